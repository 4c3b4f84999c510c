"""Tensor maps of the tensor copy engine (TMA) for the Hopper family's producer kernels.

A producer kernel with `CudaConfig.tma` takes K and V (and Q, `CudaConfig.tma_q`) as
`CUtensorMap` parameters (128 opaque bytes each, passed by value as `__grid_constant__`), one per
tensor: a 4-d view (head-dim columns, heads, keys or rows, batch) with boxes of 64 columns x 1
head x tile kv keys (Q: tile q rows) x 1 sequence, the 128-byte swizzle the wgmma descriptors
read, and zeros for keys or rows past the length and columns past the head dim
(templates/cuda/copy.j2, `tma_tile`); and the fast backward's f32 dQ accumulator, which the engine
adds boxes of 64 rows x 32 floats into (templates/cuda/backward_wgmma_base.j2, `tma_reduce_add`).
The maps are built here with the driver's `cuTensorMapEncodeTiled`, called through ctypes on
libcuda (no new dependency: the driver is what runs the kernels anyway). The shape, strides and box of a map are fixed per call
signature (launch.py's Recipe); only the address changes from call to call, so each
`TensorMapEncoder` keeps its last address and re-encodes only when a call brings another one
(a host function of the driver, about a microsecond).
"""

from __future__ import annotations

import ctypes

from ...errors import LaunchError

# CUtensorMap enums (cuda.h)
_DTYPES = {"f16": 6, "bf16": 9, "f32": 7}  # CU_TENSOR_MAP_DATA_TYPE_FLOAT16, _BFLOAT16, _FLOAT32
# FP8 bytes (FP8 prefill; uint8: a CuPy array of them) are mapped as UINT16 pairs of values (the
# kernels' elem_t): the map's columns are half the head dim, its boxes of 64 pairs 128 bytes
_PAIRS = ("e4m3", "e5m2", "uint8")
_UINT16 = 1  # CU_TENSOR_MAP_DATA_TYPE_UINT16
_ELEM_BYTES = {"f16": 2, "bf16": 2, "f32": 4, "e4m3": 1, "e5m2": 1, "uint8": 1}
_NO_INTERLEAVE, _SWIZZLE_NONE, _SWIZZLE_128B, _L2_128B, _OOB_ZERO = 0, 0, 3, 2, 0
MAP_BYTES, MAP_ALIGN = 128, 64
_SWIZZLES = {False: _SWIZZLE_NONE, 32: 1, 64: 2, 128: _SWIZZLE_128B}  # CU_TENSOR_MAP_SWIZZLE_*, by bytes
BOX_COLS = 64  # one 128-byte swizzle block of 2-byte elements (of f32: 32, box_cols)
_MAX_STRIDE = 2**40

_LIB: list = []


def _driver():
    if not _LIB:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            fn = lib.cuTensorMapEncodeTiled
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                           ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
                           ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32),
                           ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
            _LIB.append(fn)
        except (OSError, AttributeError) as e:
            raise LaunchError(f"the tensor copy engine's maps need the CUDA driver's cuTensorMapEncodeTiled "
                              f"(libcuda.so.1, CUDA 12 or newer): {e}") from None
    return _LIB[0]


def tma_layout_problem(shape: tuple, strides: tuple, dtype: str) -> str | None:
    """Why a (B, L, H, D) tensor (strides in elements) cannot be read through a tensor map, or
    None: the map needs positive strides below 2^40 bytes, multiples of 16 bytes (the runtime
    copies other layouts first, as it does for layouts its 16-byte copies cannot read)."""
    e = _ELEM_BYTES.get(dtype)
    if e is None:
        return f"dtype {dtype} has no tensor map here"
    for n, s in zip(shape[:3], strides[:3]):
        if n > 1 and (s <= 0 or (s * e) % 16 or s * e >= _MAX_STRIDE):
            return f"stride {s} elements along an axis of {n}"
    return None


class TensorMapEncoder:
    """The tensor map of one (B, L, H, D) tensor of one call signature; `encode(ptr)` writes the
    128 bytes for the tensor at `ptr` (kept while the address stays the same)."""

    def __init__(self, source: str, shape: tuple, strides: tuple, dtype: str, box_rows: int, swizzle: bool | int = True,
                 box_cols: int = BOX_COLS):
        b, length, h, d = shape
        e = _ELEM_BYTES[dtype]  # bytes of an element of `strides`
        self.source = source  # the call's tensor whose address the map holds ("q", "k", "v", "out", FP8's "vt")
        # True: the 128-byte swizzle; or its bytes, 128, 64 or 32 (FP8's V^T by its tile kv, fp8.vt_swizzle; FP8's
        # Q and K of head dims up to 64: 64, CudaConfig.qk_swizzle); False: none (out's staging buffer)
        self.swizzle = _SWIZZLES[swizzle] if swizzle is not True else _SWIZZLE_128B
        pairs = dtype in _PAIRS
        self.dtype = _UINT16 if pairs else _DTYPES[dtype]
        self.dims = (ctypes.c_uint64 * 4)(d // 2 if pairs else d, h, length, b)
        # strides of the head, key and batch axes in bytes; an axis of one element may have any
        # stride (torch's of a size-1 axis, say): the map gets the contiguous one, never stepped by
        out, prev = [], (e, d)
        for n, s in ((h, strides[2]), (length, strides[1]), (b, strides[0])):
            out.append(s * e if n > 1 else prev[0] * prev[1])
            prev = (out[-1], n)
        self.strides = (ctypes.c_uint64 * 3)(*out)
        self.box = (ctypes.c_uint32 * 4)(box_cols, 1, box_rows, 1)
        self.elem = (ctypes.c_uint32 * 4)(1, 1, 1, 1)
        self._raw = ctypes.create_string_buffer(MAP_BYTES + MAP_ALIGN)
        base = ctypes.addressof(self._raw)
        self.address = base + (-base % MAP_ALIGN)  # CUtensorMap is 64-byte aligned
        self.ptr = None

    def encode(self, ptr: int) -> int:
        """The host address of the 128 bytes of the map for the tensor at `ptr`."""
        if ptr != self.ptr:
            rc = _driver()(self.address, self.dtype, 4, ptr, self.dims, self.strides, self.box, self.elem,
                           _NO_INTERLEAVE, self.swizzle, _L2_128B, _OOB_ZERO)
            if rc != 0:
                self.ptr = None
                dims, strides = tuple(self.dims), tuple(self.strides)
                raise LaunchError(f"{self.source}: cuTensorMapEncodeTiled failed (CUresult {rc}) for dims {dims}, "
                                  f"byte strides {strides}, address {ptr:#x}; build the kernel with "
                                  "target cuda { tma=off } to copy the tiles without the tensor copy engine")
            self.ptr = ptr
        return self.address


__all__ = ["MAP_ALIGN", "MAP_BYTES", "TensorMapEncoder", "tma_layout_problem"]
