"""The WGSL backward module as emitted (issue 41; templates/wgsl/backward.wgsl.j2): for every example
and golden variant on the WGSL profiles, its sections in plan.backward.SECTIONS' order, each entry
point within webgpu-core's 8 storage buffers and 16384 bytes of workgroup memory, the manifest's
"backward" naming the source's entry points, `attngen check`'s lines, and the WGSL compiler accepting the
module (validation only: no pipeline is compiled; Tint on the Dawn pass)."""

from __future__ import annotations

import os
import re

import pytest

import attngen
from attngen.api import get_profile
from attngen.backends import get
from attngen.backends.wgsl.emit import backward_plan
from attngen.plan.backward import SECTIONS, problems
from attngen.plan.lower import lower

from conftest import ROOT, example_specs, spec_of

BACKEND = get("wgsl")


def _cases():
    specs = [(f"{f}:{s.name}", s) for f, s in example_specs()]
    specs += [(f"variants:{s.name}", s) for s in
              attngen.parse(open(os.path.join(ROOT, "tests", "golden", "variants.attn")).read())]
    out = []
    for name, spec in specs:
        if spec.dtype == "bf16":
            continue
        for profile in ("webgpu-core", "wgpu-software"):
            if not attngen.check(spec, "wgsl", get_profile(profile, "wgsl")):
                out.append((name, spec, profile))
    return out


CASES = _cases()


def _plan(spec, profile):
    return lower(spec, BACKEND, BACKEND.profile(profile))


@pytest.mark.parametrize("case", CASES, ids=[f"{n}-{p}" for n, _, p in CASES])
def test_backward_source_and_manifest(case):
    _, spec, profile = case
    plan = _plan(spec, profile)
    helpers = BACKEND.helper_sources(plan)
    back = BACKEND.manifest(plan)["backward"]
    lines = BACKEND.describe_backward(plan)
    if problems(spec) or backward_plan(plan) is None:  # paged, or head dims beyond the blocks
        assert "backward" not in helpers and back["available"] is False and "none" in lines[0]
        return
    source = helpers["backward"]
    found = re.findall(r"^// ---- (.+) ----$", source, re.M)
    assert tuple(found) == SECTIONS
    assert "attention " + spec.name in source  # the header carries the spec
    assert back["available"] and back["workgroup_storage_bytes"] <= 16384
    for e in back["entry_points"]:
        assert e["storage_buffers"] <= 8
        assert f"fn {e['entry_point']}(" in source
    assert [e["role"] for e in back["entry_points"]] == ["preprocess", "dkdv", "dq"]
    assert len(lines) == 5 and all(e["entry_point"] in "\n".join(lines) for e in back["entry_points"])
    assert BACKEND.helper_sources(plan)["backward"] == source  # deterministic


def test_the_wgsl_compiler_accepts_the_backward_modules():
    """naga (or Tint, on Dawn): every mask kind, softcap, unequal head dims, f32 / f16 native /
    f16 packed, a split schedule; f16 native where the device has shader-f16."""
    from conftest import require
    require("wgsl")
    from attngen.backends.wgsl.devices import device_state
    st = device_state()
    dev = st.device
    bodies = ["head_dim 64\n dtype f32", "head_dim qk=192 v=128\n dtype f16\n mask causal",
              "head_dim 32\n dtype f16\n mask window(left=8, right=2)\n softcap 20\n target wgsl { f16=packed }",
              "head_dim 64\n dtype f16\n mask custom\n schedule split_kv(2)",
              "head_dim 512\n dtype f16\n mask causal(bottom_right)"]
    for body in bodies:
        for profile in ("webgpu-core", "wgpu-software"):
            plan = _plan(spec_of(body), profile)
            if "shader-f16" in plan.features and "shader-f16" not in st.features:
                continue
            dev.create_shader_module(code=BACKEND.helper_sources(plan)["backward"])  # raises when naga refuses


def test_head_dims_too_large_have_none():
    plan = _plan(spec_of("head_dim 1024\n dtype f16"), "wgpu-software")
    assert "backward" not in BACKEND.helper_sources(plan)
    assert BACKEND.describe_backward(plan)[0].startswith("backward: none (head dims qk=1024 v=1024")
