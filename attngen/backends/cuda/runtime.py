"""CUDA runtime: NVRTC -> cubin (cached on disk) -> CuPy module -> launch.

Accepts CuPy arrays, PyTorch CUDA tensors, anything with __cuda_array_interface__, and
DLPack producers. Strides are honoured: the kernel reads any layout whose head dim is
contiguous, whose other strides are multiples of 16 bytes and whose base pointer is 16-byte
aligned; other layouts are first copied to a contiguous buffer (inputs only; an `out=` that
the kernel cannot write directly is an error). Work is launched on the caller's current
stream (PyTorch's for torch tensors, CuPy's otherwise).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from ...errors import LaunchError
from ...plan.lower import lower
from ...plan.profiles import Profile
from ...resources import generator_version
from ...runtime.blockmask import BlockMask, check_against
from ...runtime.cache import cache_key, cached
from ...runtime.kernel import Kernel, Rendered
from ...runtime.launch import resolve
from . import args as cuda_args
from . import nvrtc

_TORCH_DTYPES = {"torch.float16": "f16", "torch.bfloat16": "bf16", "torch.float32": "f32"}
_NP_DTYPES = {"float16": "f16", "float32": "f32", "bfloat16": "bf16"}
_ELEM_BYTES = {"f16": 2, "bf16": 2, "f32": 4}


def cupy_module():
    """CuPy, or a LaunchError saying how to install it."""
    try:
        import cupy  # type: ignore
    except ImportError:
        raise LaunchError("the cuda target needs CuPy (and a CUDA 13 driver): pip install cupy-cuda13x, "
                          "or in attngen's checkout: pip install '.[gpu]'") from None
    return cupy


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


def _empty_like(t: _Tensor, shape, dtype: str):
    if t.kind == "torch":
        import torch  # only reached with torch tensors, so torch is installed
        tdt = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[dtype]
        return torch.empty(shape, dtype=tdt, device=t.obj.device)
    cupy = _cupy()
    with cupy.cuda.Device(t.device):
        return cupy.empty(shape, dtype={"f16": cupy.float16, "f32": cupy.float32}[dtype])


def _stream(t: _Tensor):
    """The stream the caller's framework is using now, as a CuPy stream."""
    cupy = _cupy()
    if t.kind != "torch":
        return cupy.cuda.get_current_stream()
    import torch
    ptr = torch.cuda.current_stream(t.obj.device).cuda_stream
    cached = _TORCH_STREAMS.get(ptr)
    if cached is None:
        from_external = getattr(cupy.cuda.Stream, "from_external", None)
        cached = None
        if from_external is not None:
            try:
                cached = from_external(torch.cuda.current_stream(t.obj.device))
            except (TypeError, AttributeError, ValueError):
                cached = None
        if cached is None:
            cached = cupy.cuda.ExternalStream(ptr)
        _TORCH_STREAMS[ptr] = cached
    return cached


_TORCH_STREAMS: dict = {}


# Dynamic shared memory per block after opt-in, by compute capability (CUDA C++ Programming
# Guide, "Technical Specifications per Compute Capability"): what a device of that kind reports
# as MaxSharedMemoryPerBlockOptin. Used to plan for a device that is not here (precompile).
SHARED_MEMORY_OPTIN = {80: 166912, 86: 101376, 87: 166912, 89: 101376, 90: 232448,
                       100: 232448, 103: 232448, 110: 232448, 120: 101376, 121: 101376}


def profile_for(backend, cc: int, smem_optin: int | None = None) -> Profile:
    """The profile of a device of compute capability `cc` (e.g. 90) whose opt-in shared memory
    per block is `smem_optin` bytes (by default what devices of that capability have): the
    sm80 or sm90 profile narrowed to the device. A device's own kernels (device_profile) and
    kernels built ahead of time for it (precompile) plan with the same profile, so they find
    each other in the disk cache."""
    if cc < 80:
        raise LaunchError(f"compute capability {cc // 10}.{cc % 10}: attngen's CUDA kernels need 8.0 or newer "
                          "(mma.sync m16n8k16 and cp.async)")
    base = backend.profile("cuda-sm90" if cc >= 90 else "cuda-sm80")
    smem = smem_optin if smem_optin is not None else SHARED_MEMORY_OPTIN.get(cc, base.limit("shared_memory_bytes"))
    # wgmma exists on compute capability 9.0 only (sm_90a); later GPUs get the mma.sync family
    arch = f"sm_{cc}a" if cc == 90 and base.features.get("wgmma") else f"sm_{cc}"
    return base.narrowed(
        limits={"shared_memory_bytes": min(smem, base.limit("shared_memory_bytes"))},
        features={"wgmma": bool(base.features.get("wgmma")) and cc == 90},
        sections={"device": {"arch": arch, "compute_capability": cc}},
    )


def device_profile(backend, device_id: int | None = None) -> Profile:
    """The profile for a CUDA device, narrowed to what the device reports (`backend`: the CUDA
    backend, which looks profiles up)."""
    cupy = _cupy()
    dev = cupy.cuda.Device(device_id) if device_id is not None else cupy.cuda.Device()
    cc = int(dev.compute_capability)
    if cc < 80:
        raise LaunchError(f"GPU {dev.id} has compute capability {cc // 10}.{cc % 10}; attngen's CUDA "
                          "kernels need 8.0 or newer (mma.sync m16n8k16 and cp.async)")
    optin = _device_attribute(dev, "MaxSharedMemoryPerBlockOptin")
    return profile_for(backend, cc, optin)


def _device_attribute(dev, name: str):
    """One attribute of a CuPy device (None when CuPy cannot name it). CuPy's Device.attributes
    queries every attribute the driver has; one is all a compile needs."""
    try:
        from cupy.cuda import runtime  # type: ignore
        return runtime.deviceGetAttribute(getattr(runtime, f"cudaDevAttr{name}"), dev.id)
    except (ImportError, AttributeError):
        return dev.attributes.get(name)


class CudaKernel(Kernel):
    target = "cuda"

    def __init__(self, emitted, cubin: bytes, device_id: int):
        super().__init__(emitted)
        self.cubin = cubin
        self._functions: dict = {}
        self._home_device = device_id
        self._sm_count: dict = {}
        self._capture: list | None = None  # set by prepared()

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

    def __call__(self, q, k, v, *, mask=None, kv_lens=None, cu_seqlens_q=None, cu_seqlens_k=None,
                 block_table=None, k_new=None, v_new=None, return_lse=False, out=None):
        """See docs/variants.md for the options; every input is checked before the launch."""
        tq, tk, tv = _as_tensor("q", q), _as_tensor("k", k), _as_tensor("v", v)
        named = {"q": tq, "k": tk, "v": tv}
        if k_new is not None:
            named["k_new"] = _as_tensor("k_new", k_new)
        if v_new is not None:
            named["v_new"] = _as_tensor("v_new", v_new)
        devices = {t.device for t in named.values()}
        if len(devices) > 1:
            raise LaunchError("q, k, v (and k_new, v_new) are on different GPUs: "
                              + ", ".join(f"{n} on {t.device}" for n, t in named.items()))
        launch = resolve(self.plan, {n: t.shape for n, t in named.items()}, {n: t.dtype for n, t in named.items()},
                         kv_lens=kv_lens, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                         block_table=block_table, has_mask=mask is not None, cores=self._cores(tq.device))
        append = launch.len_new > 0
        for name in list(named):
            t = named[name]
            if not _readable(t):
                if append and name in ("k", "v"):
                    raise LaunchError(f"{name} is the cache that k_new / v_new are appended to, so the kernel "
                                      "writes it in place: it needs a contiguous head dim, strides that are "
                                      "multiples of 16 bytes and a 16-byte aligned pointer")
                named[name] = _contiguous(name, t)
        tq, tk, tv = named["q"], named["k"], named["v"]
        out_shape = launch.out_shape_for(self.plan.d_v)
        if out is None:
            out = _empty_like(tq, out_shape, self.plan.dtype)
        to = _as_tensor("out", out)
        if to.shape != out_shape or to.dtype != self.plan.dtype:
            raise LaunchError(f"out must have shape {out_shape} and dtype {self.plan.dtype}, "
                              f"got {to.shape} {to.dtype}")
        if to.device != tq.device:
            raise LaunchError(f"out is on GPU {to.device}, q on GPU {tq.device}")
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
        lse = _empty_like(tq, launch.lse_shape, "f32") if return_lse else None
        bm = None
        if mask is not None:
            bm = mask if isinstance(mask, BlockMask) else cuda_args.build_block_mask(
                mask, self.plan.tile_q, self.plan.tile_kv, tq.device)
            check_against(bm, launch.batch, launch.heads_q, launch.len_q, launch.len_k,
                          self.plan.tile_q, self.plan.tile_kv, "cuda")
        if not launch.empty:
            self._launch(named, to, lse, bm, launch, cu_seqlens_q, cu_seqlens_k, kv_lens, block_table)
        return (out, lse) if return_lse else out

    def _launch(self, named, to, lse, bm, launch, cu_q, cu_k, kv_lens, block_table):
        cupy = _cupy()
        dev = named["q"].device
        packed = launch.layout == "packed"
        values = {"q": named["q"].ptr, "k": named["k"].ptr, "v": named["v"].ptr, "out": to.ptr,
                  "lse": None if lse is None else _as_tensor("lse", lse).ptr}
        for prefix, name in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "out")):
            t = to if name == "out" else named[name]
            for axis, st in zip("blh", cuda_args.strides3(t, packed)):
                values[f"{prefix}_s{axis}"] = st
        values.update(len_q=launch.len_q, len_k=launch.len_k, heads_q=launch.heads_q, group=launch.group,
                      batch=launch.batch, splits=launch.splits, len_new=launch.len_new,
                      lse_sb=0 if packed else launch.heads_q * launch.len_q,
                      lse_sh=launch.total_q if packed else launch.len_q)
        keep = []  # device copies that must live until the launches are queued
        stream = _stream(named["q"])
        with cupy.cuda.Device(dev), stream:
            for name, host, given in (("cu_seqlens_q", launch.cu_seqlens_q, cu_q),
                                      ("cu_seqlens_k", launch.cu_seqlens_k if cu_k is not None else None, cu_k),
                                      ("kv_lens", launch.kv_lens, kv_lens),
                                      ("block_table", launch.block_table, block_table)):
                values[name] = None if host is None else cuda_args.device_ints(name, host, given, dev)
                keep.append(values[name])
            if "block_table" in values and values["block_table"] is not None:
                values["bt_stride"] = launch.block_table.shape[1]
            for prefix, name in (("kn", "k_new"), ("vn", "v_new")):
                t = named.get(name)
                values[name] = None if t is None else t.ptr
                for axis, st in zip("blh", (0, 0, 0) if t is None else cuda_args.strides3(t, False)):
                    values[f"{prefix}_s{axis}"] = st
            if bm is not None:
                values.update(cuda_args.mask_values(bm, dev))
            for name, shape in cuda_args.workspace_shapes(self.plan, launch).items():
                values[name] = _empty_like(named["q"], shape, "f32")
                keep.append(values[name])
            if "ws_s" in values:
                values["s_stride"] = max(launch.len_k, 1)
            todo = [(self._function(dev, entry), grid, threads, smem, args)
                    for entry, grid, threads, smem, args in cuda_args.launches(self.plan, values, launch)]
            for fn, grid, threads, smem, args in todo:
                fn(grid, (threads, 1, 1), args, shared_mem=smem, stream=stream)
        if self._capture is not None:
            self._capture.append((dev, stream, todo, keep))

    def prepared(self, q, k, v, **options):
        """Run one checked call and return a function that launches the same kernels again with
        the same arguments and buffers, without the Python-side checks (benchmarks, replay).
        The inputs must stay alive and unchanged in shape while it is used."""
        self._capture = []
        try:
            result = self(q, k, v, **options)
            captured = self._capture
        finally:
            self._capture = None
        cupy = _cupy()

        def launch():
            for dev, stream, todo, _keep in captured:
                with cupy.cuda.Device(dev):
                    for fn, grid, threads, smem, args in todo:
                        fn(grid, (threads, 1, 1), args, shared_mem=smem, stream=stream)
            return result
        return launch


def kernel_key(plan) -> str:
    """The disk-cache key of a plan's cubin. The plan (tiles, entry points, arch: everything the
    emitter reads) and the generator version (a digest of every template, profile and module)
    determine the source, so no source is rendered to look a kernel up. The NVRTC version is not
    part of the key: a cubin is machine code for its arch and stays valid; `attngen cache clear`
    rebuilds everything with a newer compiler (docs/architecture.md, "The generator version and the
    cache")."""
    return cache_key(generator=generator_version(), target="cuda", arch=plan.details.arch,
                     plan=hashlib.sha256(repr(plan).encode()).hexdigest())


def build_cubin(plan, render) -> tuple[bytes, bool]:
    """(cubin, found in the cache) for a plan: from the on-disk cache, else NVRTC compiles
    render(plan)."""
    return cached(kernel_key(plan), ".cubin", lambda: nvrtc.compile_cubin(render(plan), plan.details.arch)[0])


def compile_kernel(backend, spec, profile: Profile | str | None = None, device_id: int | None = None) -> CudaKernel:
    """Plan and compile `spec` with `backend` (the CUDA backend) for a CUDA device (the current
    one by default). A kernel found in the disk cache is neither rendered nor compiled."""
    cupy = _cupy()
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
    return CudaKernel(emitted, cubin, device_id)


def precompile(backend, spec, cc: int) -> tuple[bool, str]:
    """Fill the disk cache with `spec`'s kernel for devices of compute capability `cc`, as
    compile_kernel will look it up there; needs NVRTC, no GPU. (found already, entry key)."""
    plan = lower(spec, backend, profile_for(backend, cc))
    _, hit = build_cubin(plan, backend.render)
    return hit, kernel_key(plan)


__all__ = ["CudaKernel", "build_cubin", "compile_kernel", "cupy_module", "device_profile", "kernel_key",
           "precompile", "profile_for"]
