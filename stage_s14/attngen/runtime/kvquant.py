"""Quantized KV caches (`kv_dtype e4m3 | e5m2 | i8`, issue 44): the stored formats, the quantizer
and the checks of a call's scales, for every target and the float64 reference.

    stored, scale = attngen.quantize_kv(k, "i8")           # numpy in, numpy out
    k64 = attngen.dequantize_kv(stored, scale, "i8")       # the exact float64 values

Stored bytes: FP8 bit patterns as uint8 (e4m3: OCP "fn", bias 7, no infinities, 0x7f / 0xff NaN,
largest 448; e5m2: bias 15, 0x7c inf, largest 57344), i8 as int8. Scales are float32: FP8 one per
(sequence, KV head), shape (B, Hkv); i8 one per block of 32 consecutive values of a row, shape
(..., D / 32). Value = scale * decoded byte (docs/language.md, "Quantized KV caches").
"""

from __future__ import annotations

import numpy as np

from ..errors import LaunchError

I8_BLOCK = 32  # values per i8 scale (llama.cpp's q8_0 block)
FP8 = {  # exponent bits, mantissa bits, bias, largest finite value
    "e4m3": (4, 3, 7, 448.0),
    "e5m2": (5, 2, 15, 57344.0),
}
STORED = {"e4m3": np.uint8, "e5m2": np.uint8, "i8": np.int8}  # the numpy dtype of k and v
_NAN_CODE = 0x7F  # a quiet NaN in both FP8 formats (e4m3fn's only one; e5m2: 0x7d-0x7f are NaNs)


def _decode_table(kv_dtype: str) -> np.ndarray:
    """float64 value of each of the 256 FP8 bytes."""
    e_bits, m_bits, bias, _ = FP8[kv_dtype]
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    e = (codes >> m_bits) & ((1 << e_bits) - 1)
    m = codes & ((1 << m_bits) - 1)
    frac = m / (1 << m_bits)
    value = np.where(e == 0, frac * 2.0 ** (1 - bias), (1 + frac) * 2.0 ** (e - bias))
    value = sign * value
    top = (1 << e_bits) - 1
    if kv_dtype == "e4m3":  # fn: only S.1111.111 is NaN; the rest of exponent 15 is finite
        value = np.where((e == top) & (m == 7), np.nan, value)
    else:  # IEEE-like: exponent 31 is inf (m = 0) or NaN
        value = np.where(e == top, np.where(m == 0, sign * np.inf, np.nan), value)
    return value


def decode_fp8(codes, kv_dtype: str) -> np.ndarray:
    """The exact float64 values of FP8 bytes (uint8)."""
    return _decode_table(kv_dtype)[np.asarray(codes, dtype=np.uint8)]


def encode_fp8(values, kv_dtype: str) -> np.ndarray:
    """float values -> FP8 bytes (uint8): round to nearest, ties to the even code; finite values
    beyond the largest saturate to +-largest (inf too); NaN stays NaN (0x7f, 0xff with its sign)."""
    x = np.asarray(values, dtype=np.float64)
    table = _decode_table(kv_dtype)
    largest = FP8[kv_dtype][3]
    finite_codes = np.array([c for c in range(0x80) if np.isfinite(table[c])])  # 0 .. largest, ascending
    grid = table[finite_codes]
    a = np.minimum(np.abs(np.nan_to_num(x, nan=0.0)), largest)
    hi = np.clip(np.searchsorted(grid, a), 0, len(grid) - 1)
    lo = np.clip(hi - 1, 0, len(grid) - 1)
    d_lo, d_hi = a - grid[lo], grid[hi] - a
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (finite_codes[hi] % 2 == 0))
    code = np.where(pick_hi, finite_codes[hi], finite_codes[lo])
    code = code | np.where(np.signbit(x), 0x80, 0)
    code = np.where(np.isnan(x), np.where(np.signbit(x), 0x80 | _NAN_CODE, _NAN_CODE), code)
    return code.astype(np.uint8)


def quantize_kv(x, kv_dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """A float cache (B, L, H, D) -> (stored bytes, float32 scales) for `kv_dtype`: FP8 scales
    max|x| / largest per (b, h) over L and D, i8 scales max|x| / 127 per block of 32 values; a
    slice or block of zeros gets scale 0 and bytes 0. The bytes are quantize_rows' (the values in
    f32, their f32 quotients by the scale rounded to the nearest code), what the kernels' append
    writes for the same values and scales. See the module docstring."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 4:
        raise ValueError(f"quantize_kv takes a cache of shape (B, L, H, D), not {x.shape}")
    if np.isinf(x).any():
        raise ValueError("quantize_kv: the cache holds inf, which no finite scale represents")
    if kv_dtype in FP8:  # the scale from the float64 max; the bytes as the kernels' append makes them
        amax = np.nanmax(np.abs(x), axis=(1, 3), initial=0.0)  # (B, H)
        scale = (amax / FP8[kv_dtype][3]).astype(np.float32)
        return quantize_rows(x, kv_dtype, scale[:, None, :]), scale
    if kv_dtype != "i8":
        raise ValueError(f"unknown kv_dtype {kv_dtype!r} (expected e4m3, e5m2, i8)")
    if x.shape[-1] % I8_BLOCK:
        raise ValueError(f"kv_dtype i8 needs a head dim that is a multiple of {I8_BLOCK}, not {x.shape[-1]}")
    if np.isnan(x).any():
        raise ValueError("quantize_kv: kv_dtype i8 has no NaN")
    return quantize_rows(x, "i8")


def dequantize_kv(stored, scale, kv_dtype: str) -> np.ndarray:
    """The float64 values of a contiguous quantized cache (B, L, H, D): exact (the decoded byte
    times the float64 of its f32 scale)."""
    stored, scale = np.asarray(stored), np.asarray(scale, dtype=np.float64)
    return unscaled(stored, kv_dtype) * expand_scale(scale, kv_dtype, stored.shape)


def unscaled(stored, kv_dtype: str) -> np.ndarray:
    """The decoded bytes as float64, before the scale."""
    return decode_fp8(stored, kv_dtype) if kv_dtype in FP8 else np.asarray(stored).astype(np.float64)


def expand_scale(scale: np.ndarray, kv_dtype: str, shape: tuple) -> np.ndarray:
    """A contiguous cache's scales broadcast to its shape (B, L, H, D)."""
    if kv_dtype in FP8:
        return scale[:, None, :, None]
    return np.repeat(scale, I8_BLOCK, axis=-1).reshape(shape)


def scale_shape(kv_dtype: str, stored_shape: tuple, batch: int) -> tuple:
    """The shape a call's k_scale / v_scale must have for a cache of `stored_shape`."""
    if kv_dtype in FP8:
        return (batch, stored_shape[2])
    return (*stored_shape[:-1], stored_shape[-1] // I8_BLOCK)


def check_scales(name: str, kernel: str, kv_dtype: str | None, stored, scale, batch: int, block_table=None,
                 kv_lens=None):
    """The checked float32 scales of `stored` (k or v, host or device), or a LaunchError naming
    the argument (`name`: k_scale or v_scale): missing, of another dtype or shape, inf, NaN,
    negative, or 0 over values that are not all 0 (checked where `stored` is a numpy array).

    What is checked when: shape and dtype on every call; the values (finite, >= 0) on every call
    where the scales are a numpy array (a scan of the scales: 1/32 of i8's values, two numbers per
    sequence for FP8), and the 0-over-values check where the cache is a numpy array too (a scan of
    the cache). Scales resident on the device (a target's tensor of dtype f32, e.g. WGSL's
    WgslTensor) are the caller's: shape and dtype only, nothing is read back (returned as they are)."""
    if kv_dtype is None:
        if scale is not None:
            raise LaunchError(f"{name}= needs a kernel built with `kv_dtype e4m3 | e5m2 | i8`; kernel '{kernel}' "
                              "stores K and V in its dtype")
        return None
    if scale is None:
        raise LaunchError(f"kernel '{kernel}' stores K and V as {kv_dtype}: pass k_scale= and v_scale= (float32, "
                          f"{'(B, Hkv)' if kv_dtype in FP8 else '(..., head_dim / 32)'}; docs/language.md, "
                          "\"Quantized KV caches\")")
    on_device = not isinstance(scale, np.ndarray) and hasattr(scale, "shape") and hasattr(scale, "dtype")
    if not isinstance(scale, np.ndarray) and not on_device:
        raise LaunchError(f"{name} must be a numpy float32 array (or one on the device), not {type(scale).__name__}")
    dtype = str(scale.dtype)
    check_scale_shape(name, kv_dtype, tuple(stored.shape), tuple(scale.shape),
                      "float32" if dtype in ("float32", "f32") else dtype, batch)
    if on_device:  # the values stay where they are: nothing is read back per call
        return scale
    for bad, why in ((np.isnan(scale), "NaN"), (np.isinf(scale), "inf"), (scale < 0, "a negative scale")):
        if bad.any():
            at = tuple(int(i) for i in np.argwhere(bad)[0])
            raise LaunchError(f"{name}{list(at)} is {scale[at]}: {why} (scales are finite and >= 0)")
    zero = scale == 0
    if zero.any() and isinstance(stored, np.ndarray):
        live = _nonzero_per_scale(stored, kv_dtype, batch, block_table, kv_lens)
        wrong = zero & live
        if wrong.any():
            at = tuple(int(i) for i in np.argwhere(wrong)[0])
            raise LaunchError(f"{name}{list(at)} is 0, but the values it scales are not all 0 (a scale of 0 is the "
                              "quantizer's all-zero block; every other value would be lost)")
    return np.ascontiguousarray(scale)


def check_scale_shape(name: str, kv_dtype: str, stored_shape: tuple, shape: tuple, dtype: str, batch: int) -> None:
    """A LaunchError naming `name` (k_scale or v_scale) when a scale array of `shape` and `dtype`
    (numpy's name: float32, ...) cannot hold the scales of a cache of `stored_shape` (any target:
    host or device arrays)."""
    want = scale_shape(kv_dtype, stored_shape, batch)
    if dtype != "float32":
        raise LaunchError(f"{name} has dtype {dtype}, but scales are float32")
    if tuple(shape) != want:
        what = "(B, Hkv): one per sequence and KV head" if kv_dtype in FP8 else \
            f"the cache's shape with the head dim replaced by head_dim / {I8_BLOCK}: one per block of {I8_BLOCK}"
        raise LaunchError(f"{name} has shape {tuple(shape)}, but kv_dtype {kv_dtype} needs {want} ({what})")


def _nonzero_per_scale(stored: np.ndarray, kv_dtype: str, batch: int, block_table, kv_lens) -> np.ndarray:
    """Whether any value a scale multiplies is non-zero, in the scales' shape."""
    nz = (stored.view(np.uint8) & 0x7F) != 0 if kv_dtype in FP8 else stored != 0  # FP8: 0x80 is -0.0
    if kv_dtype == "i8":
        return nz.reshape(*nz.shape[:-1], -1, I8_BLOCK).any(axis=-1)
    if block_table is None:
        return nz.any(axis=(1, 3))
    table, lens, page = np.asarray(block_table), np.asarray(kv_lens), stored.shape[1]
    out = np.zeros((batch, stored.shape[2]), bool)
    for b in range(batch):
        pages = table[b, : -(-int(lens[b]) // page)]
        rows = nz[pages].reshape(-1, *nz.shape[2:])[: int(lens[b])]
        out[b] = rows.any(axis=(0, 2))
    return out


# ---- the append's quantizer: what the kernels write for k_new / v_new (CUDA and WGSL) ----------

def quantize_rows(x, kv_dtype: str, scale=None):
    """Rows of k_new / v_new (..., D) quantized exactly as the kernels' append writes them
    (docs/language.md, "Quantized KV caches": the append), in f32 arithmetic:

    - FP8 (`scale`: float32, broadcast to x.shape[:-1]: the (sequence, KV head)'s static scale):
      y = f32(x) / scale (IEEE f32 division; scale 0: y = 0, NaN stays NaN), then the nearest FP8
      byte (ties to even, finite values beyond the largest and infinities saturated), NaN as 0x7f
      whatever its sign (the GPUs' f16 -> f32 conversions do not keep a NaN's sign). Returns the
      uint8 bytes.
    - i8: per block of 32 values, scale = max|x| / 127 (f32 division), byte = rint(x / scale) (f32
      division, ties to even) in -127 .. 127; a block of zeros gets scale 0 and bytes 0. Returns
      (int8 bytes, float32 scales (..., D / 32)); a block holding inf or NaN raises ValueError (the
      kernels store it with scale NaN and report it).

    The quotient is rounded twice, to f32 and then to the format: where the f32 quotient lands on a
    tie between two codes that the exact one is just off, the code is the even one, not the nearer
    (about 1 value in 5000 of standard normal data at e4m3; attngen.quantize_kv uses this function,
    so the offline and the appended bytes agree). IEEE f32 division and nothing else: CUDA's
    __fdiv_rn, numpy's float32, and WGSL's div_rn (the adapter's `/`, which WGSL lets be 2.5 ulp
    off, corrected to the nearest f32 by exact integer comparisons) give the same quotient."""
    x = np.asarray(x, dtype=np.float32)
    if kv_dtype in FP8:
        s = np.broadcast_to(np.asarray(scale, dtype=np.float32), x.shape[:-1])[..., None]
        with np.errstate(invalid="ignore", divide="ignore"):
            y = np.where(s != 0, x / np.where(s != 0, s, np.float32(1)), np.where(np.isnan(x), x, np.float32(0)))
        codes = encode_fp8(y.astype(np.float32).astype(np.float64), kv_dtype)
        return np.where(np.isnan(y), np.uint8(_NAN_CODE), codes).astype(np.uint8)  # NaN: 0x7f, its sign dropped
    if kv_dtype != "i8":
        raise ValueError(f"unknown kv_dtype {kv_dtype!r} (expected e4m3, e5m2, i8)")
    if x.shape[-1] % I8_BLOCK:
        raise ValueError(f"kv_dtype i8 needs a head dim that is a multiple of {I8_BLOCK}, not {x.shape[-1]}")
    if not np.isfinite(x).all():
        raise ValueError("kv_dtype i8 has no inf or NaN: a block of 32 holding one is stored with scale NaN "
                         "(and the kernels report it)")
    blocks = x.reshape(*x.shape[:-1], x.shape[-1] // I8_BLOCK, I8_BLOCK)
    scales = np.abs(blocks).max(axis=-1, initial=np.float32(0)) / np.float32(127)  # f32 division
    s = scales[..., None]
    with np.errstate(invalid="ignore", divide="ignore"):
        q = np.where(s > 0, np.rint(blocks / np.where(s > 0, s, np.float32(1))), np.float32(0))
    return np.clip(q, -127, 127).astype(np.int8).reshape(x.shape), scales.astype(np.float32)


def append_kv(kv_dtype: str, k, v, k_scale, v_scale, k_new, v_new, kv_lens, block_table=None):
    """Copies of a quantized cache (k, v and their scales) with the rows of k_new / v_new (B, Lnew,
    Hkv, D) quantized (quantize_rows) into keys kv_lens[b] .. of each sequence, as a call with an
    append leaves the cache: contiguous (B, L, Hkv, D), or paged (pages, page, Hkv, D) with
    block_table. FP8 scales stay as they are (the sequence's static scale); i8's are written at
    the new rows."""
    k, v = np.array(k), np.array(v)
    ks, vs = np.array(k_scale, dtype=np.float32), np.array(v_scale, dtype=np.float32)
    lens = np.asarray(kv_lens).astype(np.int64)
    for cache, sc, new in ((k, ks, np.asarray(k_new)), (v, vs, np.asarray(v_new))):
        for b in range(new.shape[0]):
            rows = new[b]  # (Lnew, Hkv, D)
            if kv_dtype in FP8:
                stored, scales = quantize_rows(rows, kv_dtype, sc[b][None, :]), None
            else:
                stored, scales = quantize_rows(rows, kv_dtype)
            for r in range(rows.shape[0]):
                j = int(lens[b]) + r
                at = (int(np.asarray(block_table)[b, j // cache.shape[1]]), j % cache.shape[1]) \
                    if block_table is not None else (b, j)
                cache[at] = stored[r]
                if scales is not None:
                    sc[at] = scales[r]
    return k, v, ks, vs
