"""Does the adapter keep an invocation's small arrays in registers? (issue 13)

The register-tiled WGSL kernel holds acc, p, s and part as arrays indexed by loop counters
(templates/wgsl/kernel.wgsl.j2). A driver that does not unroll those loops has to keep the
arrays in memory (local / scratch), and every FMA then costs loads and stores: the kernel ran at
1-2% of the FMA ceiling on the H100. This probe times the same work, the P V update of the
kernel (acc[i][w] += p[i] * V[j][w] for 4 rows x 4 vec4 column groups per key, p and V from
workgroup memory), written three ways:

  loops    `for` loops over i and w indexing arrays, as the kernel writes it today
  indexed  the loops unrolled in the source, arrays indexed by constants
  scalars  unrolled, one named variable per element

    python3 benchmarks/probes/probe_wgsl_arrays.py [--workgroups N] [--iters N]

Prints TFLOP/s for each and the FMA ceiling of benchmarks/suite/wgsl_peers.py beside them.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: F401, E402  (benchmarks/suite/ on sys.path)
from wgsl_peers import _group, _pipeline, fma_ceiling, measure  # noqa: E402

from attngen.backends.wgsl.devices import device_state, wgpu  # noqa: E402

ROWS, GROUPS, KEYS, WG = 4, 4, 32, 128

_HEAD = """
struct P {{ iters: u32, a: u32, b: u32, c: u32 }}
@group(0) @binding(0) var<uniform> prm: P;
@group(0) @binding(1) var<storage, read_write> out: array<vec4<f32>>;
var<workgroup> sV: array<vec4<f32>, {kv4}>;
var<workgroup> sP: array<f32, {p}>;

@compute @workgroup_size({wg})
fn main(@builtin(local_invocation_index) lid: u32, @builtin(global_invocation_id) g: vec3<u32>) {{
    for (var e = lid; e < {kv4}u; e += {wg}u) {{ sV[e] = vec4<f32>(f32(e % 7u) * 1e-3); }}
    for (var e = lid; e < {p}u; e += {wg}u) {{ sP[e] = f32(e % 5u) * 1e-3; }}
    workgroupBarrier();
    let tr = lid / 8u;
    let tc = lid % 8u;
"""

_LOOPS = """
    var acc: array<array<vec4<f32>, {groups}>, {rows}>;
    for (var it = 0u; it < prm.iters; it++) {{
        for (var j = 0u; j < {keys}u; j++) {{
            var p: array<f32, {rows}>;
            for (var i = 0u; i < {rows}u; i++) {{ p[i] = sP[(tr + 16u * i) * 36u + j]; }}
            for (var w = 0u; w < {groups}u; w++) {{
                let v = sV[j * 32u + tc + 8u * w];
                for (var i = 0u; i < {rows}u; i++) {{ acc[i][w] += p[i] * v; }}
            }}
        }}
    }}
    var total = vec4<f32>();
    for (var i = 0u; i < {rows}u; i++) {{ for (var w = 0u; w < {groups}u; w++) {{ total += acc[i][w]; }} }}
    out[g.x] = total;
}}
"""


def _indexed() -> str:
    body = [f"    var acc: array<array<vec4<f32>, {GROUPS}>, {ROWS}>;",
            "    for (var it = 0u; it < prm.iters; it++) {", f"        for (var j = 0u; j < {KEYS}u; j++) {{",
            f"            var p: array<f32, {ROWS}>;"]
    body += [f"            p[{i}] = sP[(tr + {16 * i}u) * 36u + j];" for i in range(ROWS)]
    for w in range(GROUPS):
        body.append(f"            let v{w} = sV[j * 32u + tc + {8 * w}u];")
        body += [f"            acc[{i}][{w}] += p[{i}] * v{w};" for i in range(ROWS)]
    body += ["        }", "    }", "    out[g.x] = " + " + ".join(f"acc[{i}][{w}]" for i in range(ROWS)
                                                             for w in range(GROUPS)) + ";", "}"]
    return "\n".join(body) + "\n"


def _scalars() -> str:
    body = [f"    var a{i}_{w} = vec4<f32>();" for i in range(ROWS) for w in range(GROUPS)]
    body += ["    for (var it = 0u; it < prm.iters; it++) {", f"        for (var j = 0u; j < {KEYS}u; j++) {{"]
    body += [f"            let p{i} = sP[(tr + {16 * i}u) * 36u + j];" for i in range(ROWS)]
    for w in range(GROUPS):
        body.append(f"            let v{w} = sV[j * 32u + tc + {8 * w}u];")
        body += [f"            a{i}_{w} += p{i} * v{w};" for i in range(ROWS)]
    body += ["        }", "    }", "    out[g.x] = " + " + ".join(f"a{i}_{w}" for i in range(ROWS)
                                                             for w in range(GROUPS)) + ";", "}"]
    return "\n".join(body) + "\n"


def source(kind: str) -> str:
    head = _HEAD.format(kv4=KEYS * 32, p=16 * ROWS * 36, wg=WG)
    if kind == "loops":
        return head + _LOOPS.format(rows=ROWS, groups=GROUPS, keys=KEYS)
    return head + (_indexed() if kind == "indexed" else _scalars())


def run(kind: str, workgroups: int, iters: int) -> dict:
    st = device_state()
    dev = st.device
    pipe = _pipeline(dev, dev.create_shader_module(code=source(kind)), "main")
    u = dev.create_buffer_with_data(data=np.array([iters, 0, 0, 0], np.uint32).tobytes(),
                                    usage=wgpu.BufferUsage.UNIFORM)
    out = dev.create_buffer(size=workgroups * WG * 16, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
    ms, timing, _ = measure([(pipe, _group(dev, pipe, {0: u, 1: out}), (workgroups, 1, 1))], out, 5)
    got = np.frombuffer(dev.queue.read_buffer(out, 0, 16 * 4), np.float32)
    flops = 2.0 * workgroups * WG * iters * KEYS * ROWS * GROUPS * 4
    return {"kind": kind, "ms": ms, "tflops": flops / ms / 1e9, "timing": timing, "first": got[:4].tolist()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workgroups", type=int, default=1056)
    ap.add_argument("--iters", type=int, default=256)
    args = ap.parse_args()
    st = device_state()
    print(f"adapter: {st.adapter.info.get('device', '?')} ({st.adapter.info.get('backend_type', '?')})")
    ref = None
    for kind in ("loops", "indexed", "scalars"):
        r = run(kind, args.workgroups, args.iters)
        same = "" if ref is None else ("  same result" if np.allclose(r["first"], ref, rtol=1e-4) else "  DIFFERENT")
        ref = ref if ref is not None else r["first"]
        print(f"{kind:8} {r['tflops']:8.2f} TFLOP/s {r['ms']:9.3f} ms  ({r['timing']}){same}", flush=True)
    c = fma_ceiling("f32")
    print(f"FMA ceiling {c['tflops']:.2f} TFLOP/s f32")


if __name__ == "__main__":
    main()
