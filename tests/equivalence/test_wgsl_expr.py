"""Score and mask expressions over indices only (issue 42, the first emitter slice) on target
wgsl, against the float64 reference: masks and scores, f32 and f16, odd lengths, Lq != Lk, GQA
with groups of 3, rows that see no key; the emitter's floor division and modulo against Python's;
the refusals (cuda: inputs, tests/backends/cuda/test_expr_source.py; inputs: test_wgsl_inputs.py; the
backward: test_wgsl_expr_backward.py)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import attngen
from attngen.backends import get as get_backend
from attngen.backends.wgsl import expr as wgsl_expr
from attngen.lang.expr import INT, Binary, Const, Var
from attngen.reference import reference

from conftest import check_against_reference, kernel_for, random_qkv, require, spec_of

MASKS = {
    "causal band": "k <= q && q - k < 5",
    "2d neighbourhood": "abs(q // 4 - k // 4) <= 1 && abs(q % 4 - k % 4) <= 1",
    "bottom right": "k <= q + Lk - Lq",
    "negative floor": "(q - k) // 3 != -2 && (k - q) % 5 != 4",
    "heads": "where(h % 3 == 0, k <= q, k >= q) || hkv == b",
}
SCORES = {
    "distance bias": "s - 0.125 * abs(q - k)",
    "tanh cap": "30 * tanh(s / 30)",  # planned as softcap 30 (attngen.plan.check.normalised)
    "mixed": "where(k % 2 == 0, s, sigmoid(s) + 0.5 * h) - log(1 + k) / 4 + min(q, 3) * 0.1",
}
SHAPES = [(1, 1, 1), (2, 7, 7), (1, 113, 113), (2, 7, 20), (1, 20, 7), (1, 113, 37)]


def _spec(dtype, mask=None, score=None, heads="q=6 kv=2", head_dim=16, extra=""):
    body = f"head_dim {head_dim}\nheads {heads}\ndtype {dtype}\n"
    body += f"mask {mask}\n" if mask else ""
    body += f"score {score}\n" if score else ""
    return spec_of(body + extra)


def _kernel_or_skip(spec):
    return kernel_for(spec, "wgsl")


@pytest.mark.parametrize("dtype", ["f32", "f16"])
@pytest.mark.parametrize("name", sorted(MASKS))
def test_mask_expressions(name, dtype):
    require("wgsl")
    spec = _spec(dtype, mask=MASKS[name])
    for b, lq, lk in SHAPES:
        q, k, v = random_qkv(spec, b, lq, lk, seed=lq * 131 + lk)
        check_against_reference(spec, "wgsl", q, k, v)


@pytest.mark.parametrize("dtype", ["f32", "f16"])
@pytest.mark.parametrize("name", sorted(SCORES))
def test_score_expressions(name, dtype):
    require("wgsl")
    spec = _spec(dtype, score=SCORES[name], mask="k <= q + 3")
    for b, lq, lk in SHAPES:
        q, k, v = random_qkv(spec, b, lq, lk, seed=lq * 7 + lk)
        check_against_reference(spec, "wgsl", q, k, v)


def test_score_and_mask_with_small_tiles_split_kv_and_two_pass():
    require("wgsl")
    for extra in ("tile q=16 kv=16", "schedule split_kv(3)", "schedule two_pass"):
        spec = _spec("f32", mask="abs(q // 8 - k // 8) <= 1 && abs(q % 8 - k % 8) <= 1",
                     score="s - 0.125 * abs(q - k)", extra=extra)
        for b, lq, lk in [(2, 7, 7), (1, 113, 113), (1, 9, 70)]:
            q, k, v = random_qkv(spec, b, lq, lk, seed=lq + lk)
            check_against_reference(spec, "wgsl", q, k, v)


def test_rows_that_see_no_key_give_zero_and_minus_inf_with_nan_in_hidden_keys():
    require("wgsl")
    # rows q < 3 see no key; every other row sees keys k <= q - 3 only
    spec = _spec("f32", mask="k <= q - 3", score="s - 0.25 * abs(q - k)", heads="q=3 kv=1")
    q, k, v = random_qkv(spec, 2, 11, 13, seed=5)
    ref, ref_lse = reference(spec, q, k, v, return_lse=True)
    assert np.isneginf(ref_lse[:, :, :3]).all() and np.isfinite(ref_lse[:, :, 3:]).all()
    k[:, 10:] = np.nan  # keys 10.. are hidden from every row (at most q - 3 = 7)
    v[:, 10:] = np.inf
    out, lse = kernel_for(spec, "wgsl")(q, k, v, return_lse=True)
    out, lse = np.asarray(out, np.float64), np.asarray(lse, np.float64)
    assert not np.isnan(out).any() and not np.isnan(lse).any()
    assert np.all(out[:, :3] == 0) and np.isneginf(lse[:, :, :3]).all()
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(lse[:, :, 3:], ref_lse[:, :, 3:], rtol=1e-5, atol=1e-5)


def test_the_source_quotes_the_expressions_and_is_deterministic():
    spec = _spec("f16", mask="k <= q && q - k < 64", score="30 * tanh(s / 29)")  # (/ 30: planned as softcap 30)
    a, b = attngen.emit(spec, target="wgsl").source, attngen.emit(spec, target="wgsl").source
    assert a == b
    assert "// mask k <= q && q - k < 64\nfn mask_expr(b: i32, h: i32, hkv: i32, q: i32, k: i32, Lq: i32, Lk: i32) -> bool {\n" \
           "    return (k <= q) && ((q - k) < 64i);\n}" in a
    assert "fn score_expr(s: f32, b: i32, h: i32, hkv: i32, q: i32, k: i32, Lq: i32, Lk: i32) -> f32 {\n" \
           "    return 30.0f * expr_tanh(s / 29.0f);\n}" in a
    assert "fn expr_floor_div" not in a  # helpers only where used


def test_clamp_with_lo_above_hi_is_min_of_max():
    """clamp(x, lo, hi) is min(max(x, lo), hi) where lo > hi too, as the reference's: WGSL's clamp
    of constants with lo > hi is a shader-creation error, its float clamp may take the median
    (found by tests/equivalence/test_expr_fuzz.py)."""
    require("wgsl")
    spec = _spec("f32", mask="k <= clamp(q, 5, 2) || k == clamp(0, 0, -1) + 3",
                 score="s + clamp(s, 1.5, 0.5) + clamp(0.25 * k, 0.125 * q, -1)", heads="q=3 kv=1")
    for b, lq, lk in [(1, 7, 7), (2, 13, 20)]:
        q, k, v = random_qkv(spec, b, lq, lk, seed=lq)
        check_against_reference(spec, "wgsl", q, k, v)


# ---- the emitter --------------------------------------------------------------------------------

def _floor_ops_shader(pairs):
    """A shader writing a // k and a % k for each pair, k read from a buffer (no constant folding)."""
    body = "\n".join(f"    {{\n        let k = divisors[{n}];\n"
                     f"        out[{2 * n}] = {wgsl_expr.render(Binary('//', Const(a, INT), Var('k', INT), INT))};\n"
                     f"        out[{2 * n + 1}] = {wgsl_expr.render(Binary('%', Const(a, INT), Var('k', INT), INT))};\n    }}"
                     for n, (a, _) in enumerate(pairs))
    helpers = "\n".join(wgsl_expr.helpers_of(Binary("//", Var("q", INT), Var("k", INT), INT),
                                             Binary("%", Var("q", INT), Var("k", INT), INT)))
    return (f"@group(0) @binding(0) var<storage, read_write> out: array<i32>;\n"
            f"@group(0) @binding(1) var<storage, read> divisors: array<i32>;\n{helpers}\n"
            f"@compute @workgroup_size(1)\nfn main() {{\n{body}\n}}\n")


def test_floor_division_and_modulo_of_negatives_as_python():
    pairs = [(a, b) for a, b in itertools.product((-7, -6, -1, 0, 1, 6, 7, -2147483647, 2147483647), (-3, -2, -1, 1, 2, 3, 7))]
    # the text: helpers called on the operands
    assert wgsl_expr.render(Binary("//", Var("q", INT), Const(-8, INT), INT)) == "expr_floor_div(q, (-8i))"
    assert wgsl_expr.render(Binary("%", Var("q", INT), Const(8, INT), INT)) == "expr_floor_mod(q, 8i)"
    require("wgsl")
    import wgpu
    from attngen.backends.wgsl.devices import device
    dev = device()
    source = _floor_ops_shader(pairs)
    module = dev.create_shader_module(code=source)
    out = dev.create_buffer(size=8 * len(pairs), usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
    divs = dev.create_buffer_with_data(data=np.array([b for _, b in pairs], np.int32).tobytes(),
                                       usage=wgpu.BufferUsage.STORAGE)
    pipeline = dev.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
    group = dev.create_bind_group(layout=pipeline.get_bind_group_layout(0),
                                  entries=[{"binding": 0, "resource": {"buffer": out}},
                                           {"binding": 1, "resource": {"buffer": divs}}])
    enc = dev.create_command_encoder()
    p = enc.begin_compute_pass()
    p.set_pipeline(pipeline)
    p.set_bind_group(0, group)
    p.dispatch_workgroups(1)
    p.end()
    dev.queue.submit([enc.finish()])
    got = np.frombuffer(dev.queue.read_buffer(out), np.int32).reshape(-1, 2)
    want = np.array([(a // b, a % b) for a, b in pairs], np.int64)
    assert (got == want).all(), [(pairs[i], tuple(got[i]), tuple(want[i])) for i in np.nonzero((got != want).any(1))[0]]


def test_emitter_types_and_literals():
    r = wgsl_expr.render
    spec = _spec("f32", score="s * 2 + q / 3 - exp(-k) + floor(s) + clamp(q, 0, 5) * 1e-3")
    text = r(spec.score)
    assert "f32(q) / 3.0f" in text and "exp(f32(-k))" in text and "f32(i32(floor(s)))" in text
    assert "0.001f" in text and "min(max(q, 0i), 5i)" in text
    assert r(Const(-2**31, INT)) == "(-2147483647i - 1i)"
    # floor of an integer operation stays one operand (found by the fuzzer: `--i32(...)`)
    neg = _spec("f32", score="-floor(-floor(-4.0)) * 0.5 + -floor(q - k) * 0.25")
    assert r(neg.score) == "(f32(-(-i32(floor((-4.0f))))) * 0.5f) + (f32(-(q - k)) * 0.25f)"
    require("wgsl")
    q, k, v = random_qkv(neg, 1, 7, 9)
    check_against_reference(neg, "wgsl", q, k, v)


# ---- what stays refused -------------------------------------------------------------------------

def test_both_targets_take_expressions_and_the_backward_index_only_ones():
    reads = spec_of("head_dim 16\ndtype f32\ninput prefix[b] i32\nmask k <= q || k < prefix[b]")
    assert get_backend("wgsl").expression_problems(reads) == []  # inputs: tests/equivalence/test_wgsl_inputs.py
    index_only = _spec("f32", mask="k <= q", score="s - 0.5 * abs(q - k)")
    assert get_backend("wgsl").expression_problems(index_only) == []
    assert get_backend("cuda").expression_problems(index_only) == []  # (tests/backends/cuda/test_expr_source.py)
    assert "in_prefix" in attngen.emit(reads, target="cuda").source  # (test_expr_inputs_source.py)
    from attngen.backends.wgsl.emit import backward_plan
    from attngen.plan.backward import problems
    # the backward: wgsl's compiles index-only expressions (test_wgsl_expr_backward.py); problems() without
    # expressions=True is a target whose backward compiles none
    assert "not compiled by this target's backward kernels yet" in problems(index_only)[0].message
    plan = attngen.lower(index_only, target="wgsl")
    assert backward_plan(plan) is not None and "backward" in get_backend("wgsl").helper_sources(plan)


def test_lk_is_the_sequence_length_with_kv_lens():
    """Lk (and k's range) are each sequence's own with kv_lens, as in the reference."""
    require("wgsl")
    spec = _spec("f32", mask="k <= q + Lk - Lq && k >= Lk - 9", score="s - 0.1 * (Lk - k)")
    q, k, v = random_qkv(spec, 3, 5, 40, seed=3)
    kv_lens = np.array([40, 17, 6], np.int32)
    ref, ref_lse = reference(spec, q, k, v, kv_lens=kv_lens, return_lse=True)
    out, lse = kernel_for(spec, "wgsl")(q, k, v, kv_lens=kv_lens, return_lse=True)
    np.testing.assert_allclose(np.asarray(out, np.float64), ref, rtol=1e-4, atol=1e-5)
    same = np.isneginf(ref_lse)
    assert np.array_equal(np.isneginf(np.asarray(lse)), same)
    np.testing.assert_allclose(np.asarray(lse, np.float64)[~same], ref_lse[~same], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("extra", ["accumulate qk=f16 pv=f32", "target wgsl { f16=native }", "target wgsl { f16=packed }"])
def test_f16_storage_and_accumulators(extra):
    """With accumulate qk=f16, Q is scaled as it is staged: the raw dot product is s already."""
    require("wgsl")
    spec = _spec("f16", mask="abs(q // 4 - k // 4) <= 1", score="s - 0.125 * abs(q - k)", extra=extra)
    for b, lq, lk in [(2, 7, 7), (1, 113, 37)]:
        q, k, v = random_qkv(spec, b, lq, lk, seed=lq)
        check_against_reference(spec, "wgsl", q, k, v)
