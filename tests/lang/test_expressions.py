"""Score and mask expressions, and inputs (issue 42's front-end): parse, types, errors with carets,
the round trip through the printed text and through stored data, and the targets' refusal."""

from __future__ import annotations

import dataclasses
import json

import pytest

import attngen
from attngen.lang import validate
from attngen.lang.expr import Binary, Const, Fn, Input, Load, Unary, Var, format_expr
from attngen.lang.spec import Mask, format_spec, specs_from_data, specs_to_data

from conftest import spec_of

ISSUE_EXAMPLES = """\
attention alibi {
    head_dim 128
    heads    q=16 kv=16
    dtype    f16
    input    slopes[h] f32
    score    s - slopes[h] * abs(q - k)
    mask     causal
}
attention prefix_lm {
    head_dim 64
    dtype    f32
    input    prefix[b] i32
    mask     k <= q || k < prefix[b]
}
attention docs {
    head_dim 128
    dtype    f16
    input    doc[b, q] i32
    mask     k <= q && doc[b, q] == doc[b, k]
}
attention swin {
    head_dim 32
    dtype    f16
    input    table[h, 169] f32
    score    s + table[h, (q // 7 - k // 7 + 6) * 13 + (q % 7 - k % 7 + 6)]
    mask     q // 49 == k // 49
}
"""

I, R, B = "int", "real", "bool"


def body(text: str) -> str:
    return f"attention t {{\n    head_dim 64\n    dtype f16\n{text}\n}}\n"


def errors(text: str) -> list:
    with pytest.raises(attngen.SpecError) as e:
        attngen.parse(body(text), "e.attn")
    return e.value.diagnostics


def test_the_issue_examples_parse_to_typed_ir():
    alibi, prefix, docs, swin = attngen.parse(ISSUE_EXAMPLES, "issue.attn")
    assert alibi.mask == Mask("causal")
    assert alibi.inputs == (Input("slopes", ("h",), "f32"),)
    assert alibi.score == Binary("-", Var("s", R), Binary(
        "*", Load("slopes", (Var("h", I),), R), Fn("abs", (Binary("-", Var("q", I), Var("k", I), I),), I), R), R)
    assert prefix.mask.kind == "expr" and prefix.score is None
    assert prefix.mask.expr == Binary("||", Binary("<=", Var("k", I), Var("q", I), B),
                                      Binary("<", Var("k", I), Load("prefix", (Var("b", I),), I), B), B)
    assert docs.inputs == (Input("doc", ("b", "q"), "i32"),)
    assert swin.inputs == (Input("table", ("h", 169), "f32"),)
    assert swin.mask.expr.type == B and swin.score.type == R


def test_named_masks_stay_named_and_expressions_need_operators():
    assert spec_of("head_dim 64\ndtype f16\nmask causal(bottom_right)").mask == Mask("causal", bottom_right=True)
    assert spec_of("head_dim 64\ndtype f16\nmask window(left=-0, right=3)").mask == Mask("window", left=0, right=3)
    assert spec_of("head_dim 64\ndtype f16\nmask k <= q").mask == Mask("expr", expr=Binary(
        "<=", Var("k", I), Var("q", I), B))


@pytest.mark.parametrize("text", [
    "k <= q || k < 3 && q > 1",
    "(k <= q || k < 3) && q > 1",
    "!(k < q) && !(q == k)",
    "q - k - 1 >= 0",
    "q - (k - 1) >= 0",
    "-q // 3 == -(q // 3)",
    "q // -2 * 3 % 5 != k",
    "(q < k) == (k < 4)",
    "abs(q // 8 - k // 8) <= 2 && abs(q % 8 - k % 8) <= 2",
    "where(q < k, q, k) > clamp(k, 0, Lq - 1) || min(q, k) == max(q, Lk - Lq)",
    "floor(log(1.0 + abs(q - k)) * 2.5) < 4",
    "q * 1.5e-3 > 2.0",
    "b == (-(-0)) || k == -(-3) || q * 0.5 > -(-0.0)",  # a negated zero literal is the literal (fuzzer)
])
def test_expressions_print_back_to_the_same_ir(text):
    s = spec_of(f"head_dim 64\ndtype f16\nmask {text}")
    printed = format_expr(s.mask.expr)
    assert spec_of(f"head_dim 64\ndtype f16\nmask {printed}") == s
    assert format_expr(spec_of(f"head_dim 64\ndtype f16\nmask {printed}").mask.expr) == printed


def test_precedence_is_that_of_c():
    e = spec_of("head_dim 64\ndtype f16\nmask k <= q || k < 3 && q > 1").mask.expr
    assert e.op == "||" and e.b.op == "&&"
    e = spec_of("head_dim 64\ndtype f16\nmask -2 // 3 == q").mask.expr
    assert e.a == Binary("//", Const(-2, I), Const(3, I), I)  # the literal -2, floor-divided: -1
    e = spec_of("head_dim 64\ndtype f16\nmask -(q // 3) == q").mask.expr
    assert e.a == Unary("-", Binary("//", Var("q", I), Const(3, I), I), I)


def test_specs_round_trip_through_text_and_data():
    specs = attngen.parse(ISSUE_EXAMPLES, "issue.attn")
    for s in specs:
        text = format_spec(s)
        assert attngen.parse(text) == [s]
        assert format_spec(attngen.parse(text)[0]) == text
        assert validate(s) == []
    source = next(iter(specs[0].spans.values())).source
    data = json.loads(json.dumps(specs_to_data(specs, source)))
    assert specs_from_data(data, source) == specs


def test_spec_text_of_named_masks_is_unchanged():
    s = spec_of("head_dim 64\ndtype f16\nmask causal")
    assert "input" not in format_spec(s) and "score" not in format_spec(s)


def test_inputs_may_be_declared_after_their_use_and_grad_marks_a_learnable_bias():
    s = spec_of("head_dim 64\ndtype f16\nscore s + bias[b, h, q, k]\ninput bias[b, h, q, k] f16 grad")
    assert s.inputs == (Input("bias", ("b", "h", "q", "k"), "f16", grad=True),)
    assert "input      bias[b, h, q, k] f16 grad" in format_spec(s)


def test_a_spec_built_with_a_wrong_ir_is_refused_by_validate():
    s = spec_of("head_dim 64\ndtype f16\ninput w[h] f32\nscore s * w[h]")
    bad = dataclasses.replace(s, score=Const(1, I))  # an integer score, and w read by nothing
    assert validate(bad)
    assert validate(dataclasses.replace(s, score=Unary("-", Const(1.0, R), R)))  # prints as the literal -1.0


def test_every_error_of_a_file_at_once_with_carets_and_hints():
    text = body("    input slopes[h] f32 grad\n"
                "    input doc[b, q] i32\n"
                "    score s - slope[h] * abs(q - k) + exp(q, k) + doc[b, q] // 2.0\n"
                "    mask k <= q || doc[b] > 0 || s > 0")
    with pytest.raises(attngen.SpecError) as e:
        attngen.parse(text, "m.attn")
    got = [(d.span.line, d.span.column, d.message) for d in e.value.diagnostics]
    assert got == [
        (6, 15, "unknown input 'slope'"),
        (6, 39, "'exp' takes 1 argument, not 2"),
        (6, 64, "'//' needs an integer, not a real"),
        (7, 20, "input 'doc' has 2 axes (b, q), indexed with 1"),
        (7, 34, "a mask cannot read the score s (it decides which keys are scored)"),
    ]
    assert e.value.diagnostics[0].hint == "did you mean 'slopes'?"
    assert str(e.value).split("\n")[:3] == [
        "m.attn:6:15: error: unknown input 'slope'",
        "        score s - slope[h] * abs(q - k) + exp(q, k) + doc[b, q] // 2.0",
        "                  ^^^^^",
    ]


@pytest.mark.parametrize("lines, message, hint", [
    ("mask k + q", "a mask must be a boolean expression; this is an integer", "compare positions"),
    ("mask k <= q + 1.5 && w[h] > 0\ninput w[h] f32", "a mask cannot read the real input 'w' (f32)", "score s + w[h]"),
    ("score q - k", "a score must be a real expression; this is an integer", "start from s"),
    ("score s + k < q", "a score must be a real expression; this is a boolean", "mask"),
    ("mask kk <= q", "unknown name 'kk'", "did you mean 'k'?"),
    ("mask k <= q && causal", "the named mask 'causal' is not part of an expression", "k <= q"),
    ("score s + sigmod(s)", "unknown function 'sigmod'", "did you mean 'sigmoid'?"),
    ("score clamp(s, 0.0)", "'clamp' takes 3 arguments, not 2", "write: clamp(x, lo, hi)"),
    ("score max(s, x=1.0)", "'max' takes no named arguments", None),
    ("score s + w[h, 4]\ninput w[h, 4] f32", "index 4 is out of range for axis 4 of 'w' (0 .. 3)", None),
    ("score s + w[h, 1 - 2]\ninput w[h, 4] f32", "index -1 is out of range for axis 4 of 'w' (0 .. 3)", None),
    ("score s + w[h]\ninput w[h, 4] f32", "input 'w' has 2 axes (h, 4), indexed with 1", "write: w[h, 4]"),
    ("score s * 1e999", "constant 1e999 is not finite (it overflows)", None),
    ("score s * inf", "'inf' is not a constant of the language", None),
    # constant sub-expressions out of f32 (WGSL evaluates them as it compiles, and refused the kernel)
    ("score s + exp(100)", "the constant exp(100) is not finite (reals are f32 in kernels)", "constants must be finite"),
    ("score s + log(0) * 0", "the constant log(0) is not finite", None),
    ("score s + sqrt(1 - 2) * q", "the constant sqrt(1 - 2) is undefined", None),
    ("score s * (1e30 * 1e30)", "the constant 1e+30 * 1e+30 is not finite", None),
    ("mask q < 99999999999", "integer constant 99999999999 is out of range", None),
    ("mask q < 65536 * 65536", "the constant 65536 * 65536 = 4294967296 is out of range", "32-bit and wrap"),
    ("mask q // 0 == 1", "'//' by zero", None),
    ("mask k <= q && w > 0\ninput w[b] i32", "input 'w' is a tensor: index it", "write: w[b]"),
    ("score s + w[h]\ninput w[h] i32 grad", "input 'w' is i32: only a real input (f32, f16, bf16) has a gradient", None),
    ("mask k < w[b]\ninput w[b] i32\ninput u[h] f32 grad", "input 'u' has grad, but the score does not read it", None),
    ("mask k < q\ninput u[h] f32", "input 'u' is read by no expression", None),
    ("mask k < w[b]\ninput w[b] i32\ninput w[h] i32", "duplicate input 'w' (first on line 5)", None),
    ("score s + k[q]\ninput k[q] f32", "an input may not be named 'k'", None),
    ("score s + mask[q]\ninput mask[q] f32", "an input may not be named 'mask'", None),
    ("score s + w[t]\ninput w[t] f32", "an input's axis is an index name (b, h, hkv, q, k) or a positive integer", None),
    ("score s + w[0]\ninput w[0] f32", "'input axis' must be at least 1, not 0", None),
    ("score s + w[q]\ninput w[q] f64", "unknown input dtype 'f64'", None),
    ("score s + w[q]\ninput w", "input 'w' needs its axes", None),
    ("score s * 2.0\nsoftcap 30", "a score expression and a softcap together", "score C * tanh(s / C)"),
    ("score s + where(k < q, 1, q < k)", "where's two branches are a boolean and a number", None),
    ("score s + (k < q)", "'+' needs an integer or a real, not a boolean", None),
])
def test_expression_errors(lines, message, hint):
    ds = errors("\n".join("    " + ln for ln in lines.split("\n")))
    d = next((d for d in ds if message in d.message), None)
    assert d is not None, [x.message for x in ds]
    assert d.span.source.name == "e.attn" and d.span.line >= 4
    if hint:
        assert hint in d.hint


def test_syntax_errors_in_expressions():
    ds = errors("    mask k <= q <= 3")
    assert ds[0].message.startswith("unexpected '<='") and (ds[0].span.line, ds[0].span.column) == (4, 17)
    ds = errors("    mask (k <= q + 1")
    assert "expected ')'" in ds[0].message and (ds[0].span.line, ds[0].span.column) == (4, 21)
    ds = errors("    score s +")
    assert ds[0].message.startswith("unexpected end of line; expected")


def test_cuda_compiles_expressions_that_read_inputs():
    """Target cuda compiles expressions and their inputs (tests/backends/cuda/test_expr_source.py,
    test_expr_inputs_source.py): each input a loader, each read a call of it."""
    (s,) = attngen.parse(body("    input p[b] i32\n    input t[4] f32\n    mask k <= q || k < p[b]\n"
                              "    score s * t[k % 8] + t[clamp(q, 0, 3)]"), "x.attn")
    source = attngen.emit(s, target="cuda").source
    assert "int in_p(const ExprInputs& in, int site, int i0)" in source
    # p[b] and t[clamp(q, 0, 3)] are in bounds in every call (plan.expr_reads.in_bounds): site 0,
    # untested; t[k % 8] may leave the axis: site 2, reported
    assert "return (k <= q) || (k < in_p(in, 0, b));" in source
    assert "return (s * in_t(in, 2, expr_floor_mod(k, 8))) + in_t(in, 0, min(max(q, 0), 3));" in source


def test_wgsl_refuses_a_bf16_input_at_its_declaration():
    """Target wgsl compiles expressions and their inputs (tests/equivalence/test_wgsl_expr.py,
    test_wgsl_inputs.py); a bf16 input is refused (WGSL has no bf16), at its declaration."""
    (s,) = attngen.parse(body("    input p[b] bf16\n    score s - p[b]"), "x.attn")
    with pytest.raises(attngen.SpecError) as e:
        attngen.emit(s, target="wgsl")
    got = {(d.span.line, d.span.column): d.message for d in e.value.diagnostics}
    assert got.keys() == {(4, 5)}
    assert "input 'p' is bf16: WGSL has no bf16 type" in got[(4, 5)]


def test_an_expression_after_a_misspelt_key_gets_a_hint():
    (d,) = errors("    maks k <= q")
    assert d.message == "unexpected character '<'" and (d.span.line, d.span.column) == (4, 12)
    assert d.hint.startswith("did you mean 'mask'?")
