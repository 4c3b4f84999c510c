"""Bad input: every mistake is a SpecError with file:line:col, the line, a caret and a hint.

Nothing here may raise anything but attngen.SpecError. Language errors come from
attngen.parse; target errors (memory, dtypes, what is not generated yet) from
attngen.check and attngen.lower with a profile.
"""

from __future__ import annotations

import dataclasses
import random
import re
import time

import pytest

import attngen
from attngen import SpecError
from attngen.api import check as _check


def check(spec, profile):
    """The checker's diagnostics for `spec` on a Profile (its target from the profile)."""
    return _check(spec, profile.target, profile)
from attngen.errors import Diagnostic
from attngen.api import decode_source
from attngen.api import lower as plan
from attngen.api import get_profile

FILE = "bad.attn"
HEADER = re.compile(r"^(?P<file>[^\n]+?):(?P<line>\d+):(?P<col>\d+): error: (?P<msg>.*)$")


def error_of(text, filename=FILE) -> SpecError:
    """The SpecError that parsing `text` raises (any other exception fails the test)."""
    with pytest.raises(SpecError) as info:
        attngen.parse(text, filename)
    err = info.value
    assert_well_formed(err, text if isinstance(text, str) else None)
    return err


def assert_well_formed(err: SpecError, text: str | None = None) -> None:
    """Every diagnostic prints as `file:line:col: error: ...`, the source line, then a caret
    under the column (the line cut to a window when it is long), then its hint if any."""
    assert isinstance(err, SpecError) and isinstance(err, ValueError)
    assert err.diagnostics
    assert str(err) == err.format()
    for d in err.diagnostics:
        lines = d.format().split("\n")
        assert d.span is not None, f"no position for: {d.message}"
        m = HEADER.match(lines[0])
        assert m, lines[0]
        assert (m["file"], int(m["line"]), int(m["col"])) == (d.span.filename, d.span.line, d.span.column)
        assert m["msg"] == d.message
        snippet, caret = lines[1], lines[2]
        assert snippet.startswith("    ")
        assert re.fullmatch(r"    *\^+", caret), caret
        assert len(snippet) <= 4 + 106  # long lines are cut to a window
        if text is not None:
            lines_of_text = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
            src = lines_of_text[d.span.line - 1]
            if len(src) <= 100 and d.span.column <= len(src):
                # the whole line is shown (one character for one), the caret under the span's start
                assert len(snippet) - 4 == len(src)
                assert caret.index("^") - 4 == d.span.column - 1
        if d.hint:
            assert lines[3] == f"  hint: {d.hint}"
        else:
            assert len(lines) == 3
    if len(err.diagnostics) > 1:
        assert str(err).endswith(f"\n{len(err.diagnostics)} errors")


def block(body: str, name: str = "k") -> str:
    return f"attention {name} {{\n{body}\n}}\n"


def body_error(body: str) -> Diagnostic:
    """The one diagnostic of a block holding a valid head_dim and dtype, then `body` (line 4)."""
    err = error_of(block(f"head_dim 64\ndtype f16\n{body}"))
    assert len(err.diagnostics) == 1, str(err)
    return err.diagnostics[0]


# -- unknown or misspelt keys and values: did you mean ------------------------------------

@pytest.mark.parametrize("line, wrong, hint", [
    ("mask caual", "caual", "did you mean 'causal'?"),
    ("mask Causal", "Causal", "did you mean 'causal'?"),
    ("mask widow(left=8)", "widow", "did you mean 'window'?"),
    ("mask windw", "windw", "did you mean 'window'?"),
    ("schedule fusd", "fusd", "did you mean 'fused'?"),
    ("schedule split_k(4)", "split_k", "did you mean 'split_kv'?"),
    ("schedule two_pas", "two_pas", "did you mean 'two_pass'?"),
    ("kv_cache contigous", "contigous", "did you mean 'contiguous'?"),
    ("kv_cache pagd(page=16)", "pagd", "did you mean 'paged'?"),
    ("shedule fused", "shedule", "did you mean 'schedule'?"),
    ("mak causal", "mak", "did you mean 'mask'?"),
    ("softcapp 30", "softcapp", "did you mean 'softcap'?"),
    ("kvcache contiguous", "kvcache", "did you mean 'kv_cache'?"),
    ("accumulate qk=f23", "f23", "did you mean 'f32'?"),
    ("accumulate qkk=f32 pv=f32", "qkk", "did you mean 'qk'?"),
    ("heads q=32 k=8", "k", "did you mean 'kv'?"),
    ("tile q=64 k=32", "k", "did you mean 'kv'?"),
    ("target cdua { warps=4 }", "cdua", "did you mean 'cuda'?"),
    ("target wgls", "wgls", "did you mean 'wgsl'?"),
    ("target cuda { wraps=4 }", "wraps", "did you mean 'warps'?"),
    ("target cuda { stage=2 }", "stage", "did you mean 'stages'?"),
    ("target wgsl { subgroup=on }", "subgroup", "did you mean 'subgroups'?"),
    ("target wgsl { workgroups=64 }", "workgroups", "did you mean 'workgroup'?"),
    ("target wgsl { subgroups=of }", "of", "did you mean 'off'?"),
])
def test_misspelt_words_get_did_you_mean(line, wrong, hint):
    d = body_error(line)
    assert wrong in d.message
    assert d.hint == hint
    assert d.span.line == 4
    assert d.span.column == line.index(wrong) + 1


def test_causal_alignment_misspelt():
    d = body_error("mask causal(bottom_rigth)")
    assert d.message == "causal takes one alignment: causal(bottom_right) or causal(top_left)"
    assert d.hint == "did you mean 'bottom_right'?"
    assert (d.span.line, d.span.column) == (4, 13)


@pytest.mark.parametrize("dtype, hint", [
    ("fp16", "f16"), ("half", "f16"), ("float16", "f16"), ("F16", "f16"), ("f61", "f16"),
    ("bfloat16", "bf16"), ("bf61", "bf16"), ("fp32", "f32"), ("float", "f32"), ("float32", "f32"),
    ("fp8", "e4m3"), ("float8_e4m3fn", "e4m3"), ("fp8_e5m2", "e5m2"), ("e4m4", "e4m3"),
])
def test_dtype_aliases_are_errors_with_the_right_name(dtype, hint):
    err = error_of(block(f"head_dim 64\ndtype {dtype}"))
    (d,) = err.diagnostics
    assert d.message == f"unknown dtype '{dtype}' (expected f16, bf16, f32, e4m3, e5m2)"
    assert d.hint == f"did you mean '{hint}'?"
    assert (d.span.line, d.span.column) == (3, 7)


def test_head_dm_suggests_head_dim_and_is_one_error():
    """One typo was two errors: the unknown key and the missing head_dim. The unknown key whose
    suggestion is the missing required key says it all."""
    err = error_of("attention llama {\n    head_dm 128\n    dtype f16\n}\n")
    msgs = [(d.span.line, d.message, d.hint) for d in err.diagnostics]
    assert msgs == [
        (2, "unknown key 'head_dm'", "did you mean 'head_dim'?"),
    ]
    text = str(err)
    assert "bad.attn:2:5: error: unknown key 'head_dm'\n        head_dm 128\n        ^^^^^^^\n" \
           "  hint: did you mean 'head_dim'?" in text


@pytest.mark.parametrize("body, expected", [
    # a typo of dtype: one error, as for head_dim
    ("head_dim 64\ndtyp f16", [(3, "unknown key 'dtyp'")]),
    # a typo of head_dim and no dtype: the typo, and dtype missing
    ("head_dm 64", [(1, "attention 'k' has no 'dtype' (it is required)"), (2, "unknown key 'head_dm'")]),
    # an unknown key close to nothing required: the missing key is still reported
    ("headz 64\ndtype f16", [(1, "attention 'k' has no 'head_dim' (it is required)"), (2, "unknown key 'headz'")]),
    # the close match given as well: the typo is still an error, nothing is missing
    ("head_dim 64\nhead_dm 64\ndtype f16", [(3, "unknown key 'head_dm'")]),
])
def test_a_typo_of_a_required_key_is_not_also_a_missing_key(body, expected):
    err = error_of(block(body, "k"))
    assert [(d.span.line, d.message) for d in err.diagnostics] == expected


def test_mask_caual_full_message():
    err = error_of("attention m {\n    head_dim 64\n    dtype f16\n    mask caual\n}\n", "m.attn")
    assert str(err) == (
        "m.attn:4:10: error: unknown mask 'caual' (expected none, causal, causal(bottom_right), window, custom)\n"
        "        mask caual\n"
        "             ^^^^^\n"
        "  hint: did you mean 'causal'?"
    )


def test_unknown_word_far_from_everything_lists_what_is_known():
    d = body_error("zebra 1")
    assert d.message == "unknown key 'zebra'"
    assert d.hint.startswith("known keys: head_dim, heads, dtype")
    d = body_error("mask zebra")
    assert "unknown mask 'zebra'" in d.message and d.hint.startswith("write: mask none | causal")


# -- required keys ------------------------------------------------------------------------

@pytest.mark.parametrize("body, missing", [
    ("dtype f16", ["head_dim"]),
    ("head_dim 64", ["dtype"]),
    ("mask causal", ["head_dim", "dtype"]),
    ("", ["head_dim", "dtype"]),
])
def test_missing_required_keys(body, missing):
    err = error_of(f"attention need {{\n{body}\n}}\n")
    # at the same position, diagnostics are ordered by message
    assert [d.message for d in err.diagnostics] == sorted(
        f"attention 'need' has no '{key}' (it is required)" for key in missing)
    for d in err.diagnostics:
        assert (d.span.line, d.span.column) == (1, 11)  # the kernel's name
        assert d.hint.startswith("add a line: ")


# -- sizes: zero, negative, not a multiple, too large, absurd --------------------------------

@pytest.mark.parametrize("line, message, hint", [
    ("head_dim 0", "'head_dim' must be at least 8, not 0", None),
    ("head_dim -8", "'head_dim' must be at least 8, not -8", None),
    ("head_dim 12", "'head_dim' must be a multiple of 8, not 12", "try 8 or 16"),
    ("head_dim 1032", "'head_dim' = 1032 is too large (at most 1024)", None),
    ("head_dim 64.0", "'head_dim' must be an integer, not '64.0'",
     "write: head_dim N  or  head_dim qk=N v=M  (multiples of 8, 8..1024)"),
    ("head_dim qk=0 v=64", "'head_dim.qk' must be at least 8, not 0", None),
    ("head_dim qk=64 v=-64", "'head_dim.v' must be at least 8, not -64", None),
    ("heads q=0 kv=1", "'heads.q' must be at least 1, not 0", None),
    ("heads q=8 kv=-2", "'heads.kv' must be at least 1, not -2", None),
    ("heads 0", "'heads' must be at least 1, not 0", None),
    ("heads q=65536", "'heads.q' = 65536 is too large (at most 65535)", None),
    ("tile q=0", "'tile.q' must be at least 1, not 0", None),
    ("tile kv=-64", "'tile.kv' must be at least 1, not -64", None),
    ("tile d=0", "'tile.d' must be at least 8, not 0", None),
    ("tile q=2048", "'tile.q' = 2048 is too large (at most 1024)", None),
    ("schedule split_kv(0)", "'schedule' must be at least 1, not 0", None),
    ("schedule split_kv(-3)", "'schedule' must be at least 1, not -3", None),
    ("kv_cache paged(page=0)", "'kv_cache.page' must be at least 1, not 0", None),
    ("mask window(left=-1)", "'window.left' must be at least 0, not -1", None),
    ("mask window(left=4, right=-1)", "'window.right' must be at least 0, not -1", None),
    ("target cuda { warps=0 }", "'target.warps' must be at least 1, not 0", None),
    ("target cuda { stages=9 }", "'target.stages' = 9 is too large (at most 8)", None),
    ("target wgsl { workgroup=0 }", "'target.workgroup' must be at least 1, not 0", None),
])
def test_bad_sizes(line, message, hint):
    body = line if line.startswith("head_dim") else f"head_dim 64\ndtype f16\n{line}"
    if line.startswith("head_dim"):
        body += "\ndtype f16"
    err = error_of(block(body))
    (d,) = err.diagnostics
    assert d.message == message
    assert d.hint == hint


@pytest.mark.parametrize("key", ["head_dim {n}", "heads q={n}", "heads q=8 kv={n}", "tile q={n}", "tile kv={n}",
                                 "mask window(left={n})", "mask window(left=1, right={n})",
                                 "schedule split_kv({n})", "kv_cache paged(page={n})",
                                 "target cuda {{ warps={n} }}", "target wgsl {{ workgroup={n} }}"])
@pytest.mark.parametrize("n", [str(10**40), str(2**31), str(2**64), "9" * 5000, "1" + "0" * 5000],
                         ids=["1e40", "2^31", "2^64", "5000nines", "5001digits"])
def test_absurdly_large_integers(key, n):
    line = key.format(n=n)
    body = f"{line}\ndtype f16" if key.startswith("head_dim") else f"head_dim 64\ndtype f16\n{line}"
    err = error_of(block(body))
    (d,) = err.diagnostics
    assert "is too large (at most " in d.message
    assert len(d.message) < 200  # the number is quoted cut short
    assert len(str(err)) < 600


def test_huge_negative_integer_is_too_small_not_too_large():
    err = error_of(block("head_dim 64\ndtype f16\nmask window(left=-" + "9" * 5000 + ")"))
    (d,) = err.diagnostics
    assert d.message == "'window.left' must be at least 0, not -9999999999999999999..."


def test_leading_zeros_do_not_make_a_number_large():
    (s,) = attngen.parse(block("head_dim " + "0" * 5000 + "64\ndtype f16"))
    assert s.head_dim_qk == 64


def test_long_line_snippet_is_cut_around_the_caret():
    text = block("head_dim 64\ndtype f16\nscale " + "1" * 5000 + ".5")
    err = error_of(text)
    (d,) = err.diagnostics
    assert d.message == "'scale' must be a positive finite number, not 11111111111111111111..."
    lines = str(err).split("\n")
    assert lines[1].startswith("    scale 1111") and lines[1].endswith("...")
    assert lines[2].index("^") == lines[1].index("1")


# -- scale and softcap --------------------------------------------------------------------

@pytest.mark.parametrize("key", ["scale", "softcap"])
@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "Infinity", "1e999", "-1e999", "0", "0.0", "-0.0", "-1",
                                   "-2.5", "1e-400", "+0"])
def test_non_finite_or_non_positive_scale_and_softcap(key, value):
    d = body_error(f"{key} {value}")
    assert d.message.startswith(f"'{key}' must be a positive finite number, not ")
    assert value in d.message
    assert (d.span.line, d.span.column) == (4, len(key) + 2)


@pytest.mark.parametrize("key", ["scale", "softcap"])
@pytest.mark.parametrize("value", ["1e300", "1.7976931348623157e308", "3.5e38", "1e13", "1e-13", "5e-324",
                                   "1" * 400])
def test_scale_and_softcap_outside_what_an_f32_constant_holds(key, value):
    d = body_error(f"{key} {value}")
    assert d.message.startswith(f"'{key}' = {value[:20]}")
    assert d.message.endswith("is out of range (1e-12 to 1e+12: the kernels hold it in f32)")


def test_extreme_scale_and_softcap_together_still_emit():
    """At the ends of the range, scale / softcap and the rest are finite f32 constants."""
    from attngen.api import emit_plan
    for scale, cap in [("1e12", "1e-12"), ("1e-12", "1e12")]:
        (s,) = attngen.parse(block(f"head_dim 64\ndtype f32\nscale {scale}\nsoftcap {cap}"))
        for target, profile in [("cuda", "cuda-sm80"), ("wgsl", "webgpu-core")]:
            assert "attngen_k" in emit_plan(plan(s, target, profile)).source


@pytest.mark.parametrize("key", ["scale", "softcap"])
def test_minus_inf_is_not_a_number(key):
    d = body_error(f"{key} -inf")
    assert d.message == "unexpected character '-'"
    assert d.hint is None  # not the hint about names: '-' does not follow a name here
    assert (d.span.line, d.span.column) == (4, len(key) + 2)


@pytest.mark.parametrize("line, message", [
    ("scale", "missing value for 'scale'"),
    ("softcap", "missing value for 'softcap'"),
    ("scale 1 2", "too many values for 'scale'"),
    ("softcap auto", "'softcap' must be a positive finite number, not 'auto'"),
    ("scale none", "'scale' must be a positive finite number, not 'none'"),
    ("scale x=1", "'scale' must be a positive finite number, not 'x=1'"),
])
def test_scale_and_softcap_forms(line, message):
    assert body_error(line).message == message


# -- duplicates -----------------------------------------------------------------------------

def test_duplicate_key():
    err = error_of("attention d {\n    head_dim 64\n    dtype f16\n    mask causal\n    mask none\n}\n")
    (d,) = err.diagnostics
    assert d.message == "duplicate key 'mask' (first set on line 4)"
    assert (d.span.line, d.span.column) == (5, 5)
    assert d.hint == "remove one of them"


def test_duplicate_target_block_and_option():
    err = error_of(block("head_dim 64\ndtype f16\ntarget cuda { warps=4 }\ntarget cuda { stages=2 }\n"
                         "heads q=8 q=8"))
    assert [d.message for d in err.diagnostics] == [
        "duplicate 'target cuda' block (first on line 4)",
        "'heads' option 'q' given twice",
    ]


def test_duplicate_kernel_names():
    text = block("head_dim 64\ndtype f16", "same") + "\n" + block("head_dim 32\ndtype f32", "same")
    err = error_of(text)
    (d,) = err.diagnostics
    assert d.message == "duplicate kernel name 'same' (first on line 1)"
    assert (d.span.line, d.span.column) == (6, 11)
    assert d.hint == "each attention block needs its own name"


# -- heads ------------------------------------------------------------------------------------

@pytest.mark.parametrize("q, kv, near", [(32, 6, "4 or 8"), (28, 8, "4 or 7"), (12, 5, "4 or 6"), (8, 16, "4 or 8")])
def test_heads_q_not_divisible_by_kv(q, kv, near):
    d = body_error(f"heads q={q} kv={kv}")
    assert d.message == (f"heads q={q} is not a multiple of kv={kv} (each KV head serves a whole group "
                         "of query heads)")
    assert d.hint == f"kv must divide {q}, e.g. {near}"
    assert d.span.column == len(f"heads q={q} ") + 1  # points at kv=


# -- structure: braces, empty files, stray words -------------------------------------------

def test_missing_closing_brace_at_end_of_file():
    err = error_of("attention a {\n    head_dim 64\n    dtype f16\n")
    (d,) = err.diagnostics
    assert d.message.startswith("unexpected end of file; expected '}'")
    assert d.hint == "a block opened with '{' is not closed with '}'"
    assert (d.span.line, d.span.column) == (3, 14)  # just after the last text


def test_missing_closing_brace_of_a_target_block():
    err = error_of(block("head_dim 64\ndtype f16\ntarget cuda { warps=4").rstrip("}\n"))
    assert "unexpected end of file" in err.diagnostics[0].message
    assert err.diagnostics[0].hint == "a block opened with '{' is not closed with '}'"


def test_missing_closing_brace_before_the_next_block():
    text = ("attention a {\n    head_dim 64\n    dtype f16\n\n"
            "attention b {\n    head_dim 64\n    dtype f16\n}\n")
    err = error_of(text)
    (d,) = err.diagnostics
    assert d.span.line == 6
    assert d.hint == "the block before line 5 is not closed: is a '}' missing there?"


def test_extra_closing_brace():
    err = error_of(block("head_dim 64\ndtype f16") + "}\n")
    (d,) = err.diagnostics
    assert d.message == "unexpected '}'; expected 'attention'"
    assert (d.span.line, d.span.column) == (5, 1)
    assert d.hint == "this '}' closes no block: is there one '}' too many?"


def test_extra_closing_brace_inside_a_block():
    err = error_of("attention a {\n    head_dim 64\n    dtype f16 }\n}\n")
    (d,) = err.diagnostics
    assert d.span.line == 4 and "'}'" in d.message


@pytest.mark.parametrize("text, line, col, message", [
    ("attention a\n    head_dim 64\n    dtype f16\n}\n", 1, 12, "unexpected end of line; expected '{'"),
    ("attention {\n}\n", 1, 11, "unexpected '{'; expected a name"),
    ("attention a {\n  head_dim 64\n  dtype f16\n  mask window(left=4\n}\n", 4, 21,
     "unexpected end of line; expected ')' or ','"),
    ("attention a {\n  head_dim 64\n  dtype f16\n  mask window left=4)\n}\n", 4, 21, "unexpected ')'"),
    ("attention a {\n  head_dim = 64\n}\n", 2, 12, "unexpected '='"),
    ("head_dim 64\n", 1, 1, "unexpected 'head_dim'; expected 'attention'"),
    ("attention a { head_dim 64 dtype f16 }\n", None, None, "'dtype' starts another setting"),
])
def test_syntax_errors(text, line, col, message):
    err = error_of(text)
    d = err.diagnostics[-1] if line is None else err.diagnostics[0]
    assert message in d.message
    if line is not None:
        assert (d.span.line, d.span.column) == (line, col)


def test_commas_between_target_options_get_a_hint():
    err = error_of(block("head_dim 64\ndtype f16\ntarget cuda { warps=4, stages=2 }"))
    (d,) = err.diagnostics
    assert d.hint == "separate a target's options with spaces, not commas"


def test_one_setting_per_line():
    (d,) = error_of(block("head_dim 64\ndtype f16 mask causal")).diagnostics
    assert d.message == "'mask' starts another setting on the line of 'dtype'"
    assert d.hint == "put one setting per line"


@pytest.mark.parametrize("line, message", [
    ("mask { }", "'mask' takes no { } block"),
    ("dtype f16 f32", "too many values for 'dtype'"),
    ("mask causal window(left=1)", "too many values for 'mask'"),
    ("head_dim", "missing value for 'head_dim'"),
    ("heads", "missing value for 'heads'"),
    ("tile", "missing value for 'tile'"),
    ("accumulate", "missing value for 'accumulate'"),
    ("target", "expected a target name (cuda or wgsl) for 'target'"),
    ("mask window", "window needs its size"),
    ("mask window()", "'mask' needs left="),
    ("mask window(right=4)", "'mask' needs left="),
    ("mask window(4)", "unexpected '4' for 'mask'"),
    ("mask causal()", "causal takes one alignment"),
    ("schedule split_kv", "split_kv needs its number of splits"),
    ("schedule split_kv(1, 2)", "split_kv takes one argument"),
    ("kv_cache paged", "paged needs its page size"),
    ("kv_cache paged()", "'kv_cache' needs page="),
    ("kv_cache paged(16)", "unexpected '16' for 'kv_cache'"),
    ("head_dim qk=64", "'head_dim' needs v="),
    ("heads kv=8", "'heads' needs q="),
    ("target wgsl { warps=4 }", "unknown option 'warps' for 'target' (expected workgroup, subgroups, f16, prefetch, decode, matrix)"),
    ("target metal", "unknown target 'metal' (expected cuda, wgsl)"),
    ("target wgsl { subgroups=maybe }", "unknown subgroups mode 'maybe' (expected auto, on, off)"),
])
def test_malformed_values(line, message):
    if line.startswith("head_dim"):
        body, at = f"{line}\ndtype f16", 2
    elif line.startswith("dtype"):
        body, at = f"head_dim 64\n{line}", 3
    else:
        body, at = f"head_dim 64\ndtype f16\n{line}", 4
    err = error_of(block(body))
    (d,) = err.diagnostics
    assert message in d.message
    assert d.span.line == at


@pytest.mark.parametrize("text", ["", "\n", "   \n\t\n", "\r\n\r\n", "# only a comment", "# one\n# two\n\n# three\n"])
def test_empty_file_and_only_comments(text):
    err = error_of(text)
    (d,) = err.diagnostics
    assert d.message == "the file defines no attention kernel"
    assert (d.span.line, d.span.column) == (1, 1)
    assert d.hint == "a spec file holds one or more `attention NAME { ... }` blocks"


# -- binary garbage -------------------------------------------------------------------------

def test_nul_bytes():
    with pytest.raises(SpecError) as info:
        decode_source(b"attention a {\n  head_dim 64\x00\n}\n", "bin.attn")
    (d,) = info.value.diagnostics
    assert d.message == "the file contains a NUL byte (is it binary?)"
    assert (d.span.filename, d.span.line, d.span.column) == ("bin.attn", 2, 14)
    assert_well_formed(info.value)
    # a NUL in str text is a syntax error, shown as '?'
    err = error_of("attention a {\x00}")
    assert "U+0000" in err.diagnostics[0].message
    assert "attention a {?}" in str(err)


@pytest.mark.parametrize("data, line, col, byte", [
    (b"\xff\xfe", 1, 1, "0xff"),
    (b"attention a {\n  dtype \xe9\n}\n", 2, 9, "0xe9"),
    (b"# caf\xc3\xa9 ok\n\x80", 2, 1, "0x80"),
    (b"attention \xc3", 1, 11, "0xc3"),
])
def test_invalid_utf8(data, line, col, byte):
    with pytest.raises(SpecError) as info:
        decode_source(data, "bin.attn")
    (d,) = info.value.diagnostics
    assert d.message.startswith(f"the file is not UTF-8 text (byte {byte} at offset ")
    assert (d.span.line, d.span.column) == (line, col)
    assert d.hint == "spec files are plain text"
    assert_well_formed(info.value)
    # attngen.parse accepts bytes and says the same
    with pytest.raises(SpecError, match="not UTF-8 text"):
        attngen.parse(data, "bin.attn")


@pytest.mark.parametrize("seed", range(40))
def test_random_bytes_through_decode_source(seed):
    rng = random.Random(seed)
    data = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 400)))
    with pytest.raises(SpecError) as info:
        attngen.parse(decode_source(data, "rand.bin"), "rand.bin")
    assert_well_formed(info.value)


@pytest.mark.parametrize("seed", range(20))
def test_random_bytes_spliced_into_a_valid_spec(seed):
    rng = random.Random(seed)
    good = block("head_dim 64\ndtype f16\nmask causal").encode()
    at = rng.randrange(len(good))
    data = good[:at] + bytes(rng.randrange(256) for _ in range(rng.randrange(1, 8))) + good[at:]
    try:
        specs = attngen.parse(decode_source(data, "splice.attn"), "splice.attn")
    except SpecError as err:
        assert_well_formed(err)
    else:
        assert len(specs) == 1  # the bytes happened to be harmless (e.g. spaces in a comment)


@pytest.mark.parametrize("odd", ["\f", "\x0b", "\u2028", "\x1c", "\x85"])
def test_snippet_shows_the_line_the_parser_counted(odd):
    """Form feeds and other characters str.splitlines breaks at are not line breaks here."""
    text = f"attention a {{ # {odd} comment\n  head_dim 64\n  dtype f1\n}}\n"
    err = error_of(text)
    (d,) = err.diagnostics
    assert (d.span.line, d.span.column) == (3, 9)
    assert str(err).split("\n")[1:3] == ["      dtype f1", "            ^^"]


def test_lone_carriage_returns_end_lines_like_newlines():
    """Classic Mac line endings read as line breaks; error positions count lines the same way."""
    (spec,) = attngen.parse("attention a {\rhead_dim 64\rdtype f16\r}\r")
    assert spec == attngen.parse("attention a {\nhead_dim 64\ndtype f16\n}\n")[0]
    err = error_of("attention a {\rhead_dim 64\rdtype f1\r}\r")
    (d,) = err.diagnostics
    assert (d.span.line, d.span.column) == (3, 7)
    assert str(err).split("\n")[1:3] == ["    dtype f1", "          ^^"]


def test_control_characters_are_shown_as_question_marks():
    err = error_of("attention a {\n  head_dim 64\x07\n}\n")
    assert "U+0007" in err.diagnostics[0].message
    assert "head_dim 64?" in str(err)


# -- names ------------------------------------------------------------------------------------

@pytest.mark.parametrize("head, col, hint", [
    ("attention foo-bar {", 14, "names are ASCII letters, digits and '_', starting with a letter or '_'"),
    ("attention 9x {", 11, "names are ASCII letters, digits and '_', starting with a letter or '_'"),
    ("attention héllo {", 12, "names are ASCII letters, digits and '_', starting with a letter or '_'"),
    ("attention 注意 {", 11, "names are ASCII letters, digits and '_', starting with a letter or '_'"),
    ("attention x*/ {", 12, None),
    ("attention x */ {", 13, None),
    ("attention a.b {", 12, "names are ASCII letters, digits and '_', starting with a letter or '_'"),
    ("attention x\"; int y; {", 12, None),
    ("attention x` {", 12, None),
    ("attention x\\ {", 12, None),
])
def test_names_that_are_not_identifiers(head, col, hint):
    err = error_of(f"{head}\n    head_dim 64\n    dtype f16\n}}\n")
    (d,) = err.diagnostics
    assert (d.span.line, d.span.column) == (1, col)
    assert d.hint == hint
    assert d.message.startswith("unexpected")


def test_names_that_would_collide_with_reserved_identifiers():
    err = error_of(block("head_dim 64\ndtype f16", "__global__"))
    assert err.diagnostics[0].message == "kernel names may not start with '__' (reserved in C++ and WGSL)"
    err = error_of(block("head_dim 64\ndtype f16", "n" * 65))
    assert err.diagnostics[0].message == "kernel name is 65 characters long (at most 64)"


# -- every error at once, sorted by position ------------------------------------------------

MANY = """\
attention one {
    head_dim 12
    dtype    fp16
    mask     caual
}

attention two {
    head_dim 64
    dtype    f16
    heads    q=32 kv=6
    shedule  fused
    scale    -1
    softcap  nan
}
"""


def test_every_error_in_the_file_at_once_sorted_by_position():
    err = error_of(MANY, "many.attn")
    got = [(d.span.line, d.span.column, d.message.split(" (")[0], d.hint) for d in err.diagnostics]
    assert got == [
        (2, 14, "'head_dim' must be a multiple of 8, not 12", "try 8 or 16"),
        (3, 14, "unknown dtype 'fp16'", "did you mean 'f16'?"),
        (4, 14, "unknown mask 'caual'", "did you mean 'causal'?"),
        (10, 19, "heads q=32 is not a multiple of kv=6", "kv must divide 32, e.g. 4 or 8"),
        (11, 5, "unknown key 'shedule'", "did you mean 'schedule'?"),
        (12, 14, "'scale' must be a positive finite number, not -1", None),
        (13, 14, "'softcap' must be a positive finite number, not 'nan'",
         "write: softcap C  (a positive number) or softcap none"),
    ]
    text = str(err)
    positions = [text.index(f"many.attn:{line}:{col}:") for line, col, _, _ in got]
    assert positions == sorted(positions)
    assert text.endswith("\n7 errors")


def test_errors_of_blocks_are_reported_in_file_order_even_with_equal_columns():
    text = block("dtype f16", "b") + block("head_dim 64", "a")
    err = error_of(text)
    assert [(d.span.line, d.message) for d in err.diagnostics] == [
        (1, "attention 'b' has no 'head_dim' (it is required)"),
        (4, "attention 'a' has no 'dtype' (it is required)"),
    ]


# -- accumulate f16 ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("acc", ["f16", "qk=f16", "pv=f16", "qk=f16 pv=f16", "qk=f32 pv=f16"])
def test_accumulate_f16_needs_dtype_f16(dtype, acc):
    err = error_of(block(f"head_dim 64\ndtype {dtype}\naccumulate {acc}"))
    (d,) = err.diagnostics
    assert d.message.startswith(f"accumulate f16 needs dtype f16 (this kernel stores {dtype}")
    assert d.hint == "use accumulate qk=f32 pv=f32"
    assert (d.span.line, d.span.column) == (4, 1)


# -- target checks: through attngen.check and attngen.lower --------------------------------

def spec_of(body: str, name: str = "k"):
    (s,) = attngen.parse(block(body), "t.attn")
    return s


def target_errors(spec, target, profile) -> list[Diagnostic]:
    diags = check(spec, get_profile(profile, target))
    with pytest.raises(SpecError) as info:
        plan(spec, target, profile)
    assert list(info.value.diagnostics) == diags  # plan reports exactly what check found
    assert_well_formed(info.value)
    return diags


def test_cuda_tiles_that_do_not_fit_shared_memory_state_bytes_and_limit():
    s = spec_of("head_dim 256\ndtype f32\ntile q=128 kv=128")
    (d,) = target_errors(s, "cuda", "cuda-sm80")
    limit = get_profile("cuda-sm80", "cuda").limit("shared_memory_bytes")
    # f32 runs on CUDA cores: Q, K, V rows of 256 + 4 padding floats, and a 128 x (128 + 4) P tile
    needed = 3 * 128 * (256 + 4) * 4 + 128 * (128 + 4) * 4
    assert needed == 466944 and limit == 166912
    assert d.message.startswith("target cuda (profile cuda-sm80): tile q=128 kv=128")
    assert f"needs {needed} bytes of shared memory" in d.message
    assert f"cuda-sm80 allows {limit}" in d.message
    assert "sQ 128x260 f32" in d.message
    assert (d.span.line, d.span.column) == (4, 1)  # the tile line
    assert "smaller tile" in d.hint


def test_cuda_memory_error_on_sm90_names_its_own_limit():
    s = spec_of("head_dim 256\ndtype f32\ntile q=128 kv=128")
    (d,) = target_errors(s, "cuda", "cuda-sm90")
    assert "needs 466944 bytes of shared memory" in d.message and "cuda-sm90 allows 232448" in d.message


def test_cuda_register_limit_is_an_error_too():
    s = spec_of("head_dim 128\ndtype f16\ntile q=64 kv=256\ntarget cuda { stages=1 }")
    (d,) = target_errors(s, "cuda", "cuda-sm80")
    # the accumulator (128 / 2), the scores (256 x 3 / 2), Q fragments (128 / 4) and 48 more
    assert "tile q=64 kv=256 on 4 warps with head_dim v=128 needs about 528 registers per thread" in d.message
    assert "128 threads may use at most 255 each" in d.message
    assert d.span.line == 4


def test_cuda_register_estimate_may_spill_a_little_when_the_spec_chooses():
    """A user-chosen tile that spills a few registers is slower, not wrong: it is accepted."""
    s = spec_of("head_dim 128\ndtype f16\ntile q=128 kv=64\ntarget cuda { warps=4 }")
    assert check(s, get_profile("cuda-sm90", "cuda")) == []
    p = plan(s, "cuda", "cuda-sm90")
    assert p.config.registers_estimate > p.config.registers_cap  # shown by attngen build --emit ir


@pytest.mark.parametrize("profile, limit", [("webgpu-core", 16384), ("wgpu-software", 32768),
                                            ("wgpu-vulkan-nvidia", 49152)])
def test_wgsl_tiles_that_do_not_fit_workgroup_memory(profile, limit):
    # tile d given: the planner may not chunk the head dim further (the register-tiled kernel
    # streams K, then V, through one buffer sKV of kv x d)
    s = spec_of("head_dim 128\ndtype f32\ntile q=16 kv=128 d=128\ntarget wgsl { subgroups=off }")
    (d,) = target_errors(s, "wgsl", profile)
    m = re.search(r"needs (\d+) bytes of workgroup memory \((.*)\), but (\S+) allows (\d+)", d.message)
    assert m, d.message
    assert (m[3], int(m[4])) == (profile, limit)
    assert int(m[1]) > limit
    # sKV: 128 rows of 128 f32, at least
    assert int(m[1]) >= 128 * 128 * 4
    assert d.hint == "use a smaller tile d or tile kv"


def test_wgsl_webgpu_core_f16_memory_message():
    # tile d given (else the planner chunks the head dim until it fits)
    s = spec_of("head_dim 128\ndtype f16\ntile q=16 kv=64 d=128\ntarget wgsl { f16=native }")
    (d,) = target_errors(s, "wgsl", "webgpu-core")
    assert d.message.startswith("target wgsl (profile webgpu-core): tile q=16 kv=64 d=128 with head_dim qk=128 "
                                "v=128 needs ")
    assert "sQ 16x128 f16 + sKV 64x128 f16" in d.message
    packed = spec_of("head_dim 128\ndtype f16\ntile q=16 kv=64 d=128")  # webgpu-core's default: f32 tiles
    (d,) = target_errors(packed, "wgsl", "webgpu-core")
    assert "sQ 16x128 f32 + sKV 64x128 f32" in d.message
    assert d.message.endswith("but webgpu-core allows 16384")


def test_cuda_tile_q_and_warps_must_agree():
    """Each warp owns 16 or 32 rows of Q: tile q=128 on 4 warps (the design example's) is fine,
    on 2 warps (64 rows each) it is not."""
    ok = spec_of("head_dim 128\ndtype f16\ntile q=128 kv=64\ntarget cuda { warps=4 stages=2 }")
    assert check(ok, get_profile("cuda-sm80", "cuda")) == []
    s = spec_of("head_dim 128\ndtype f16\ntile q=128 kv=64\ntarget cuda { warps=2 stages=2 }")
    (d,) = target_errors(s, "cuda", "cuda-sm80")
    assert "tile q=128 over warps=2 gives 64 rows per warp; each warp owns 16 or 32 rows of Q" in d.message
    assert d.hint == "use warps=8 or warps=4"
    assert d.span.line == 5  # the target cuda line


@pytest.mark.parametrize("line", ["mask custom", "kv_cache paged(page=16)", "schedule split_kv(4)",
                                  "schedule split_kv(auto)", "schedule two_pass"])
@pytest.mark.parametrize("target, profile", [("cuda", "cuda-sm80"), ("cuda", "cuda-sm90"), ("wgsl", "webgpu-core"),
                                             ("wgsl", "wgpu-vulkan-nvidia")])
def test_variants_are_generated(line, target, profile):
    """Issue 3's variants (docs/variants.md) build on both targets."""
    assert check(spec_of(f"head_dim 64\ndtype f16\n{line}"), get_profile(profile, target)) == []


@pytest.mark.parametrize("profile", ["cuda-sm80", "cuda-sm90"])
@pytest.mark.parametrize("body", ["head_dim 512\ndtype f16", "head_dim qk=576 v=512\ndtype bf16",
                                  "head_dim 320\ndtype f16\ntile d=64", "head_dim 64\ndtype f32\ntile d=16"])
def test_cuda_two_pass_with_head_dim_chunks_is_generated(body, profile):
    """two_pass streams head dims in chunks like the other schedules (tests/backends/cuda/test_head_dims.py)."""
    assert check(spec_of(f"{body}\nschedule two_pass"), get_profile(profile, "cuda")) == []


def test_all_target_errors_at_once_sorted():
    # webgpu-core without its optional features: subgroups=on is refused as well
    bare = dataclasses.replace(get_profile("webgpu-core", "wgsl"), features={"guaranteed": [], "optional": []})
    s = spec_of("head_dim 512\ndtype bf16\nmask custom\nkv_cache paged(page=16)\nschedule two_pass\ntile d=64\n"
                "target wgsl { subgroups=on }")
    diags = check(s, bare)
    with pytest.raises(SpecError) as info:
        plan(s, "wgsl", bare)
    assert list(info.value.diagnostics) == diags
    assert [d.span.line for d in diags] == [3, 8]  # dtype; the target wgsl line
    assert "WGSL has no bf16" in diags[0].message
    assert "subgroups=on" in diags[1].message
    # mask custom with two_pass over a paged cache and head dim chunks is generated (no error of its own)
    assert not any("mask custom" in d.message or "two_pass" in d.message for d in diags)
    ok = spec_of("head_dim 512\ndtype f32\nmask custom\nkv_cache paged(page=16)\nschedule two_pass\ntile d=64")
    assert check(ok, get_profile("webgpu-core", "wgsl")) == []


@pytest.mark.parametrize("profile", ["webgpu-core", "wgpu-software", "wgpu-vulkan-nvidia"])
def test_bf16_on_wgsl_says_wgsl_has_no_bf16(profile):
    s = spec_of("head_dim 64\ndtype bf16\nmask causal")
    (d,) = target_errors(s, "wgsl", profile)
    assert d.message == f"target wgsl (profile {profile}): dtype bf16 is not available: WGSL has no bf16 type"
    assert "use dtype f16" in d.hint
    assert d.span.line == 3
    # the same spec builds for cuda
    assert check(s, get_profile("cuda-sm80", "cuda")) == []


def test_bf16_examples_build_for_cuda_and_are_refused_for_wgsl_with_the_reason():
    specs = attngen.parse(open("examples/gemma2_9b.attn", encoding="utf-8").read(), "examples/gemma2_9b.attn")
    for s in specs:
        assert check(s, get_profile("cuda-sm90", "cuda")) == []
        (d,) = check(s, get_profile("webgpu-core", "wgsl"))
        assert "WGSL has no bf16" in d.message
        assert d.span.filename == "examples/gemma2_9b.attn"


def test_f16_on_a_wgsl_profile_without_shader_f16():
    """f16 storage is packed in u32 words there (no feature needed); what needs f16 arithmetic or
    the native f16 type is refused, naming the profile and the reason."""
    prof = get_profile("webgpu-core", "wgsl").narrowed(name="no-f16", features={"optional": ["subgroups"]})
    assert check(spec_of("head_dim 64\ndtype f16"), prof) == []
    (d,) = check(spec_of("head_dim 64\ndtype f16\ntarget wgsl { f16=native }"), prof)
    assert d.message == ("target wgsl (profile no-f16): f16=native needs the shader-f16 feature, which this "
                         "profile does not offer")
    assert d.hint == "use f16=packed (or auto): f16 in u32 words"
    (d,) = check(spec_of("head_dim 64\ndtype f16\naccumulate qk=f16"), prof)
    assert "accumulate f16 needs the shader-f16 feature (f16 arithmetic)" in d.message
    assert check(spec_of("head_dim 64\ndtype f32"), prof) == []


def test_subgroups_on_without_the_feature():
    prof = get_profile("webgpu-core", "wgsl").narrowed(name="no-sg", features={"optional": ["shader-f16"]})
    s = spec_of("head_dim 64\ndtype f32\ntarget wgsl { subgroups=on }")
    (d,) = check(s, prof)
    assert "subgroups=on, but this profile has no subgroups feature" in d.message
    assert d.span.line == 4


def test_wgsl_workgroup_not_a_multiple_of_tile_q():
    s = spec_of("head_dim 64\ndtype f32\ntile q=16\ntarget wgsl { workgroup=40 }")
    (d,) = target_errors(s, "wgsl", "webgpu-core")
    assert "workgroup=40 is not a multiple of tile q=16" in d.message
    assert d.span.line == 5


@pytest.mark.parametrize("head_dim", ["136", "qk=8 v=136", "qk=200 v=24", "8"])
@pytest.mark.parametrize("profile", ["webgpu-core", "wgpu-software", "wgpu-vulkan-nvidia"])
def test_wgsl_auto_invocations_per_row_divide_every_head_dim(head_dim, profile):
    """With workgroup=auto the planner picks invocations per row that divide the head dims
    (wgpu-vulkan-nvidia's default of 16 does not divide 136 or 8)."""
    s = spec_of(f"head_dim {head_dim}\ndtype f16")
    assert check(s, get_profile(profile, "wgsl")) == []
    c = plan(s, "wgsl", profile).config
    assert s.head_dim_qk % c.threads_per_row == 0 and s.head_dim_v % c.threads_per_row == 0


def test_wgsl_explicit_workgroup_that_does_not_divide_the_head_dim_is_an_error():
    s = spec_of("head_dim 136\ndtype f16\ntile q=16\ntarget wgsl { workgroup=256 }")
    (d,) = target_errors(s, "wgsl", "wgpu-vulkan-nvidia")
    assert "16 invocations per row of Q do not divide head dim v=136" in d.message
    assert d.span.line == 5


def test_valid_specs_have_no_target_errors():
    s = spec_of("head_dim 128\ndtype f16\nheads q=32 kv=8\nmask causal")
    for target, profile in [("cuda", "cuda-sm80"), ("cuda", "cuda-sm90"), ("wgsl", "webgpu-core"),
                            ("wgsl", "wgpu-software"), ("wgsl", "wgpu-vulkan-nvidia")]:
        assert check(s, get_profile(profile, target)) == []
        assert plan(s, target, profile).smem_bytes > 0


# -- performance -----------------------------------------------------------------------------

def best_of(n, fn):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def test_a_large_file_of_comments_parses_fast():
    text = "".join(f"# comment line {i}: nothing to see here\n" for i in range(200_000))
    text += block("head_dim 64\ndtype f16")
    assert text.count("\n") > 200_000
    specs = []
    elapsed = best_of(3, lambda: specs.append(attngen.parse(text, "big.attn")))
    assert elapsed < 1.0, f"{elapsed:.2f} s for 200,000 comment lines"
    assert specs[0][0].span("name").line == 200_001


def test_a_file_of_only_comments_fails_fast():
    text = "# nothing\n" * 200_000

    def run():
        with pytest.raises(SpecError, match="defines no attention kernel"):
            attngen.parse(text)

    assert best_of(3, run) < 1.0


def test_comments_and_blank_lines_inside_a_block_and_crlf_are_fast():
    text = "attention a {\r\n" + "    # inside\r\n\r\n" * 100_000 + "head_dim 64\r\ndtype f16\r\n}\r\n"
    assert best_of(3, lambda: attngen.parse(text)) < 1.0


def test_many_errors_format_fast():
    text = "".join(block("head_dim 12\ndtype fp16", f"k{i}") for i in range(1000))
    t0 = time.perf_counter()
    err = error_of(text)
    assert len(err.diagnostics) == 2000
    assert [d.span.line for d in err.diagnostics] == sorted(d.span.line for d in err.diagnostics)
    assert time.perf_counter() - t0 < 5.0


def test_a_block_with_a_bad_name_still_reports_its_other_errors():
    text = ("attention a {\n head_dim 64\n dtype f16\n}\n"
            "attention a {\n head_dim 63\n dtype f16\n}\n")
    with pytest.raises(SpecError) as info:
        attngen.parse(text, "dup.attn")
    messages = [d.message for d in info.value.diagnostics]
    assert any("duplicate kernel name 'a'" in m for m in messages)
    assert any("multiple of 8" in m for m in messages)


def test_a_target_name_followed_by_a_word_asks_for_an_option_block():
    """`target cuda auto` said "expected a target name (cuda or wgsl)", though the name was there."""
    with pytest.raises(attngen.SpecError) as info:
        attngen.parse("attention t {\n head_dim 64\n dtype f16\n target cuda auto\n}\n")
    (d,) = info.value.diagnostics
    assert "expected an option block after 'target cuda'" in d.message and (d.span.line, d.span.column) == (4, 14)


def test_an_unknown_target_name_is_named_even_with_more_words():
    with pytest.raises(attngen.SpecError) as info:
        attngen.parse("attention t {\n head_dim 64\n dtype f16\n target nope auto\n}\n")
    (d,) = info.value.diagnostics
    assert "unknown target 'nope'" in d.message
