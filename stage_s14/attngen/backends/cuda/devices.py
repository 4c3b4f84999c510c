"""The CUDA devices: CuPy, the profile of a device of a given compute capability (what lets
`attngen precompile` plan for a GPU that is not here), the live device's profile, its name and
how many GPUs the process sees. kernel.py compiles for what this module reports.
"""

from __future__ import annotations

from ...errors import LaunchError
from ...plan.profiles import Profile


def cupy_module():
    """CuPy, or a LaunchError saying how to install it."""
    try:
        import cupy  # type: ignore
    except ImportError:
        raise LaunchError("the cuda target needs CuPy (and a CUDA 13 driver): pip install cupy-cuda13x, "
                          "or in attngen's checkout: pip install '.[gpu]'") from None
    return cupy


# What to do on a machine whose CUDA runtime finds no GPU: the end of every such LaunchError.
_INSTEAD = ("; on a machine without an NVIDIA GPU use target wgsl (attngen.compile(spec, target='wgsl'), "
            "attngen run --target wgsl), or build CUDA kernels for a GPU elsewhere with 'attngen precompile' "
            "(NVRTC, no GPU needed)")


def _no_gpu(cupy, status: str) -> LaunchError:
    """The LaunchError for a CUDA runtime that reports no usable device (`status`: its error's
    text). CUDA says cudaErrorInsufficientDriver both when there is no driver at all and when
    the driver is too old; the driver version (0: none) tells the two apart."""
    try:
        driver = int(cupy.cuda.runtime.driverGetVersion())
    except Exception:  # noqa: BLE001 - a runtime this broken has no driver to speak of
        driver = 0
    if "NoDevice" in status or "InsufficientDriver" not in status:
        what = f"the CUDA runtime finds no NVIDIA GPU ({status.split(':')[0]})"
    elif driver == 0:
        what = "no NVIDIA driver is installed, so the cuda target has no GPU to run on (CUDA: cudaErrorInsufficientDriver)"
    else:
        what = (f"the NVIDIA driver (CUDA {driver // 1000}.{driver % 1000 // 10}) is older than CuPy's CUDA "
                "runtime needs: update the driver, or install the CuPy for its CUDA version")
    return LaunchError(what + _INSTEAD)


def _is_cuda_error(e: Exception) -> bool:
    """CuPy's CUDARuntimeError (cupy.cuda.runtime; by name, so a CuPy without it still works)."""
    return type(e).__name__ in ("CUDARuntimeError", "CUDADriverError")


def gpu_count(cupy) -> int:
    """How many GPUs the process sees (asked once per CuPy); a LaunchError saying what is
    missing and what to do instead when there is no driver or no GPU, where CuPy raises its
    CUDARuntimeError (compile_kernel and device_identity ask first, so no raw CUDA error of a
    machine without a GPU reaches the caller)."""
    runtime = cupy.cuda.runtime
    if runtime not in _GPUS:
        try:
            n = int(runtime.getDeviceCount())
        except Exception as e:
            if _is_cuda_error(e):
                raise _no_gpu(cupy, str(e)) from None
            raise
        if n == 0:
            raise _no_gpu(cupy, "cudaErrorNoDevice: no CUDA-capable device is detected")
        _GPUS[runtime] = n
    return _GPUS[runtime]


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
        features={"wgmma": bool(base.features.get("wgmma")) and cc == 90,
                  "fp8_wgmma": bool(base.features.get("fp8_wgmma")) and cc == 90},
        sections={"device": {"arch": arch, "compute_capability": cc}},
    )


def device_profile(backend, device_id: int | None = None) -> Profile:
    """The profile for a CUDA device, narrowed to what the device reports (`backend`: the CUDA
    backend, which looks profiles up)."""
    cupy = cupy_module()
    gpu_count(cupy)
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


# GPUs the process sees, by CuPy runtime module (one in practice; a test's stand-in is another).
_GPUS: dict = {}


def one_gpu(cupy) -> bool:
    """Whether the process sees one GPU (then the current device needs no check per call)."""
    return gpu_count(cupy) == 1


def device_name(cupy, device: int) -> str:
    """The GPU's name: the driver's cuDeviceGetName (cudaGetDeviceProperties, which queries
    every property, costs tens of milliseconds of a cached compile), else the properties."""
    try:
        import ctypes
        lib = ctypes.CDLL("libcuda.so.1")
        handle = ctypes.c_int()
        buf = ctypes.create_string_buffer(256)
        if lib.cuDeviceGet(ctypes.byref(handle), device) == 0 and lib.cuDeviceGetName(buf, 256, handle) == 0:
            return buf.value.decode()
    except (OSError, AttributeError, UnicodeDecodeError):
        pass
    name = cupy.cuda.runtime.getDeviceProperties(device)["name"]
    return name.decode() if isinstance(name, bytes) else name


__all__ = ["SHARED_MEMORY_OPTIN", "cupy_module", "device_name", "device_profile", "gpu_count", "one_gpu",
           "profile_for"]
