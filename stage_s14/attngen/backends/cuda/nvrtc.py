"""CUDA source -> cubin with NVRTC. Needs no GPU: CI uses it to compile-check every kernel.

The generated kernels include no headers, so no include path is needed. NVRTC comes from
NVIDIA's `cuda-bindings` package (`cuda.bindings.nvrtc`, with the `nvidia-cuda-nvrtc`
library); where only CuPy is installed, CuPy's own NVRTC binding is used instead.
"""

from __future__ import annotations

import itertools
import os
import time

from ...errors import CompileError

OPTIONS = ("--std=c++17",)
# ATTNGEN_NVRTC_LINEINFO=1 adds -lineinfo (Nsight Compute's source view ties each instruction to a
# line of the generated source; benchmarks/probes/ncu_backward.py): the cache keys name it (key_extra).
LINEINFO = "ATTNGEN_NVRTC_LINEINFO"


def key_extra() -> dict:
    """What the compile options add to a cubin's cache key: {} by default (the keys of every cubin
    built without the profiling option stay as they were)."""
    return {"nvrtc": "-lineinfo"} if os.environ.get(LINEINFO) else {}
_REPORTS = itertools.count()  # (compile_cubin: an entry point of its own per reported compile)


def _cuda_bindings():
    try:
        from cuda.bindings import nvrtc  # type: ignore
    except ImportError:
        return None
    return nvrtc


def available() -> bool:
    if _cuda_bindings() is not None:
        return True
    try:
        from cupy_backends.cuda.libs import nvrtc  # type: ignore  # noqa: F401
    except ImportError:
        return False
    return True


def version() -> tuple[int, int]:
    nv = _cuda_bindings()
    if nv is not None:
        err, major, minor = nv.nvrtcVersion()
        return (major, minor)
    from cupy_backends.cuda.libs import nvrtc  # type: ignore
    return tuple(nvrtc.getVersion())


def compile_cubin(source: str, arch: str, name: str = "attngen.cu", report: bool = False) -> tuple[bytes, str]:
    """Compile to a cubin for `arch` (e.g. "sm_90"); returns (cubin, compiler log). With
    `report`, the log holds ptxas's resource report (registers, spills) of every entry point: the
    source then ends in an empty kernel of its own (one more entry in the report), because the GPU
    machine's NVRTC (13.0) serves a program it has compiled before, in any process, from a cache:
    in a tenth of the time and with an empty log, a comment of its own notwithstanding
    (benchmarks/NOTES.md, 2026-11-27)."""
    options = [*OPTIONS, *key_extra().values(), f"--gpu-architecture={arch}"] + (["--ptxas-options=-v"] if report else [])
    if report:
        source += (f'\nextern "C" __global__ void attngen_report_{os.getpid()}_{time.monotonic_ns()}_'
                   f'{next(_REPORTS)}() {{}}  // (a program of its own: ptxas runs and reports)\n')
    nv = _cuda_bindings()
    if nv is not None:
        return _compile_cuda_bindings(nv, source, options, name)
    return _compile_cupy(source, options, name)


def _compile_cuda_bindings(nv, source, options, name):
    def ok(result):
        err, *rest = result if isinstance(result, tuple) else (result,)
        if err != nv.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(f"NVRTC: {nv.nvrtcGetErrorString(err)[1].decode()}")
        return rest[0] if len(rest) == 1 else rest

    prog = ok(nv.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], []))
    try:
        (result,) = nv.nvrtcCompileProgram(prog, len(options), [o.encode() for o in options])
        # NVRTC writes into these buffers: they must be mutable. (NVIDIA's examples pass
        # b" " * size, which for size 1 overwrites CPython's shared b" " object, process-wide.)
        log = bytearray(ok(nv.nvrtcGetProgramLogSize(prog)))
        ok(nv.nvrtcGetProgramLog(prog, log))
        log_text = bytes(log).rstrip(b"\x00 ").decode(errors="replace")
        if result != nv.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(f"NVRTC failed to compile {name} ({' '.join(options)}):\n{log_text}")
        cubin = bytearray(ok(nv.nvrtcGetCUBINSize(prog)))
        ok(nv.nvrtcGetCUBIN(prog, cubin))
        return bytes(cubin), log_text
    finally:
        nv.nvrtcDestroyProgram(prog)


def _compile_cupy(source, options, name):
    try:
        from cupy_backends.cuda.libs import nvrtc  # type: ignore
    except ImportError:
        raise CompileError("no NVRTC found: pip install cuda-bindings nvidia-cuda-nvrtc "
                           "(or in attngen's checkout: pip install '.[gpu]')") from None
    prog = nvrtc.createProgram(source, name, [], [])
    try:
        try:
            nvrtc.compileProgram(prog, options)
        except nvrtc.NVRTCError:
            log = nvrtc.getProgramLog(prog)
            raise CompileError(f"NVRTC failed to compile {name} ({' '.join(options)}):\n{log}") from None
        return nvrtc.getCUBIN(prog), nvrtc.getProgramLog(prog)
    finally:
        nvrtc.destroyProgram(prog)


def resource_usage(log: str) -> dict:
    """{entry point: (registers, spill-store bytes, spill-load bytes)} from a ptxas report."""
    import re
    out = {}
    parts = re.split(r"Compiling entry function '(\w+)'", log)
    for name, body in zip(parts[1::2], parts[2::2]):
        regs = re.search(r"Used (\d+) registers", body)
        spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", body)
        out[name] = (int(regs.group(1)) if regs else 0, int(spill.group(1)) if spill else 0,
                     int(spill.group(2)) if spill else 0)
    return out
