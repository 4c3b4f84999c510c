"""The CUDA backward's dK/dV and dQ steps run on the CPU against attngen.reference_backward (no
GPU needed): the generated f32 source (templates/cuda/backward.cu.j2) is compiled as C++ with g++
behind tests/cuda_emulation.py's shim (one std::thread per CUDA thread, a std::barrier for
__syncthreads; run_blocks), so the index arithmetic, the masks' loop bounds, GQA, kv_lens, packed
sequences, the custom masks' lists and score and mask expressions (issue 42: their tile skipping
and d score / d s) are checked wherever the suite runs. D_i (the preprocess step, a warp
reduction) is computed here in numpy; tests/equivalence/test_backward_cuda.py runs all three steps
on a GPU."""

from __future__ import annotations

import ctypes
import shutil

import numpy as np
import pytest

from attngen.api import lower
from attngen.backends.cuda import backward as bw
from attngen.backends.cuda import backward_launch
from attngen.backends.cuda.args import mask_words
from attngen.reference import reference, reference_backward, relative_error
from attngen.runtime.blockmask import build_arrays

from conftest import spec_of
from cuda_emulation import delta_rows, emulated_args, gxx_library, shim

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ to compile the emulation")

RUN = r'''
extern "C" void run_step(int step, const Args* a, int gx, int gy, int gz, int smem_bytes) {
    run_blocks(gx, gy, gz, kThreads, smem_bytes, [&] {
        float* const sm = reinterpret_cast<float*>(g_smem);
        if (step == 1) dkdv(*a, sm); else dq(*a, sm);
    });
}
'''


def _library(plan, tmp_dir):
    source = bw.render_backward(plan)
    run = RUN
    if plan.spec.inputs:  # the expressions' inputs: the steps' last parameter (an ExprInputs)
        run = (RUN.replace("const Args* a,", "const Args* a, const ExprInputs* in,")
               .replace("sm);", "sm, *in);"))
    if any(i.grad for i in plan.spec.inputs):  # `grad` inputs: the dK/dV step's ExprGrads after them
        run = (run.replace("const ExprInputs* in,", "const ExprInputs* in, const ExprGrads* g,")
               .replace("dkdv(*a, sm, *in);", "dkdv(*a, sm, *in, *g);"))
    if bw.partials(plan):  # step 3: <entry>_bwd_grads, the partial sums added up
        run = run.replace("else dq(", "else if (step == 3) grad_partials_sum(*a, *in, *g); else dq(")
    return gxx_library(shim("f32") + source[: source.index("// The entry points")] + run, tmp_dir)


def _emulate(spec, q, k, v, dout, out, lse, *, kv_lens=None, cu=None, cuk=None, mask=None, inputs=None,
             errors=None, input_grads=None, tmp_dir):
    plan = lower(spec, "cuda", "cuda-sm80")
    cfg = bw.backward_config(plan)
    lib = _library(plan, tmp_dir)
    packed = cu is not None
    grads = [np.full(x.shape, np.nan, np.float32) for x in (q, k, v)]
    a, ptr, (b, lq, lk, hq, hkv) = emulated_args((q, k, v, out, dout, *grads), lse, delta_rows(dout, out, packed),
                                                 packed=packed, kv_lens=kv_lens, cu=cu, cuk=cuk)
    if mask is not None:
        kind, data, counts, tiles, _, _ = build_arrays(np, mask, plan.tile_q, plan.tile_kv)
        data = mask_words(np, data) if kind == "bool" else data.astype(np.float32)
        bm_b, bm_h, mlq, _ = data.shape[:3] + (None,)
        row, nq, nk = data.shape[-1], counts.shape[-1], tiles.shape[-1]
        setattr(a, "mask_bits" if kind == "bool" else "mask_add", ptr(np.ascontiguousarray(data)))
        a.mask_counts = ptr(np.ascontiguousarray(counts, np.int32))
        a.mask_tiles = ptr(np.ascontiguousarray(tiles, np.int32))
        a.mask_sb, a.mask_sh, a.mask_sl = bm_h * mlq * row if bm_b > 1 else 0, mlq * row if bm_h > 1 else 0, row
        a.list_sb, a.list_sh, a.n_kvtiles = bm_h * nq if bm_b > 1 else 0, nq if bm_h > 1 else 0, nk
    t = cfg.tile
    extra = ()
    if spec.inputs:  # backward_launch._expr_inputs, with host addresses (`errors`: 8 int32 words, the report)
        from types import SimpleNamespace
        ptrs = {f"input_{i.name}": ptr(np.ascontiguousarray(inputs[i.name])) for i in spec.inputs}
        launch = SimpleNamespace(batch=b, heads_q=hq, heads_kv=hkv, len_q=lq, capacity=k.shape[1])
        extra = (ctypes.byref(backward_launch._expr_inputs(spec, ptrs, launch, ptr(errors), 0)),)
    n_x = -(-(lk if packed else k.shape[1]) // t)
    if input_grads is not None:  # {name: zeroed f32 array of the input's shape}, filled by the dK/dV step
        from attngen.backends.cuda import expr_grads
        parts = {n: np.zeros(w, np.float32) for n, w in expr_grads.partial_words(
            spec, {n: x.shape for n, x in input_grads.items()}, n_x * hkv * b, t, hq // hkv).items()}
        g = type("ExprGrads", (ctypes.Structure,), {"_fields_": [(n, ctypes.c_void_p)
                                                                  for n in expr_grads.fields(spec, atomic=False)]})()
        for n, x in {**input_grads, **parts}.items():
            setattr(g, n, ptr(x))
        a._keep.append(g)
        extra += (ctypes.byref(g),)
    lib.run_step(1, ctypes.byref(a), *extra, n_x, hkv, b, cfg.smem_bytes)
    lib.run_step(2, ctypes.byref(a), *extra, -(-lq // t), hq, b, cfg.smem_bytes)
    if bw.partials(plan):  # a grid of 3 blocks: the threads' stride over the entries is exercised
        lib.run_step(3, ctypes.byref(a), *extra, 3, 1, 1, 0)
    return grads


def _check(body, shapes, tmp_path, seed=0, poison=False, **kw):
    spec = spec_of(body)
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    if poison:  # keys past kv_lens hold inf / NaN
        for bi, n in enumerate(kw["kv_lens"]):
            k[bi, n:], v[bi, n:] = np.inf, np.nan
    ref_kw = {n: x for n, x in (("kv_lens", kw.get("kv_lens")), ("cu_seqlens_q", kw.get("cu")),
                                ("cu_seqlens_k", kw.get("cuk")), ("mask", kw.get("mask"))) if x is not None}
    ref_kw.update(kw.get("inputs") or {})
    out, lse = reference(spec, q, k, v, return_lse=True, **ref_kw)
    out, lse = out.astype(np.float32), np.ascontiguousarray(lse, np.float32)
    dout = rng.standard_normal(out.shape).astype(np.float32)
    if kw.get("cu") is not None and kw.get("cuk") is None:
        kw["cuk"] = kw["cu"]
    got = _emulate(spec, q, k, v, dout, out, lse, tmp_dir=str(tmp_path), **kw)
    want = reference_backward(spec, q, k, v, dout, **ref_kw)
    for g, w, name in zip(got, want, ("dq", "dk", "dv")):
        assert np.isfinite(g).all(), f"{name}: not finite (or not written)"
        assert relative_error(g, w) <= 2e-5, f"{name}: {relative_error(g, w):.3g}"
    for name, g in (kw.get("input_grads") or {}).items():  # `grad` inputs: the fourth value
        assert relative_error(g, want[3][name]) <= 2e-5, f"{name}: {relative_error(g, want[3][name]):.3g}"
    return got


def test_structured_masks_gqa_softcap_and_unequal_dims(tmp_path):
    _check("head_dim 32\n dtype f32\n mask causal", [(1, 113, 6, 32), (1, 113, 2, 32), (1, 113, 2, 32)], tmp_path)
    _check("head_dim 16\n dtype f32\n mask window(left=5, right=2)\n softcap 30\n scale 0.3",
           [(1, 70, 4, 16), (1, 50, 1, 16), (1, 50, 1, 16)], tmp_path)
    dq, _, _ = _check("head_dim qk=24 v=8\n dtype f32\n mask causal(bottom_right)",
                      [(2, 17, 3, 24), (2, 5, 3, 24), (2, 5, 3, 8)], tmp_path)
    assert not dq[:, :12].any()  # rows that see no key


def test_kv_lens_with_inf_and_nan_past_them(tmp_path):
    lens = [0, 37, 100, 1]
    _, dk, dv = _check("head_dim 16\n dtype f32\n mask window(left=20)", [(4, 7, 6, 16), (4, 100, 2, 16),
                                                                            (4, 100, 2, 16)], tmp_path,
                       kv_lens=lens, poison=True)
    for bi, n in enumerate(lens):
        assert not dk[bi, n:].any() and not dv[bi, n:].any()


def test_packed_sequences(tmp_path):
    cuq = np.concatenate([[0], np.cumsum([1, 7, 113, 0, 30])]).astype(np.int32)
    cuk = np.concatenate([[0], np.cumsum([1, 20, 113, 3, 0])]).astype(np.int32)
    _check("head_dim 16\n dtype f32\n mask causal(bottom_right)", [(cuq[-1], 6, 16), (cuk[-1], 2, 16),
                                                                  (cuk[-1], 2, 16)], tmp_path, cu=cuq, cuk=cuk)


def test_custom_masks(tmp_path):
    rng = np.random.default_rng(1)
    same = (np.arange(113)[:, None] * 3 // 113) == (np.arange(150)[None, :] * 3 // 150)
    add = np.where(same & (rng.random((2, 1, 113, 150)) < 0.7), rng.standard_normal((2, 1, 113, 150)), -np.inf)
    add[:, :, 3] = -np.inf
    _check("head_dim 16\n dtype f32\n mask custom", [(2, 113, 4, 16), (2, 150, 2, 16), (2, 150, 2, 16)], tmp_path,
           mask=add.astype(np.float32))
    _check("head_dim 16\n dtype f32\n tile q=16 kv=16\n mask custom", [(2, 50, 4, 16), (2, 70, 2, 16),
                                                                       (2, 70, 2, 16)], tmp_path,
           mask=rng.random((1, 4, 50, 70)) < 0.3)
    cu = np.concatenate([[0], np.cumsum([5, 0, 40, 17])]).astype(np.int32)
    _check("head_dim 16\n dtype f32\n mask custom", [(62, 4, 16), (62, 2, 16), (62, 2, 16)], tmp_path, cu=cu,
           mask=rng.random((4, 1, 40, 40)) < 0.5)


# Score and mask expressions (issue 42): (mask, score), each with GQA 3, odd lengths and Lq != Lk.
EXPRESSIONS = [
    ("k <= q", "s - 0.25 * abs(q - k)"),                                   # ALiBi with a constant slope
    (None, "5 * tanh(s / 4.5)"),
    ("abs(q // 8 - k // 8) <= 1 && abs(q % 8 - k % 8) <= 1", "where(k % 2 == 0, s, sigmoid(s) * 3 + 0.1 * h)"),
    ("k < q && q - k < 20", None),                                         # row 0 sees no key
]


@pytest.mark.parametrize("mask,score", EXPRESSIONS)
def test_score_and_mask_expressions(mask, score, tmp_path):
    body = "head_dim 16\n dtype f32\n" + (f" mask {mask}\n" if mask else "") + (f" score {score}\n" if score else "")
    dq, _, _ = _check(body, [(2, 37, 6, 16), (2, 50, 2, 16), (2, 50, 2, 16)], tmp_path)
    if mask == "k < q && q - k < 20":
        assert not dq[:, 0].any()  # a row that sees no key
    # kv_lens with inf / NaN past them (and a sequence of no key), and packed sequences
    lens = [0, 23]
    _, dk, dv = _check(body, [(2, 7, 3, 16), (2, 40, 1, 16), (2, 40, 1, 16)], tmp_path, kv_lens=lens, poison=True)
    for bi, n in enumerate(lens):
        assert not dk[bi, n:].any() and not dv[bi, n:].any()
    cuq = np.concatenate([[0], np.cumsum([1, 0, 30])]).astype(np.int32)
    cuk = np.concatenate([[0], np.cumsum([3, 2, 41])]).astype(np.int32)
    _check(body, [(cuq[-1], 6, 16), (cuk[-1], 2, 16), (cuk[-1], 2, 16)], tmp_path, cu=cuq, cuk=cuk)


def test_expression_tiles_skipped(tmp_path):
    """Tiles of 64 (head dim 16): the band's query and key ranges, and a hole inside them."""
    for mask in ("k <= q && q - k < 20", "abs(q // 64 - k // 64) != 1"):
        _check(f"head_dim 16\n dtype f32\n mask {mask}\n", [(1, 200, 2, 16), (1, 230, 1, 16), (1, 230, 1, 16)],
               tmp_path)


# Expressions that read inputs (issue 42): ExprInputs as the steps' last parameter, the loaders on the host.
INPUTS = [
    ("input slopes[h] f32\n score s - slopes[h] * abs(q - k)\n mask causal",
     lambda rng, b, lq, lk, hq: {"slopes": rng.random(hq).astype(np.float32)}),
    ("input table[h, 41] f16\n score s + table[h, clamp(k - q, -20, 20) + 20]",
     lambda rng, b, lq, lk, hq: {"table": rng.standard_normal((hq, 41)).astype(np.float16)}),
    ("input slopes[h] f32\n input bias[b, h, q, k] f16\n score s * slopes[h] + bias[b, h, q, k]\n mask k < q",
     lambda rng, b, lq, lk, hq: {"slopes": (rng.random(hq) + 0.5).astype(np.float32),
                                 "bias": rng.standard_normal((b, hq, lq, lk)).astype(np.float16)}),
    # masks over inputs tested per element (the kernel of the spec itself; compile() runs the builder
    # + mask custom where the score reads none)
    ("input prefix[b] i32\n input slopes[h] f32\n score s - slopes[h] * abs(q - k)\n mask k <= q || k < prefix[b]",
     lambda rng, b, lq, lk, hq: {"prefix": rng.integers(0, lk, b).astype(np.int32),
                                 "slopes": rng.random(hq).astype(np.float32)}),
    ("input doc[b, q] i32\n mask k <= q && doc[b, q] == doc[b, k]",
     lambda rng, b, lq, lk, hq: {"doc": np.sort(rng.integers(0, 4, (b, lq)), axis=1).astype(np.int32)}),
]


@pytest.mark.parametrize("case", range(len(INPUTS)))
def test_expressions_that_read_inputs(case, tmp_path):
    """GQA 3, Lq != Lk both ways (Lq = Lk for document ids), kv_lens with inf / NaN past them; no
    read out of bounds reported."""
    lines, make = INPUTS[case]
    body = f"head_dim 16\n dtype f32\n {lines}\n"
    rng = np.random.default_rng(case)
    shapes = ((2, 37, 50, None), (2, 50, 7, None), (2, 7, 40, [0, 23]))
    if "doc" in lines:  # doc[b, q] is read at k too: Lq = Lk
        shapes = ((2, 37, 37, None), (2, 40, 40, [0, 23]))
    for b, lq, lk, lens in shapes:
        errors = np.zeros(8, np.int32)
        got = _check(body, [(b, lq, 6, 16), (b, lk, 2, 16), (b, lk, 2, 16)], tmp_path, seed=lq,
                     inputs=make(rng, b, lq, lk, 6), errors=errors, poison=lens is not None,
                     **({"kv_lens": lens} if lens else {}))
        assert not errors.any()
        if "k < q" in lines:
            assert not got[0][:, 0].any()  # row 0 sees no key


def test_a_read_out_of_bounds_is_reported(tmp_path):
    """t[q - k] at a visible pair with q < k: word kErrExprRead gets site0 + the read's site (1)."""
    spec = spec_of("head_dim 16\n dtype f32\n input t[q] f32\n score s + t[q - k]")
    q = np.ones((1, 3, 1, 16), np.float32)
    errors = np.zeros(8, np.int32)
    _emulate(spec, q, q, q, q, q, np.zeros((1, 1, 3), np.float32), inputs={"t": np.ones(3, np.float32)},
             errors=errors, tmp_dir=str(tmp_path))
    assert errors.tolist() == [0, 0, 0, 0, 1, 0, 0, 0]


def test_grad_inputs_read_once_per_pair(tmp_path):
    """`grad` inputs in the deterministic family (issue 42): a full bias read once per pair,
    bias[b, h, q, k] and bias[b, hkv, q, k] (the GQA group's heads added by one thread in turn),
    added into by the dK/dV step without atomics; GQA 3, Lq != Lk both ways, a row that sees no key
    and kv_lens with inf / NaN past them (their entries stay 0)."""
    for heads, hb in (("h", 6), ("hkv", 2)):
        body = (f"head_dim 16\n dtype f32\n input bias[b, {heads}, q, k] f32 grad\n"
                f" score s + bias[b, {heads}, q, k]\n mask k < q + Lk - Lq\n")
        for b, lq, lk, lens in ((2, 37, 50, None), (2, 50, 7, [7, 3])):
            rng = np.random.default_rng(lq)
            bias = rng.standard_normal((b, hb, lq, lk)).astype(np.float32)
            grads = {"bias": np.zeros(bias.shape, np.float32)}
            _check(body, [(b, lq, 6, 16), (b, lk, 2, 16), (b, lk, 2, 16)], tmp_path, seed=lq,
                   inputs={"bias": bias}, errors=np.zeros(8, np.int32), input_grads=grads,
                   poison=lens is not None, **({"kv_lens": lens} if lens else {}))
            assert grads["bias"].any()
            if lens:
                assert not grads["bias"][1, :, :, 3:].any()


GRAD_TABLES = [
    # (spec body, input shapes, B, Lq, Lk, Hq, Hkv, kv_lens)
    ("input t[h, 63] f32 grad\n score s + t[h, clamp(k - q, -31, 31) + 31]", {"t": ("h", 63)}, 2, 113, 7, 6, 2,
     None),
    ("input t[h, 63] f32 grad\n score s + t[h, clamp(k - q, -31, 31) + 31]\n mask k < q", {"t": ("h", 63)},
     1, 7, 113, 3, 3, None),
    ("input slopes[h] f32 grad\n score s - slopes[h] * abs(q - k)\n mask causal", {"slopes": ("h",)},
     2, 13, 29, 6, 2, [29, 5]),
    ("input t[h, 32] f32 grad\n score s + t[h, where(k > q, 16, 0) + where(abs(k - q) < 8, abs(k - q), "
     "min(8 + floor(log(abs(k - q) / 8) / log(16) * 8), 15))]", {"t": ("h", 32)}, 1, 41, 37, 3, 1, None),
    ("input bias[h, q, k] f32 grad\n score s + bias[h, q, k]", {"bias": ("h", "q", "k")}, 2, 9, 11, 3, 1, [11, 4]),
    ("input slopes[h] f32 grad\n input bias[b, hkv, q, k] f32 grad\n input t[h, 63] f32 grad\n"
     " score s - slopes[h] * abs(q - k) + bias[b, hkv, q, k] + t[h, clamp(k - q, -31, 31) + 31]",
     {"slopes": ("h",), "bias": ("b", "hkv", "q", "k"), "t": ("h", 63)}, 2, 1, 19, 6, 2, [19, 12]),
]


@pytest.mark.parametrize("case", GRAD_TABLES, ids=["table-113x7-g3", "table-7x113-causal", "alibi-slopes-kvlens",
                                                    "t5-log", "bias-without-b", "mixed-hkv-1x19"])
def test_grad_inputs_summed_through_partials(case, tmp_path):
    """`grad` inputs that many pairs read, in the deterministic family (issue 42): a clamped relative
    table of 63 entries, ALiBi's learnable slopes with kv_lens, a T5 bucketed table with log, a bias
    without b, a read at hkv beside the others; GQA 3, Lq != Lk both ways, a row that sees no key,
    through the partial sums and grad_partials_sum, against attngen.reference_backward; a second run
    gives the same bits."""
    body, shapes, b, lq, lk, hq, hkv, lens = case
    ext = {"b": b, "h": hq, "hkv": hkv, "q": lq, "k": lk}
    rng = np.random.default_rng(lq * 7 + lk)
    inputs = {n: (0.3 * rng.standard_normal([ext.get(a, a) for a in s])).astype(np.float32) for n, s in shapes.items()}
    runs = []
    for _ in range(2):
        grads = {n: np.zeros(x.shape, np.float32) for n, x in inputs.items()}
        _check(f"head_dim 16\n dtype f32\n {body}\n", [(b, lq, hq, 16), (b, lk, hkv, 16), (b, lk, hkv, 16)], tmp_path,
               seed=lq, inputs=inputs, errors=np.zeros(8, np.int32), input_grads=grads,
               **({"kv_lens": lens} if lens else {}))
        assert all(g.any() for g in grads.values())
        runs.append(grads)
    assert all(np.array_equal(runs[0][n], runs[1][n]) for n in inputs)
