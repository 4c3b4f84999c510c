"""FP8 prefill (`dtype e4m3 | e5m2`, issue 44): the inputs' bytes, the descales, a quantizer, for
every runtime and the float64 reference.

    q8, q_descale = attngen.quantize_fp8(q, "e4m3", heads_kv=4)   # numpy in: (bytes, (B, Hkv) f32)
    q64 = attngen.dequantize_fp8(q8, q_descale, "e4m3")           # the exact float64 values

A value of q, k or v is its FP8 byte's value (runtime/kvquant.py decodes them exactly) times the
descale of its (sequence, KV head): q_descale, k_descale and v_descale are float32 of shape
(B, Hkv), as FlashAttention-3 takes them (q's per KV head: a GQA group of query heads shares one).
Each must be finite and > 0; a call without them takes 1 (docs/language.md, "FP8 prefill").
"""

from __future__ import annotations

import numpy as np

from ..errors import LaunchError
from .kvquant import FP8, decode_fp8, encode_fp8

DESCALES = ("q_descale", "k_descale", "v_descale")
# torch's dtypes of FP8 bytes, by spec dtype (torch.float8_e4m3fn is the OCP "fn" format)
TORCH_FP8 = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}


def fp8_bytes(name: str, x, dtype: str, who: str) -> np.ndarray:
    """The host uint8 bytes of an FP8 input: a torch float8 tensor of the spec's format, or a uint8
    array holding the bytes (numpy, CuPy, a CPU or CUDA torch tensor); anything else a LaunchError
    naming the argument and what it needs."""
    mod = type(x).__module__.split(".")[0]
    if mod == "torch":
        kind = str(x.dtype).replace("torch.", "")
        if kind == TORCH_FP8[dtype] or kind == "uint8":
            t = x.detach()
            return (t.view(__import__("torch").uint8) if kind != "uint8" else t).cpu().numpy()
        raise LaunchError(f"{who}: {name} is a torch.{kind} tensor; spec dtype {dtype} takes torch.{TORCH_FP8[dtype]} "
                          "or uint8 bytes (attngen.quantize_fp8 makes them)")
    a = x.get() if callable(getattr(x, "get", None)) and hasattr(x, "dtype") else np.asarray(x)
    if a.dtype != np.uint8:
        raise LaunchError(f"{who}: {name} has dtype {a.dtype}; spec dtype {dtype} takes its FP8 bytes as uint8 "
                          f"(or a torch.{TORCH_FP8[dtype]} tensor; attngen.quantize_fp8 makes them)")
    return a


def check_descales(given: dict, batch: int, heads_kv: int, who: str) -> dict:
    """{name: float32 (B, Hkv) host array} of the descales given on the host (None: all ones), each
    checked: float32 (or float64 / Python floats, read as float32), shape (B, Hkv), finite and > 0;
    a LaunchError naming the argument, its index and the reason otherwise."""
    out = {}
    for name in DESCALES:
        x = given.get(name)
        if x is None:
            out[name] = np.ones((batch, heads_kv), np.float32)
            continue
        a = np.asarray(x)
        if not (np.issubdtype(a.dtype, np.floating) or a.dtype == np.float32):
            raise LaunchError(f"{who}: {name} has dtype {a.dtype}; descales are float32")
        if a.shape != (batch, heads_kv):
            raise LaunchError(f"{who}: {name} has shape {tuple(a.shape)}; it must be (B, Hkv) = ({batch}, {heads_kv}): "
                              "one descale per sequence and KV head")
        a = a.astype(np.float32)
        for bad, why in ((np.isnan(a), "NaN"), (np.isinf(a), "inf"), (a <= 0, "not > 0")):
            if bad.any():
                at = tuple(int(i) for i in np.argwhere(bad)[0])
                raise LaunchError(f"{who}: {name}[{at[0]}, {at[1]}] is {a[at]}: {why} (descales are finite and > 0)")
        out[name] = np.ascontiguousarray(a)
    return out


def dequantize_fp8(stored, descale, dtype: str, group: int | None = None) -> np.ndarray:
    """The exact float64 values of FP8 bytes (B, L, H, D) with descales (B, Hkv): each byte's value
    times the descale of its sequence and KV head (H / Hkv heads per KV head, or `group`)."""
    stored = np.asarray(stored, dtype=np.uint8)
    d = np.asarray(descale, dtype=np.float64)
    group = group if group is not None else stored.shape[2] // d.shape[1]
    return decode_fp8(stored, dtype) * np.repeat(d, group, axis=1)[:, None, :, None]


def quantize_fp8(x, dtype: str = "e4m3", heads_kv: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A float tensor (B, L, H, D) -> (FP8 bytes as uint8, float32 descales (B, Hkv)): per sequence and
    KV head (H / heads_kv heads each; default: every head its own), descale = max|x| / the format's
    largest value, bytes = x / descale rounded to nearest even (saturating). An all-zero slice gets
    descale 1 (descales are > 0). inf has no FP8 descale: a ValueError."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 4:
        raise ValueError(f"quantize_fp8 takes a tensor of shape (B, L, H, D), not {x.shape}")
    if dtype not in FP8:
        raise ValueError(f"unknown FP8 dtype {dtype!r} (expected e4m3, e5m2)")
    if np.isinf(x).any():
        raise ValueError("quantize_fp8: the tensor holds inf, which no finite descale represents")
    heads_kv = heads_kv or x.shape[2]
    if x.shape[2] % heads_kv:
        raise ValueError(f"quantize_fp8: {x.shape[2]} heads are not a multiple of heads_kv={heads_kv}")
    g = x.shape[2] // heads_kv
    grouped = x.reshape(x.shape[0], x.shape[1], heads_kv, g, x.shape[3])
    amax = np.nanmax(np.abs(grouped), axis=(1, 3, 4), initial=0.0)  # (B, Hkv)
    descale = np.where(amax > 0, amax / FP8[dtype][3], 1.0).astype(np.float32)
    return encode_fp8(x / np.repeat(descale.astype(np.float64), g, axis=1)[:, None, :, None], dtype), descale
