"""The WGSL family on subgroup matrices (issue 43; attngen/backends/wgsl/matrix.py): the profile's
configs, the plan, the checker's refusals, and the generated sources validated by Tint on Dawn's
Null backend (no GPU: Tint parses, resolves and runs its uniformity analysis; nothing executes).
Equivalence on a GPU: tests/equivalence/test_wgsl_sgmat.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from attngen import api
from attngen.api import get_profile
from attngen.backends.wgsl import devices
from attngen.backends.wgsl.matrix import FEATURE, MatrixConfig, choose, from_adapter, matrix_configs


def test_the_dawn_nvidia_profile_lists_the_h100s_configs_and_the_plan_prefers_16x16x16():
    prof = get_profile("dawn-vulkan-nvidia", "wgsl")
    configs = matrix_configs(prof)
    assert MatrixConfig(16, 16, 16, "f16", "f32", 32, 32) in configs
    assert MatrixConfig(16, 8, 8, "f16", "f32", 32, 32) in configs
    assert {c.component for c in configs} == {"f16", "i8", "u8"}
    assert choose(prof) == MatrixConfig(16, 16, 16, "f16", "f32", 32, 32)
    # a profile without the feature has no configs, whatever it lists
    assert matrix_configs(get_profile("wgpu-vulkan-nvidia", "wgsl")) == ()
    assert choose(get_profile("webgpu-core", "wgsl")) is None


def test_an_adapter_with_other_shapes_plans_with_its_own():
    # Dawn's list as wgpudawn's extras.get_adapter_properties gives it (e.g. Apple's 8x8x8)
    dawn = [{"component_type": "f16", "result_component_type": "f32", "m": 8, "n": 8, "k": 8,
             "min_subgroup_size": 32, "max_subgroup_size": 32},
            {"component_type": "f32", "result_component_type": "f32", "m": 8, "n": 8, "k": 8,
             "min_subgroup_size": 32, "max_subgroup_size": 32}]
    base = get_profile("dawn-vulkan-nvidia", "wgsl")
    live = base.narrowed(name="live", features={"subgroup_matrix_configs": from_adapter(dawn)})
    assert choose(live) == MatrixConfig(8, 8, 8, "f16", "f32", 32, 32)
    # no f16 -> f32 shape, or subgroup sizes that vary: nothing to plan with
    none = base.narrowed(features={"subgroup_matrix_configs": from_adapter(dawn[1:])})
    assert choose(none) is None
    varying = [{**dawn[0], "min_subgroup_size": 16}]
    assert choose(base.narrowed(features={"subgroup_matrix_configs": from_adapter(varying)})) is None


def test_the_dawn_profile_matches_an_nvidia_adapter_only_under_wgpudawn(monkeypatch):
    prof = get_profile("dawn-vulkan-nvidia", "wgsl")
    info = {"vendor_id": 0x10DE, "backend_type": "Vulkan"}
    monkeypatch.setattr(devices, "RUNTIME", "wgpudawn")
    assert devices._matches(prof, info)
    monkeypatch.setattr(devices, "RUNTIME", "wgpu")
    assert not devices._matches(prof, info)
    assert devices._matches(get_profile("wgpu-vulkan-nvidia", "wgsl"), info)


def test_dawns_toggles_are_the_f16_and_unsafe_apis_ones():
    assert devices.DAWN_TOGGLES == ("allow_unsafe_apis", "vulkan_enable_f16_on_nvidia")
    assert FEATURE == "chromium-experimental-subgroup-matrix"
