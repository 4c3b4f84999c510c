"""The WGSL family on subgroup matrices (issue 43; attngen/backends/wgsl/matrix.py): the profile's
configs, the plan, the checker's refusals, and the generated sources validated by Tint on Dawn's
Null backend (no GPU: Tint parses, resolves and runs its uniformity analysis; nothing executes).
Equivalence on a GPU: tests/equivalence/test_wgsl_sgmat.py."""

from __future__ import annotations

import json
import re
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


def test_the_dawn_profile_matches_an_nvidia_adapter_only_under_wgpudawn():
    prof = get_profile("dawn-vulkan-nvidia", "wgsl")
    info = {"vendor_id": 0x10DE, "backend_type": "Vulkan"}
    assert devices._matches(prof, info, "wgpudawn")
    assert not devices._matches(prof, info, "wgpu")
    assert devices._matches(get_profile("wgpu-vulkan-nvidia", "wgsl"), info, "wgpu")


def test_dawns_toggles_are_the_f16_and_unsafe_apis_ones():
    assert devices.DAWN_TOGGLES == ("allow_unsafe_apis", "vulkan_enable_f16_on_nvidia")
    assert FEATURE == "chromium-experimental-subgroup-matrix"


SPEC = """attention t {{
    head_dim   {d}
    heads      q={hq} kv={hkv}
    dtype      {dtype}
    mask       {mask}
{extra}    target wgsl {{ {options} }}
}}"""


def spec_of(d=128, hq=4, hkv=4, dtype="f16", mask="causal", extra="", options="matrix=on"):
    (spec,) = api.parse(SPEC.format(d=d, hq=hq, hkv=hkv, dtype=dtype, mask=mask,
                                    extra=f"    {extra}\n" if extra else "", options=options))
    return spec


def messages(spec, profile="dawn-vulkan-nvidia"):
    return [d.message for d in api.check(spec, "wgsl", get_profile(profile, "wgsl"))]


def test_matrix_on_plans_the_family_and_check_says_so():
    plan = api.lower(spec_of(), "wgsl", "dawn-vulkan-nvidia")
    c = plan.config
    assert c.matrix == MatrixConfig(16, 16, 16, "f16", "f32", 32, 32)
    assert (c.tile_q, c.tile_kv, c.workgroup) == (64, 32, 128)  # d128: 4 subgroups
    c64 = api.lower(spec_of(d=64), "wgsl", "dawn-vulkan-nvidia").config
    assert (c64.tile_q, c64.tile_kv, c64.workgroup) == (128, 32, 256)  # d64: 8 subgroups
    assert c64.smem_bytes <= 49152
    assert plan.features == ("shader-f16", "subgroups", FEATURE)
    assert plan.smem_bytes <= 49152
    from attngen import backends
    lines = backends.get("wgsl").describe(plan)
    assert any(line.startswith("subgroup matrix 16x16x16 f16 -> f32") for line in lines)
    src = api.emit_plan(plan).source
    assert "enable chromium_experimental_subgroup_matrix;" in src and "subgroupMatrixMultiplyAccumulate" in src
    assert "@builtin(subgroup_id) sg: u32" in src
    assert src == api.emit_plan(api.lower(spec_of(), "wgsl", "dawn-vulkan-nvidia")).source  # deterministic


def test_matrix_off_plans_the_scalar_family():
    plan = api.lower(spec_of(options="matrix=off"), "wgsl", "dawn-vulkan-nvidia")
    assert plan.config.matrix is None and FEATURE not in plan.features


@pytest.mark.parametrize("options", ["matrix=auto", ""])
@pytest.mark.parametrize("d", [64, 128])
def test_matrix_auto_plans_the_family_where_the_profile_offers_a_config(options, d):
    """auto (the default): measured faster on every row of the WGSL grid, so it is the family's
    plan where the profile has a usable config and the family serves the spec."""
    auto = api.lower(spec_of(d=d, options=options), "wgsl", "dawn-vulkan-nvidia")
    on = api.lower(spec_of(d=d), "wgsl", "dawn-vulkan-nvidia")
    assert auto.config == on.config and auto.features == on.features == ("shader-f16", "subgroups", FEATURE)
    assert not messages(spec_of(d=d, options=options))
    from attngen import backends
    assert any(line.startswith("subgroup matrix 16x16x16 f16 -> f32 (of the profile's configs; target wgsl { "
                               "matrix=auto })") for line in backends.get("wgsl").describe(auto))
    assert "subgroup_matrix" in api.emit_plan(auto).manifest


REFUSED = [
    ({"dtype": "f32"}, "storage f32"),
    ({"d": 256}, "head_dim qk=256 v=256"),
    ({"d": 96}, "head_dim qk=96"),
    ({"mask": "k % 3 != 1"}, "mask expr"),
    ({"extra": "schedule split_kv(4)"}, "schedule split_kv"),
    ({"extra": "schedule two_pass"}, "schedule two_pass"),
    ({"extra": "accumulate qk=f16 pv=f32"}, "accumulate f16"),
    ({"extra": "tile q=32 kv=32"}, "tile sizes from the spec"),
    ({"options": "matrix=on f16=packed"}, "f16=packed"),
    ({"options": "matrix=on subgroups=off"}, "subgroups=off"),
    ({"options": "matrix=on workgroup=128"}, "workgroup from the spec"),
]


@pytest.mark.parametrize("kwargs, why", REFUSED, ids=[w for _, w in REFUSED])
def test_matrix_auto_keeps_what_the_family_refuses_on_the_scalar_family_silently(kwargs, why):
    kw = {**kwargs, "options": kwargs.get("options", "matrix=on").replace("matrix=on", "matrix=auto")}
    assert messages(spec_of(**kw)) == []
    plan = api.lower(spec_of(**kw), "wgsl", "dawn-vulkan-nvidia")
    assert plan.config.matrix is None and FEATURE not in plan.features
    # matrix=on names why (test_matrix_on_names_what_the_family_does_not_take_yet)
    assert any(why in m for m in messages(spec_of(**{**kwargs, "options": kwargs.get("options", "matrix=on")})))


def _narrowed(**features):
    return get_profile("dawn-vulkan-nvidia", "wgsl").narrowed(name="narrowed", features=features)


@pytest.mark.parametrize("profile, why", [
    (_narrowed(guaranteed=["shader-f16", "subgroups"], optional=[FEATURE]), "the feature only on request"),
    (_narrowed(guaranteed=["subgroups", FEATURE], optional=["shader-f16"]), "shader-f16 only on request"),
    (_narrowed(subgroup_min_size=16), "subgroups of 16 to 32"),
    (_narrowed(subgroup_matrix_configs=[]), "no configs"),
    (get_profile("dawn-vulkan-nvidia", "wgsl").narrowed(limits={"workgroup_storage_bytes": 32768}), "32 KiB"),
])
def test_matrix_auto_needs_guaranteed_features_one_subgroup_size_a_config_and_room(profile, why):
    for d in (64, 128):
        assert api.lower(spec_of(d=d, options=""), "wgsl", profile).config.matrix is None, why
        assert not api.check(spec_of(d=d, options=""), "wgsl", profile)


def test_matrix_auto_takes_the_family_per_head_dim_where_only_one_fits():
    roomy = get_profile("dawn-vulkan-nvidia", "wgsl").narrowed(limits={"workgroup_storage_bytes": 36864})
    assert api.lower(spec_of(d=128, options=""), "wgsl", roomy).config.matrix is not None  # 33808 bytes
    assert api.lower(spec_of(d=64, options=""), "wgsl", roomy).config.matrix is None  # 42000 bytes


def test_matrix_auto_on_profiles_without_configs_plans_what_matrix_off_plans():
    """The profiles without subgroup matrices (the golden files' among them) are unchanged by auto."""
    from conftest import example_specs
    for name in ("webgpu-core", "wgpu-vulkan-nvidia", "wgpu-software", "wgpu-apple", "wgpu-intel", "wgpu-adreno"):
        prof = get_profile(name, "wgsl")
        for _, spec in example_specs():
            if spec.dtype == "bf16" or api.check(spec, "wgsl", prof):
                continue
            off = api.parse(api.format_spec(spec).replace("target wgsl {", "target wgsl { matrix=off", 1))[0]
            assert api.lower(spec, "wgsl", prof).config == api.lower(off, "wgsl", prof).config, (name, spec.name)


def test_a_mask_over_inputs_builds_its_block_mask_on_the_companion_kernels_tiles():
    """The `mask custom` companion of a mask over inputs may be planned on the family (auto) while
    the spec's own kernel is scalar: the builder (`--emit block-mask`) takes the companion's tiles."""
    from attngen import backends
    from attngen.backends.wgsl.manifest import companion_plan
    (spec,) = api.parse("attention t {\n head_dim 128\n dtype f16\n input doc[b, q] i32\n"
                        " mask k <= q && doc[b, q] == doc[b, k]\n}")
    plan = api.lower(spec, "wgsl", "dawn-vulkan-nvidia")
    att = companion_plan(plan)
    assert plan.config.matrix is None and att.config.matrix is not None
    assert (att.tile_q, att.tile_kv) != (plan.tile_q, plan.tile_kv)
    builder = backends.get("wgsl").helper_sources(plan)["block-mask"]
    assert f"const TILE_Q: u32 = {att.tile_q}u;" in builder and f"const TILE_KV: u32 = {att.tile_kv}u;" in builder
    m = api.emit_plan(plan).manifest["mask_inputs"]["attention"]["manifest"]
    assert FEATURE in m["features"] and m["subgroup_matrix"]["m"] == 16


# ---- at load: a plan for a named profile whose configs the live adapter lacks ------------------------

def test_at_load_auto_falls_back_to_the_scalar_build_and_on_is_refused():
    from attngen import backends
    from attngen.backends.wgsl.kernel import _matrix_problem, _plan
    backend = backends.get("wgsl")
    dawn = get_profile("dawn-vulkan-nvidia", "wgsl")
    live = dawn.narrowed(name="dawn-vulkan-nvidia@no-matrices", features={
        "guaranteed": ["shader-f16", "subgroups"], "subgroup_matrix_configs": []})
    plan, prof = _plan(spec_of(options=""), backend, dawn, live)
    assert plan.config.matrix is None and FEATURE not in plan.features and plan.profile == "dawn-vulkan-nvidia"
    off = api.lower(spec_of(options="matrix=off"), "wgsl", "dawn-vulkan-nvidia")
    assert plan.config == off.config
    assert api.emit_plan(plan).source.split("\n", 20)[-1] == api.emit_plan(off).source.split("\n", 20)[-1]
    # where the adapter offers the config, auto keeps the family
    assert _plan(spec_of(options=""), backend, dawn, dawn)[0].config.matrix is not None
    # matrix=on keeps its plan, and the device check refuses it, naming the config and what to do
    plan, _ = _plan(spec_of(), backend, dawn, live)
    why = _matrix_problem(plan, live, "this device (H200)")
    assert plan.config.matrix is not None and "16x16x16 f16 -> f32 subgroup matrices" in why
    assert "this device (H200) does not offer" in why and "matrix=auto" in why
    varying = dawn.narrowed(features={"subgroup_min_size": 16})
    assert "subgroups of 16 to 32" in _matrix_problem(plan, varying)
    assert _plan(spec_of(options=""), backend, dawn, varying)[0].config.matrix is None


@pytest.mark.parametrize("profile", ["webgpu-core", "wgpu-vulkan-nvidia", "wgpu-software"])
def test_matrix_on_without_the_feature_names_it_and_the_profile(profile):
    (msg,) = messages(spec_of(), profile)
    assert "matrix=on needs the chromium-experimental-subgroup-matrix" in msg and f"profile {profile}" in msg


def test_matrix_on_with_the_feature_but_no_usable_config_lists_what_the_profile_has():
    base = get_profile("dawn-vulkan-nvidia", "wgsl")
    ints = base.narrowed(name="ints", features={"subgroup_matrix_configs": [
        {"m": 16, "n": 16, "k": 32, "component": "i8", "result": "i32", "min_subgroup_size": 32,
         "max_subgroup_size": 32}]})
    (msg,) = [d.message for d in api.check(spec_of(), "wgsl", ints)]
    assert "offers no f16 -> f32 subgroup-matrix config" in msg and "16x16x32 i8 -> i32" in msg


@pytest.mark.parametrize("kwargs, why", [
    ({"dtype": "f32"}, "storage f32"),
    ({"d": 256}, "head_dim qk=256 v=256"),
    ({"d": 96}, "head_dim qk=96"),
    ({"mask": "k % 3 != 1"}, "mask expr"),
    ({"extra": "schedule split_kv(4)"}, "schedule split_kv"),
    ({"extra": "schedule two_pass"}, "schedule two_pass"),
    ({"extra": "accumulate qk=f16 pv=f32"}, "accumulate f16"),
    ({"extra": "tile q=32 kv=32"}, "tile sizes from the spec"),
    ({"options": "matrix=on f16=packed"}, "f16=packed"),
    ({"options": "matrix=on subgroups=off"}, "subgroups=off"),
])
def test_matrix_on_names_what_the_family_does_not_take_yet(kwargs, why):
    msgs = messages(spec_of(**kwargs))
    assert any("the subgroup-matrix family does not take" in m and why in m for m in msgs), msgs


# ---- Tint on Dawn's Null backend -----------------------------------------------------------------
# Run in a child process: WGPU_BACKEND_TYPE=Null must be set before wgpudawn makes its instance,
# and this process's may already exist (the Dawn pass of scripts/test.sh). The child compiles each
# source (create_shader_module: Tint's parser, resolver, uniformity analysis) and creates its
# pipeline, which the Null adapter refuses only for its 16 KiB of workgroup storage (it reports
# the bytes Tint counted, which must be the plan's).
_CHILD = r"""
import json, sys
import wgpudawn
from wgpudawn.backends.dawn import extras
extras.set_instance_extras(enable_toggles=["allow_unsafe_apis"])
adapter = wgpudawn.gpu.request_adapter_sync()
if adapter is None or adapter.info.get("backend_type") != "Null":
    print(json.dumps({"skip": "no Null adapter: " + repr(adapter and dict(adapter.info))}))
    sys.exit(0)
wanted = ["shader-f16", "subgroups", "chromium-experimental-subgroup-matrix"]
missing = [f for f in wanted if f not in adapter.features]
if missing:
    print(json.dumps({"skip": "the Null adapter lacks " + ", ".join(missing)}))
    sys.exit(0)
device = adapter.request_device_sync(required_features=wanted)
out = {}
for item in json.load(sys.stdin):
    try:
        module = device.create_shader_module(code=item["source"])
    except Exception as e:
        out[item["name"]] = "module: " + str(e)
        continue
    try:
        device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": item["entry"]})
        out[item["name"]] = "ok"
    except Exception as e:
        out[item["name"]] = "pipeline: " + str(e)
print(json.dumps(out))
"""


def tint_null(sources: dict) -> dict:
    """{name: "ok" | "module: <error>" | "pipeline: <error>"} for {name: (source, entry point)}."""
    pytest.importorskip("wgpudawn")
    env = {**os.environ, "WGPU_BACKEND_TYPE": "Null"}
    items = [{"name": n, "source": s, "entry": e} for n, (s, e) in sources.items()]
    res = subprocess.run([sys.executable, "-c", _CHILD], input=json.dumps(items), env=env, capture_output=True,
                         text=True, timeout=120)
    if res.returncode != 0:
        pytest.skip(f"Dawn's Null backend did not run: {res.stderr.strip()[-500:]}")
    answer = json.loads(res.stdout.strip().splitlines()[-1])
    if "skip" in answer:
        pytest.skip(answer["skip"])
    return answer


GRID = [dict(d=d, mask=mask) for d in (64, 128) for mask in ("none", "causal", "window(left=100, right=3)")] + [
    dict(d=128, mask="causal", extra="softcap 30"),
    dict(d=64, hq=6, hkv=2, mask="none", extra="softcap 50"),  # GQA 3
    dict(d=128, hq=3, hkv=1, mask="causal(bottom_right)"),
    dict(d=64, mask="causal", extra="kv_cache paged(page=16)"),
    dict(d=64, hq=6, hkv=2, mask="custom"),
    dict(d=128, mask="custom", extra="softcap 20"),
]


def test_the_generated_sources_compile_under_tint_on_dawns_null_backend():
    plans = {f"case{i}": api.lower(spec_of(**kw), "wgsl", "dawn-vulkan-nvidia") for i, kw in enumerate(GRID)}
    sources = {name: (api.emit_plan(p).source, p.entry) for name, p in plans.items()}
    # the test means something: an offset from local_invocation_index is refused (uniformity)
    src, entry = sources["case1"]
    bad = src.replace("(&sS, sb + 0u", "(&sS, (lid / 32u) * TILE_KV * S_COL + 0u", 1)
    assert bad != src
    sources["uniformity"] = (bad, entry)
    result = tint_null(sources)
    assert "requires argument 1 to be uniform" in result.pop("uniformity")
    for name, got in result.items():
        smem = plans[name].smem_bytes
        assert got == "ok" or (got.startswith("pipeline: The total use of workgroup storage ")
                               and f"({smem} bytes)" in got), (name, got[:2000])


def test_the_examples_that_auto_plans_on_the_family_compile_under_tint():
    """matrix=auto's kernels of the examples on dawn-vulkan-nvidia (Llama-3, Mistral's window,
    packed documents' custom mask, Whisper's d64) and the `mask custom` companion of a mask over
    inputs, as a browser's Tint takes them."""
    from conftest import example_specs
    from attngen.backends.wgsl.manifest import companion_plan
    plans = {}
    for _, spec in example_specs():
        if spec.dtype == "bf16" or api.check(spec, "wgsl", get_profile("dawn-vulkan-nvidia", "wgsl")):
            continue
        plan = api.lower(spec, "wgsl", "dawn-vulkan-nvidia")
        if plan.config.matrix is not None:
            plans[spec.name] = plan
    assert {"llama3_8b_prefill", "mistral_7b_prefill", "whisper_large_v3_cross"} <= set(plans)
    (inputs,) = api.parse("attention t {\n head_dim 64\n dtype f16\n input doc[b, q] i32\n"
                          " mask k <= q && doc[b, q] == doc[b, k]\n}")
    plans["companion"] = companion_plan(api.lower(inputs, "wgsl", "dawn-vulkan-nvidia"))
    result = tint_null({name: (api.emit_plan(p).source, p.entry) for name, p in plans.items()})
    for name, got in result.items():
        assert got == "ok" or (got.startswith("pipeline: The total use of workgroup storage ")
                               and f"({plans[name].smem_bytes} bytes)" in got), (name, got[:2000])


def test_the_manifest_lists_the_feature_and_the_config():
    em = api.emit(spec_of(), "wgsl", "dawn-vulkan-nvidia")
    m = em.manifest
    assert FEATURE in m["features"] and m["workgroup_size"] == [128, 1, 1]
    assert {k: v for k, v in m["subgroup_matrix"].items() if k != "note"} == {
        "m": 16, "n": 16, "k": 16, "component": "f16", "result": "f32", "min_subgroup_size": 32,
        "max_subgroup_size": 32}
    # the scalar family's manifest has no such key
    assert "subgroup_matrix" not in api.emit(spec_of(options="matrix=off"), "wgsl", "dawn-vulkan-nvidia").manifest


# ---- alignment of workgroup memory (matrix.py's ALIGN rule) ---------------------------------------
_DECL = re.compile(r"^var<workgroup> (\w+): array<(?:atomic<)?(\w+)>?, (\d+)>;", re.M)
_CONST = re.compile(r"^const (\w+): u32 = ([\w\s+*()]+);", re.M)
_LET = re.compile(r"\blet (\w+) = ([\w\s+*/%()]+);")
_CALL = re.compile(r"subgroupMatrix(Load|Store)<[^>]*>\(&(\w+), ")
_BYTES = {"f16": 2, "f32": 4, "u32": 4, "i32": 4}


def _args(src, at):
    """The comma-separated arguments of the call whose argument list continues at src[at:]."""
    out, depth, start = [], 0, at
    for i in range(at, len(src)):
        ch = src[i]
        if ch in "(<":
            depth += 1
        elif ch in ">" and depth:
            depth -= 1
        elif ch == ")":
            if depth == 0:
                out.append(src[start:i].strip())
                return out
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(src[start:i].strip())
            start = i + 1
    raise AssertionError("unbalanced call")


def _terms(expr, known):
    """The values of a u32 expression (consts and lets substituted; every other name free) at 0
    and with each free variable at 1 .. 8."""
    for _ in range(8):  # lets of lets
        expr = re.sub(r"\b[A-Za-z_]\w*\b", lambda m: f"({known[m.group(0)]})" if m.group(0) in known else m.group(0),
                      expr)
    expr = re.sub(r"\b(\d+)u\b", r"\1", expr)
    expr = expr.replace("/", "//")
    free = sorted(set(re.findall(r"\b[A-Za-z_]\w*\b", expr)))
    at = lambda **v: eval(expr, {"__builtins__": {}}, {n: v.get(n, 0) for n in free})
    # each free variable at 0 .. 8 with the others 0 (linear terms: its coefficient; also the
    # values of the few non-linear ones, a subgroup's rows modulo a tile)
    return [("constant", at())] + [(f"{n}={i}", at(**{n: i})) for n in free for i in range(1, 9)]


def misaligned(src):
    """Every workgroup variable of `src` not a multiple of 16 bytes, and every offset or stride
    term of a subgroup-matrix load or store on workgroup memory not a multiple of 16 bytes."""
    decls = {name: (ty, int(n)) for name, ty, n in _DECL.findall(src)}
    known = {n: v for n, v in _CONST.findall(src)}
    known.update({n: e for n, e in _LET.findall(src) if n not in known})
    bad = [f"{n}: {_BYTES[t] * k} bytes" for n, (t, k) in decls.items() if _BYTES[t] * k % 16]
    calls = 0
    for m in _CALL.finditer(src):
        if m.group(2) not in decls:
            continue  # storage memory
        calls += 1
        size = _BYTES[decls[m.group(2)][0]]
        args = _args(src, m.end())
        for what, expr in (("offset", args[0]), ("stride", args[-1])):
            for var, coeff in _terms(expr, known):
                if coeff * size % 16:
                    bad.append(f"{m.group(1)} on {m.group(2)}: {what} {expr!r} at {var} is {coeff} elements")
    assert calls, "no subgroup-matrix call on workgroup memory found"
    return bad


@pytest.mark.parametrize("kw", GRID, ids=lambda kw: "-".join(str(v) for v in kw.values()))
def test_every_workgroup_variable_and_matrix_offset_is_16_byte_aligned(kw):
    src = api.emit_plan(api.lower(spec_of(**kw), "wgsl", "dawn-vulkan-nvidia")).source
    assert misaligned(src) == []
    # the check sees a misaligned variable and a misaligned offset
    assert misaligned(src.replace("array<atomic<u32>, 4>", "array<atomic<u32>, 1>", 1))
    first = _CALL.search(src)
    assert misaligned(src[:first.end()] + "4u + " + src[first.end():])


def test_the_planner_refuses_a_config_that_cannot_be_aligned():
    base = get_profile("dawn-vulkan-nvidia", "wgsl")
    odd = base.narrowed(name="odd", features={"subgroup_matrix_configs": [
        {"m": 4, "n": 8, "k": 4, "component": "f16", "result": "f32", "min_subgroup_size": 32,
         "max_subgroup_size": 32}]})
    (msg,) = [d.message for d in api.check(spec_of(), "wgsl", odd)]
    assert "16-byte aligned" in msg and "MAT_K columns on sK is 4 f16 elements" in msg, msg
    from attngen.backends.wgsl.matrix import alignment_problems, matrix_offsets, layout
    mc = choose(get_profile("dawn-vulkan-nvidia", "wgsl"))
    assert alignment_problems(layout(spec_of(), mc)[0], matrix_offsets(spec_of(), mc)) == []
