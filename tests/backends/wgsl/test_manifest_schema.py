"""The WGSL manifest is a versioned schema (docs/manifest-wgsl.schema.json, issue 14): every
example's and every golden variant's manifest, on every WGSL profile and with packed f16,
validates; manifests a foreign runtime could not follow do not."""

from __future__ import annotations

import copy
import json
import os

import pytest

import attngen
from attngen.api import get_profile

from conftest import ROOT, example_specs

jsonschema = pytest.importorskip("jsonschema")

with open(os.path.join(ROOT, "docs", "manifest-wgsl.schema.json")) as f:
    SCHEMA = json.load(f)
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def _specs():
    out = [(f"{f}:{s.name}", s) for f, s in example_specs()]
    for s in attngen.parse(open(os.path.join(ROOT, "tests", "golden", "variants.attn")).read()):
        out.append((f"variants:{s.name}", s))
    return out


def _cases():
    """(name, spec, profile) of every WGSL kernel among them, and the f16 ones again with packed f16;
    on dawn-vulkan-nvidia, those of the subgroup-matrix family (matrix=auto's choice there)."""
    out = []
    dawn = get_profile("dawn-vulkan-nvidia", "wgsl")
    for name, spec in _specs():
        if spec.dtype != "bf16" and not attngen.check(spec, "wgsl", dawn) and attngen.lower(spec, "wgsl", dawn).config.matrix:
            out.append((name, spec, "dawn-vulkan-nvidia"))
        for profile in ("webgpu-core", "wgpu-software"):
            if spec.dtype != "bf16" and not attngen.check(spec, "wgsl", get_profile(profile, "wgsl")):
                out.append((name, spec, profile))
        if spec.dtype == "f16" and "f16" not in (spec.acc_qk, spec.acc_pv):
            packed = attngen.parse(attngen.format_spec(spec).replace("f16=auto", "f16=packed"))[0]
            out.append((name + "+packed", packed, "webgpu-core"))
    return out


CASES = _cases()


def test_the_schema_is_a_schema():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert len(CASES) > 40
    assert sum(p == "dawn-vulkan-nvidia" for _, _, p in CASES) >= 3  # subgroup-matrix kernels among them


@pytest.mark.parametrize("case", CASES, ids=[f"{n}-{p}" for n, _, p in CASES])
def test_manifests_validate(case):
    _, spec, profile = case
    m = attngen.emit(spec, target="wgsl", profile=profile).manifest
    errors = sorted(VALIDATOR.iter_errors(json.loads(json.dumps(m))), key=str)
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors[:5])


def test_what_a_runtime_could_not_follow_is_refused():
    m = json.loads(json.dumps(attngen.emit(attngen.parse("attention t {\n head_dim 64\n dtype f16\n schedule split_kv(auto)\n}\n")[0],
                                           target="wgsl", profile="webgpu-core").manifest))
    assert VALIDATOR.is_valid(m)
    bad = []
    x = copy.deepcopy(m); del x["bindings"][0]["fields"][0]["value"]; bad.append(x)        # a uniform without its value
    x = copy.deepcopy(m); x["entry_points"][0]["dispatch"][0] = "Lq - 1"; bad.append(x)          # outside the formula grammar
    x = copy.deepcopy(m); del x["schedule"]["split_rule"]; bad.append(x)                          # S cannot be computed
    x = copy.deepcopy(m); x["bindings"][1]["type"] = "write"; bad.append(x)                       # not a WebGPU binding type
    x = copy.deepcopy(m); del x["f16_storage"]; bad.append(x)                                     # f16 without its storage
    x = copy.deepcopy(m); x["manifest_version"] = 2; bad.append(x)
    for b in bad:
        assert not VALIDATOR.is_valid(b)


INPUT_SPECS = [
    "head_dim 64\n dtype f16\n input slopes[h] f32\n score s - slopes[h] * abs(q - k)\n mask causal",
    "head_dim 32\n dtype f32\n input doc[b, q] i32\n input allow[h, k] bool\n mask k <= q && doc[b, q] == doc[b, k] || allow[h, k]",
    "head_dim 32\n dtype f32\n input table[h, 169] f16\n score s + table[h, (q // 7 - k // 7 + 6) * 13 + (q % 7 - k % 7 + 6)]\n"
    " schedule two_pass",
]


@pytest.mark.parametrize("body", INPUT_SPECS)
def test_manifests_with_inputs_validate_and_describe_the_binding(body):
    spec = attngen.parse("attention t {\n " + body + "\n}\n")[0]
    m = json.loads(json.dumps(attngen.emit(spec, target="wgsl", profile="webgpu-core").manifest))
    assert VALIDATOR.is_valid(m), [e.message for e in VALIDATOR.iter_errors(m)][:3]
    (binding,) = [b for b in m["bindings"] if b["name"] == "inputs"]
    assert binding["type"] == "storage" and binding["dtype"] == "u32"
    assert [i["name"] for i in m["inputs"]["inputs"]] == [i.name for i in spec.inputs]
    assert m["inputs"]["inputs"][0]["offset"] == "1"
    fields = {f["name"]: f["value"] for f in m["bindings"][0]["fields"]}
    assert all(fields[i["offset_field"]] == i["offset"] for i in m["inputs"]["inputs"])
    bad = copy.deepcopy(m)
    del bad["inputs"]["inputs"][0]["offset"]
    assert not VALIDATOR.is_valid(bad)
