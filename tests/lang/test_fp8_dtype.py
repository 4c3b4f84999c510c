"""`dtype e4m3 | e5m2 [out=bf16 | f16]` (FP8 prefill, issue 44): reading, defaults, printing, errors."""

from __future__ import annotations

import dataclasses

import pytest

import attngen
from attngen import AttentionSpec, SpecError, format_spec
from attngen.lang import validate


def one(body: str) -> AttentionSpec:
    (spec,) = attngen.parse(f"attention t {{\n    head_dim 128\n{body}\n}}\n", "t.attn")
    return spec


def error(body: str):
    with pytest.raises(SpecError) as e:
        attngen.parse(f"attention t {{\n    head_dim 128\n{body}\n}}\n", "t.attn")
    return e.value.diagnostics


@pytest.mark.parametrize("text, dtype, out", [
    ("dtype e4m3", "e4m3", "bf16"), ("dtype e5m2", "e5m2", "bf16"), ("dtype e4m3 out=f16", "e4m3", "f16"),
    ("dtype e5m2 out=bf16", "e5m2", "bf16"),
])
def test_fp8_dtypes_read_with_their_output_dtype(text, dtype, out):
    spec = one(f"    {text}")
    assert (spec.dtype, spec.out_dtype, spec.output_dtype, spec.is_fp8) == (dtype, out, out, True)
    assert f"dtype      {dtype} out={out}" in format_spec(spec)
    assert attngen.parse(format_spec(spec)) == [spec]


def test_other_dtypes_have_no_out_and_print_as_before():
    spec = one("    dtype f16")
    assert (spec.out_dtype, spec.output_dtype, spec.is_fp8) == (None, "f16", False)
    assert "out=" not in format_spec(spec)


def test_a_spec_built_in_python_gets_the_default_output():
    spec = AttentionSpec("t", 64, 64, "e4m3")
    assert spec.out_dtype == "bf16" and validate(spec) == []
    assert dataclasses.replace(one("    dtype f16"), dtype="e5m2").out_dtype == "bf16"
    (d,) = validate(AttentionSpec("t", 64, 64, "f16", out_dtype="bf16"))
    assert "out= chooses the output dtype of an FP8 kernel" in d.message


@pytest.mark.parametrize("body, message", [
    ("    dtype f16 out=bf16", "out= chooses the output dtype of an FP8 kernel (dtype e4m3 or e5m2); dtype f16 "
                              "stores its output in f16"),
    ("    dtype e4m3 out=f32", "unknown output dtype 'f32' (expected bf16, f16)"),
    ("    dtype e4m3 out=e4m3", "unknown output dtype 'e4m3' (expected bf16, f16)"),
    ("    dtype e4m3 scale=2", "unknown option 'scale' for 'dtype' (expected out)"),
    ("    dtype e4m3 out=bf16 more", "too many values for 'dtype'"),
    ("    dtype e4m3\n    kv_dtype e4m3", "kv_dtype quantizes the K and V of an f16 / bf16 / f32 kernel; dtype e4m3 "
                                          "stores q, k and v in FP8 already (descaled at the call)"),
    ("    dtype e4m3\n    accumulate f16", "accumulate f16 needs dtype f16 (this kernel stores e4m3: FP8 products "
                                           "accumulate in f32)"),
])
def test_fp8_dtype_errors(body, message):
    (d,) = error(body)
    assert d.message == message


def test_fp8_aliases_name_the_dtype():
    (d,) = error("    dtype fp8")
    assert d.hint == "did you mean 'e4m3'?"
    (d,) = error("    dtype float8_e5m2")
    assert d.hint == "did you mean 'e5m2'?"
    (d,) = error("    dtype f16\n    accumulate fp8")  # accumulate takes no FP8: no FP8 hint
    assert "e4m3" not in (d.hint or "")


def test_fp8_specs_survive_the_parse_cache_data():
    from attngen.errors import Source
    from attngen.lang.spec import specs_from_data, specs_to_data
    text = "attention t {\n    head_dim 64\n    dtype e5m2 out=f16\n}\n"
    (spec,) = attngen.parse(text)
    source = Source("x.attn", text)
    again = specs_from_data(specs_to_data([dataclasses.replace(spec, spans={})], source), source)
    assert again == [spec] and again[0].out_dtype == "f16"
