"""The CUDA backward of score and mask expressions over indices (issue 42; docs/backward.md) against
attngen.reference_backward, in both families: the fast one (Hopper's wgmma, taken by default on
cuda-sm90 for f16/bf16 and head dims 64 / 128) and the deterministic one (`target cuda {
backward=deterministic }`, CUDA cores). ALiBi with a constant slope under `mask k <= q`, a tanh cap
that is not a softcap, a gated score with sigmoid, a 2D neighbourhood, a causal band, a mask with
holes (query steps and key tiles it hides between visible ones); f16 and bf16, lengths 1, 7, 257,
300 with Lq != Lk, GQA groups of 3, kv_lens with inf / NaN past them, packed sequences, rows that
see no key, a hidden key holding NaN; expressions that read inputs (ALiBi's slopes[h], a relative
table, a derivative that reads inputs, masks over inputs by the builder: document ids, prefix-LM
with kv_lens; a mask and a score that both read inputs, per element) and a read out of bounds. Needs a GPU (the fast family a Hopper one: those cases skip
elsewhere); tests/backends/cuda/test_backward_expr_source.py compiles the sources anywhere and
tests/backends/cuda/test_backward_emulated.py runs the deterministic one on the CPU."""

from __future__ import annotations

import numpy as np
import pytest

import attngen
from attngen.reference import relative_error, tolerance

from conftest import spec_of, to_device
from backward_helpers import check_backward, check_kv_lens_hidden_keys, check_nan_keys, check_packed, \
    family_kernel, ints, qkv, rand, to_np

ALIBI = ("k <= q", "s - 0.25 * abs(q - k)")
EXPRESSIONS = {
    "alibi": ALIBI,
    "tanh": (None, "5 * tanh(s / 4.5)"),
    "gated": (None, "where(k % 2 == 0, s, sigmoid(s) * 3 + 0.1 * h)"),
    "2d neighbourhood": ("abs(q // 8 - k // 8) <= 1 && abs(q % 8 - k % 8) <= 1", None),
    "band": ("k <= q && q - k < 64", None),
    "holes": ("abs(q // 128 - k // 128) != 1", None),  # key blocks of 128 see rows 0-127 and 256-
}
FAMILIES = ("fast", "deterministic")


def _spec(name, family, dtype="f16", head_dim=128):
    mask, score = EXPRESSIONS[name]
    body = (f"head_dim {head_dim}\ndtype {dtype}\n" + (f"mask {mask}\n" if mask else "")
            + (f"score {score}\n" if score else ""))
    return spec_of(body + ("target cuda { backward=deterministic }\n" if family == "deterministic" else ""))


def _kernel(spec, family):
    return family_kernel(spec, "wgmma" if family == "fast" else "fma")


# (name, family, dtype): the fast family for every expression, the deterministic one for three
CASES = [(name, "fast", "f16" if i % 2 == 0 else "bf16") for i, name in enumerate(EXPRESSIONS)] + [
    ("alibi", "deterministic", "bf16"), ("gated", "deterministic", "f16"), ("2d neighbourhood", "deterministic", "bf16")]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}")
def test_matches_reference(case):
    name, family, dtype = case
    spec = _spec(name, family, dtype)
    _kernel(spec, family)
    rng = np.random.default_rng(len(name))
    for b, lq, lk in ((1, 257, 300), (2, 300, 257), (2, 7, 7), (1, 1, 300)):
        check_backward(spec, *qkv(spec, rng, b, lq, lk))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", ["alibi", "tanh"])
def test_kv_lens_with_inf_and_nan_past_them(name, family):
    spec = _spec(name, family, head_dim=64)
    _kernel(spec, family)
    check_kv_lens_hidden_keys(spec, *qkv(spec, np.random.default_rng(6), 4, 70, 300), [0, 137, 300, 1])


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", ["alibi", "2d neighbourhood"])
def test_packed_sequences(name, family):
    spec = _spec(name, family, "bf16", head_dim=64)
    _kernel(spec, family)
    check_packed(spec, [1, 70, 300, 0, 130], [1, 200, 300, 3, 0], np.random.default_rng(5))


@pytest.mark.parametrize("family", FAMILIES)
def test_rows_that_see_no_key_and_a_hidden_key_holding_nan(family):
    """`k < q && q - k < 64`: row 0 sees no key (zero gradient). Key 200 holds NaN in k: the rows
    that do not see it (before 201, and from 264) get the reference's dq; the others NaN."""
    mask = "k < q && q - k < 64"
    spec = spec_of(f"head_dim 64\ndtype f16\nmask {mask}\n"
                   + ("target cuda { backward=deterministic }\n" if family == "deterministic" else ""))
    kernel = _kernel(spec, family)
    rng = np.random.default_rng(9)
    q, k, v = qkv(spec, rng, 1, 300, 300)
    (dq, _, _), _ = check_backward(spec, q, k, v)
    assert not dq[:, 0].any()
    k[0, 200] = np.nan
    check_nan_keys(spec, kernel, q, k, v, rng, seen=slice(201, 264), unseen=np.r_[0:201, 264:300])


# ---- expressions that read inputs: the score's as the forward takes them, the mask's by the builder ------

INPUT_SPECS = {
    # name: (spec lines, inputs (rng, b, lq, lk, hq) -> {name: numpy array})
    "alibi slopes": ("input slopes[h] f32\nscore s - slopes[h] * abs(q - k)\nmask causal",
                     lambda rng, b, lq, lk, hq: {"slopes": rng.random(hq).astype(np.float32)}),
    "relative table": ("input table[h, 41] f16\nscore s + table[h, clamp(k - q, -20, 20) + 20]",
                       lambda rng, b, lq, lk, hq: {"table": rng.standard_normal((hq, 41)).astype(np.float16)}),
    "derivative reads": ("input slopes[h] f32\ninput bias[b, h, q, k] f16\nscore s * slopes[h] + bias[b, h, q, k]\n"
                         "mask k < q",  # row 0 sees no key
                         lambda rng, b, lq, lk, hq: {"slopes": (rng.random(hq) + 0.5).astype(np.float32),
                                                     "bias": rng.standard_normal((b, hq, lq, lk)).astype(np.float16)}),
    "documents": ("input doc[b, q] i32\nmask k <= q && doc[b, q] == doc[b, k]",
                  lambda rng, b, lq, lk, hq: {"doc": np.sort(rng.integers(0, 4, (b, lq)), axis=1).astype(np.int32)}),
    "prefix-lm": ("input prefix[b] i32\nmask k <= q || k < prefix[b]",
                  lambda rng, b, lq, lk, hq: {"prefix": rng.integers(0, lk, b).astype(np.int32)}),
    # both read inputs: the kernel tests the mask per element (no builder), as its forward does
    "documents and alibi": ("input doc[b, q] i32\ninput slopes[h] f32\nscore s - slopes[h] * abs(q - k)\n"
                            "mask k <= q && doc[b, q] == doc[b, k]",
                            lambda rng, b, lq, lk, hq: {
                                "doc": np.sort(rng.integers(0, 4, (b, lq)), axis=1).astype(np.int32),
                                "slopes": rng.random(hq).astype(np.float32)}),
}


def _input_spec(name, family, dtype="f16", head_dim=64):
    extra = "target cuda { backward=deterministic }\n" if family == "deterministic" else ""
    return spec_of(f"head_dim {head_dim}\ndtype {dtype}\n{INPUT_SPECS[name][0]}\n{extra}")


def _device_inputs(spec, arrays: dict) -> dict:
    """A score's inputs on the GPU (the CudaKernel reads them there); a mask's alone as numpy arrays
    (the builder's cache digests them)."""
    import cupy
    from attngen.lang.expr import inputs_read
    from attngen.plan.mask_inputs import reads_inputs
    by_builder = reads_inputs(spec) and not (spec.score is not None and inputs_read(spec.score))
    return arrays if by_builder else {n: cupy.asarray(a) for n, a in arrays.items()}


INPUT_CASES = [(name, family) for name in INPUT_SPECS for family in FAMILIES]


@pytest.mark.parametrize("case", INPUT_CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def test_inputs_match_reference(case):
    """Odd lengths, Lq != Lk, GQA groups of 3 (6 query heads, 2 KV heads), f16 and bf16."""
    name, family = case
    shapes = ((1, 257, 300), (2, 7, 113), (2, 113, 7))
    if "doc" in INPUT_SPECS[name][0]:  # doc[b, q] is read at k too: Lq = Lk
        shapes = ((1, 257, 257), (2, 7, 7), (2, 113, 113))
    for i, (b, lq, lk) in enumerate(shapes):
        spec = _input_spec(name, family, "f16" if i % 2 == 0 else "bf16")
        _kernel(spec, family)
        rng = np.random.default_rng(lq + lk)
        arrays = INPUT_SPECS[name][1](rng, b, lq, lk, 6)
        (dq, _, _), _ = check_backward(spec, *qkv(spec, rng, b, lq, lk), call=_device_inputs(spec, arrays),
                                       ref_kw=arrays)
        if "k < q" in INPUT_SPECS[name][0]:
            assert not dq[:, 0].any()


@pytest.mark.parametrize("family", FAMILIES)
def test_a_mask_over_inputs_with_kv_lens_reuses_the_forwards_block_mask(family):
    spec = _input_spec("prefix-lm", family)
    kernel = _kernel(spec, family)
    lens = np.array([300, 1, 137], np.int32)
    prefix = {"prefix": np.array([3, 0, 200], np.int32)}
    q, k, v = qkv(spec, np.random.default_rng(11), 3, 70, 300)
    for bi, n in enumerate(lens):
        k[bi, n:], v[bi, n:] = np.inf, np.nan
    built = kernel.mask_builds
    (_, dk, dv), _ = check_backward(spec, q, k, v, call={"kv_lens": lens, **prefix},
                                    ref_kw={"kv_lens": lens, **prefix})
    assert kernel.mask_builds == built + 1  # the forward's build; the backward reuses its BlockMask
    for bi, n in enumerate(lens):
        assert not dk[bi, n:].any() and not dv[bi, n:].any()


def test_a_read_out_of_bounds_in_the_backward_is_raised():
    """The backward evaluates the score at the visible pairs, as the forward: a read out of an
    input's bounds there is reported in the errors word, and raised by the next attngen call."""
    from attngen.backends.cuda.launch import pending
    from attngen.errors import LaunchError
    spec = spec_of("head_dim 64\ndtype f16\ninput t[q] f32\nscore s + t[q - k]\n"
                   "target cuda { backward=deterministic }")
    kernel = _kernel(spec, "deterministic")
    import cupy
    q = cupy.ones((1, 3, 1, 64), cupy.float16)
    out, lse = cupy.zeros((1, 3, 1, 64), cupy.float16), cupy.zeros((1, 1, 3), cupy.float32)
    t = cupy.ones(3, cupy.float32)
    kernel.backward(q, q, q, out, lse, out, t=t)  # (no forward ran: the backward's reads alone)
    cupy.cuda.runtime.deviceSynchronize()
    assert pending()
    with pytest.raises(LaunchError, match=r"the score expression read input 't' out of its bounds in t\[q - k\]"):
        kernel.backward(q, q, q, out, lse, out, t=t)


# ---- `grad` inputs (the fast family): the fourth value, against reference_backward's -------------------

GRAD_CASES = [
    # (id, spec lines, inputs (rng, b, lq, lk, hq))
    ("relative table", "input table[h, 41] f32 grad\nscore s + table[h, clamp(k - q, -20, 20) + 20]\nmask causal",
     lambda rng, b, lq, lk, hq: {"table": rng.standard_normal((hq, 41)).astype(np.float32)}),
    ("slopes and a full bias", "input slopes[h] f32 grad\ninput bias[b, h, q, k] f16 grad\n"
     "score s * slopes[h] + bias[b, h, q, k]\nmask k < q",  # row 0 sees no key: its bias gets 0
     lambda rng, b, lq, lk, hq: {"slopes": (rng.random(hq) + 0.5).astype(np.float32),
                                 "bias": rng.standard_normal((b, hq, lq, lk)).astype(np.float16)}),
]


# the deterministic family, no atomics: reads once per pair added directly (plan.backward.injective),
# the others through partial sums per dK/dV block (expr_grads.py)
GRAD_CASES_DETERMINISTIC = [
    ("full bias, deterministic", "input bias[b, hkv, q, k] f16 grad\nscore s + bias[b, hkv, q, k]\nmask k < q\n"
     "target cuda { backward=deterministic }",
     lambda rng, b, lq, lk, hq: {"bias": rng.standard_normal((b, 2, lq, lk)).astype(np.float16)}),
    ("table and slopes, deterministic", "input table[h, 41] f32 grad\ninput slopes[h] f32 grad\n"
     "score s * slopes[h] + table[h, clamp(k - q, -20, 20) + 20]\nmask causal\ntarget cuda { backward=deterministic }",
     lambda rng, b, lq, lk, hq: {"table": rng.standard_normal((hq, 41)).astype(np.float32),
                                 "slopes": (rng.random(hq) + 0.5).astype(np.float32)}),
    ("bias without b, deterministic", "input bias[h, q, k] f32 grad\nscore s + bias[h, q, k]\n"
     "target cuda { backward=deterministic }",
     lambda rng, b, lq, lk, hq: {"bias": rng.standard_normal((hq, lq, lk)).astype(np.float32)}),
]


def _with_grad_inputs(spec, kernel, rng, arrays, b, lq, lk, lens):
    """Random q, k, v, dout (6 query heads, 2 KV heads) drawn from `rng`, the forward and
    kernel.backward with the inputs `arrays` (on the GPU) and kv_lens `lens` (None: none), and
    reference_backward's: (the kernel's 4 values, the reference's, a function that runs the
    backward again on the same arguments)."""
    import cupy
    q, k, v = qkv(spec, rng, b, lq, lk)
    dout = rand(rng, b, lq, 6, spec.head_dim_v)
    extra = {} if lens is None else {"kv_lens": np.asarray(lens, np.int32)}
    call = {**{n: cupy.asarray(a) for n, a in arrays.items()}, **({"kv_lens": ints(lens)} if lens else {})}
    qd, kd, vd, dout_d = to_device("cuda", spec.dtype, q, k, v, dout)
    out, lse = kernel(qd, kd, vd, return_lse=True, **call)
    got = kernel.backward(qd, kd, vd, out, lse, dout_d, **call)
    ref = attngen.reference_backward(spec, q, k, v, dout, **arrays, **extra)
    return got, ref, lambda: kernel.backward(qd, kd, vd, out, lse, dout_d, **call)


@pytest.mark.parametrize("case", GRAD_CASES + GRAD_CASES_DETERMINISTIC, ids=lambda c: c[0])
def test_grad_inputs(case):
    """Odd lengths, Lq != Lk, GQA 3, kv_lens (keys past them read no entry): dq, dk, dv as the
    reference's, and each grad input's f32 gradient (the fast family's atomicAdd: in no fixed
    order; the deterministic family's once-per-pair reads: the group's heads in a fixed order)
    within twice the forward's tolerance of the reference's."""
    name, lines, make = case
    for i, (b, lq, lk, lens) in enumerate(((1, 257, 300, None), (2, 113, 7, None), (3, 70, 130, [130, 1, 77]))):
        spec = spec_of(f"head_dim 64\ndtype {'f16' if i % 2 == 0 else 'bf16'}\n{lines}\n")
        kernel = _kernel(spec, "deterministic" if "deterministic" in lines else "fast")
        rng = np.random.default_rng(lq + lk)
        arrays = make(rng, b, lq, lk, 6)
        got, ref, again = _with_grad_inputs(spec, kernel, rng, arrays, b, lq, lk, lens)
        assert len(got) == 4 and set(got[3]) == set(ref[3])
        bound = 2 * tolerance(spec)
        for what, g, r in zip(("dq", "dk", "dv"), got[:3], ref[:3]):
            err = relative_error(to_np(g), r)
            assert err <= bound, f"{what}: {err:.3g}"
        for n, g in got[3].items():  # (q's framework: torch for bf16)
            assert str(g.dtype).endswith("float32") and tuple(g.shape) == arrays[n].shape
            err = relative_error(to_np(g), ref[3][n])
            assert err <= bound, f"{n}: {err:.3g}"
        if "k < q" in lines:
            assert not to_np(got[0])[:, 0].any() and not to_np(got[3]["bias"])[:, :, 0].any()
        if "deterministic" in lines:  # the same bits on a second run
            second = again()
            assert all(np.array_equal(to_np(second[3][n]), to_np(g)) for n, g in got[3].items())


@pytest.mark.parametrize("head_dim, lines", [
    (128, "input table[h, 2047] f32 grad\nscore s + table[h, clamp(k - q, -1023, 1023) + 1023]\nmask causal"),
    (64, "input slopes[h] f32 grad\ninput t[h, 33] f32 grad\nscore s * slopes[h] + t[h, clamp(16 - (k - q), 0, 32)]"),
    (128, "input table[h, 201] f32 grad\nscore s + table[h, clamp(k - q, -100, 100) + 100]"),
], ids=("relative table d128", "slopes and a decreasing table d64", "a table clamped on both sides d128"))
def test_grad_reads_summed_per_step(head_dim, lines):
    """Reads that a step's pairs share (expr_grads.staged_reads: a table at a function of k - q,
    either direction, a per-head slope) are summed per warpgroup step in shared memory and flushed
    once per entry; steps whose pairs all read one entry (a slope; a distance clamped past its
    bound: the last two cases) sum in registers and add once per warp: both lengths odd (Lq < Lk
    and Lq > Lk), GQA 3, kv_lens; each gradient within twice the forward's tolerance of the
    reference's."""
    from attngen.backends.cuda import expr_grads
    spec = spec_of(f"head_dim {head_dim}\ndtype f16\n{lines}\n")
    kernel = _kernel(spec, "fast")  # (skips without a GPU)
    assert [d for *_, d in expr_grads.staged_reads(spec)] == ([1] if head_dim == 128 else [0, -1])
    for b, lq, lk, lens in ((1, 257, 301, None), (2, 301, 113, [113, 5])):
        rng = np.random.default_rng(lq * lk)
        # slopes near 1, table entries of about 0.5 (h: the 6 query heads)
        arrays = {i.name: (rng.standard_normal((6, *i.axes[1:])) * 0.5 + (len(i.axes) == 1)).astype(np.float32)
                  for i in spec.inputs}
        got, ref, _ = _with_grad_inputs(spec, kernel, rng, arrays, b, lq, lk, lens)
        bound = 2 * tolerance(spec)
        for what, g, r in [*zip(("dq", "dk", "dv"), got[:3], ref[:3]), *((n, got[3][n], ref[3][n]) for n in ref[3])]:
            err = relative_error(to_np(g), r)
            assert err <= bound, f"{what} (b {b}, {lq} x {lk}): {err:.3g}"
