"""Property tests (hypothesis) of the front end, the checker, the planner and the emitters.

(a) any text at all: attngen.parse returns specs or raises SpecError, never anything else;
(b) random valid specs, written as text from the language's vocabulary, parse to what was
    written, and on every profile either plan and emit or are refused with a SpecError;
(c) parse(format_spec(spec)) == [spec].
"""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings, strategies as st

import attngen
from attngen import AttentionSpec, SpecError, format_spec
from attngen.api import emit_plan
from attngen.api import decode_source
from attngen.api import lower as plan
from attngen.api import get_profile
from attngen.lang.spec import KVCache, Mask, Schedule, Tile

from conftest import FUZZ_SCALE, count


# What a spec keeps of `target cuda { ... }` / `target wgsl { ... }` (spec.options(target)):
# the options given, those left at auto absent.
def CudaOptions(warps=None, stages=None):
    return {k: v for k, v in (("warps", warps), ("stages", stages)) if v is not None}


def WgslOptions(workgroup=None, subgroups="auto"):
    sg = None if subgroups == "auto" else subgroups
    return {k: v for k, v in (("workgroup", workgroup), ("subgroups", sg)) if v is not None}


PROFILES = [("cuda", "cuda-sm80"), ("cuda", "cuda-sm90"), ("wgsl", "webgpu-core"),
            ("wgsl", "wgpu-software"), ("wgsl", "wgpu-vulkan-nvidia")]

# Modest, deterministic settings: the whole file runs in well under a minute on 2 CPU cores; the
# whole campaign (ATTNGEN_FUZZ=full, tests/conftest.py) runs FUZZ_SCALE times as many.
SETTINGS = settings(max_examples=150 * FUZZ_SCALE, deadline=None, derandomize=FUZZ_SCALE == 1, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SPEC_SETTINGS = settings(SETTINGS, max_examples=100 * FUZZ_SCALE)  # each example draws a whole spec


def parse_or_spec_error(text):
    """attngen.parse's answer for any input: a list of specs, or the SpecError it raised."""
    try:
        specs = attngen.parse(text, "prop.attn")
    except SpecError as err:
        assert err.diagnostics
        for d in err.diagnostics:
            assert d.span is not None, d.message
            assert d.format().startswith(f"prop.attn:{d.span.line}:{d.span.column}: error: ")
        assert str(err)
        return err
    assert specs and all(isinstance(s, AttentionSpec) for s in specs)
    return specs


# -- (a) random text never raises anything but SpecError --------------------------------------

WORDS = ["attention", "head_dim", "heads", "dtype", "accumulate", "mask", "softcap", "scale", "tile",
         "schedule", "kv_cache", "target", "cuda", "wgsl", "f16", "bf16", "f32", "none", "causal",
         "bottom_right", "top_left", "window", "left", "right", "custom", "auto", "fused", "split_kv",
         "two_pass", "contiguous", "paged", "page", "q", "kv", "qk", "v", "pv", "d", "warps", "stages",
         "workgroup", "subgroups", "on", "off", "any", "x", "_", "__x", "nan", "inf", "caual", "fp16",
         # score and mask expressions, inputs
         "score", "input", "s", "b", "h", "hkv", "Lq", "Lk", "w", "where", "abs", "clamp", "floor", "grad",
         "i32", "bool",
         # quantized KV caches
         "kv_dtype", "e4m3", "e5m2", "i8"]
PUNCT = ["{", "}", "(", ")", "=", ",", "\n", "\r\n", " ", "\t", "# comment\n", "#", "-", "+", ".", "e",
         "\x00", "\ufeff", "\u2028", "\f", "\r", "é", "*/", "\\", '"',
         "[", "]", "<=", "==", "!=", "<", "||", "&&", "!", "//", "%", "*", "/"]
NUMBERS = st.one_of(
    st.integers(-10, 2000).map(str),
    st.integers(-(10**50), 10**50).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["0", "8", "64", "128", "4096", "1e999", "1e-400", ".5", "5.", "1e3", "+8", "-0",
                     "9" * 500, "0" * 300 + "64"]),
)
TOKENS = st.one_of(st.sampled_from(WORDS), st.sampled_from(PUNCT), NUMBERS)
TOKEN_SOUP = st.lists(TOKENS, max_size=60).map(lambda ts: " ".join(ts) if len(ts) % 3 else "".join(ts))


@SETTINGS
@given(st.text(max_size=300))
def test_any_text_parses_or_raises_spec_error(text):
    count("test_any_text_parses_or_raises_spec_error")
    parse_or_spec_error(text)


@SETTINGS
@given(st.binary(max_size=300))
def test_any_bytes_decoded_with_replace_parse_or_raise_spec_error(data):
    count("test_any_bytes_decoded_with_replace_parse_or_raise_spec_error")
    parse_or_spec_error(data.decode("utf-8", errors="replace"))


@SETTINGS
@given(st.binary(max_size=300))
def test_any_bytes_through_decode_source_parse_or_raise_spec_error(data):
    count("test_any_bytes_through_decode_source_parse_or_raise_spec_error")
    try:
        text = decode_source(data, "prop.attn")
    except SpecError as err:
        (d,) = err.diagnostics
        assert "not UTF-8" in d.message or "NUL byte" in d.message
        return
    parse_or_spec_error(text)
    parse_or_spec_error(data)  # parse takes bytes too


@SETTINGS
@given(TOKEN_SOUP)
def test_token_soup_parses_or_raises_spec_error(text):
    count("test_token_soup_parses_or_raises_spec_error")
    parse_or_spec_error(text)


@SETTINGS
@given(st.lists(TOKENS, max_size=25).map(" ".join), st.integers(0, 20))
def test_token_soup_inside_a_block_parses_or_raises_spec_error(soup, where):
    count("test_token_soup_inside_a_block_parses_or_raises_spec_error")
    lines = ["head_dim 64", "dtype f16", "mask causal"]
    lines.insert(where % 4, soup)
    result = parse_or_spec_error("attention p {\n" + "\n".join(lines) + "\n}\n")
    if isinstance(result, SpecError):
        return
    # the soup was valid: it can only have added settings to a kernel named p
    assert [s.name for s in result] == ["p"]


# -- (b) random valid specs -----------------------------------------------------------------------

DIMS = st.integers(1, 32).map(lambda n: 8 * n)  # multiples of 8 in 8..256
NAME = st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,15}", fullmatch=True)
INDENT = st.sampled_from(["", "    ", "\t", "  "])
TRAILER = st.sampled_from(["", "", "   # a comment", " ", "\t"])


def positive_real(lo=1e-3, hi=1e3):
    """(text, value): a positive number written as the language allows (ints, floats, exponents)."""
    return st.one_of(
        st.floats(lo, hi, allow_nan=False, allow_infinity=False).map(lambda x: (repr(x), x)),
        st.floats(lo, hi).map(lambda x: (f"{x:.3e}", float(f"{x:.3e}"))),
        st.integers(1, 1000).map(lambda n: (str(n), float(n))),
        st.sampled_from([("0.125", 0.125), (".5", 0.5), ("50.0", 50.0), ("30", 30.0), ("1e-2", 0.01)]),
    ).filter(lambda tv: lo <= tv[1] <= hi)


@st.composite
def spec_text_and_value(draw):
    """A valid spec written as text in a random layout, and the AttentionSpec it means."""
    name = draw(NAME)
    fields: dict = {}
    lines: list[str] = []

    qk = draw(DIMS)
    v = draw(st.one_of(st.just(qk), DIMS))
    if qk == v and draw(st.booleans()):
        lines.append(f"head_dim {qk}")
    else:
        lines.append(draw(st.sampled_from([f"head_dim qk={qk} v={v}", f"head_dim v={v} qk={qk}"])))
    fields.update(head_dim_qk=qk, head_dim_v=v)

    dtype = draw(st.sampled_from(["f16", "bf16", "f32", "f16", "bf16", "f32", "e4m3", "e5m2"]))
    out = draw(st.sampled_from([None, "bf16", "f16"])) if dtype in ("e4m3", "e5m2") else None  # FP8 prefill
    lines.append(f"dtype {dtype}" + (f" out={out}" if out else ""))
    fields["dtype"] = dtype
    if out:
        fields["out_dtype"] = out

    heads = draw(st.sampled_from(["omit", "any", "n", "q", "qkv"]))
    if heads != "omit":
        kv = draw(st.integers(1, 16))
        group = draw(st.integers(1, 8))
        if heads == "any":
            lines.append("heads any")
        elif heads == "n":
            lines.append(f"heads {kv}")
            fields.update(heads_q=kv, heads_kv=kv)
        elif heads == "q":
            lines.append(f"heads q={kv * group}")
            fields.update(heads_q=kv * group, heads_kv=kv * group)
        else:
            lines.append(f"heads q={kv * group} kv={kv}")
            fields.update(heads_q=kv * group, heads_kv=kv)

    accs = ["f32", "f16"] if dtype == "f16" else ["f32"]  # (FP8 too: f32 only)
    if draw(st.booleans()):
        a_qk, a_pv = draw(st.sampled_from(accs)), draw(st.sampled_from(accs))
        lines.append(f"accumulate qk={a_qk} pv={a_pv}" if a_qk != a_pv or draw(st.booleans())
                     else f"accumulate {a_qk}")
        fields.update(acc_qk=a_qk, acc_pv=a_pv)

    mask = draw(st.sampled_from(["omit", "none", "causal", "causal(bottom_right)", "causal(top_left)",
                                 "window", "window2", "custom"]))
    if mask == "window":
        left = draw(st.integers(0, 2**31 - 1))
        lines.append(f"mask window(left={left})")
        fields["mask"] = Mask("window", left=left, right=0)
    elif mask == "window2":
        left, right = draw(st.integers(0, 10**6)), draw(st.integers(0, 10**6))
        lines.append(f"mask window(left={left}, right={right})")
        fields["mask"] = Mask("window", left=left, right=right)
    elif mask != "omit":
        lines.append(f"mask {mask}")
        kind = mask.split("(")[0]
        fields["mask"] = Mask(kind, bottom_right=mask == "causal(bottom_right)")

    if draw(st.booleans()):
        text, value = draw(positive_real(1.0, 1000.0))
        lines.append(f"softcap {text}")
        fields["softcap"] = value
    if draw(st.booleans()):
        # accumulate qk=f16 takes scales up to 1 (Q is scaled in f16): docs/language.md, Numerics
        text, value = draw(positive_real(1e-3, 1.0 if fields.get("acc_qk") == "f16" else 10.0))
        lines.append(f"scale {text}")
        fields["scale"] = value

    if draw(st.integers(0, 2)) == 0:
        tq = draw(st.sampled_from([None, 16, 32, 64, 128, 8, 48, 256]))
        tkv = draw(st.sampled_from([None, 16, 32, 64, 128, 8, 24]))
        td = draw(st.sampled_from([None] * 6 + [8, 16] if max(qk, v) >= 16 else [None] * 6 + [8]))
        parts = [f"q={tq}" if tq else "q=auto"] + ([f"kv={tkv}"] if tkv else []) + ([f"d={td}"] if td else [])
        lines.append("tile " + " ".join(parts))
        fields["tile"] = Tile(tq, tkv, td)

    sched = draw(st.sampled_from(["omit", "fused", "fused", "split_kv(4)", "split_kv(auto)", "two_pass"]))
    if sched != "omit":
        lines.append(f"schedule {sched}")
        fields["schedule"] = {"fused": Schedule("fused"), "split_kv(4)": Schedule("split_kv", 4),
                              "split_kv(auto)": Schedule("split_kv", None),
                              "two_pass": Schedule("two_pass")}[sched]
    if draw(st.integers(0, 3)) == 0:
        page = draw(st.sampled_from([None, 16, 64]))
        lines.append(f"kv_cache paged(page={page})" if page else "kv_cache contiguous")
        fields["kv_cache"] = KVCache("paged", page) if page else KVCache("contiguous")

    if draw(st.integers(0, 2)) == 0:
        warps = draw(st.sampled_from([None, 1, 2, 4, 8]))
        stages = draw(st.sampled_from([None, 1, 2, 3]))
        opts = ([f"warps={warps}"] if warps else []) + ([f"stages={stages}"] if stages else [])
        lines.append("target cuda { " + " ".join(opts) + " }")
        fields.setdefault("targets", {})["cuda"] = CudaOptions(warps, stages)
    if draw(st.integers(0, 2)) == 0:
        wg = draw(st.sampled_from([None, 64, 128, 256, 32]))
        sg = draw(st.sampled_from(["auto", "on", "off"]))
        opts = ([f"workgroup={wg}"] if wg else []) + [f"subgroups={sg}"]
        lines.append("target wgsl {\n  " + "\n  ".join(opts) + "\n}")
        fields.setdefault("targets", {})["wgsl"] = WgslOptions(wg, sg)

    order = draw(st.permutations(lines))
    body = "\n".join(f"{draw(INDENT)}{line}{draw(TRAILER)}" for line in order)
    eol = draw(st.sampled_from(["\n", "\r\n"]))
    text = f"# generated\nattention {name} {{\n{body}\n}}\n".replace("\n", eol)
    return text, AttentionSpec(name=name, **fields)


@SPEC_SETTINGS
@given(spec_text_and_value())
def test_valid_spec_text_parses_to_what_was_written(case):
    count("test_valid_spec_text_parses_to_what_was_written")
    text, expected = case
    (spec,) = attngen.parse(text, "valid.attn")
    assert spec == expected
    assert spec.resolved_scale > 0 and math.isfinite(spec.resolved_scale)


def plan_everywhere(spec):
    """(target, profile, plan or SpecError) for every profile; nothing else may be raised."""
    out = []
    for target, profile in PROFILES:
        try:
            p = plan(spec, target, profile)
        except SpecError as err:
            assert all(d.span is not None for d in err.diagnostics)
            assert all(f"target {target} (profile {profile})" in d.message for d in err.diagnostics)
            out.append((target, profile, err))
            continue
        assert p.target == target and p.profile == profile
        assert p.entry == "attngen_" + spec.name
        assert 0 < p.smem_bytes
        limit_key = "shared_memory_bytes" if target == "cuda" else "workgroup_storage_bytes"
        assert p.smem_bytes <= get_profile(profile, target).limit(limit_key)
        assert 0 < p.threads <= get_profile(profile, target).limit(
            "threads_per_block" if target == "cuda" else "invocations_per_workgroup")
        out.append((target, profile, p))
    return out


def check_emitted(spec, p):
    em = emit_plan(p)
    assert isinstance(em.source, str) and p.entry in em.source
    assert em.manifest["entry_point"] == p.entry
    assert em.manifest["kernel"] == spec.name
    assert attngen.parse(em.manifest["spec"]) == [spec]  # the manifest carries the spec itself
    assert emit_plan(p).source == em.source  # deterministic


@SPEC_SETTINGS
@given(spec_text_and_value())
def test_valid_specs_plan_and_emit_for_cuda_or_are_refused(case):
    count("test_valid_specs_plan_and_emit_for_cuda_or_are_refused")
    text, _ = case
    (spec,) = attngen.parse(text)
    for target, _profile, result in plan_everywhere(spec):
        if target == "cuda" and not isinstance(result, SpecError):
            check_emitted(spec, result)


@SPEC_SETTINGS
@given(spec_text_and_value())
def test_valid_specs_plan_and_emit_for_wgsl_or_are_refused(case):
    count("test_valid_specs_plan_and_emit_for_wgsl_or_are_refused")
    text, _ = case
    (spec,) = attngen.parse(text)
    for target, _profile, result in plan_everywhere(spec):
        if target == "wgsl" and not isinstance(result, SpecError):
            check_emitted(spec, result)


@SPEC_SETTINGS
@given(spec_text_and_value())
def test_the_simplest_valid_specs_build_everywhere_they_should(case):
    """Specs that use nothing a target lacks and no explicit tiles are never refused."""
    count("test_the_simplest_valid_specs_build_everywhere_they_should")
    _, spec = case
    plain = AttentionSpec(name=spec.name, head_dim_qk=spec.head_dim_qk, head_dim_v=spec.head_dim_v,
                          dtype=spec.dtype, heads_q=spec.heads_q, heads_kv=spec.heads_kv,
                          acc_qk=spec.acc_qk, acc_pv=spec.acc_pv, mask=spec.mask if spec.mask.kind != "custom"
                          else Mask(), softcap=spec.softcap, scale=spec.scale)
    (plain,) = attngen.parse(format_spec(plain))  # with spans, for the diagnostics
    for target, profile, result in plan_everywhere(plain):
        if target == "wgsl" and plain.dtype == "bf16":
            assert isinstance(result, SpecError) and "WGSL has no bf16" in str(result)
        elif plain.is_fp8 and (target == "wgsl" or profile != "cuda-sm90"):  # FP8 prefill: cuda-sm90 only
            assert isinstance(result, SpecError) and "FP8" in str(result)
        elif plain.is_fp8 and (plain.head_dim_qk % 16 or plain.head_dim_v % 16 or max(plain.head_dim_qk,
                                                                                      plain.head_dim_v) > 256):
            assert isinstance(result, SpecError) and "multiples of 16 up to 256" in str(result)
        else:
            assert not isinstance(result, SpecError), f"{profile}: {result}"


# -- (c) round trip ----------------------------------------------------------------------------

@SPEC_SETTINGS
@given(spec_text_and_value())
def test_round_trip_of_random_valid_specs(case):
    count("test_round_trip_of_random_valid_specs")
    text, _ = case
    (spec,) = attngen.parse(text)
    printed = format_spec(spec)
    assert attngen.parse(printed) == [spec]
    assert format_spec(attngen.parse(printed)[0]) == printed


SPECS = st.builds(
    AttentionSpec,
    name=NAME,
    head_dim_qk=st.integers(1, 128).map(lambda n: 8 * n),
    head_dim_v=st.integers(1, 128).map(lambda n: 8 * n),
    dtype=st.just("f16"),
    heads_q=st.none(),
    heads_kv=st.none(),
    acc_qk=st.sampled_from(["f32", "f16"]),
    acc_pv=st.sampled_from(["f32", "f16"]),
    mask=st.one_of(
        st.sampled_from([Mask("none"), Mask("causal"), Mask("causal", bottom_right=True), Mask("custom")]),
        st.builds(lambda a, b: Mask("window", left=a, right=b), st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1)),
    ),
    softcap=st.one_of(st.none(), st.floats(1e-12, 1e12)),
    scale=st.one_of(st.none(), st.floats(1e-12, 1e12)),
    tile=st.builds(Tile, st.one_of(st.none(), st.integers(1, 1024)), st.one_of(st.none(), st.integers(1, 1024)),
                   st.one_of(st.none(), st.just(8))),
    schedule=st.one_of(st.just(Schedule()), st.just(Schedule("two_pass")),
                       st.builds(lambda n: Schedule("split_kv", n), st.one_of(st.none(), st.integers(1, 1024)))),
    kv_cache=st.one_of(st.just(KVCache()), st.builds(lambda n: KVCache("paged", n), st.integers(1, 65536))),
    targets=st.builds(lambda c, w: {"cuda": c, "wgsl": w},
                      st.builds(CudaOptions, st.one_of(st.none(), st.integers(1, 32)),
                                st.one_of(st.none(), st.integers(1, 8))),
                      st.builds(WgslOptions, st.one_of(st.none(), st.integers(1, 1024)),
                                st.sampled_from(["auto", "on", "off"]))),
)


@SPEC_SETTINGS
@given(SPECS, st.sampled_from(["f16", "bf16", "f32"]), st.integers(1, 64), st.integers(1, 16))
def test_round_trip_of_spec_objects(spec, dtype, kv, group):
    count("test_round_trip_of_spec_objects")
    from dataclasses import replace
    if dtype != "f16":
        spec = replace(spec, dtype=dtype, acc_qk="f32", acc_pv="f32")
    spec = replace(spec, heads_q=kv * group, heads_kv=kv) if group > 1 else spec
    if spec.acc_qk == "f16" and spec.scale is not None and spec.scale > 1:
        spec = replace(spec, scale=1.0 / spec.scale)  # accumulate qk=f16 takes scales up to 1
    assert attngen.parse(format_spec(spec)) == [spec]


@settings(SETTINGS, max_examples=40)
@given(st.lists(spec_text_and_value(), min_size=1, max_size=4, unique_by=lambda c: c[1].name))
def test_files_of_several_kernels_round_trip(cases):
    count("test_files_of_several_kernels_round_trip")
    text = "\n".join(t for t, _ in cases)
    specs = attngen.parse(text)
    assert specs == [s for _, s in cases]
    assert attngen.parse("\n".join(format_spec(s) for s in specs)) == specs


def test_token_vocabulary_covers_every_key():
    from attngen.lang.reader import USAGE
    assert set(USAGE) <= set(WORDS)
