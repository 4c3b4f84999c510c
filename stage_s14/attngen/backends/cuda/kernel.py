"""CUDA runtime: NVRTC -> cubin (cached on disk) -> CuPy module -> launch.

Accepts CuPy arrays, PyTorch CUDA tensors, anything with __cuda_array_interface__, and
DLPack producers. Strides are honoured: the kernel reads any layout whose head dim is
contiguous, whose other strides are multiples of 16 bytes and whose base pointer is 16-byte
aligned; other layouts are first copied to a contiguous buffer (inputs only; an `out=` that
the kernel cannot write directly is an error). Work is launched on the caller's current
stream (PyTorch's for torch tensors, CuPy's otherwise).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import warnings
from dataclasses import dataclass

import numpy as np

from ...errors import LaunchError
from ...plan.lower import lower
from ...plan.profiles import Profile
from ...resources import generator_version
from ...runtime.blockmask import BlockMask, check_against, mask_keys
from ...runtime.cache import cache_key, cached
from ...runtime.kernel import Kernel, Rendered
from ...runtime.launch import OnDevice, host_ints, on_device, resolve
from . import args as cuda_args
from . import nvrtc
from .devices import cupy_module, device_profile, gpu_count, one_gpu, profile_for
from .launch import (KEPT_FOR_GRAPHS, ZEROED, Packed, Recipe, capturing, error_flags, pending, raise_pending,
                       register_sites, workspace_layout)
from .tensor_maps import TensorMapEncoder, tma_layout_problem

_TORCH_DTYPES = {"torch.float16": "f16", "torch.bfloat16": "bf16", "torch.float32": "f32",
                 "torch.float8_e4m3fn": "e4m3", "torch.float8_e5m2": "e5m2"}
_NP_DTYPES = {"float16": "f16", "float32": "f32", "bfloat16": "bf16"}
# (FP8 bytes: torch's float8 tensors as e4m3 / e5m2, uint8 arrays; a quantized cache's int8)
_ELEM_BYTES = {"f16": 2, "bf16": 2, "f32": 4, "e4m3": 1, "e5m2": 1, "uint8": 1, "int8": 1}
_cupy = cupy_module


@dataclass
class _Tensor:
    """A device array seen through its pointer, shape, strides (elements) and dtype."""

    obj: object
    kind: str  # torch | cupy
    ptr: int
    shape: tuple
    strides: tuple
    dtype: str  # f16 | bf16 | f32, or a description of something else
    device: int


def _as_tensor(name: str, x) -> _Tensor:
    mod = type(x).__module__.split(".")[0]
    if mod == "torch":
        if not x.is_cuda:
            raise LaunchError(f"{name} is a PyTorch tensor on {x.device}; the cuda target needs CUDA "
                              "tensors (move it with .cuda())")
        dtype = _TORCH_DTYPES.get(str(x.dtype), str(x.dtype).replace("torch.", ""))
        return _Tensor(x, "torch", x.data_ptr(), tuple(x.shape), tuple(x.stride()), dtype, x.device.index)
    if isinstance(x, np.ndarray):
        raise LaunchError(f"{name} is a numpy array in host memory; the cuda target needs device "
                          "arrays (CuPy, PyTorch CUDA tensors, or anything with "
                          "__cuda_array_interface__ or DLPack)")
    cupy = _cupy()
    if not isinstance(x, cupy.ndarray):
        if hasattr(x, "__cuda_array_interface__"):
            x = cupy.asarray(x)
        elif hasattr(x, "__dlpack__"):
            try:
                x = cupy.from_dlpack(x)
            except Exception as e:  # a host DLPack array, an unsupported dtype, ...
                raise LaunchError(f"{name}: cannot take it through DLPack onto the GPU ({e})") from None
        else:
            raise LaunchError(f"{name} is a {type(x).__name__}; the cuda target needs CuPy arrays, "
                              "PyTorch CUDA tensors, or objects with __cuda_array_interface__ / DLPack")
    item = x.dtype.itemsize
    strides = tuple(s // item for s in x.strides)
    return _Tensor(x, "cupy", x.data.ptr, tuple(x.shape), strides,
                   _NP_DTYPES.get(x.dtype.name, x.dtype.name), x.device.id)


def _readable(t: _Tensor) -> bool:
    """Whether the kernel's 16-byte copies can read this layout directly."""
    vec = 16 // _ELEM_BYTES.get(t.dtype, 16)
    if t.ptr % 16 or (t.shape[-1] > 1 and t.strides[-1] != 1):
        return False
    return all(s % vec == 0 for s, n in zip(t.strides[:-1], t.shape[:-1]) if n > 1)


def _extent(t: _Tensor) -> tuple[int, int]:
    """The byte range [start, end) a tensor's elements span."""
    item = _ELEM_BYTES.get(t.dtype, 1)
    if any(n == 0 for n in t.shape):
        return t.ptr, t.ptr
    lo = sum((n - 1) * s for n, s in zip(t.shape, t.strides) if s < 0)
    hi = sum((n - 1) * s for n, s in zip(t.shape, t.strides) if s > 0)
    return t.ptr + lo * item, t.ptr + (hi + 1) * item


def _overlap(a: _Tensor, b: _Tensor) -> bool:
    (a0, a1), (b0, b1) = _extent(a), _extent(b)
    return a.device == b.device and a0 < b1 and b0 < a1


def _contiguous(name: str, t: _Tensor) -> _Tensor:
    if t.kind == "torch":
        c = t.obj.contiguous()
        if c.data_ptr() % 16:
            c = c.clone()
        return _as_tensor(name, c)
    cupy = _cupy()
    return _as_tensor(name, cupy.array(t.obj, copy=True, order="C"))


def _launch_stream(kind: str, device: int):
    """A context in which CuPy works on the stream the kernels are launched on."""
    if kind != "torch":
        return contextlib.nullcontext()  # CuPy's current stream already
    with warnings.catch_warnings():  # CuPy 14 prefers Stream.from_external, which takes no raw handle
        warnings.simplefilter("ignore", DeprecationWarning)
        return _cupy().cuda.ExternalStream(_stream_getter(kind, device)())


_KINDS: dict = {}  # type -> "torch" | "cupy" | "" (the fast path takes exactly these two array types)


def _kind(x) -> str:
    t = type(x)
    kind = _KINDS.get(t)
    if kind is None:
        mod = t.__module__.split(".")[0]
        kind = _KINDS[t] = ("torch" if mod == "torch" and t.__name__ == "Tensor" else
                            "cupy" if mod == "cupy" and t.__name__ == "ndarray" else "")
    return kind


_ARRAYS = ("q", "k", "v", "k_new", "v_new", "kv_lens", "cu_seqlens_q", "cu_seqlens_k", "block_table", "k_scale",
           "v_scale")


def _signature(arrays: tuple, mask, out, options: tuple):
    """(key of a call's Recipe, addresses of `arrays` (0 where None)), or (None, None) when the
    call must be checked in full: arrays other than torch tensors and CuPy arrays (host integer
    arrays, objects seen through __cuda_array_interface__ or DLPack), masks that are not a
    BlockMask. The key holds what the checks read: shapes, strides, dtypes, devices, alignment."""
    key, ptrs = [options], []
    for x in arrays:
        if x is None:
            key.append(None)
            ptrs.append(0)
            continue
        kind = _KINDS.get(type(x)) or _kind(x)
        if kind == "torch":
            p = x.data_ptr()
            key.append((x.shape, x.stride(), x.dtype, x.get_device(), p & 15))
        elif kind == "cupy":
            p = x.data.ptr
            key.append((x.shape, x.strides, x.dtype, x.device.id, p & 15))
        else:
            return None, None
        ptrs.append(p)
    if mask is not None:
        if not isinstance(mask, BlockMask):
            return None, None
        key.append((mask.kind, mask.shape, mask.tile_q, mask.tile_kv, mask.device))
    if out is not None:
        kind = _kind(out)
        if not kind:
            return None, None
        p = out.data_ptr() if kind == "torch" else out.data.ptr
        key.append((out.shape, out.stride() if kind == "torch" else out.strides, out.dtype,
                    out.get_device() if kind == "torch" else out.device.id, p & 15))
    return tuple(key), ptrs


_NO_INTS = {"kv_lens": None, "cu_seqlens_q": None, "cu_seqlens_k": None, "block_table": None}


def _qkv_signature(q, k, v):
    """(key, q's, k's and v's addresses) of a call with q, k and v alone, all PyTorch tensors: what
    _signature keys (shapes, strides, dtypes, devices, alignment), read with fewer steps (a plain
    call's host time, benchmarks/probes/probe_host.py); None for anything else (_signature decides)."""
    if _KINDS.get(type(q)) != "torch" or _KINDS.get(type(k)) != "torch" or _KINDS.get(type(v)) != "torch":
        return None
    pq, pk, pv = q.data_ptr(), k.data_ptr(), v.data_ptr()
    return ((_QKV, q.shape, q.stride(), q.dtype, q.get_device(), k.shape, k.stride(), k.dtype, k.get_device(),
             v.shape, v.stride(), v.dtype, v.get_device(), pq & 15, pk & 15, pv & 15), pq, pk, pv)


_QKV = "q, k, v alone"  # the first item of _qkv_signature's keys (no key of _signature starts with it)


def _ptr(x) -> int:
    return x.data_ptr() if _kind(x) == "torch" else x.data.ptr


def _int_input(name: str, x, ndim: int, device: int):
    """(what resolve checks, the device array the kernel reads or None, its row stride in
    elements) of an integer input: a device array stays where it is (int32, read by the kernel
    as it is: resolve gets its shape only), anything else is read on the host (resolve checks
    its contents; it is copied to the GPU after the checks)."""
    mod = type(x).__module__.split(".")[0]
    if mod == "torch" and x.is_cuda:
        where, dtype = x.device.index, str(x.dtype).replace("torch.", "")
    elif mod == "cupy" or (mod != "torch" and hasattr(x, "__cuda_array_interface__")):
        if mod != "cupy":
            x = _cupy().asarray(x)
        where, dtype = x.device.id, x.dtype.name
    else:
        return host_ints(name, x, ndim), None, None
    if where != device:
        raise LaunchError(f"{name} is on GPU {where}, but q is on GPU {device}")
    desc = on_device(name, tuple(x.shape), dtype, ndim)
    strides = tuple(x.stride()) if mod == "torch" else tuple(s // 4 for s in x.strides)
    if any(n > 1 and st != 1 for n, st in zip(x.shape[1:], strides[1:])) or (
            ndim == 1 and x.shape[0] > 1 and strides[0] != 1):
        x = x.contiguous() if mod == "torch" else _cupy().ascontiguousarray(x)
        strides = tuple(x.stride()) if mod == "torch" else tuple(s // 4 for s in x.strides)
    return desc, x, (strides[0] if ndim == 2 else 1)


class CudaKernel(Kernel):
    target = "cuda"

    def __init__(self, emitted, cubin: bytes, device_id: int, backend=None):
        super().__init__(emitted)
        self.backend = backend  # the CUDA backend (its backward: backward.py, which imports this module)
        self.cubin = cubin
        self._functions: dict = {}
        self._home_device = device_id
        self._sm_count: dict = {}
        self._recipes: dict = {}  # call signature -> Recipe (launch.py)
        # expression inputs (issue 42): their names, and where this kernel's reads out of bounds are reported
        self._inputs = tuple(i.name for i in emitted.plan.spec.inputs)  # (fp8_call.Fp8Kernel: the descales)
        self._site0 = register_sites(_site_messages(emitted.plan.spec)) if self._inputs else 0

    def _function(self, device_id: int, entry: str | None = None):
        """The loaded entry point (the main one by default) on a device."""
        entry = entry or self.plan.entry
        module = self._functions.get(device_id)
        if module is None:
            cupy = _cupy()
            with cupy.cuda.Device(device_id):
                module = cupy.cuda.function.Module()
                module.load(self.cubin)
            self._functions[device_id] = module = (module, {})
        fns = module[1]
        if entry not in fns:
            cupy = _cupy()
            with cupy.cuda.Device(device_id):
                fn = module[0].get_function(entry)
                smem = next(e[4] for e in cuda_args.entry_points(self.plan) if e[0] == entry)
                # Above 48 KiB of dynamic shared memory a kernel must opt in.
                cupy.cuda.driver.funcSetAttribute(
                    fn.ptr, cupy.cuda.driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)
            fns[entry] = fn
        return fns[entry]

    _input_prefix = "input_"  # the kernel parameter of an expression input (fp8_call.Fp8Kernel: a descale's own name)

    def _device_inputs(self, inputs: dict, launch, dev: int) -> tuple:
        """({parameter: address}, copies kept until the launch, whether the recipe may be kept) of the
        call's expression inputs (args.device_inputs)."""
        return cuda_args.device_inputs(self.plan.spec, inputs, launch, dev, f"kernel '{self.plan.spec.name}' (cuda)")

    def _maps(self, named: dict, launch) -> dict:
        """Tensor maps a kernel adds to, or puts in place of, those of q, k and v (none here)."""
        return {}

    def torch_operator(self, name: str | None = None):
        """This kernel as a PyTorch operator (attngen.torch.operator; docs/torch.md)."""
        from .torch_op import TorchOperator, operator_name
        return TorchOperator(self, name or operator_name(self, kernel_key(self.plan)))

    def compute_units(self) -> int:
        """The current GPU's multiprocessors (a call's, for the inputs on that GPU)."""
        return self._cores(_cupy().cuda.Device().id)

    def _cores(self, device_id: int) -> int:
        if device_id not in self._sm_count:
            cupy = _cupy()
            self._sm_count[device_id] = cupy.cuda.Device(device_id).attributes["MultiProcessorCount"]
        return self._sm_count[device_id]

    def block_mask(self, mask) -> BlockMask:
        """A BlockMask of `mask` for this kernel's tiles, built on the GPU (attngen.block_mask)."""
        device = _cupy().cuda.Device().id
        mod = type(mask).__module__.split(".")[0]
        if mod == "cupy":
            device = mask.device.id
        elif mod == "torch" and mask.is_cuda:
            device = mask.device.index
        return cuda_args.build_block_mask(mask, self.plan.tile_q, self.plan.tile_kv, device)

    def backward(self, q, k, v, out, lse, dout, **options):
        """(dq, dk, dv) of this kernel's attention (docs/backward.md): three launches on the caller's
        stream, outputs of q's kind (backends/cuda/backward.py, through the backend). The call's
        options, and its expression inputs by name (checked as the call's; any other keyword is a
        LaunchError naming it)."""
        known = ("mask", "kv_lens", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")
        inputs = {n: x for n, x in options.items() if n not in known}
        return self.backend.run_backward(self, q, k, v, out, lse, dout, inputs=inputs,
                                         **{n: x for n, x in options.items() if n in known})

    def __call__(self, q, k, v, *, mask=None, kv_lens=None, cu_seqlens_q=None, cu_seqlens_k=None,
                 block_table=None, k_new=None, v_new=None, return_lse=False, out=None, max_seqlen_q=None,
                 max_seqlen_k=None, check=False, k_scale=None, v_scale=None, **inputs):
        """See docs/variants.md for the options; every input is checked before the launch, once
        per signature (docs/cuda-calls.md). Integer inputs on the GPU are checked by the kernels:
        what they find is raised by the next attngen call, or by this one with check=True (which
        synchronises). `**inputs`: the spec's expression inputs by name (docs/language.md), CuPy
        arrays or PyTorch CUDA tensors of their declared dtype and shape; a read out of an input's
        bounds is reported like a bad integer input. k_scale / v_scale: a quantized cache's scales
        (kv_dtype, docs/language.md "Quantized KV caches"), CUDA float32 arrays (or numpy, uploaded and
        checked per call)."""
        scales = {"k_scale": k_scale, "v_scale": v_scale}
        if inputs or k_scale is not None or v_scale is not None:
            return self._call(q, k, v, mask, out, return_lse, max_seqlen_q, max_seqlen_k, check,
                              {"kv_lens": kv_lens, "cu_seqlens_q": cu_seqlens_q, "cu_seqlens_k": cu_seqlens_k,
                               "block_table": block_table}, k_new, v_new, inputs, scales)[0]
        if (mask is None and out is None and kv_lens is None and block_table is None and cu_seqlens_q is None
                and cu_seqlens_k is None and k_new is None and v_new is None and not return_lse and not check
                and max_seqlen_q is None and max_seqlen_k is None):
            # q, k and v alone (a plain prefill call): the same signature as _call's, fewer steps
            qkv = _qkv_signature(q, k, v)
            if qkv is not None:
                recipe = self._recipes.get(qkv[0])
                if recipe is not None:
                    if pending():
                        raise_pending()
                    return self._run(recipe, {"q": qkv[1], "k": qkv[2], "v": qkv[3]}, None, False, q)[0]
                result, recipe, _, _ = self._call(q, k, v, None, None, False, None, None, False, _NO_INTS, None, None)
                if recipe.cacheable:
                    self._keep_recipe(qkv[0], recipe)
                return result
        return self._call(q, k, v, mask, out, return_lse, max_seqlen_q, max_seqlen_k, check,
                          {"kv_lens": kv_lens, "cu_seqlens_q": cu_seqlens_q, "cu_seqlens_k": cu_seqlens_k,
                           "block_table": block_table}, k_new, v_new)[0]

    def _call(self, q, k, v, mask, out, return_lse, max_seqlen_q, max_seqlen_k, check, ints, k_new, v_new,
              inputs=None, scales=None):
        """(result, recipe, addresses, workspace) of a call; `inputs`: the expression inputs given;
        `scales`: k_scale and v_scale (a quantized cache's)."""
        if pending():
            raise_pending()
        inputs = inputs or {}
        scales = scales or {}
        arrays = (q, k, v, k_new, v_new, ints["kv_lens"], ints["cu_seqlens_q"], ints["cu_seqlens_k"],
                  ints["block_table"], scales.get("k_scale"), scales.get("v_scale"),
                  *(inputs.get(n) for n in self._inputs))
        key, addrs = _signature(arrays, mask, out, (bool(return_lse), max_seqlen_q, max_seqlen_k))
        if set(inputs) - set(self._inputs):  # an unknown keyword: the checks name it
            key = None
        recipe = self._recipes.get(key) if key is not None else None
        if recipe is not None:
            ptrs = dict(zip(_ARRAYS + tuple(self._input_prefix + n for n in self._inputs), addrs))
            if mask is not None:
                ptrs.update(_mask_ptrs(mask))
            if out is not None:
                ptrs["out"] = _ptr(out)
                recipe.check_out_overlap(ptrs["out"], ptrs)
            keep = ()
        else:
            tensors = {"q": q, "k": k, "v": v}
            if k_new is not None:
                tensors["k_new"] = k_new
            if v_new is not None:
                tensors["v_new"] = v_new
            recipe, ptrs, keep = self._checked(tensors, ints, mask, out, bool(return_lse), max_seqlen_q,
                                               max_seqlen_k, inputs, scales)
            if key is not None and recipe.cacheable:
                self._keep_recipe(key, recipe)
        result, ws = self._run(recipe, ptrs, out, return_lse, q, keep)
        if check:
            _cupy().cuda.runtime.streamSynchronize(recipe.stream())
            error_flags(_cupy(), recipe.device).raise_found("this call's kernels")
        return result, recipe, ptrs, (ws, keep)  # keep: copies that lived until their launches were queued

    def _keep_recipe(self, key, recipe: Recipe):
        if len(self._recipes) >= 64:  # a bound on the signatures kept
            self._recipes.clear()
        self._recipes[key] = recipe

    def _checked(self, tensors: dict, ints: dict, mask, out, return_lse: bool, max_seqlen_q, max_seqlen_k,
                 inputs: dict, scales: dict):
        """Every check of a call (docs/variants.md); returns its Recipe, the addresses of its
        inputs and the copies that must live until the launch."""
        named = {name: _as_tensor(name, x) for name, x in tensors.items()}
        kv_dtype = self.plan.spec.kv_dtype
        for name in ("k", "v"):  # torch's FP8 tensors are the bytes of the kv_dtype of their format
            if kv_dtype in ("e4m3", "e5m2") and named[name].dtype == kv_dtype:
                named[name].dtype = "uint8"
        devices = {t.device for t in named.values()}
        if len(devices) > 1:
            raise LaunchError("q, k, v (and k_new, v_new) are on different GPUs: "
                              + ", ".join(f"{n} on {t.device}" for n, t in named.items()))
        dev = named["q"].device
        ndims = {"kv_lens": 1, "cu_seqlens_q": 1, "cu_seqlens_k": 1, "block_table": 2}
        given = {name: _int_input(name, x, ndims[name], dev) for name, x in ints.items() if x is not None}
        if mask is not None and isinstance(given.get("cu_seqlens_q", (None,))[0], OnDevice):
            # packed sequences on the device with a mask: the mask's rows and keys are the longest
            # sequence's (a longer one is reported by the kernel)
            lq_m, lk_m = (mask.shape[2], mask.shape[3]) if isinstance(mask, BlockMask) else tuple(mask.shape[-2:])
            max_seqlen_q = min(lq_m, named["q"].shape[0]) if max_seqlen_q is None else max_seqlen_q
            max_seqlen_k = min(lk_m, named["k"].shape[0]) if max_seqlen_k is None else max_seqlen_k
        launch = resolve(self.plan, {n: t.shape for n, t in named.items()}, {n: t.dtype for n, t in named.items()},
                         has_mask=mask is not None, cores=self._cores(dev), max_seqlen_q=max_seqlen_q,
                         max_seqlen_k=max_seqlen_k, mask_keys=None if mask is None else mask_keys(mask),
                         **{n: g[0] for n, g in given.items()})
        append = launch.len_new > 0
        # kept only when the next call of this signature can take its arrays as they are: device
        # integer arrays read in place (not host arrays, not copies of strided ones)
        keep, cacheable = [], all(g[1] is ints[n] for n, g in given.items())
        # a strided device integer input was copied (_int_input): the copy lives until the launch
        # is queued like every copy of the call (and for good when the call is captured); freed
        # here, its memory could become this call's out or workspace while the kernels read it
        keep.extend(g[1] for n, g in given.items() if g[1] is not None and g[1] is not ints[n])
        expr_ptrs, copies, plain = ({}, [], True) if not (self._inputs or inputs) else self._device_inputs(
            inputs, launch, dev)
        keep.extend(copies)
        cacheable = cacheable and plain
        q_layout = (named["q"].shape, named["q"].strides)  # the caller's q (named["q"] may be a copy below)
        for name in list(named):
            t = named[name]
            if (self.plan.config.tma and name in (("q", "k", "v") if self.plan.config.tma_q else ("k", "v"))
                    and len(t.shape) == 4 and _readable(t)
                    and tma_layout_problem(t.shape, t.strides, t.dtype) is not None and not append):
                # the tensor copy engine's maps need positive strides (backends/cuda/tensor_maps.py)
                named[name] = _contiguous(name, t)
                keep.append(named[name].obj)
                cacheable = False
                continue
            if not _readable(t):
                if append and name in ("k", "v"):
                    raise LaunchError(f"{name} is the cache that k_new / v_new are appended to, so the kernel "
                                      "writes it in place: it needs a contiguous head dim, strides that are "
                                      "multiples of 16 bytes and a 16-byte aligned pointer")
                named[name] = _contiguous(name, t)
                keep.append(named[name].obj)
                cacheable = False
        kv_scales, scale_keep, plain_scales = cuda_args.kv_scales(self.plan, named, scales, launch, dev,
                                                                  _as_tensor, _launch_stream(named["q"].kind, dev))
        keep.extend(scale_keep)
        cacheable = cacheable and plain_scales
        tq = named["q"]
        out_shape = launch.out_shape_for(self.plan.d_v)
        if out is not None:
            to = _as_tensor("out", out)
            if to.shape != out_shape or to.dtype != self.plan.out_dtype:
                raise LaunchError(f"out must have shape {out_shape} and dtype {self.plan.out_dtype}, "
                                  f"got {to.shape} {to.dtype}")
            if to.device != dev:
                raise LaunchError(f"out is on GPU {to.device}, q on GPU {dev}")
            if not _readable(to):
                raise LaunchError("out must have a contiguous head dim, strides that are multiples of 16 "
                                  "bytes and a 16-byte aligned pointer")
            if any(st == 0 for st, n in zip(to.strides, to.shape) if n > 1):
                raise LaunchError(f"out has a zero stride (strides {to.strides}): its elements overlap, so "
                                  "the kernel cannot write it (an expanded / broadcast view?)")
            for name, t in named.items():
                if _overlap(to, t):
                    raise LaunchError(f"out overlaps {name} in memory: the kernel reads {name} while it writes "
                                      "out, so the result would be wrong; pass a separate out=")
        else:
            to = _Tensor(None, tq.kind, 0, out_shape, _row_major(out_shape), self.plan.out_dtype, dev)
        bm = None
        if mask is not None and not isinstance(mask, BlockMask) and capturing(_stream_getter(tq.kind, dev)()):
            raise LaunchError("mask is not a BlockMask, and this call is being captured into a CUDA graph: building "
                              "the BlockMask reads the mask on the host, which a capture cannot hold; build it "
                              "before the capture (kernel.block_mask(mask)) and pass that")
        if mask is not None:
            bm = mask if isinstance(mask, BlockMask) else cuda_args.build_block_mask(
                mask, self.plan.tile_q, self.plan.tile_kv, dev)
            check_against(bm, launch.batch, launch.heads_q, launch.len_q, launch.mask_lk,
                          self.plan.tile_q, self.plan.tile_kv, "cuda")
            if not isinstance(mask, BlockMask):
                keep.append(bm)
                cacheable = False
        ptrs = {name: t.ptr for name, t in named.items()}
        ptrs.update(expr_ptrs)
        ptrs.update({name: t.ptr for name, t in kv_scales.items()})
        if out is not None:
            ptrs["out"] = to.ptr
        cupy = _cupy()
        with cupy.cuda.Device(dev), _launch_stream(tq.kind, dev):  # host arrays go up on the launches' stream
            for name, (checked, arr, _stride) in given.items():
                if arr is None:  # a host array, checked by resolve: to the GPU
                    if capturing(cupy.cuda.get_current_stream().ptr):
                        raise LaunchError(
                            f"{name} is a host array, and this call is being captured into a CUDA graph, "
                            "which cannot hold a copy from host memory: pass it as a CUDA array (the "
                            "kernels read integer inputs on the device, docs/cuda-calls.md)")
                    arr = cupy.asarray(np.ascontiguousarray(checked, dtype=np.int32))
                    keep.append(arr)
                ptrs[name] = _ptr(arr)
            if bm is not None:
                ptrs.update(_mask_ptrs(bm))
            recipe = self._recipe(named, to, launch, bm, given, return_lse, dev, cacheable, q_layout, kv_scales)
        return recipe, ptrs, keep

    def _recipe(self, named: dict, to: _Tensor, launch, bm, given: dict, return_lse: bool, dev: int,
                cacheable: bool, q_layout: tuple, kv_scales: dict) -> Recipe:
        """The launches of a checked call (cuda_args.launches), packed with the tensors as slots."""
        packed = launch.layout == "packed"
        values = cuda_args.scale_strides(kv_scales)
        for prefix, name in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "out")):
            t = to if name == "out" else named[name]
            for axis, st in zip("blh", cuda_args.strides3(t, packed)):
                values[f"{prefix}_s{axis}"] = st
        for prefix, name in (("kn", "k_new"), ("vn", "v_new")):
            t = named.get(name)
            for axis, st in zip("blh", (0, 0, 0) if t is None else cuda_args.strides3(t, False)):
                values[f"{prefix}_s{axis}"] = st
        values.update(len_q=launch.len_q, len_k=launch.len_k, heads_q=launch.heads_q, group=launch.group,
                      batch=launch.batch, batch_size=launch.batch, splits=launch.splits, len_new=launch.len_new,
                      lse_sb=0 if packed else launch.heads_q * launch.len_q,
                      lse_sh=launch.total_q if packed else launch.len_q,
                      rows_q=launch.total_q if packed else 0,
                      rows_k=launch.capacity if packed else (named["k"].shape[0] if launch.layout == "paged" else 0),
                      errors=error_flags(_cupy(), dev).ptr, **cuda_args.input_values(self.plan.spec, launch, self._site0))
        if launch.block_table is not None:
            values["bt_stride"] = given["block_table"][2] or launch.block_table.shape[1]
        if bm is not None:
            values.update(cuda_args.mask_values(bm, dev))  # its arrays are slots: the addresses come per call
        ws_sizes = cuda_args.workspace_bytes(self.plan, launch)
        persistent = cuda_args.persistent_words(self.plan, launch)
        layout, ws_bytes = workspace_layout(ws_sizes)
        if "ws_s" in ws_sizes:
            values["s_stride"] = max(launch.len_k, 1)
        # the addresses a call of this signature passes (the rest of the pointer parameters stay null)
        slots = frozenset(list(named) + list(given) + list(kv_scales) + ["out"] + (["lse"] if return_lse else [])
                          + [self._input_prefix + n for n in self._inputs]
                          + (["mask_bits", "mask_add", "mask_counts", "mask_tiles"] if bm is not None else [])
                          + list(ws_sizes) + list(persistent))
        # the tensor copy engine's maps of K and V, and Q (CudaConfig.tma, tma_q): the main entry
        # point reads them
        maps = {}
        if self.plan.config.tma:
            for name in ("q", "k", "v") if self.plan.config.tma_q else ("k", "v"):
                t = named[name]
                rows, box = (launch.len_q, self.plan.tile_q) if name == "q" else (launch.len_k, self.plan.tile_kv)
                shape = (t.shape[0], rows, t.shape[2], t.shape[3]) if len(t.shape) == 4 else None
                if shape is not None and min(shape) > 0:  # (no keys / rows: nothing is read, the map stays zeros)
                    maps["tmap_" + name] = TensorMapEncoder(name, shape, t.strides, t.dtype, box)
            maps.update(self._maps(named, launch))  # (FP8: tmap_v over V^T)
            if self.plan.config.tma_store and len(to.shape) == 4 and min(to.shape) > 0:
                # the output's map (CudaConfig.tma_store): boxes of a warpgroup's 64 rows; re-encoded
                # when a call's out lies elsewhere (Packed.launch)
                maps["tmap_o"] = TensorMapEncoder("out", tuple(to.shape), to.strides, to.dtype, 64, swizzle=False)
        launches = [] if launch.empty else [
            Packed(self._function(dev, entry), grid, threads, smem, params,
                   {**values, **maps} if entry == self.plan.entry else values, slots)
            for entry, params, grid, threads, smem in cuda_args.launches(self.plan, launch,
                                                                         bm.kind if bm is not None else None)]
        # where each input lies relative to its address: a given out= must not overlap any of them
        extents = {name: tuple(e - t.ptr for e in _extent(t)) for name, t in named.items()}
        kind, q_dtype = named["q"].kind, named["q"].dtype
        out_shape, lse_shape = launch.out_shape_for(self.plan.d_v), launch.lse_shape
        # out like the caller's q (shape, dtype, row-major strides: q_layout, seen before any copy)?
        # then torch.empty_like(q) allocates it, the cheapest way
        like_q = tuple(q_layout[0]) == tuple(out_shape) and tuple(q_layout[1]) == _row_major(out_shape)
        return Recipe(launches, layout, ws_bytes, device=dev, kind=kind, cacheable=cacheable, extents=extents,
                      out_extent=tuple(e - to.ptr for e in _extent(to)),
                      alloc_out=_allocator(kind, dev, out_shape, self.plan.out_dtype, q_dtype, like_q),
                      alloc_lse=_allocator(kind, dev, lse_shape, "f32", q_dtype) if return_lse else None,
                      alloc_ws=_allocator(kind, dev, (ws_bytes // 4,), "f32", q_dtype) if ws_bytes else None,
                      stream=_stream_getter(kind, dev), persistent=persistent,
                      zeros=_zeros(kind, dev) if persistent else None)

    def _run(self, recipe: Recipe, ptrs: dict, out, return_lse: bool, q, keep=()):
        """Allocate the outputs and workspace of a call (in q's framework, on its GPU) and launch
        the recipe's kernels on the caller's current stream; (result, workspace). `keep`: arrays
        the launches read that the call made (copies of inputs, uploads, a built mask), kept for
        good if it is captured."""
        if out is None:  # (a given out's address is in ptrs already)
            out = recipe.alloc_out(q)
            ptrs["out"] = _ptr(out)
        lse = ws = None
        if return_lse:
            lse = recipe.alloc_lse(q)
            ptrs["lse"] = _ptr(lse)
        if recipe.ws_bytes:
            ws = recipe.alloc_ws(q)
            base = _ptr(ws)
            for name, off in recipe.workspaces:
                ptrs[name] = base + off
        if recipe.launches:
            cupy = _cupy()
            stream = recipe.stream()
            # A call captured into a CUDA graph: its replays write the workspace, count in the
            # tile counters and read the call's copies long after this call returns. CuPy's pool
            # would hand them to the next allocation on the stream (torch's allocator keeps a
            # capture's memory in the graph's private pool), so what a captured call took from
            # CuPy (its workspace, copies of inputs) is kept for as long as the process runs,
            # and its counters are its own (ZeroedBuffers). docs/cuda-calls.md, "CUDA graphs".
            captured = (ws is not None or recipe.persistent or keep) and capturing(stream)
            if captured:
                held = [x for x in (ws, *keep) if x is not None and not _is_torch(x)]
                if held:
                    KEPT_FOR_GRAPHS.append(held)
            for name, words in recipe.persistent.items():
                ptrs[name] = ZEROED.get(recipe.kind, recipe.device, stream, words, recipe.zeros, captured)
            if one_gpu(cupy) or cupy.cuda.runtime.getDevice() == recipe.device:
                for p in recipe.launches:
                    p.launch(cupy.cuda.driver, ptrs, stream)
            else:
                with cupy.cuda.Device(recipe.device):
                    for p in recipe.launches:
                        p.launch(cupy.cuda.driver, ptrs, stream)
        return ((out, lse) if return_lse else out), ws

    def prepared(self, q, k, v, **options):
        """Run one checked call and return a function that launches the same kernels again with
        the same arguments and buffers, without any Python-side work but the launches
        (benchmarks, replay). The inputs must stay alive and unchanged in shape while it is used."""
        ints = {n: options.pop(n, None) for n in ("kv_lens", "cu_seqlens_q", "cu_seqlens_k", "block_table")}
        scales = {n: options.pop(n, None) for n in ("k_scale", "v_scale")}
        opt = {n: options.pop(n, d) for n, d in (("mask", None), ("out", None), ("return_lse", False),
                                                 ("max_seqlen_q", None), ("max_seqlen_k", None), ("check", False),
                                                 ("k_new", None), ("v_new", None))}
        inputs = {n: options.pop(n) for n in self._inputs if n in options}  # expression inputs (FP8: descales)
        if options:
            raise TypeError(f"prepared() got unexpected options: {', '.join(options)}")
        result, recipe, ptrs, held = self._call(q, k, v, opt["mask"], opt["out"], opt["return_lse"],
                                                opt["max_seqlen_q"], opt["max_seqlen_k"], opt["check"], ints,
                                                opt["k_new"], opt["v_new"], inputs, scales)
        cupy = _cupy()
        driver = cupy.cuda.driver
        device = contextlib.nullcontext() if one_gpu(cupy) else cupy.cuda.Device(recipe.device)

        def launch():
            with device:
                stream = recipe.stream()
                for p in recipe.launches:
                    p.launch(driver, ptrs, stream)
            _keep = (q, k, v, held, ints, opt, inputs, scales)  # noqa: F841 - the buffers the launches use
            return result
        return launch


def _site_messages(spec) -> list:
    """What a read out of bounds at each input read (site 1, 2, ...) of the spec's expressions means."""
    from ...lang.expr import format_expr
    from .expr import sites
    return [f"kernel '{spec.name}' (cuda): the {what} expression read input '{load.input}' out of its bounds in "
            f"{format_expr(load)} (at a pair where its result is used; the kernel read 0 there and that call's output "
            "is not to be used: attngen.reference names the index)" for what, load in sites(spec)]


def _is_torch(x) -> bool:
    """A torch tensor (its memory is torch's caching allocator's, which keeps a capture's memory
    in the graph's private pool)."""
    return type(x).__module__.startswith("torch")


def _row_major(shape) -> tuple:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


def _allocator(kind: str, device: int, shape: tuple, dtype: str, like_dtype: str, same_layout: bool = False):
    """A function of `like` (the call's q: an array of dtype `like_dtype` on `device`) that
    allocates an uninitialised array of `shape` and `dtype` on `device` in the caller's
    framework: torch's caching allocator (on its current stream) or CuPy's memory pool. For
    torch the cheapest ways there are taken (benchmarks/probes/probe_host.py, host time per call on
    the H100's host: torch.empty(shape, dtype=, device=) 6.3 us, q.new_empty(shape) 5.1,
    torch.empty_like(q) 3.6): empty_like where `like` has the shape, dtype and row-major
    strides asked for (`same_layout`: the recipe's key holds q's shape and strides)."""
    if kind == "torch":
        import torch  # only reached with torch tensors, so torch is installed
        tdt = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[dtype]
        if dtype == like_dtype and same_layout:
            return torch.empty_like
        if dtype == like_dtype:
            return lambda like: like.new_empty(shape)
        return lambda like: like.new_empty(shape, dtype=tdt)
    cupy = _cupy()
    cdt = {"f16": cupy.float16, "f32": cupy.float32}[dtype]

    def alloc(like):
        with cupy.cuda.Device(device):
            return cupy.empty(shape, dtype=cdt)
    return alloc


def _zeros(kind: str, device: int):
    """A function making a zeroed int32 array of n words on `device` in the caller's framework, on
    its current stream (the stream the kernels are launched on)."""
    if kind == "torch":
        import torch
        return lambda n: torch.zeros(n, dtype=torch.int32, device=torch.device("cuda", device))
    cupy = _cupy()

    def zeros(n):
        with cupy.cuda.Device(device):
            return cupy.zeros(n, dtype=cupy.int32)
    return zeros


def _stream_getter(kind: str, device: int):
    """A function giving the handle of the stream the caller's framework is using now (PyTorch's
    for torch tensors, CuPy's otherwise): the kernels are launched on it."""
    if kind == "torch":
        import torch
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # what torch.compile's launchers call
        if raw is not None:
            return functools.partial(raw, device)
        return lambda: torch.cuda.current_stream(device).cuda_stream
    cupy = _cupy()
    return lambda: cupy.cuda.get_current_stream().ptr


def _mask_ptrs(bm: BlockMask) -> dict:
    return {"mask_bits": bm.data.data.ptr if bm.kind == "bool" else 0,
            "mask_add": bm.data.data.ptr if bm.kind == "additive" else 0,
            "mask_counts": bm.counts.data.ptr, "mask_tiles": bm.tiles.data.ptr}


def kernel_key(plan) -> str:
    """The disk-cache key of a plan's cubin. The plan (tiles, entry points, arch: everything the
    emitter reads) and the generator version (a digest of every template, profile and module)
    determine the source, so no source is rendered to look a kernel up. The NVRTC version is not
    part of the key: a cubin is machine code for its arch and stays valid; `attngen cache clear`
    rebuilds everything with a newer compiler (docs/architecture.md, "The generator version and the
    cache")."""
    from . import nvrtc
    return cache_key(generator=generator_version(), target="cuda", arch=plan.details.arch,
                     plan=hashlib.sha256(repr(plan).encode()).hexdigest(), **nvrtc.key_extra())


def build_cubin(plan, render) -> tuple[bytes, bool]:
    """(cubin, found in the cache) for a plan: from the on-disk cache, else NVRTC compiles
    render(plan)."""
    return cached(kernel_key(plan), ".cubin", lambda: nvrtc.compile_cubin(render(plan), plan.details.arch)[0])


def compile_kernel(backend, spec, profile: Profile | str | None = None, device_id: int | None = None,
                   cls=None) -> CudaKernel:
    """Plan and compile `spec` with `backend` (the CUDA backend) for a CUDA device (the current
    one by default), as a `cls` (CudaKernel by default). A kernel found in the disk cache is neither
    rendered nor compiled."""
    cupy = _cupy()
    gpu_count(cupy)  # no driver or no GPU: a LaunchError that says so, not CuPy's CUDA error
    if device_id is None:
        device_id = cupy.cuda.Device().id
    live = device_profile(backend, device_id)
    # a profile named by the caller still compiles for this device's arch
    profile = live if profile is None else backend.profile(profile).narrowed(sections={"device": live.section("device")})
    plan = lower(spec, backend, profile)
    if plan.smem_bytes > live.limit("shared_memory_bytes"):
        raise LaunchError(f"kernel '{spec.name}' needs {plan.smem_bytes} bytes of shared memory; "
                          f"GPU {device_id} allows {live.limit('shared_memory_bytes')}")
    emitted = Rendered(plan, backend.render, backend.manifest)
    cubin, _ = build_cubin(plan, lambda _plan: emitted.source)
    return (cls or CudaKernel)(emitted, cubin, device_id, backend)


def precompile(backend, spec, cc: int) -> tuple[bool, str]:
    """Fill the disk cache with `spec`'s kernel for devices of compute capability `cc`, as
    compile_kernel will look it up there; needs NVRTC, no GPU. (found already, entry key)."""
    plan = lower(spec, backend, profile_for(backend, cc))
    _, hit = build_cubin(plan, backend.render)
    return hit, kernel_key(plan)


__all__ = ["CudaKernel", "build_cubin", "compile_kernel", "kernel_key", "precompile"]
