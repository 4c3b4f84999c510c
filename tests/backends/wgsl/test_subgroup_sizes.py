"""Subgroup sizes (issue 13, part 5): a row's invocations reduce with subgroupShuffleXor over
lane masks below THREADS_PER_ROW, so a plan is right on any adapter whose subgroups hold whole
rows: THREADS_PER_ROW a power of two no larger than the smallest subgroup the adapter may run
(4 on SwiftShader, 8 on lavapipe, 32 on NVIDIA, 64 on AMD, up to 128). Checked here by the plan's
reasoning for every size; run for real on lavapipe (the suite), SwiftShader (tests/browser:
subgroups_f32) and the H100's Vulkan driver (the GPU machine). Peers got exactly this wrong:
microsoft/onnxruntime#28520 (keys skipped at size 32), ggml-org/llama.cpp#23040 (a hard-coded 32
on size-128 adapters)."""

from __future__ import annotations

import re

import pytest

import attngen
from attngen.api import emit_plan, get_profile

from conftest import spec_of

SIZES = [4, 8, 16, 32, 64, 128]
BODIES = ["head_dim 64\n dtype f32\n mask causal", "head_dim 128\n dtype f32",
          "head_dim 256\n dtype f32\n tile q=8", "head_dim 32\n dtype f32\n heads q=7 kv=1"]


def _profile(size):
    base = get_profile("wgpu-vulkan-nvidia", "wgsl")
    return base.narrowed(name=f"sg{size}", features={"guaranteed": ["subgroups"], "optional": [],
                                                      "subgroup_min_size": size, "subgroup_max_size": size})


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("body", BODIES)
def test_a_row_never_straddles_a_subgroup(size, body):
    spec = spec_of(body + "\n target wgsl { subgroups=on }")
    plan = attngen.lower(spec, "wgsl", _profile(size))
    c = plan.config
    tpr = c.threads_per_row
    assert c.subgroups and tpr & (tpr - 1) == 0 and tpr <= size
    src = emit_plan(plan).source
    masks = [int(m) for m in re.findall(r"subgroupShuffleXor\([^,]+, (\d+)u\)", src)]
    assert (masks != []) == (tpr > 1) and all(m < tpr for m in masks)  # shuffles stay inside a row's lanes


@pytest.mark.parametrize("size", SIZES)
def test_a_workgroup_of_whole_rows_is_refused_when_rows_are_wider_than_subgroups(size):
    """A spec that asks for more invocations per row than the subgroups hold gets workgroup-memory
    reductions, or is refused naming the reason, never a plan that would mix rows."""
    spec = spec_of("head_dim 128\n dtype f32\n tile q=2 kv=32\n target wgsl { workgroup=64 subgroups=on }")
    problems = attngen.check(spec, "wgsl", _profile(size))
    if 32 <= size:
        assert problems == []
    else:
        assert problems and "subgroup" in problems[0].message
