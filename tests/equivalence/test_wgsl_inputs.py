"""Expression inputs (issue 42: `input NAME[AXES] DTYPE`) on target wgsl, against the float64
reference: the issue's four examples (ALiBi, prefix-LM, document ids, Swin's relative-position
table), f32 and f16, odd lengths, Lq != Lk, GQA with groups of 3, kv_lens, a row that sees no
key, u8 / bool / f16 inputs, the split schedules; reads out of an input's bounds flagged (and
not flagged where `&&` or `where` keeps the read from happening); every bad input a LaunchError
that names it."""

from __future__ import annotations

import numpy as np
import pytest

import attngen
from attngen.errors import LaunchError
from attngen.reference import reference, relative_error, tolerance

from conftest import kernel_for, random_qkv, require, spec_of

HEADS = "q=6 kv=2"  # GQA, groups of 3


def _slopes(rng, b, hq, lq, lk):
    return {"slopes": (2.0 ** (-8.0 * np.arange(1, hq + 1) / hq)).astype(np.float32)}


def _prefix(rng, b, hq, lq, lk):
    return {"prefix": rng.integers(0, lk + 2, size=b).astype(np.int32)}


def _docs(rng, b, hq, lq, lk):
    # document ids that grow along the sequence (packed documents), and one that does not
    doc = np.sort(rng.integers(0, 4, size=(b, lq)), axis=1).astype(np.int32)
    doc[:, lq // 2:] += rng.integers(0, 2, size=(b, 1)).astype(np.int32) * 7
    return {"doc": doc}


def _table(dtype):
    def make(rng, b, hq, lq, lk):
        return {"table": rng.standard_normal((hq, 169)).astype(dtype)}
    return make


EXAMPLES = {
    "alibi": ("input slopes[h] f32\nscore s - slopes[h] * abs(q - k)\nmask causal", _slopes),
    "prefix_lm": ("input prefix[b] i32\nmask k <= q || k < prefix[b]", _prefix),
    "documents": ("input doc[b, q] i32\nmask k <= q && doc[b, q] == doc[b, k]", _docs),
    "swin": ("input table[h, 169] f32\nscore s + table[h, (q // 7 - k // 7 + 6) * 13 + (q % 7 - k % 7 + 6)]\n"
             "mask q // 49 == k // 49", _table(np.float32)),
}
SHAPES = [(1, 1, 1), (2, 7, 7), (1, 113, 113), (2, 7, 20), (1, 20, 7)]


def _spec(dtype, body, extra=""):
    return spec_of(f"head_dim 16\nheads {HEADS}\ndtype {dtype}\n{body}\n{extra}")


def _check(spec, b, lq, lk, make, seed=0, **options):
    """The kernel's out and lse against the reference's on random data and inputs."""
    q, k, v = random_qkv(spec, b, lq, lk, seed=seed)
    inputs = make(np.random.default_rng(seed), b, q.shape[2], lq, lk)
    np_dtype = np.float16 if spec.dtype == "f16" else np.float32
    out, lse = kernel_for(spec, "wgsl")(*(x.astype(np_dtype) for x in (q, k, v)), return_lse=True,
                                         **options, **inputs)
    ref, ref_lse = reference(spec, q, k, v, return_lse=True, **options, **inputs)
    out, lse = np.asarray(out, np.float64), np.asarray(lse, np.float64)
    assert not np.isnan(out).any() and not np.isnan(lse).any()
    err = relative_error(out, ref)
    assert err <= tolerance(spec), f"{spec.name} {(b, lq, lk)}: relative L2 error {err:.3g}"
    empty = np.isneginf(ref_lse)
    assert np.array_equal(np.isneginf(lse), empty)
    assert np.all(out[np.transpose(empty, (0, 2, 1))] == 0)
    np.testing.assert_allclose(lse[~empty], ref_lse[~empty], rtol=1e-4, atol=1e-4)
    return empty


@pytest.mark.parametrize("dtype", ["f32", "f16"])
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_the_issues_examples(name, dtype):
    require("wgsl")
    body, make = EXAMPLES[name]
    spec = _spec(dtype, body)
    for n, (b, lq, lk) in enumerate(SHAPES):
        _check(spec, b, lq, lk, make, seed=n)


def test_kv_lens_and_a_row_that_sees_no_key():
    require("wgsl")
    spec = _spec("f32", "input prefix[b] i32\nmask k + 2 <= q || k < prefix[b]")
    fixed = lambda rng, b, hq, lq, lk: {"prefix": np.array([0, 3, 40], np.int32)}  # noqa: E731
    empty = _check(spec, 3, 9, 30, fixed, kv_lens=np.array([30, 5, 17], np.int32))
    assert empty[0, :, :2].all() and not empty[1:].any()  # sequence 0's rows 0 and 1 see no key


def test_u8_bool_and_f16_inputs():
    require("wgsl")
    spec = _spec("f16", "input allow[h, k] bool\ninput shift[b] u8\ninput table[h, 169] f16\n"
                        "mask allow[h, k] || k + shift[b] <= q\n"
                        "score s + table[h, (q // 7 - k // 7 + 6) * 13 + (q % 7 - k % 7 + 6)] * where(k < 49, 1, 0)")

    def make(rng, b, hq, lq, lk):
        return {"allow": rng.random((hq, lk)) < 0.3, "shift": rng.integers(0, 256, size=b).astype(np.uint8),
                "table": rng.standard_normal((hq, 169)).astype(np.float16)}
    for n, (b, lq, lk) in enumerate([(2, 7, 7), (3, 49, 49), (2, 7, 20)]):
        _check(spec, b, lq, lk, make, seed=n)


@pytest.mark.parametrize("schedule", ["split_kv(3)", "two_pass"])
def test_split_schedules(schedule):
    require("wgsl")
    body, make = EXAMPLES["swin"]
    spec = _spec("f32", body, f"schedule {schedule}")
    for n, (b, lq, lk) in enumerate([(2, 7, 20), (1, 113, 113)]):
        _check(spec, b, lq, lk, make, seed=n)


# ---- reads out of bounds ------------------------------------------------------------------------

def _bounds_case(body, lq=7, lk=7):
    spec = _spec("f32", "input tab[4] i32\n" + body)
    q, k, v = random_qkv(spec, 1, lq, lk, seed=2)
    return spec, (q, k, v), {"tab": np.array([1, -1, 2, 3], np.int32)}


def test_a_read_out_of_bounds_is_flagged_where_the_reference_raises():
    require("wgsl")
    spec, qkv, inputs = _bounds_case("score s + tab[q - k]\nmask k <= q")
    with pytest.raises(LaunchError, match="out of"):
        reference(spec, *qkv, **inputs)
    with pytest.raises(LaunchError, match=r"the score expression read input 'tab' out of its bounds in tab\[q - k\]"):
        kernel_for(spec, "wgsl")(*qkv, **inputs)
    spec, qkv, inputs = _bounds_case("mask k <= q && tab[q - k] > 0")
    with pytest.raises(LaunchError, match="the mask expression read input 'tab'"):
        kernel_for(spec, "wgsl")(*qkv, **inputs)


@pytest.mark.parametrize("body", [
    "mask k <= q && q - k < 4 && tab[q - k] > 0",           # && decides first
    "mask k > q || q - k >= 4 || tab[q - k] > 0",           # || decides first
    "score where(q - k < 4, s + tab[q - k], s)\nmask k <= q",  # where: only the branch that is the result
    "score s + tab[q - k]\nmask k <= q && q - k < 4",       # the score only at visible pairs
])
def test_reads_the_language_keeps_in_bounds_are_not_flagged(body):
    require("wgsl")
    spec, qkv, inputs = _bounds_case(body)
    out = kernel_for(spec, "wgsl")(*qkv, **inputs)
    ref = reference(spec, *qkv, **inputs)
    assert relative_error(out, ref) <= tolerance(spec)


def test_where_with_an_input_in_a_branch_is_a_function_that_evaluates_one_branch():
    spec, _, _ = _bounds_case("score where(q - k < 4, s + tab[q - k], s)\nmask k <= q")
    src = attngen.emit(spec, target="wgsl").source
    assert "fn score_expr_where1(s: f32, b: i32, h: i32, hkv: i32, q: i32, k: i32, Lq: i32, Lk: i32) -> f32 {\n" \
           "    if ((q - k) < 4i) {\n        return s + f32(in_tab(1u, q - k));\n    }\n    return s;\n}" in src
    assert "select(" not in src[src.index("fn score_expr_where1"):src.index("fn score_transform")]


# ---- bad inputs ---------------------------------------------------------------------------------

def test_bad_inputs_are_launch_errors_that_name_them():
    require("wgsl")
    body, make = EXAMPLES["documents"]
    spec = _spec("f32", body)
    q, k, v = random_qkv(spec, 2, 7, 7)
    doc = make(np.random.default_rng(0), 2, 6, 7, 7)["doc"]
    kernel = kernel_for(spec, "wgsl")
    cases = [
        ({}, r"reads input 'doc' \(i32, axes \[b, q\]\): pass doc=\.\.\."),
        ({"doc": doc, "docs": doc}, r"unknown input docs \(spec t declares: doc\)"),
        ({"doc": doc[:, :5]}, r"input 'doc' has shape \(2, 5\); its axes \[b=2, q=7\] need \(2, 7\)"),
        ({"doc": doc.astype(np.int64)}, r"input 'doc' is int64; it is declared i32: pass a numpy array of dtype int32"),
        ({"doc": doc.tolist()}, r"input 'doc' is a list; inputs are numpy arrays"),
    ]
    for given, message in cases:
        with pytest.raises(LaunchError, match=message):
            kernel(q, k, v, **given)
    cu = np.array([0, 7, 14], np.int32)
    with pytest.raises(LaunchError, match=r"take a padded batch \(B, L, H, D\), not packed sequences"):
        kernel(q.reshape(14, 6, 16), k.reshape(14, 2, 16), v.reshape(14, 2, 16), cu_seqlens_q=cu, doc=doc)


def test_bf16_inputs_and_too_many_storage_buffers_are_refused():
    with pytest.raises(attngen.SpecError, match="input 'slopes' is bf16: WGSL has no bf16 type"):
        attngen.emit(_spec("f32", "input slopes[h] bf16\nscore s - slopes[h] * abs(q - k)"), target="wgsl")
    with pytest.raises(attngen.SpecError, match="needs 9 storage buffers; profile webgpu-core allows 8"):
        attngen.emit(_spec("f32", "input slopes[h] f32\nscore s - slopes[h] * abs(q - k)\nmask custom"),
                     target="wgsl", profile="webgpu-core")


def test_attngen_run_makes_up_inputs_of_the_declared_shapes_and_dtypes():
    from attngen.harness.runner import made_up, runtime_inputs
    spec = _spec("f16", "input allow[h, k] bool\ninput shift[b] u8\ninput doc[b, q] i32\ninput table[h, 169] f16\n"
                        "mask allow[h, k] || k + shift[b] <= q && doc[b, q] >= 0\nscore s + table[h, k % 169]")
    q, k, v = random_qkv(spec, 2, 7, 20)
    _, _, opts = runtime_inputs(spec, q, k, v, np.random.default_rng(0))
    assert {n: (a.shape, a.dtype.name) for n, a in opts.items()} == {
        "allow": ((6, 20), "bool"), "shift": ((2,), "uint8"), "doc": ((2, 7), "int32"), "table": ((6, 169), "float16")}
    assert opts["doc"].max() <= 20
    lines = made_up(spec, {"B": 2, "Lq": 7, "Lk": 20}, 0)
    assert "input doc[b, q] i32: random integers 0 .. max(Lq, Lk)" in lines
