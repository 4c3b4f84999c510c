"""How the compile of one WGSL compute shader grows with the short-circuit terms of an `if` in a loop

Dawn over SwiftShader (the CI's second pass) took the backward of a `grad` input read twice
through a sigmoid past 8 GB while it compiled (benchmarks/NOTES.md, eleventh session). The cause
was the input loaders' and grad_inputs_add's bounds tests, chains of `||` / `&&`: each term is a
branch, and the compile grows exponentially with those branches in a loop's body. This probe
compiles a shader with one `if` of N `x != c` terms joined by `&&` (or by `&`), in a loop or
not, each in a child process under a memory cap and a timeout, and prints the compile's time and
the child's peak memory:

    ATTNGEN_WGPU=wgpudawn VK_ICD_FILENAMES=/usr/lib/chromium/vk_swiftshader_icd.json \\
        python3 benchmarks/probes/probe_dawn_branches.py [--terms 10 20 24 28] [--cap-gb 2] [--timeout 40]

Without ATTNGEN_WGPU it runs wgpu-py (naga), whose pipelines lavapipe compiles lazily.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import threading
import time

_CHILD = """
import os, sys
wgpu = __import__(os.environ.get("ATTNGEN_WGPU", "").strip() or "wgpu")
device = wgpu.gpu.request_adapter_sync(power_preference="high-performance").request_device_sync()
module = device.create_shader_module(code=sys.stdin.read())
device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
"""


def shader(terms: int, in_loop: bool, op: str) -> str:
    """One `if` of `terms` comparisons joined by `op`, in a loop of a runtime length or not."""
    test = f"if ({f' {op} '.join(f'(x != {c + 1}u)' for c in range(terms))}) {{ acc += 1u; }}"
    body = (f"for (var i = 0u; i < buf[0]; i++) {{\n        let x = buf[i] + i;\n        {test}\n    }}"
            if in_loop else f"let x = buf[gid.x];\n    {test}")
    return ("@group(0) @binding(0) var<storage, read_write> buf: array<u32>;\n\n"
            "@compute @workgroup_size(64)\n"
            "fn main(@builtin(global_invocation_id) gid: vec3<u32>) {\n"
            f"    var acc = 0u;\n    {body}\n    buf[gid.x] = acc;\n}}\n")


def compile_once(code: str, cap_bytes: int, timeout: float) -> str:
    """The child's compile: seconds and peak resident MB, or how it ended."""
    cap = lambda: resource.setrlimit(resource.RLIMIT_AS, (cap_bytes, cap_bytes))  # noqa: E731
    t = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, preexec_fn=cap,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
    child.stdin.write(code)
    child.stdin.close()
    timer = threading.Timer(timeout, child.kill)
    timer.start()
    _, status, usage = os.wait4(child.pid, 0)  # its own peak memory, not the other children's
    timer.cancel()
    child.returncode = os.waitstatus_to_exitcode(status)
    seconds, peak = time.perf_counter() - t, usage.ru_maxrss / 1024
    if child.returncode:
        return f"ended after {seconds:.1f} s (exit {child.returncode}), {peak:.0f} MB"
    return f"{seconds:.2f} s, {peak:.0f} MB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--terms", type=int, nargs="+", default=[10, 20, 24, 28])
    ap.add_argument("--cap-gb", type=float, default=2.0)
    ap.add_argument("--timeout", type=float, default=40.0)
    args = ap.parse_args()
    print(f"runtime {os.environ.get('ATTNGEN_WGPU') or 'wgpu'}")
    for n in args.terms:
        for in_loop, op in ((False, "&&"), (True, "&&"), (True, "&")):
            where = "in a loop" if in_loop else "no loop  "
            print(f"{n:3d} terms {op:2s} {where}: "
                  f"{compile_once(shader(n, in_loop, op), int(args.cap_gb * 2**30), args.timeout)}", flush=True)


if __name__ == "__main__":
    main()
