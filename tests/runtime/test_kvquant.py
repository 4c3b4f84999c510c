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
