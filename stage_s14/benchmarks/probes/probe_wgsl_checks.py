"""What wgpu's own shader runtime checks cost attngen's WGSL kernels (issue 13).

    python3 benchmarks/probes/probe_wgsl_checks.py [--lengths 1024,4096] [--dims 64,128] [--dtypes f32,f16]
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
from attngen.backends.wgsl.devices import trusted_module
from common import Row, add_arguments, cases, spec_text

BOUNDS, LOOPS = 0x1, 0x2  # WGPUShaderRuntimeChecks_BoundsChecks, _ForceLoopBounding
MODES = {"checked": None, "none": 0, "bounds only": BOUNDS, "loops only": LOOPS}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(ap)
    args = ap.parse_args()
    original = wgsl_kernel.create_module

    def module_with(checks):  # whatever the profile's [dialect] runtime_checks says
        if checks is None:
            return lambda dev, label, code, _mode="all": dev.create_shader_module(label=label, code=code)
        return lambda dev, label, code, _mode="all": trusted_module(dev, label, code, checks)
    for dtype, d, L, mask, dev, flops in cases(args):
        row = Row(dev, flops)
        for label, checks in list(MODES.items()) + [("checked again", None)]:
            wgsl_kernel._PIPELINES.clear()
            wgsl_kernel.create_module = module_with(checks)
            try:
                row.add(label, lambda: attngen.compile(attngen.parse(spec_text(dtype, d, mask))[0], target="wgsl"))
            finally:
                wgsl_kernel.create_module = original
        print(row.line(dtype, d, L, mask), flush=True)
    wgsl_kernel._PIPELINES.clear()


if __name__ == "__main__":
    main()
