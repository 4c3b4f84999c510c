"""The spec language: every form the design example shows parses, defaults, round trips, spans, names."""

from __future__ import annotations

import glob
import math
import os
import re

import pytest

import attngen
from attngen import AttentionSpec, SpecError, format_spec
from attngen.api import decode_source, parse_collect
from attngen.lang.spec import KVCache, Mask, Schedule, Tile


from conftest import DESIGN_EXAMPLE, ROOT


# What a spec keeps of `target cuda { ... }` / `target wgsl { ... }` (spec.options(target)):
# the options given, those left at auto absent.
def CudaOptions(warps=None, stages=None):
    return {k: v for k, v in (("warps", warps), ("stages", stages)) if v is not None}


def WgslOptions(workgroup=None, subgroups="auto"):
    sg = None if subgroups == "auto" else subgroups
    return {k: v for k, v in (("workgroup", workgroup), ("subgroups", sg)) if v is not None}

EXAMPLES = sorted(glob.glob(os.path.join(ROOT, "examples", "*.attn")))

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def one(body: str, name: str = "t") -> AttentionSpec:
    """The single spec of a block with `body` as its settings."""
    specs = attngen.parse(f"attention {name} {{\n{body}\n}}\n", "test.attn")
    assert len(specs) == 1
    return specs[0]


def minimal(extra: str = "", head_dim="64", dtype="f16") -> AttentionSpec:
    return one(f"head_dim {head_dim}\ndtype {dtype}\n{extra}")


# -- the DESIGN example ---------------------------------------------------------------------

def test_design_example_parses_with_every_value():
    (s,) = attngen.parse(DESIGN_EXAMPLE, "design.attn")
    assert s == AttentionSpec(
        name="llama3_8b_prefill", head_dim_qk=128, head_dim_v=128, dtype="f16",
        heads_q=32, heads_kv=8, acc_qk="f32", acc_pv="f32", mask=Mask("causal"),
        softcap=50.0, scale=None, tile=Tile(q=128, kv=64), schedule=Schedule("fused"),
        kv_cache=KVCache("contiguous"),
        targets={"cuda": CudaOptions(warps=4, stages=2), "wgsl": WgslOptions(workgroup=128, subgroups="auto")},
    )
    assert s.group_size == 4
    assert s.resolved_scale == pytest.approx(1 / math.sqrt(128))


def test_design_example_with_its_commented_alternatives():
    """Each alternative the example's comments name, swapped into the example."""
    swaps = [
        ("head_dim   128 ", "head_dim   qk=192 v=128 "),
        ("schedule   fused", "schedule   split_kv(4)"),
        ("schedule   fused", "schedule   split_kv(auto)"),
        ("schedule   fused", "schedule   two_pass"),
        ("kv_cache   contiguous", "kv_cache   paged(page=16)"),
        ("dtype      f16", "dtype      bf16"),
        ("dtype      f16", "dtype      f32"),
        ("accumulate qk=f32 pv=f32", "accumulate qk=f16 pv=f16"),
        ("scale      auto", "scale      0.125"),
    ]
    got = []
    for old, new in swaps:
        assert old in DESIGN_EXAMPLE
        (s,) = attngen.parse(DESIGN_EXAMPLE.replace(old, new))
        got.append(s)
    assert (got[0].head_dim_qk, got[0].head_dim_v) == (192, 128)
    assert got[1].schedule == Schedule("split_kv", 4)
    assert got[2].schedule == Schedule("split_kv", None)
    assert got[3].schedule == Schedule("two_pass")
    assert got[4].kv_cache == KVCache("paged", 16)
    assert got[5].dtype == "bf16" and got[6].dtype == "f32"
    assert (got[7].acc_qk, got[7].acc_pv) == ("f16", "f16")
    assert got[8].scale == 0.125 and got[8].resolved_scale == 0.125


# -- each key and value form ----------------------------------------------------------------

@pytest.mark.parametrize("text, qk, v", [
    ("64", 64, 64), ("8", 8, 8), ("96", 96, 96), ("256", 256, 256), ("1024", 1024, 1024),
    ("qk=192 v=128", 192, 128), ("v=128 qk=192", 192, 128), ("qk=64 v=64", 64, 64), ("+128", 128, 128),
])
def test_head_dim_forms(text, qk, v):
    s = minimal(head_dim=text)
    assert (s.head_dim_qk, s.head_dim_v) == (qk, v)


@pytest.mark.parametrize("text, q, kv", [
    ("q=32 kv=8", 32, 8), ("kv=8 q=32", 32, 8), ("q=28 kv=4", 28, 4), ("q=16", 16, 16),
    ("12", 12, 12), ("any", None, None), ("q=1 kv=1", 1, 1), ("q=65535 kv=5", 65535, 5),
])
def test_heads_forms(text, q, kv):
    s = minimal(f"heads {text}")
    assert (s.heads_q, s.heads_kv) == (q, kv)
    assert s.group_size == (None if q is None else q // kv)


def test_heads_omitted_means_any_at_run_time():
    s = minimal()
    assert s.heads_q is None and s.heads_kv is None and s.group_size is None


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32"])
def test_dtypes(dtype):
    assert minimal(dtype=dtype).dtype == dtype


@pytest.mark.parametrize("text, qk, pv", [
    ("qk=f32 pv=f32", "f32", "f32"), ("qk=f16 pv=f16", "f16", "f16"), ("qk=f16 pv=f32", "f16", "f32"),
    ("pv=f16", "f32", "f16"), ("qk=f16", "f16", "f32"), ("f16", "f16", "f16"), ("f32", "f32", "f32"),
])
def test_accumulate_forms(text, qk, pv):
    s = minimal(f"accumulate {text}")  # dtype f16: f16 accumulators are allowed
    assert (s.acc_qk, s.acc_pv) == (qk, pv)


@pytest.mark.parametrize("text, mask", [
    ("none", Mask("none")),
    ("causal", Mask("causal", bottom_right=False)),
    ("causal(bottom_right)", Mask("causal", bottom_right=True)),
    ("causal(top_left)", Mask("causal", bottom_right=False)),
    ("window(left=4096)", Mask("window", left=4096, right=0)),
    ("window(left=4096, right=0)", Mask("window", left=4096, right=0)),
    ("window(left=128, right=32)", Mask("window", left=128, right=32)),
    ("window(right=32, left=128)", Mask("window", left=128, right=32)),
    ("window( left = 7 , right = 9 )", Mask("window", left=7, right=9)),
    ("window(left=0)", Mask("window", left=0, right=0)),
    ("custom", Mask("custom")),
])
def test_mask_forms(text, mask):
    assert minimal(f"mask {text}").mask == mask


def test_window_left_alone_is_mistrals_causal_sliding_window():
    m = minimal("mask window(left=4096)").mask
    assert (m.kind, m.left, m.right) == ("window", 4096, 0)


@pytest.mark.parametrize("text, value", [
    ("50.0", 50.0), ("30", 30.0), ("1e2", 100.0), (".5", 0.5), ("2.", 2.0), ("none", None),
])
def test_softcap_forms(text, value):
    s = minimal(f"softcap {text}")
    assert s.softcap == value
    assert s.softcap is None or isinstance(s.softcap, float)


@pytest.mark.parametrize("text, value", [
    ("auto", None), ("0.125", 0.125), ("1", 1.0), ("1e-3", 1e-3), ("2.5E+1", 25.0), ("+0.5", 0.5),
])
def test_scale_forms(text, value):
    s = minimal(f"scale {text}")
    assert s.scale == value
    expected = value if value is not None else 1 / math.sqrt(64)
    assert s.resolved_scale == pytest.approx(expected)


@pytest.mark.parametrize("text, tile", [
    ("q=128 kv=64", Tile(128, 64, None)),
    ("kv=32", Tile(None, 32, None)),
    ("q=64", Tile(64, None, None)),
    ("q=auto kv=auto d=auto", Tile()),
    ("q=64 kv=64 d=32", Tile(64, 64, 32)),
    ("d=64 q=16", Tile(16, None, 64)),
])
def test_tile_forms(text, tile):
    assert minimal(f"tile {text}").tile == tile


@pytest.mark.parametrize("text, schedule", [
    ("fused", Schedule("fused")),
    ("split_kv(4)", Schedule("split_kv", 4)),
    ("split_kv(auto)", Schedule("split_kv", None)),
    ("split_kv(1)", Schedule("split_kv", 1)),
    ("two_pass", Schedule("two_pass")),
])
def test_schedule_forms(text, schedule):
    assert minimal(f"schedule {text}").schedule == schedule


@pytest.mark.parametrize("text, cache", [
    ("contiguous", KVCache("contiguous")),
    ("paged(page=16)", KVCache("paged", 16)),
    ("paged(page=256)", KVCache("paged", 256)),
])
def test_kv_cache_forms(text, cache):
    assert minimal(f"kv_cache {text}").kv_cache == cache


@pytest.mark.parametrize("text, cuda, wgsl", [
    ("target cuda { warps=4 stages=2 }", CudaOptions(4, 2), WgslOptions()),
    ("target cuda { warps=8 }", CudaOptions(8, None), WgslOptions()),
    ("target cuda { stages=3 }", CudaOptions(None, 3), WgslOptions()),
    ("target cuda { warps=auto stages=auto }", CudaOptions(), WgslOptions()),
    ("target cuda { }", CudaOptions(), WgslOptions()),
    ("target cuda {}", CudaOptions(), WgslOptions()),
    ("target cuda", CudaOptions(), WgslOptions()),
    ("target wgsl { workgroup=128 subgroups=auto }", CudaOptions(), WgslOptions(128, "auto")),
    ("target wgsl { subgroups=on }", CudaOptions(), WgslOptions(None, "on")),
    ("target wgsl { subgroups=off workgroup=64 }", CudaOptions(), WgslOptions(64, "off")),
    ("target wgsl { workgroup=auto }", CudaOptions(), WgslOptions(None, "auto")),
    ("target cuda { warps=4 stages=2 }\ntarget wgsl { workgroup=128 subgroups=auto }",
     CudaOptions(4, 2), WgslOptions(128, "auto")),
    ("target cuda {\n    warps=4\n    stages=2\n}", CudaOptions(4, 2), WgslOptions()),
    ("target cuda {   # the options may span lines\n  warps=2   # two warps\n\n  stages=1\n}",
     CudaOptions(2, 1), WgslOptions()),
    ("target wgsl { workgroup=64\nsubgroups=off }", CudaOptions(), WgslOptions(64, "off")),
])
def test_target_blocks(text, cuda, wgsl):
    s = minimal(text)
    assert (s.options("cuda"), s.options("wgsl")) == (cuda, wgsl)


# -- defaults -------------------------------------------------------------------------------

def test_defaults_are_filled_in_as_documented():
    s = minimal()
    assert s == AttentionSpec(name="t", head_dim_qk=64, head_dim_v=64, dtype="f16")
    assert (s.heads_q, s.heads_kv) == (None, None)          # any head count at run time
    assert (s.acc_qk, s.acc_pv) == ("f32", "f32")
    assert s.mask == Mask("none", bottom_right=False, left=None, right=None)
    assert s.softcap is None
    assert s.scale is None and s.resolved_scale == pytest.approx(0.125)  # 1/sqrt(64)
    assert s.tile == Tile(None, None, None)                 # the profile's tuned defaults
    assert s.schedule == Schedule("fused", None)
    assert s.kv_cache == KVCache("contiguous", None)
    assert s.options("cuda") == CudaOptions(None, None)
    assert s.options("wgsl") == WgslOptions(None, "auto")


def test_explicit_defaults_equal_omitted_ones():
    explicit = minimal("heads any\naccumulate qk=f32 pv=f32\nmask none\nsoftcap none\nscale auto\n"
                       "tile q=auto kv=auto d=auto\nschedule fused\nkv_cache contiguous\n"
                       "target cuda { warps=auto stages=auto }\ntarget wgsl { workgroup=auto subgroups=auto f16=auto prefetch=auto }")
    assert explicit == minimal()
    assert hash(explicit) == hash(minimal())


def test_auto_scale_uses_the_qk_head_dim():
    s = minimal(head_dim="qk=192 v=128")
    assert s.resolved_scale == pytest.approx(1 / math.sqrt(192))


# -- file structure: comments, blank lines, several blocks, line endings ------------------

MULTI = """

# a file with several kernels

attention first {   # trailing comment after the brace
    head_dim 64

    # a comment between settings
    dtype    f16
}
attention second {
    head_dim qk=192 v=128
    dtype    bf16
    mask     causal(bottom_right)
}   # after the closing brace


attention third { head_dim 32
    dtype f32 }
# the end
"""


def test_several_blocks_comments_and_blank_lines():
    specs = attngen.parse(MULTI, "multi.attn")
    assert [s.name for s in specs] == ["first", "second", "third"]
    assert (specs[0].head_dim_qk, specs[0].dtype) == (64, "f16")
    assert (specs[1].head_dim_qk, specs[1].head_dim_v, specs[1].mask) == (192, 128, Mask("causal", True))
    assert (specs[2].head_dim_qk, specs[2].dtype) == (32, "f32")


def test_blocks_on_one_line_after_a_closing_brace():
    text = "attention a {\nhead_dim 8\ndtype f16\n} attention b {\nhead_dim 16\ndtype f32\n}"
    assert [(s.name, s.head_dim_qk) for s in attngen.parse(text)] == [("a", 8), ("b", 16)]


def test_crlf_line_endings_parse_like_lf():
    lf = MULTI
    crlf = MULTI.replace("\n", "\r\n")
    assert "\r\n" in crlf
    assert attngen.parse(crlf) == attngen.parse(lf)
    # positions are the same too: a CRLF is one line break
    a = attngen.parse(crlf)[1].span("mask")
    b = attngen.parse(lf)[1].span("mask")
    assert (a.line, a.column) == (b.line, b.column)


def test_crlf_design_example_and_decode_source():
    data = DESIGN_EXAMPLE.replace("\n", "\r\n").encode("utf-8")
    assert attngen.parse(decode_source(data, "x.attn")) == attngen.parse(DESIGN_EXAMPLE)
    assert attngen.parse(data) == attngen.parse(DESIGN_EXAMPLE)  # bytes are decoded the same way


def test_tabs_form_feeds_and_no_trailing_newline():
    text = "attention\tt\t{\n\thead_dim\t64\t\n\f\tdtype f16\n}"
    assert attngen.parse(text) == [minimal()]


def test_utf8_byte_order_mark_is_ignored():
    data = b"\xef\xbb\xbf" + DESIGN_EXAMPLE.encode("utf-8")
    assert attngen.parse(decode_source(data, "bom.attn")) == attngen.parse(DESIGN_EXAMPLE)


def test_non_ascii_comments_are_fine():
    text = "# Gemma-2 · Überprüfung — 注意力\nattention t { # ✓\nhead_dim 64 # ≈\ndtype f16\n}\n"
    assert attngen.parse(text) == [minimal()]


def test_parse_collect_returns_valid_specs_and_diagnostics():
    text = "attention good {\nhead_dim 64\ndtype f16\n}\nattention bad {\nhead_dim 64\ndtype f8\n}\n"
    specs, diags = parse_collect(text, "mixed.attn")
    assert [s.name for s in specs] == ["good"]
    assert len(diags) == 1 and "f8" in diags[0].message


# -- round trip -----------------------------------------------------------------------------

def test_every_example_file_is_here():
    names = {os.path.basename(p) for p in EXAMPLES}
    assert {"llama3_8b.attn", "mistral_7b.attn", "gemma2_9b.attn", "whisper_large_v3.attn",
            "vit_b16.attn"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=os.path.basename)
def test_round_trip_examples(path):
    specs = attngen.parse(open(path, encoding="utf-8").read(), path)
    assert specs
    for s in specs:
        text = format_spec(s)
        assert attngen.parse(text) == [s]
        assert format_spec(attngen.parse(text)[0]) == text  # printing is a fixed point


HAND_WRITTEN = [
    "head_dim 128\ndtype f16",
    "head_dim qk=192 v=128\ndtype bf16\nheads q=16 kv=16\nmask causal",
    "head_dim 256\ndtype bf16\nheads q=16 kv=8\nmask window(left=4096)\nsoftcap 50.0",
    "head_dim 64\ndtype f32\nmask none\nscale 0.1",
    "head_dim 64\ndtype f32\nscale 1e-7\nsoftcap 1e+11",
    "head_dim 96\ndtype f16\nheads q=32\naccumulate qk=f16 pv=f32",
    "head_dim 8\ndtype f16\naccumulate f16\nmask causal(bottom_right)",
    "head_dim 1024\ndtype f32\ntile d=128\nschedule split_kv(auto)",
    "head_dim 64\ndtype f16\nschedule split_kv(1024)\nkv_cache paged(page=65536)",
    "head_dim 64\ndtype f16\nschedule two_pass\nkv_cache paged(page=1)\nmask custom",
    "head_dim 64\ndtype f16\nmask window(left=0, right=2147483647)",
    "head_dim 64\ndtype f16\nmask window(left=2147483647, right=3)",
    "head_dim 64\ndtype f16\ntile q=1 kv=1\ntarget cuda { warps=32 stages=8 }",
    "head_dim 64\ndtype f16\ntile q=1024 kv=1024 d=8\ntarget wgsl { workgroup=1024 subgroups=off }",
    "head_dim 64\ndtype f16\ntarget wgsl { subgroups=on }\ntarget cuda { stages=1 }",
    "head_dim 64\ndtype f16\nheads 65535\nscale 0.30000000000000004",
    "head_dim 64\ndtype f16\nsoftcap 1e-12\nscale 1e12",
    "head_dim 64\ndtype f16\nsoftcap 30\nscale 3",
    DESIGN_EXAMPLE,
]


@pytest.mark.parametrize("body", HAND_WRITTEN, ids=range(len(HAND_WRITTEN)))
def test_round_trip_hand_written(body):
    text = body if body.lstrip().startswith(("#", "attention")) else f"attention rt_{len(body)} {{\n{body}\n}}\n"
    (s,) = attngen.parse(text)
    printed = format_spec(s)
    assert attngen.parse(printed) == [s]
    # every key is printed, one per line, so the printed form says everything
    keys = [line.split()[0] for line in printed.splitlines()[1:-1]]
    assert keys == ["head_dim", "heads", "dtype", "accumulate", "mask", "softcap", "scale", "tile",
                    "schedule", "kv_cache", "target", "target"]


def test_format_spec_text_of_the_design_example():
    (s,) = attngen.parse(DESIGN_EXAMPLE)
    assert format_spec(s) == (
        "attention llama3_8b_prefill {\n"
        "    head_dim   128\n"
        "    heads      q=32 kv=8\n"
        "    dtype      f16\n"
        "    accumulate qk=f32 pv=f32\n"
        "    mask       causal\n"
        "    softcap    50.0\n"
        "    scale      auto\n"
        "    tile       q=128 kv=64 d=auto\n"
        "    schedule   fused\n"
        "    kv_cache   contiguous\n"
        "    target     cuda { warps=4 stages=2 key_warps=auto producer=auto persistent=auto tma=auto backward=auto }\n"
        "    target     wgsl { workgroup=128 subgroups=auto f16=auto prefetch=auto }\n"
        "}\n"
    )


def test_round_trip_of_a_whole_file():
    specs = attngen.parse(MULTI)
    text = "\n".join(format_spec(s) for s in specs)
    assert attngen.parse(text) == specs


# -- spans take no part in equality ---------------------------------------------------------

def test_same_spec_formatted_differently_compares_equal():
    a = attngen.parse("attention g {\n  head_dim 64\n  heads q=8 kv=2\n  dtype f16\n  mask window(left=16)\n}\n",
                      "a.attn")[0]
    b = attngen.parse("# a comment first\n\n\nattention g {\n\tdtype f16   # reordered\n\n"
                      "\tmask window( right=0 , left=16 )\n\theads kv=2 q=8\n\thead_dim +64\n}", "b.attn")[0]
    assert a == b
    assert hash(a) == hash(b)
    assert {a: 1}[b] == 1
    # ... while the spans they carry differ
    assert a.spans and b.spans
    assert a.span("dtype") != b.span("dtype")
    assert (a.span("dtype").line, a.span("dtype").filename) == (4, "a.attn")
    assert (b.span("dtype").line, b.span("dtype").filename) == (5, "b.attn")


def test_spans_point_at_what_was_written():
    text = "attention sp {\n    head_dim 64\n    dtype f16\n    mask causal\n    target wgsl { workgroup=64 }\n}\n"
    (s,) = attngen.parse(text, "sp.attn")
    assert (s.span("name").line, s.span("name").column) == (1, 11)
    assert (s.span("head_dim").line, s.span("head_dim").column) == (2, 5)
    assert (s.span("mask").line, s.span("mask").column) == (4, 5)
    assert s.span("target.wgsl").line == 5
    assert str(s.span("dtype")) == "sp.attn:3:5"
    # a key that was not written falls back to the kernel's name
    assert s.span("tile") == s.span("name")


def test_specs_with_different_values_differ():
    assert minimal() != minimal(dtype="f32")
    assert minimal("mask causal") != minimal("mask causal(bottom_right)")
    assert minimal("softcap 30") != minimal()
    assert one("head_dim 64\ndtype f16", name="x") != one("head_dim 64\ndtype f16", name="y")


# -- names ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["a", "_", "_x", "A9", "llama3_8b_prefill", "x" * 64, "attention", "CamelCase"])
def test_identifier_names(name):
    (s,) = attngen.parse(f"attention {name} {{\nhead_dim 64\ndtype f16\n}}\n")
    assert s.name == name
    assert IDENTIFIER.fullmatch(s.name)


@pytest.mark.parametrize("name", ["foo-bar", "9x", "héllo", "x*/", "a.b", "a b", '"q"', "x;y", "名前", "a$"])
def test_non_identifier_names_are_refused(name):
    with pytest.raises(SpecError) as info:
        attngen.parse(f"attention {name} {{\nhead_dim 64\ndtype f16\n}}\n", "n.attn")
    assert info.value.diagnostics[0].span.line == 1


def test_example_names_are_identifiers():
    for path in EXAMPLES:
        for s in attngen.parse(open(path, encoding="utf-8").read(), path):
            assert IDENTIFIER.fullmatch(s.name), s.name


# -- the public API around parse --------------------------------------------------------------

def test_load_picks_by_name(tmp_path):
    path = tmp_path / "multi.attn"
    path.write_bytes(MULTI.replace("\n", "\r\n").encode("utf-8"))
    assert attngen.load(path, name="second").name == "second"
    with pytest.raises(SpecError, match="defines 3 kernels"):
        attngen.load(path)
    with pytest.raises(SpecError, match="did you mean 'second'"):
        attngen.load(path, name="secnd")


def test_load_one_example():
    s = attngen.load(os.path.join(ROOT, "examples", "llama3_8b.attn"))
    assert (s.name, s.head_dim_qk, s.heads_q, s.heads_kv, s.mask) == ("llama3_8b_prefill", 128, 32, 8, Mask("causal"))
    assert s.span("name").filename.endswith("llama3_8b.attn")


def test_spec_error_is_a_value_error():
    assert issubclass(SpecError, ValueError)
    with pytest.raises(ValueError):
        attngen.parse("attention x {\n}\n")
