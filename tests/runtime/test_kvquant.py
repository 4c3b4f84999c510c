"""attngen.quantize_kv / dequantize_kv (issue 44, docs/language.md "Quantized KV caches"): the
stored bit patterns against known values, rounding ties, saturation, the scales. No device."""

from __future__ import annotations

import numpy as np
import pytest

import attngen
from attngen.runtime.kvquant import decode_fp8, encode_fp8


def test_e4m3_bit_patterns():
    x = [448.0, 1 / 512, -0.0, np.nan, 1.5, -1.5, 1e9, -1e9, 464.0, 2.0 ** -6]
    assert [int(c) for c in encode_fp8(x, "e4m3")] == [0x7E, 0x01, 0x80, 0x7F, 0x3C, 0xBC, 0x7E, 0xFE, 0x7E, 0x08]
    # ties to the even code: 2^-10 lies between 0 and 2^-9, 3 * 2^-10 between codes 1 and 2
    assert [int(c) for c in encode_fp8([2.0 ** -10, 3 * 2.0 ** -10, 1.0625, 1.1875], "e4m3")] == [0x00, 0x02, 0x38, 0x3A]
    t = decode_fp8(np.arange(256), "e4m3")
    assert t[0x7E] == 448 and np.isnan(t[0x7F]) and np.isnan(t[0xFF]) and t[0x01] == 2.0 ** -9
    assert np.isfinite(t[[c for c in range(256) if c & 0x7F != 0x7F]]).all()  # fn: no infinities


def test_e5m2_bit_patterns():
    x = [57344.0, 2.0 ** -16, -0.0, np.nan, 1.5, -1.5, np.inf, 2.0 ** -14]
    assert [int(c) for c in encode_fp8(x, "e5m2")] == [0x7B, 0x01, 0x80, 0x7F, 0x3E, 0xBE, 0x7B, 0x04]
    t = decode_fp8(np.arange(256), "e5m2")
    assert t[0x7C] == np.inf and t[0xFC] == -np.inf and np.isnan(t[0x7D:0x80]).all() and t[0x7B] == 57344


@pytest.mark.parametrize("kv_dtype", ["e4m3", "e5m2"])
def test_fp8_round_trips_every_finite_value(kv_dtype):
    t = decode_fp8(np.arange(256), kv_dtype)
    finite = np.flatnonzero(np.isfinite(t))
    assert np.array_equal(encode_fp8(t[finite], kv_dtype), finite.astype(np.uint8))


def test_i8_blocks_scale_by_the_block_max_and_round_half_to_even():
    x = np.zeros((1, 1, 1, 64))
    x[..., 0] = 127.0  # scale exactly 1
    x[..., 1:4] = [2.5, 3.5, -2.5]
    x[..., 32:] = 0.0  # a block of zeros: scale 0, bytes 0
    stored, scale = attngen.quantize_kv(x, "i8")
    assert stored.dtype == np.int8 and scale.dtype == np.float32 and scale.shape == (1, 1, 1, 2)
    assert list(scale.reshape(-1)) == [1.0, 0.0]
    assert list(stored.reshape(-1)[:4]) == [127, 2, 4, -2] and not stored.reshape(-1)[32:].any()
    y = np.random.default_rng(0).standard_normal((2, 3, 2, 64))
    stored, scale = attngen.quantize_kv(y, "i8")
    assert np.abs(stored).max() == 127
    blocks = np.abs(y).reshape(2, 3, 2, 2, 32).max(-1)
    assert np.array_equal(scale, blocks.astype(np.float32) / np.float32(127))
    assert np.abs(attngen.dequantize_kv(stored, scale, "i8") - y).max() <= scale.max() / 2 * (1 + 1e-6)


@pytest.mark.parametrize("kv_dtype", ["e4m3", "e5m2"])
def test_fp8_scales_are_per_sequence_and_head(kv_dtype):
    y = np.random.default_rng(1).standard_normal((2, 5, 3, 16))
    y[1, :, 2] = 0
    stored, scale = attngen.quantize_kv(y, kv_dtype)
    assert stored.dtype == np.uint8 and scale.shape == (2, 3) and scale[1, 2] == 0 and not stored[1, :, 2].any()
    largest = {"e4m3": 448.0, "e5m2": 57344.0}[kv_dtype]
    assert np.array_equal(scale, (np.abs(y).max(axis=(1, 3)) / largest).astype(np.float32))
    back = attngen.dequantize_kv(stored, scale, kv_dtype)
    assert np.abs(back - y).max() <= np.abs(y).max() * {"e4m3": 2 ** -4, "e5m2": 2 ** -3}[kv_dtype]


def test_quantize_kv_refuses_what_it_cannot_represent():
    with pytest.raises(ValueError, match="multiple of 32"):
        attngen.quantize_kv(np.ones((1, 1, 1, 48)), "i8")
    with pytest.raises(ValueError, match="inf"):
        attngen.quantize_kv(np.full((1, 1, 1, 32), np.inf), "e4m3")
    with pytest.raises(ValueError, match="unknown kv_dtype"):
        attngen.quantize_kv(np.ones((1, 1, 1, 32)), "fp4")


# ---- the append's quantizer (quantize_rows, append_kv): the kernels' f32 arithmetic --------------

def test_quantize_rows_fp8_divides_in_f32_rounds_ties_to_even_and_saturates():
    from attngen.runtime.kvquant import quantize_rows
    x = np.array([[448.0, 480.0, -1e4, np.inf, -np.inf, np.nan, -np.nan, -0.0, 1.0625, 1.1875, 2.0 ** -10]],
                 np.float32)
    got = quantize_rows(x, "e4m3", np.float32(1))
    assert [int(c) for c in got[0]] == [0x7E, 0x7E, 0xFE, 0x7E, 0xFE, 0x7F, 0x7F, 0x80, 0x38, 0x3A, 0x00]  # (-NaN: 0x7f)
    # the quotient is the f32 one: 3 / 3 is exactly 1 (0x38), 1 / 3 rounds in f32 first
    assert int(quantize_rows(np.float32([[3.0]]), "e4m3", np.float32(3))[0, 0]) == 0x38
    third = np.float32(1) / np.float32(3)
    assert quantize_rows(np.float32([[1.0]]), "e5m2", np.float32(3))[0, 0] == encode_fp8([float(third)], "e5m2")[0]
    # a scale of 0: zeros, NaN stays NaN
    assert [int(c) for c in quantize_rows(np.float32([[5.0, np.nan]]), "e5m2", np.float32(0))[0]] == [0x00, 0x7F]


def test_quantize_rows_i8_takes_each_block_of_32_by_f32_arithmetic():
    from attngen.runtime.kvquant import quantize_rows
    x = np.zeros((2, 64), np.float32)
    x[0, 0], x[0, 1:4] = 127.0, [2.5, 3.5, -2.5]  # scale 1: ties to even
    x[1, :32] = np.random.default_rng(0).standard_normal(32)
    stored, scale = quantize_rows(x, "i8")
    assert scale.dtype == np.float32 and scale.shape == (2, 2) and scale[0, 1] == 0 and scale[1, 1] == 0
    assert list(stored[0, :4]) == [127, 2, 4, -2] and not stored[:, 32:].any()
    s = np.abs(x[1, :32]).max() / np.float32(127)
    assert scale[1, 0] == s and np.array_equal(stored[1, :32], np.rint(x[1, :32] / s).astype(np.int8))
    with pytest.raises(ValueError, match="no inf or NaN"):
        quantize_rows(np.full((1, 32), np.nan, np.float32), "i8")


def test_the_quotient_is_rounded_to_f32_first_and_quantize_kv_agrees():
    """x / scale is an f32 quotient (the kernels' arithmetic): -0.63720703 / 0.007585798 is
    -84.0000000737 exactly, -84 in f32, a tie between e4m3's -80 (0xea, even) and -88 (0xeb): the even
    code, where float64 would take -88; i8's -63.4999998 is -63.5 in f32: -64. quantize_kv makes the
    same bytes as the append for the same values and scales."""
    from attngen.runtime.kvquant import quantize_rows
    x, s = np.float32(np.float16(-0.63720703)), np.float32(0.007585798)
    assert float(x) / float(s) != -84.0 and x / s == np.float32(-84.0)
    assert int(quantize_rows(np.array([[x]]), "e4m3", s)[0, 0]) == 0xEA
    y = np.random.default_rng(4).standard_normal((2, 50, 3, 64)).astype(np.float16)
    for kv_dtype in ("e4m3", "e5m2"):
        stored, scale = attngen.quantize_kv(y, kv_dtype)
        assert np.array_equal(quantize_rows(y, kv_dtype, scale[:, None, :]), stored)
    stored, scale = attngen.quantize_kv(y, "i8")
    again, scale_again = quantize_rows(y, "i8")
    assert np.array_equal(again, stored) and np.array_equal(scale_again, scale)


@pytest.mark.parametrize("kv_dtype", ["e4m3", "i8"])
@pytest.mark.parametrize("paged", [False, True])
def test_append_kv_writes_the_rows_and_the_reference_attends_to_them(kv_dtype, paged):
    from attngen.reference import reference
    from attngen.runtime.kvquant import append_kv, dequantize_kv, quantize_rows
    rng = np.random.default_rng(5)
    (k, ks), (v, vs) = [attngen.quantize_kv(rng.standard_normal((2, 8, 2, 32)), kv_dtype) for _ in "kv"]
    lens = np.array([2, 5], np.int32)
    kn, vn = [rng.standard_normal((2, 3, 2, 32)).astype(np.float16) for _ in "kv"]
    table = None
    if paged:  # pages of 4 rows, sequence 0 in pages 3, 2; sequence 1 in 0, 1
        table = np.array([[3, 2], [0, 1]], np.int32)
        k, v = (x.reshape(4, 4, 2, 32)[[2, 3, 0, 1]] for x in (k, v))
        if kv_dtype == "i8":
            ks, vs = (x.reshape(4, 4, 2, 1)[[2, 3, 0, 1]] for x in (ks, vs))
    k2, v2, ks2, vs2 = append_kv(kv_dtype, k, v, ks, vs, kn, vn, lens, table)
    row = (int(table[1, 7 // 4]), 7 % 4) if paged else (1, 7)  # sequence 1's third new row: key 5 + 2
    want = quantize_rows(kn[1, 2], kv_dtype, ks[1]) if kv_dtype != "i8" else quantize_rows(kn[1, 2], kv_dtype)[0]
    assert np.array_equal(k2[row], want) and np.array_equal(k, append_kv(kv_dtype, k, v, ks, vs, kn[:, :0],
                                                                          vn[:, :0], lens, table)[0])
    q = rng.standard_normal((2, 1, 4, 32)).astype(np.float16)
    spec = attngen.parse(f"attention t {{\n head_dim 32\n dtype f16\n"
                         + (" kv_cache paged(page=4)\n" if paged else "") + f" kv_dtype {kv_dtype}\n}}")[0]
    kw = {"block_table": table} if paged else {}
    got = reference(spec, q, k, v, k_scale=ks, v_scale=vs, kv_lens=lens, k_new=kn, v_new=vn, **kw)
    want = reference(spec, q, k2, v2, k_scale=ks2, v_scale=vs2, kv_lens=lens + 3, **kw)
    assert np.array_equal(got, want)
    assert dequantize_kv is not None
