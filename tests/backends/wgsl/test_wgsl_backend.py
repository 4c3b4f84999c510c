"""The WGSL backend: emitted source (any machine) and kernels run on the wgpu adapter present
(lavapipe on CPU-only machines) against the float64 reference.

Shapes are small: lavapipe runs on a few CPU cores, and each kernel costs a shader compile.
"""

from __future__ import annotations

import os
import re

from attngen.backends.wgsl.unroll import unroll_loops
from dataclasses import replace

import numpy as np
import pytest

import attngen
from attngen.api import emit_plan
from attngen.errors import LaunchError, SpecError
from attngen.api import lower as plan
from attngen.backends.wgsl.devices import DAWN, WGPU_FEATURE
from attngen.reference import reference, relative_error, tolerance

from conftest import skip_if_adapter_refuses

pytestmark = pytest.mark.wgsl


def spec_of(body: str) -> attngen.AttentionSpec:
    return attngen.parse("attention t {\n" + body + "\n}")[0]


def emit(body: str, profile: str):
    return emit_plan(plan(spec_of(body), "wgsl", profile))


def code_lines(source: str) -> list[str]:
    """The source without its header comment block (the first two '// ====' rules and between)."""
    lines = source.splitlines()
    rules = [i for i, ln in enumerate(lines) if ln.startswith("// ====")]
    assert rules[0] == 0 and len(rules) >= 2
    return lines[rules[1] + 1:]


# ---- emitted source: no device needed ---------------------------------------------------------

FORCED = "head_dim 64\n dtype {dtype}\n tile q=16 kv=16\n target wgsl {{ workgroup=64 subgroups=on f16=native prefetch=off }}"


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_subgroup_directive_follows_the_profile_dialect(dtype):
    body = FORCED.format(dtype=dtype)
    tint = code_lines(emit(body, "webgpu-core").source)
    naga = code_lines(emit(body, "wgpu-software").source)
    nvidia = code_lines(emit(body, "wgpu-vulkan-nvidia").source)
    expected = (["enable f16;"] if dtype == "f16" else []) + ["enable subgroups;"]
    assert tint[:len(expected)] == expected  # Chrome's Tint requires the directive
    assert "enable subgroups;" not in naga and "enable subgroups;" not in nvidia  # naga rejects it
    assert [ln for ln in tint if ln != "enable subgroups;"] == naga
    # the NVIDIA profile's dialect also unrolls the sub-block loops (docs/wgsl-variants.md)
    assert nvidia == code_lines(unroll_loops(emit(body, "wgpu-software").source)) != naga


def test_directives_come_from_the_plan():
    src = emit("head_dim 64\n dtype f32\n target wgsl { subgroups=off }", "webgpu-core").source
    assert not re.search(r"^enable ", src, re.M)
    assert "sRed" in src and "subgroupShuffleXor" not in src
    src = emit("head_dim 64\n dtype f16\n target wgsl { subgroups=off f16=native }", "webgpu-core").source
    assert re.findall(r"^enable .*$", src, re.M) == ["enable f16;"]
    # webgpu-core stores f16 packed by default (no shader-f16 in many browsers): no directive
    src = emit("head_dim 64\n dtype f16\n target wgsl { subgroups=off }", "webgpu-core").source
    assert not re.search(r"^enable ", src, re.M) and "unpack2x16float" in src
    src = emit("head_dim 64\n dtype f16", "wgpu-software").source
    assert "subgroupShuffleXor" in src and "var<workgroup> sRed" not in src


def test_emission_is_deterministic():
    body = "head_dim 96\n dtype f16\n mask window(left=5, right=2)\n softcap 30.0"
    for profile in ("webgpu-core", "wgpu-software", "wgpu-vulkan-nvidia"):
        a, b = emit(body, profile), emit(body, profile)
        assert a.source == b.source and a.manifest == b.manifest


def test_source_reads_like_the_cuda_kernel():
    src = emit("head_dim 64\n dtype f16\n mask causal", "wgpu-software").source
    cuda = emit_plan(plan(spec_of("head_dim 64\n dtype f16\n mask causal"), "cuda")).source
    sections = ["config", "types", "memory", "matmul primitives", "mask", "score transform", "kernel",
                "prologue: load Q", "loop bounds (mask)", "main loop over K/V tiles",
                "epilogue: normalise and store"]
    for name in sections:
        assert f"---- section: {name} " in src, name
        assert f"---- section: {name} " in cuda, name
    for step in ["load K/V tile", "S = Q K^T", "score transform and mask", "online softmax: m_i, l_i, alpha",
                 "O += P V"]:
        assert f"// -- {step}" in src and f"// -- {step}" in cuda, step
    for name in ("m_i", "l_i", "acc", "alpha", "fn visible(", "fn key_range(", "fn tile_is_full("):
        assert name in src
    assert src.startswith("// ====") and "Spec (normalised" in src
    assert "fn attngen_t(" in src and "alias elem_t = f16;" in src
    assert "inf" not in re.sub(r"//.*", "", src).replace("neg_inf", "")  # no infinity literals in code


def test_manifest_describes_the_launch():
    em = emit("head_dim qk=192 v=128\n dtype f16\n heads q=8 kv=2", "wgpu-software")
    m = em.manifest
    c = em.plan.config
    assert m["language"] == "WGSL"
    assert m["entry_point"] == "attngen_t"
    assert m["workgroup_size"] == [c.workgroup, 1, 1]
    assert m["dispatch"] == [f"ceil(Lq / {c.tile_q})", "Hq", "B"]
    assert m["workgroup_storage_bytes"] == c.smem_bytes
    assert m["features"] == ["shader-f16", "subgroups"]
    binds = m["bindings"]
    assert [(b["binding"], b["name"]) for b in binds] == [(0, "params"), (1, "q"), (2, "k"), (3, "v"),
                                                          (4, "out"), (5, "lse"), (6, "seq_meta"),
                                                          (7, "kv_new")]
    assert all(b["group"] == 0 for b in binds)
    assert [f["name"] for f in binds[0]["fields"]] == [f[0] for f in em.plan.details.uniform_fields]
    assert binds[0]["size_bytes"] == 4 * len(em.plan.details.uniform_fields) and binds[0]["size_bytes"] % 16 == 0
    assert binds[1]["type"] == "read-only-storage" and binds[4]["type"] == "storage"
    assert binds[2]["type"] == "storage"  # k: appended rows are written in place
    assert binds[5]["dtype"] == "f32"
    assert "multiple of 4 bytes" in m["buffer_note"]


# ---- running kernels ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def rt(tmp_path_factory):
    pytest.importorskip("wgpu")
    old = os.environ.get("ATTNGEN_CACHE_DIR")
    os.environ["ATTNGEN_CACHE_DIR"] = str(tmp_path_factory.mktemp("attngen-cache"))
    from attngen.backends import wgsl as runtime
    try:
        runtime.device()
    except LaunchError as e:
        pytest.skip(f"no wgpu adapter: {e}")
    yield runtime
    if old is None:
        os.environ.pop("ATTNGEN_CACHE_DIR", None)
    else:
        os.environ["ATTNGEN_CACHE_DIR"] = old


_NP = {"f16": np.float16, "f32": np.float32}


def inputs(spec, b, lq, lk, hq, hkv, seed=0):
    rng = np.random.default_rng(seed)
    dt = _NP[spec.dtype]
    q = rng.standard_normal((b, lq, hq, spec.head_dim_qk)).astype(dt)
    k = rng.standard_normal((b, lk, hkv, spec.head_dim_qk)).astype(dt)
    v = rng.standard_normal((b, lk, hkv, spec.head_dim_v)).astype(dt)
    return q, k, v


def check_against_reference(kernel, spec, shape, seed=0):
    """Run one shape (B, Lq, Lk, Hq, Hkv); compare out and lse with the reference."""
    q, k, v = inputs(spec, *shape, seed=seed)
    out, lse = kernel(q, k, v, return_lse=True)
    ref, ref_lse = reference(spec, q, k, v, return_lse=True)
    b, lq, lk, hq, hkv = shape
    assert out.shape == (b, lq, hq, spec.head_dim_v) and out.dtype == _NP[spec.dtype]
    assert lse.shape == (b, hq, lq) and lse.dtype == np.float32
    assert not np.isnan(out).any() and not np.isnan(lse).any()
    err = relative_error(out, ref)
    assert err <= tolerance(spec), f"{shape}: relative error {err:.3g} > {tolerance(spec)}"
    # rows that see no key: output exactly 0, lse exactly -inf
    empty = np.isneginf(ref_lse)
    np.testing.assert_array_equal(np.isneginf(lse), empty)
    assert (out.transpose(0, 2, 1, 3)[empty] == 0).all()
    seen = ~empty
    if seen.any():
        atol = 5e-2 if "f16" in (spec.acc_qk, spec.acc_pv) else 1e-4
        np.testing.assert_allclose(lse[seen], ref_lse[seen], rtol=0, atol=atol)
    return out, lse


# (spec body, profile, shapes (B, Lq, Lk, Hq, Hkv)). Lengths 1, 7, 113 with Lq != Lk both ways;
# GQA groups 1, 4 and 7. Each spec costs one shader compile.
SQUARE = [(1, 1, 1, 1, 1), (2, 7, 7, 8, 2), (1, 113, 113, 2, 2)]
RAGGED = [(1, 7, 113, 2, 1), (1, 113, 7, 8, 2), (2, 1, 7, 7, 1)]
CASES = {
    "f32-d64-causal-subgroups-on": (
        "head_dim 64\n dtype f32\n mask causal\n target wgsl { subgroups=on }", None, SQUARE + RAGGED),
    "f32-d64-causal-subgroups-off": (
        "head_dim 64\n dtype f32\n mask causal\n target wgsl { subgroups=off }", None, SQUARE + RAGGED),
    "f16-d128-none-gqa7-webgpu-core": (
        "head_dim 128\n dtype f16\n target wgsl { subgroups=on }", "webgpu-core",
        [(1, 113, 40, 7, 1), (2, 7, 113, 7, 7)]),
    "f16-d40-window-2-per-row": (  # 40 columns: at most 2 invocations per row own whole vec4 groups
        "head_dim 40\n dtype f16\n mask window(left=5, right=2)\n tile q=16\n"
        " target wgsl { workgroup=32 subgroups=off }", None, SQUARE + RAGGED),
    "f32-d8-window-left0": (
        "head_dim 8\n dtype f32\n mask window(left=0)", None, [(1, 113, 113, 2, 1), (1, 113, 7, 4, 4),
                                                              (1, 7, 113, 1, 1)]),
    "f32-d96-bottom-right-softcap-scale": (
        "head_dim 96\n dtype f32\n mask causal(bottom_right)\n softcap 30.0\n scale 0.3",
        None, [(1, 113, 7, 4, 1), (1, 7, 113, 2, 2), (2, 1, 1, 1, 1)]),
    "f16-mla-192-128-f16-accumulators": (
        "head_dim qk=192 v=128\n dtype f16\n accumulate qk=f16 pv=f16\n mask causal(bottom_right)",
        None, [(1, 113, 40, 2, 1), (1, 7, 113, 4, 2)]),
    "f16-d64-huge-window": (  # clamped to 2^30 by the plan: every range sum must stay in i32
        "head_dim 64\n dtype f16\n mask window(left=1073741824, right=1073741824)\n accumulate pv=f16",
        None, [(1, 113, 7, 2, 2), (1, 7, 113, 2, 1)]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_reference(rt, case):
    body, profile, shapes = CASES[case]
    spec = spec_of(body)
    try:
        kernel = rt.compile_kernel(spec, profile)
    except SpecError as e:
        skip_if_adapter_refuses(e, "wgsl")
        raise
    subgroups = kernel.plan.config.subgroups
    if "subgroups-on" in case:
        assert subgroups and "subgroupShuffleXor" in kernel.source
    if "subgroups-off" in case:
        assert not subgroups and "sRed" in kernel.source
    if profile == "webgpu-core" and not DAWN:
        # planned for the browser profile, compiled by naga: no `enable subgroups;`
        assert kernel.plan.profile == "webgpu-core@wgpu" and "enable subgroups;" not in kernel.source
    if profile == "webgpu-core" and DAWN:
        # Dawn's Tint takes the browser profile's dialect as it is
        assert kernel.plan.profile == "webgpu-core" and ("enable subgroups;" in kernel.source) == subgroups
    for i, shape in enumerate(shapes):
        check_against_reference(kernel, spec, shape, seed=i)


def test_subgroup_and_workgroup_reductions_agree(rt):
    on = spec_of(CASES["f32-d64-causal-subgroups-on"][0])
    off = spec_of(CASES["f32-d64-causal-subgroups-off"][0])
    q, k, v = inputs(on, 1, 113, 113, 8, 2, seed=3)
    a = rt.compile_kernel(on)(q, k, v)
    b = rt.compile_kernel(off)(q, k, v)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


def test_rows_that_see_no_key(rt):
    spec = spec_of(CASES["f32-d96-bottom-right-softcap-scale"][0])
    kernel = rt.compile_kernel(spec)
    q, k, v = inputs(spec, 1, 113, 7, 2, 1)
    out, lse = kernel(q, k, v, return_lse=True)
    assert (out[:, :106] == 0).all() and np.isneginf(lse[:, :, :106]).all()
    assert np.isfinite(lse[:, :, 106:]).all() and not np.isnan(out).any()
    out, lse = kernel(q, k[:, :0], v[:, :0], return_lse=True)  # Lk = 0: nothing to see
    assert (out == 0).all() and np.isneginf(lse).all()


@pytest.fixture(scope="module")
def f32_kernel(rt):
    spec = spec_of(CASES["f32-d64-causal-subgroups-on"][0])
    return spec, rt.compile_kernel(spec)


def test_llvmpipe_loop_budget_is_refused_not_wrong(rt):
    """Mesa's llvmpipe silently ends all loops of a shader after 65535 iterations: long rows are
    refused with a LaunchError, never returned wrong (see runtime LLVMPIPE_LOOP_BUDGET)."""
    if rt.device_state().loop_budget is None:
        pytest.skip("not llvmpipe: no loop budget")
    spec = spec_of(CASES["f16-d64-huge-window"][0])  # sees every key, like mask none
    kernel = rt.compile_kernel(spec)
    check_against_reference(kernel, spec, (1, 2, 3000, 1, 1))  # ~190 tiles: within the budget
    q, k, v = inputs(spec, 1, 2, 40000, 1, 1)  # 2500 tiles: beyond it
    with pytest.raises(LaunchError, match="65535 iterations"):
        kernel(q, k, v)
    out = np.zeros((1, 2, 1, 64), np.float16)
    with pytest.raises(LaunchError, match="65535 iterations"):
        kernel(q, k, v, out=out)
    assert (out == 0).all()  # nothing written into out=
    with pytest.raises(LaunchError, match="65535 iterations"):
        kernel(*(rt.WgslTensor.from_numpy(a) for a in (q, k, v)))


def test_adapter_profile(rt):
    prof = rt.adapter_profile()
    st = rt.device_state()
    info = st.info
    if st.subgroup_seen:  # every subgroup size that ran lies in the profile's range
        assert prof.features["subgroup_min_size"] <= min(st.subgroup_seen)
        assert prof.features["subgroup_max_size"] >= max(st.subgroup_seen)
    assert prof.limits["workgroup_storage_bytes"] == rt.device().limits["max-compute-workgroup-storage-size"]
    assert prof.section("dialect")["subgroups_directive"] is DAWN  # Tint requires the directive, naga refuses it
    if info.get("adapter_type") == "CPU":
        assert prof.name.startswith("wgpu-software@")
    if WGPU_FEATURE["subgroups"] in st.features:
        assert st.subgroup_seen and (st.subgroup_problem is None) == prof.has_feature("subgroups")


def test_inputs_and_outputs(rt, f32_kernel):
    spec, kernel = f32_kernel
    q, k, v = inputs(spec, 2, 7, 113, 8, 2)
    ref = kernel(q, k, v)
    # any strides: a transposed view is copied to contiguous memory
    qt = np.ascontiguousarray(q.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    assert not qt.flags.c_contiguous
    np.testing.assert_array_equal(kernel(qt, k, v), ref)
    # out= preallocated
    buf = np.full(ref.shape, np.nan, np.float32)
    assert kernel(q, k, v, out=buf) is buf
    np.testing.assert_array_equal(buf, ref)
    # WgslTensor in and out
    dev = rt.device()
    import wgpu
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC

    def tensor(a):
        return rt.WgslTensor(dev.create_buffer_with_data(data=a.tobytes(), usage=usage), a.shape, "f32")

    o = rt.WgslTensor(dev.create_buffer(size=ref.nbytes, usage=usage), ref.shape, "f32")
    assert kernel(tensor(q), tensor(k), tensor(v), out=o) is o
    np.testing.assert_array_equal(o.numpy(), ref)
    # GPU in, GPU out; mixed inputs read back to numpy
    gq, gk, gv = (rt.WgslTensor.from_numpy(a) for a in (qt, k, v))
    res, lse = kernel(gq, gk, gv, return_lse=True)
    assert isinstance(res, rt.WgslTensor) and isinstance(lse, rt.WgslTensor)
    np.testing.assert_array_equal(res.numpy(), ref)
    assert lse.numpy().shape == (2, 8, 7)
    assert isinstance(kernel(gq, k, v), np.ndarray)
    o2 = rt.WgslTensor.from_numpy(np.zeros(ref.shape, np.float32))  # COPY_DST usage this time
    assert kernel(gq, gk, gv, out=o2) is o2
    np.testing.assert_array_equal(o2.numpy(), ref)
    # empty launches
    assert kernel(q[:, :0], k, v).shape == (2, 0, 8, 64)
    out, lse = kernel(q[:0], k[:0], v[:0], return_lse=True)
    assert out.shape == (0, 7, 8, 64) and lse.shape == (0, 8, 7)


def test_f16_buffers(rt):
    spec = spec_of("head_dim 8\n dtype f16\n target wgsl { subgroups=off }")
    kernel = rt.compile_kernel(spec)
    check_against_reference(kernel, spec, (1, 1, 1, 1, 1))
    check_against_reference(kernel, spec, (1, 3, 5, 3, 1))


@pytest.mark.parametrize("bad, message", [
    (lambda q, k, v: (q[0], k, v), "4 dimensions"),
    (lambda q, k, v: (q[..., :32], k, v), "head_dim"),
    (lambda q, k, v: (q.astype(np.float64), k, v), "dtype float64"),
    (lambda q, k, v: (q, k.astype(np.int32), v), "k has dtype int32"),
    (lambda q, k, v: (q, k.astype(np.float16), v), "k has dtype f16"),
    (lambda q, k, v: (q[:1], k, v), "batch"),
    (lambda q, k, v: (q[:, :, :7], k, v), "not a multiple"),
    (lambda q, k, v: (q, k[:, :5], v), "same leading dimensions"),
    (lambda q, k, v: ([[1.0]], k, v), "numpy array or a WgslTensor, not list"),
    (lambda q, k, v: (object(), k, v), "numpy array or a WgslTensor"),
])
def test_launch_errors(f32_kernel, bad, message):
    spec, kernel = f32_kernel
    q, k, v = inputs(spec, 2, 7, 9, 8, 2)
    with pytest.raises(LaunchError, match=message):
        kernel(*bad(q, k, v))


def test_launch_errors_for_options(f32_kernel):
    spec, kernel = f32_kernel
    q, k, v = inputs(spec, 1, 7, 9, 2, 1)
    with pytest.raises(LaunchError, match="out has shape"):
        kernel(q, k, v, out=np.zeros((1, 7, 2, 32), np.float32))
    with pytest.raises(LaunchError, match="out has shape"):
        kernel(q, k, v, out=np.zeros((1, 7, 2, 64), np.float16))
    with pytest.raises(LaunchError, match="mask custom"):
        kernel(q, k, v, mask=np.ones((7, 9), bool))
    with pytest.raises(LaunchError, match="kv_lens has 2 entries"):
        kernel(q, k, v, kv_lens=np.array([3, 4]))


def test_device_refusals(rt):
    # planned for NVIDIA's subgroups of 32: 16 invocations per row cannot be reduced with the
    # shuffles of a smaller subgroup (lavapipe guarantees 4)
    spec = spec_of("head_dim 64\n dtype f32\n tile q=16\n target wgsl { workgroup=256 subgroups=on }")
    if rt.adapter_profile().features.get("subgroup_min_size", 0) >= 16:
        pytest.skip("this adapter's subgroups hold 16 lanes")
    with pytest.raises(LaunchError, match="guarantees subgroups of only"):
        rt.compile_kernel(spec, "wgpu-vulkan-nvidia")
    with pytest.raises(SpecError):  # the same on the live profile is a spec error
        rt.compile_kernel(spec)


def test_repr_and_manifest(f32_kernel):
    spec, kernel = f32_kernel
    assert kernel.target == "wgsl"
    assert "wgsl kernel 't'" in repr(kernel)
    assert kernel.manifest["entry_point"] == kernel.plan.entry
    assert kernel.source.count("@compute") == 1


def test_pipelines_are_cached_in_process(rt, f32_kernel):
    # a spec built with dataclasses.replace that equals a compiled one reuses its pipeline
    spec, kernel = f32_kernel
    base = spec_of("head_dim 64\n dtype f32")
    same = replace(base, mask=replace(base.mask, kind="causal"), targets={"wgsl": {"subgroups": "on"}})
    again = rt.compile_kernel(same)
    assert again.pipelines is kernel.pipelines and again.source == kernel.source
    check_against_reference(again, same, (1, 7, 7, 1, 1))


def test_compile_errors_carry_the_naga_message(rt, monkeypatch):
    from attngen.errors import CompileError

    def broken(p):
        good = type(rt.BACKEND).render(rt.BACKEND, p)
        return good.replace("fn score_transform(", "fn score_transform((")

    monkeypatch.setattr(rt.BACKEND, "render", broken)
    # an empty pipeline cache: another test of this process may have compiled the same plan (a mask
    # expression planned as causal(bottom_right) has this spec text), and a hit renders nothing
    from attngen.backends.wgsl import kernel as wgsl_kernel
    monkeypatch.setattr(wgsl_kernel, "_PIPELINES", {})
    spec = spec_of("head_dim 16\n dtype f32\n mask causal(bottom_right)")
    with pytest.raises(CompileError, match="kernel 't'") as info:
        rt.compile_kernel(spec)
    assert "score_transform" in str(info.value) or "expected" in str(info.value)


def test_subgroup_range_keeps_a_matched_profile_where_the_adapter_says_only_the_spec_range():
    from attngen.backends.wgsl.devices import subgroup_range
    # wgpu-py reports 4..128 for every adapter: NVIDIA's profile (32..32) stands, the probe saw 32
    assert subgroup_range((4, 128), (32, 32), True, (32,)) == (32, 32)
    assert subgroup_range((4, 128), (32, 32), False, (32,)) == (4, 128)  # no profile matched: the spec's
    assert subgroup_range((8, 64), (32, 32), True, ()) == (8, 64)  # a real report wins
    assert subgroup_range((4, 128), (32, 32), True, (16,)) == (16, 32)  # a smaller size ran: widened
    assert subgroup_range((0, 0), (32, 32), True, ()) is None  # no subgroups: the profile's as it is



def test_device_check_takes_the_adapter_profiles_subgroup_range():
    """wgpu-py reports subgroups of 4..128 for every adapter (pygfx/wgpu-py#699); where a vendor
    profile matched the adapter, its range is what plans assume (NVIDIA: 32), and the device
    check must agree with it (it once refused every NVIDIA plan of 8 invocations per row)."""
    from types import SimpleNamespace

    from attngen.backends.wgsl.kernel import _check_device

    st = SimpleNamespace(info={"device": "GPU"}, features=set(), subgroup_problem=None, subgroup_min=4,
                         device_limit=lambda key: 1 << 30, loop_budget=None)
    plan_ = SimpleNamespace(features=(), spec=SimpleNamespace(name="t"), smem_bytes=0, threads=256,
                            config=SimpleNamespace(subgroups=True, threads_per_row=8, matrix=None),
                            details=SimpleNamespace(runtime_checks="bounds"))
    nvidia = SimpleNamespace(features={"subgroup_min_size": 32})
    _check_device(plan_, st, nvidia)  # 8 invocations per row within NVIDIA's 32-wide subgroups
    with pytest.raises(LaunchError, match="guarantees subgroups of only 4"):
        _check_device(plan_, st, SimpleNamespace(features={"subgroup_min_size": 4}))


# ---- wgpu's own runtime checks (the profile's [dialect] runtime_checks) ---------------------------

def test_runtime_checks_come_from_the_profile_dialect():
    from attngen import backends
    from attngen.api import get_profile
    from attngen.plan.profiles import ProfileError
    spec = spec_of("head_dim 64\n dtype f32\n mask causal")
    assert plan(spec, "wgsl", "webgpu-core").details.runtime_checks == "all"
    assert plan(spec, "wgsl", "wgpu-vulkan-nvidia").details.runtime_checks == "bounds"
    nvidia = get_profile("wgpu-vulkan-nvidia", "wgsl")
    bad = nvidia.narrowed(name="bad", sections={"dialect": {"runtime_checks": "some"}})
    with pytest.raises(ProfileError, match=r"profile bad: \[dialect\] runtime_checks = 'some'; expected one of "
                                           r"'all', 'bounds', 'none'"):
        plan(spec, "wgsl", bad)
    shown = "\n".join(backends.get("wgsl").describe(plan(spec, "wgsl", nvidia)))
    assert "wgpu runtime checks: bounds (index clamps kept, loop bounding off" in shown


@pytest.mark.parametrize("body", [
    "head_dim 40\n dtype f32\n heads q=6 kv=2\n mask causal(bottom_right)\n tile q=16",
    "head_dim 64\n dtype f16\n mask window(left=5, right=2)\n softcap 20.0",
])
def test_runtime_checks_do_not_change_results(rt, body):
    """The same kernel with every check, with the index clamps only and with none: the same bits
    (attngen's kernels guard every index and end every loop themselves)."""
    spec = spec_of(body)
    live = rt.adapter_profile()
    q, k, v = inputs(spec, 2, 113, 7 if "bottom_right" in body else 113, 6 if "kv=2" in body else 1,
                     2 if "kv=2" in body else 1, seed=5)
    outs = {}
    for mode in ("all", "bounds", "none"):
        prof = live.narrowed(name=f"{live.name}-checks-{mode}", sections={"dialect": {"runtime_checks": mode}})
        if mode != "all" and rt.device_state().loop_budget is not None:
            # llvmpipe: refused (its cut of long loops is detected only with wgpu's loop bounding)
            with pytest.raises(LaunchError, match="need wgpu's loop bounding to detect the cut"):
                rt.compile_kernel(spec, prof)
            continue
        kernel = rt.compile_kernel(spec, prof)
        assert kernel.plan.details.runtime_checks == mode
        outs[mode] = kernel(q, k, v, return_lse=True)
    assert relative_error(outs["all"][0], reference(spec, q, k, v)) <= tolerance(spec)
    for mode in set(outs) - {"all"}:
        for a, b in zip(outs["all"], outs[mode]):
            np.testing.assert_array_equal(a, b)


def test_create_module_without_checks_builds_and_reports_like_the_plain_one(rt):
    """adapter.create_module's trusted path (wgpuDeviceCreateShaderModuleTrusted through wgpu-py's
    cffi handles) on the live adapter: a module that runs, and a bad shader raises as
    create_shader_module does (the kernels themselves take it only off llvmpipe)."""
    from attngen.backends.wgsl.devices import create_module, wgpu  # wgpu or wgpudawn, as the runtime
    dev = rt.device_state().device
    code = ("@group(0) @binding(0) var<storage, read_write> x: array<u32>;\n"
            "@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {\n"
            "    for (var i = 0u; i < 3u; i++) { x[g.x] += g.x; }\n}\n")
    for mode in ("all", "bounds", "none"):
        module = create_module(dev, f"probe-{mode}", code, mode)
        pipe = dev.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
        buf = dev.create_buffer(size=4 * 64, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
        group = dev.create_bind_group(layout=pipe.get_bind_group_layout(0),
                                      entries=[{"binding": 0, "resource": {"buffer": buf}}])
        enc = dev.create_command_encoder()
        cp = enc.begin_compute_pass()
        cp.set_pipeline(pipe)
        cp.set_bind_group(0, group)
        cp.dispatch_workgroups(1)
        cp.end()
        dev.queue.submit([enc.finish()])
        np.testing.assert_array_equal(np.frombuffer(dev.queue.read_buffer(buf), np.uint32), 3 * np.arange(64))
        with pytest.raises(wgpu.GPUError, match="expected"):
            create_module(dev, f"broken-{mode}", code.replace("fn main(", "fn main(("), mode)


# ---- the prefetch of the next step's tiles (target wgsl { prefetch=... }) --------------------------

def test_prefetch_follows_the_option_and_the_profile():
    def source(body, profile):
        return emit(body, profile).source
    # auto: the profile's [dialect] prefetch_tiles
    assert "var next_k: array<vec4<elem_t>, K_ITEMS>;" in source("head_dim 64\n dtype f32", "wgpu-vulkan-nvidia")
    assert "next_k" not in source("head_dim 64\n dtype f32", "webgpu-core")
    assert "next_k" not in source("head_dim 64\n dtype f32\n target wgsl { prefetch=off }", "wgpu-vulkan-nvidia")
    src = source("head_dim 64\n dtype f32\n target wgsl { prefetch=on }", "webgpu-core")
    assert "next_k" in src and "the next tiles prefetched into registers" in src
    # chunked head dims: the next Q chunk too; the two_pass schedule fetches no V
    src = source("head_dim 128\n dtype f32\n tile d=32\n target wgsl { prefetch=on }", "wgpu-software")
    assert "var next_q: array<vec4<elem_t>, Q_ITEMS>;" in src and "const Q_ITEMS: u32 =" in src
    src = source("head_dim 64\n dtype f32\n schedule two_pass\n target wgsl { prefetch=on }", "wgpu-software")
    assert "next_k" in src and "next_v" not in src
    # too many registers for a small workgroup: refused, naming the option
    with pytest.raises(SpecError, match=r"prefetch=on would hold 32 vec4 of the next tile"):
        plan(spec_of("head_dim 256\n dtype f32\n tile q=8 kv=32\n target wgsl { workgroup=32 prefetch=on }"),
             "wgsl", "wgpu-software")


@pytest.mark.parametrize("body", [
    "head_dim 64\n dtype f32\n mask causal\n heads q=7 kv=1",                          # whole head dims
    "head_dim 128\n dtype f16\n tile d=32\n mask window(left=9, right=3)",             # chunked, Q re-read
    "head_dim qk=64 v=32\n dtype f32\n tile d=16\n schedule split_kv(3)\n heads q=4 kv=2",
])
def test_prefetch_matches_the_plain_copies(rt, body):
    """prefetch on and off: the same function of the inputs (same tiles, same order of sums)."""
    outs = []
    for mode in ("off", "on"):
        spec = spec_of(body + f"\n target wgsl {{ prefetch={mode} }}")
        kernel = rt.compile_kernel(spec)
        assert kernel.plan.config.prefetch == (mode == "on")
        hq, hkv = (7, 1) if "q=7" in body else ((4, 2) if "q=4" in body else (2, 2))
        q, k, v = inputs(spec, 2, 113, 130, hq, hkv, seed=11)
        outs.append(kernel(q, k, v, return_lse=True))
        assert relative_error(outs[-1][0], reference(spec, q, k, v)) <= tolerance(spec)
    for a, b in zip(*outs):
        np.testing.assert_array_equal(a, b)
