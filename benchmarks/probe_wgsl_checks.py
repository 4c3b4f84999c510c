"""What wgpu's own shader runtime checks cost attngen's WGSL kernels (issue 13).

    python3 benchmarks/probe_wgsl_checks.py [--lengths 1024,4096] [--dims 64,128] [--dtypes f32,f16]
                                            [--masks none,causal] [--tokens 16384]

wgpu (naga) adds two runtime checks to every shader it is given: every array index is clamped
into the array ("bounds checks": a min per workgroup-memory access, an arrayLength clamp per
storage access) and every loop carries a hidden iteration counter that ends it after 2^64 passes
("loop bounding"). wgpu-native offers wgpuDeviceCreateShaderModuleTrusted, which takes the checks to
keep. attngen's kernels guard every index themselves (the equivalence and fuzz suites read past no
tensor), so the checks are a second guard. This probe compiles the suite's kernels four ways (all
checks, none, bounds only, loop bounding only), checks each output against the checked kernel's,
and prints TFLOP/s side by side: whether the checks are worth dropping on a native adapter.
It changes nothing in attngen.
"""

from __future__ import annotations

import argparse


import attngen
from attngen.backends.wgsl import kernel as wgsl_kernel
from attngen.backends.wgsl.adapter import device_state
from wgsl_probe_cases import Row, add_arguments, cases, spec_text

BOUNDS, LOOPS = 0x1, 0x2  # WGPUShaderRuntimeChecks_BoundsChecks, _ForceLoopBounding
MODES = {"checked": None, "none": 0, "bounds only": BOUNDS, "loops only": LOOPS}


def trusted_factory(device, checks: int):
    """device.create_shader_module for WGSL through wgpuDeviceCreateShaderModuleTrusted."""
    from wgpu.backends.wgpu_native import _api

    def create(*, label: str = "", code: str, **_):
        src = _api.new_struct_p("WGPUShaderSourceWGSL *", code=_api.to_c_string_view(code))
        src[0].chain.next = _api.ffi.NULL
        src[0].chain.sType = _api.lib.WGPUSType_ShaderSourceWGSL
        desc = _api.new_struct_p("WGPUShaderModuleDescriptor *",
                                 nextInChain=_api.ffi.cast("WGPUChainedStruct *", src),
                                 label=_api.to_c_string_view(label))
        mid = _api.libf.wgpuDeviceCreateShaderModuleTrusted(device._internal, desc, checks)
        if mid == _api.ffi.NULL:
            raise RuntimeError("shader module creation failed")
        return _api.GPUShaderModule(label, mid, device)
    return create


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(ap)
    args = ap.parse_args()
    dev_obj = device_state().device
    original = dev_obj.create_shader_module
    for dtype, d, L, mask, dev, flops in cases(args):
        row = Row(dev, flops)
        for label, checks in list(MODES.items()) + [("checked again", None)]:
            wgsl_kernel._PIPELINES.clear()
            dev_obj.create_shader_module = original if checks is None else trusted_factory(dev_obj, checks)
            try:
                row.add(label, lambda: attngen.compile(attngen.parse(spec_text(dtype, d, mask))[0], target="wgsl"))
            finally:
                dev_obj.create_shader_module = original
        print(row.line(dtype, d, L, mask), flush=True)
    wgsl_kernel._PIPELINES.clear()


if __name__ == "__main__":
    main()
