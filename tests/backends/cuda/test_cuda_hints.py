"""The checker's hints name only changes the spec can still make."""

from __future__ import annotations

import pytest

import attngen

from conftest import spec_of


@pytest.mark.parametrize("body, hint", [
    # stages=1 already: the hint suggested stages=1
    ("head_dim 256\n dtype f16\n tile q=256 kv=256\n target cuda { stages=1 }",
     "use a smaller tile kv, or a smaller tile q"),
    ("head_dim 256\n dtype f16\n tile q=128 kv=256\n target cuda { stages=3 }",
     "use a smaller tile kv, or a smaller tile q, or fewer stages (target cuda { stages=2 })"),
])
def test_shared_memory_hint(body, hint):
    with pytest.raises(attngen.SpecError) as info:
        attngen.lower(spec_of(body), "cuda", "cuda-sm80")
    (d,) = info.value.diagnostics
    assert "needs" in d.message and d.hint == hint


@pytest.mark.parametrize("body, target, message, hint", [
    # warps=32 blamed key_warps (never given) and hinted key_warps=1, which it already was
    ("head_dim 64\n dtype f16\n target cuda { warps=32 stages=4 }", "cuda",
     "tile q=512 with warps=32 needs 1024 threads", "use warps=16 or fewer"),
    # workgroup=1 said "1 invocations per row do not divide head dim 16" and hinted fewer than 1
    ("head_dim 16\n dtype f32\n target wgsl { workgroup=1 }", "wgsl",
     "workgroup=1: each invocation owns 16 row(s) of the 16-row tile x 16 output columns = 256 accumulators, "
     "above the 64 webgpu-core allows", "use a smaller tile q or a larger workgroup (fewer rows per invocation)"),
])
def test_thread_count_messages_name_what_the_spec_set(body, target, message, hint):
    with pytest.raises(attngen.SpecError) as info:
        attngen.lower(spec_of(body), target)
    (d,) = info.value.diagnostics
    assert message in d.message and d.hint == hint


# ---- issue 40: CuPy installed, no driver or no GPU ----------------------------------------------

def _fake_cupy(error: str | None, driver: int, count: int = 0):
    """A stand-in for CuPy whose runtime fails as CuPy's does without a driver or a GPU (this
    machine has neither CuPy nor a GPU): every call that needs the device raises `error`."""
    import types

    class CUDARuntimeError(RuntimeError):
        def __init__(self, status):
            self.status = status
            super().__init__(f"{status}: {'CUDA driver version is insufficient for CUDA runtime version' if 'Driver' in status else 'no CUDA-capable device is detected'}")

    def failing(*_args, **_kw):
        if error is None:
            return count
        raise CUDARuntimeError(error)

    runtime = types.ModuleType("cupy.cuda.runtime")
    runtime.__dict__.update(CUDARuntimeError=CUDARuntimeError, getDeviceCount=failing, getDevice=failing,
                            driverGetVersion=lambda: driver)

    class Device:
        def __init__(self, *_a):
            failing()
            self.id = 0

    cuda = types.ModuleType("cupy.cuda")
    cuda.__dict__.update(runtime=runtime, Device=Device)
    cupy = types.ModuleType("cupy")
    cupy.cuda = cuda
    return cupy, cuda, runtime


@pytest.mark.parametrize("error, driver, count, words", [
    ("cudaErrorInsufficientDriver", 0, 0, "no NVIDIA driver is installed"),
    ("cudaErrorInsufficientDriver", 12040, 0, "driver (CUDA 12.4) is older than"),
    ("cudaErrorNoDevice", 13000, 0, "finds no NVIDIA GPU"),
    (None, 13000, 0, "finds no NVIDIA GPU"),
])
def test_compile_for_cuda_without_a_device_says_so(monkeypatch, capsys, error, driver, count, words):
    """attngen.compile(target='cuda') with CuPy but no driver raised CuPy's CUDARuntimeError,
    and `attngen run` said "driver version is insufficient" with no driver at all: a LaunchError
    that says what is missing and what to do instead."""
    import sys
    cupy, cuda, runtime = _fake_cupy(error, driver, count)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "cupy.cuda", cuda)
    monkeypatch.setitem(sys.modules, "cupy.cuda.runtime", runtime)
    spec = spec_of("head_dim 64\n dtype f16")
    with pytest.raises(attngen.LaunchError) as e:
        attngen.compile(spec, target="cuda")
    message = str(e.value)
    assert words in message and "target wgsl" in message and "attngen precompile" in message, message
    from attngen.cli import main
    capsys.readouterr()
    assert main(["run", "examples/llama3_8b.attn", "--target", "cuda", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert words in err and "CUDARuntimeError" not in err and "attngen precompile" in err, err
