"""A call of an FP8 prefill kernel (`dtype e4m3 | e5m2`, fp8.py): its inputs and descales.

    out = kernel(q, k, v, q_descale=qd, k_descale=kd, v_descale=vd)   # out: (B, Lq, Hq, Dv), `out=` dtype

q, k and v are torch float8 tensors of the spec's format (torch.float8_e4m3fn / float8_e5m2) or
uint8 arrays holding the FP8 bytes (CuPy, PyTorch), on one GPU. The descales (FlashAttention-3's)
are float32 (B, Hkv): device arrays are read in place (their values are checked by the
_prepare_v entry, which reports a bad one as device integer inputs are: raised by the next attngen
call, or by this one with check=True), host arrays are checked at once and uploaded; a descale not
given is 1. Everything else is CudaKernel's call (kernel.py): the descales travel as its
expression inputs do, by name, and the launches are the plan's, _prepare_v first.
"""

from __future__ import annotations

import numpy as np

from ...errors import LaunchError
from ...runtime.blockmask import BlockMask, mask_kind
from ...runtime.fp8 import DESCALES, check_descales
from .kernel import CudaKernel, _cupy
from .tensor_maps import TensorMapEncoder

# what a padded FP8 launch leaves out (docs/language.md, "FP8 prefill")
_NOT_BUILT = {"kv_lens": "per-sequence lengths", "cu_seqlens_q": "packed sequences", "cu_seqlens_k": "packed sequences",
              "block_table": "paged caches", "k_new": "appends", "v_new": "appends", "max_seqlen_q": "packed sequences",
              "max_seqlen_k": "packed sequences"}


class Fp8Kernel(CudaKernel):
    """A compiled FP8 prefill kernel (module docstring)."""

    _input_prefix = ""  # the descales are kernel parameters of their own names

    def __init__(self, emitted, cubin: bytes, device_id: int, backend=None):
        super().__init__(emitted, cubin, device_id, backend)
        self._inputs = DESCALES
        self._ones: dict = {}  # (framework, device, B, Hkv) -> a device array of ones (a descale not given)

    @property
    def _who(self) -> str:
        return f"kernel '{self.plan.spec.name}' (cuda, dtype {self.plan.dtype})"

    def __call__(self, q, k, v, *, q_descale=None, k_descale=None, v_descale=None, mask=None, return_lse=False,
                 out=None, check=False, **options):
        for name, x in options.items():
            if name in _NOT_BUILT and x is not None:
                raise LaunchError(f"{self._who}: {name}= ({_NOT_BUILT[name]}) is not built for FP8 yet (issue 44): "
                                  "FP8 kernels take padded batches (B, L, H, D)")
            if name not in _NOT_BUILT:
                raise LaunchError(f"{self._who}: unexpected argument {name}= (an FP8 kernel takes q, k, v, q_descale, "
                                  "k_descale, v_descale, mask, return_lse, out, check)")
        if self.plan.out_dtype == "bf16" and type(q).__module__.split(".")[0] != "torch":
            raise LaunchError(f"{self._who}: its output is bf16, which the cuda target makes with PyTorch; these inputs "
                              "are not PyTorch tensors (build with `dtype e4m3 out=f16` for CuPy arrays)")
        if mask is not None and (mask.kind if isinstance(mask, BlockMask) else mask_kind(mask.dtype)) != "bool":
            raise LaunchError(f"{self._who}: an additive mask is not built for FP8 yet: pass a boolean mask "
                              "(True = attend)")
        given = {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale}
        descales = {n: x if x is not None else self._ones_for(q, k) for n, x in given.items()}
        return self._call(q, k, v, mask, out, return_lse, None, None, check,
                          {"kv_lens": None, "cu_seqlens_q": None, "cu_seqlens_k": None, "block_table": None},
                          None, None, descales)[0]

    def torch_operator(self, name: str | None = None):
        raise LaunchError(f"{self._who}: FP8 kernels have no PyTorch operator yet (its schema has no descales and "
                          "its outputs follow q's dtype): call the kernel itself")

    def prepared(self, q, k, v, **options):
        """CudaKernel.prepared with the descales (1 where not given)."""
        for n in DESCALES:
            if options.get(n) is None:
                options[n] = self._ones_for(q, k)
        return super().prepared(q, k, v, **options)

    def _ones_for(self, q, k):
        """A float32 (B, Hkv) device array of ones, in q's framework on q's GPU (a descale not given)."""
        torch_kind = type(q).__module__.split(".")[0] == "torch"
        if not hasattr(q, "shape") or not hasattr(k, "shape") or len(q.shape) != 4 or len(k.shape) != 4:
            return None  # (the call's checks name what is wrong with q or k)
        dev = q.device.index if torch_kind else getattr(getattr(q, "device", None), "id", 0)
        key = (torch_kind, dev, int(q.shape[0]), int(k.shape[2]))
        ones = self._ones.get(key)
        if ones is None:
            if torch_kind:
                import torch
                ones = torch.ones(key[2:], dtype=torch.float32, device=q.device)
            else:
                cupy = _cupy()
                with cupy.cuda.Device(dev):
                    ones = cupy.ones(key[2:], dtype=cupy.float32)
            self._ones[key] = ones
        return ones

    def _device_inputs(self, inputs: dict, launch, dev: int) -> tuple:
        """({descale: address}, copies kept until the launch, whether the recipe may be kept): device
        float32 (B, Hkv) arrays as they are (copied when not contiguous), host ones checked and uploaded."""
        cupy, shape = _cupy(), (launch.batch, launch.heads_kv)
        ptrs, keep, cacheable = {}, [], True
        host = {n: x for n, x in inputs.items() if x is not None and not _on_device(x)}
        checked = check_descales(host, *shape, self._who) if host else {}
        for name in DESCALES:
            x = inputs.get(name)
            if x is None:
                raise LaunchError(f"{self._who}: {name} is missing")  # (never: __call__ fills in ones)
            if name in host:
                with cupy.cuda.Device(dev):
                    x = cupy.asarray(checked[name])
                keep.append(x)
                cacheable = False
            else:
                mod = type(x).__module__.split(".")[0]
                dtype = str(x.dtype).replace("torch.", "") if mod == "torch" else np.dtype(x.dtype).name
                where = x.device.index if mod == "torch" else x.device.id
                if dtype != "float32":
                    raise LaunchError(f"{self._who}: {name} is a device array of {dtype}; descales are float32 "
                                      "(no conversion is made)")
                if tuple(x.shape) != shape:
                    raise LaunchError(f"{self._who}: {name} has shape {tuple(x.shape)}; it must be (B, Hkv) = {shape}: "
                                      "one descale per sequence and KV head")
                if where != dev:
                    raise LaunchError(f"{self._who}: {name} is on GPU {where}, but q is on GPU {dev}")
                if not (x.is_contiguous() if mod == "torch" else x.flags.c_contiguous):
                    x = x.contiguous() if mod == "torch" else cupy.ascontiguousarray(x)
                    keep.append(x)
                    cacheable = False
            ptrs[name] = x.data_ptr() if type(x).__module__.startswith("torch") else x.data.ptr
        return ptrs, keep, cacheable

    def _maps(self, named: dict, launch) -> dict:
        """tmap_v over the vt workspace (fp8.py): (B, Dv, Hkv, key slots) as the map's (batch, rows, heads,
        columns), boxes of one column block of the V^T tile's head-dim rows (fp8.vt_swizzle); and with Q and K in
        the 64-byte swizzle (CudaConfig.qk_swizzle), tmap_q and tmap_k in its place (qk_maps)."""
        from .fp8 import padded_keys, vt_swizzle
        slots, dv, hkv = padded_keys(launch.len_k), self.plan.d_v, launch.heads_kv
        shape = (launch.batch, dv, hkv, slots)
        maps = qk_maps(self.plan, named, launch)
        if min(shape) == 0:
            return {**maps, "tmap_v": None}  # (no keys: nothing is read)
        swizzle = vt_swizzle(self.plan.config.tile_kv)  # (boxes of one column block of a V^T tile)
        return {**maps, "tmap_v": TensorMapEncoder("vt", shape, (hkv * dv * slots, slots, dv * slots, 1),
                                                   self.plan.dtype, self.plan.config.d_v_pad, swizzle=swizzle,
                                                   box_cols=swizzle // 2)}


def qk_maps(plan, named: dict, launch) -> dict:
    """tmap_q and tmap_k of a kernel whose Q and K tiles are in the 64-byte swizzle (CudaConfig.qk_swizzle 64,
    templates/cuda/copy.j2, tma_tile_sw64): boxes of 32 two-value elements (one 64-byte row) x tile rows, the
    64-byte swizzle; {} for the 128-byte one (kernel.py's maps)."""
    if plan.config.qk_swizzle != 64:
        return {}
    maps = {}
    for name, rows, box in (("q", launch.len_q, plan.tile_q), ("k", launch.len_k, plan.tile_kv)):
        t = named[name]
        shape = (t.shape[0], rows, t.shape[2], t.shape[3]) if len(t.shape) == 4 else None
        if shape is not None and min(shape) > 0:  # (else kernel.py's: none)
            maps["tmap_" + name] = TensorMapEncoder(name, shape, t.strides, t.dtype, box, swizzle=64, box_cols=32)
    return maps


def _on_device(x) -> bool:
    """A CuPy array or a CUDA torch tensor (else a host array: numpy, a list, a CPU tensor)."""
    mod = type(x).__module__.split(".")[0]
    if mod == "torch":
        return bool(x.is_cuda)
    return mod == "cupy" or hasattr(x, "__cuda_array_interface__")


__all__ = ["Fp8Kernel", "qk_maps"]
