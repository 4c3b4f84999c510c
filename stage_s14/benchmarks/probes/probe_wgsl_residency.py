"""How many workgroups of 256 invocations the adapter keeps on one multiprocessor, by workgroup
memory and by registers (issue 13): synthetic kernels, timed by grid size.

    python3 benchmarks/probes/probe_wgsl_residency.py [--smem-kib 16,48] [--live 8,96,160] [--loads 40960]

Each invocation walks a chain of dependent loads through workgroup memory (latency-bound: one
workgroup of 8 warps leaves the multiprocessor mostly idle) while keeping `live` f32 values in
registers (each updated once per `live` steps, all summed at the end, so none can be dropped),
with `smem` KiB of workgroup memory. The grid is n x the adapter's multiprocessor count (132 on
the H100; --sms) workgroups. If two workgroups fit one multiprocessor, a grid of twice the SM
count takes about as long as one of the SM count; if one fits, twice as long (waves). The table
gives the time of each grid over the time of the first: 2.0 at n 2 says one workgroup per
multiprocessor. attngen's q128 kernels (256 invocations, ~48 KiB, 32 scores and 64 accumulators
per invocation) read 2.0 in benchmarks/probes/probe_wgsl_occupancy.py. It changes nothing in attngen.
"""

from __future__ import annotations

import argparse

import numpy as np

from attngen.backends.wgsl.devices import device_state, wgpu
import common  # noqa: F401  (benchmarks/suite/ on sys.path)
from wgsl_peers import _group, _pipeline, measure  # noqa: E402

_SOURCE = """
struct Params {{ iters: u32, seed: u32, pad0: u32, pad1: u32 }}
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
const N: u32 = {words}u;  // workgroup memory in 32-bit words
var<workgroup> buf: array<u32, N>;

@compute @workgroup_size(256, 1, 1)
fn walk(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {{
    for (var i = lid; i < N; i += 256u) {{ buf[i] = (i * 2654435761u + P.seed) % N; }}
    workgroupBarrier();
{init}
    var idx = lid;
    for (var it = 0u; it < P.iters; it++) {{
{body}
    }}
    out[wg.x * 256u + lid] = f32(idx){total};
}}
"""


def source(smem_kib: int, live: int) -> str:
    words = smem_kib * 256
    init = "\n".join(f"    var r{k} = f32(lid + {k}u);" for k in range(live))
    # one dependent load per step; each step also feeds one of the live values (in turn)
    steps = max(live, 8)
    body = "\n".join(f"        idx = buf[(idx + {s}u) % N];" + (f" r{s % live} = r{s % live} * 0.5 + f32(idx);" if live else "")
                     for s in range(steps))
    total = "".join(f" + r{k}" for k in range(live))
    return _SOURCE.format(words=words, init=init, body=body, total=total)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smem-kib", default="16,48")
    ap.add_argument("--live", default="8,96,160")
    ap.add_argument("--loads", type=int, default=40960, help="dependent loads per invocation")
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--waves", default="1,2,3,4")
    args = ap.parse_args()
    st = device_state()
    dev = st.device
    print(st.description())
    for kib in (int(x) for x in args.smem_kib.split(",")):
        for live in (int(x) for x in args.live.split(",")):
            module = dev.create_shader_module(code=source(kib, live))
            pipe = _pipeline(dev, module, "walk")
            iters = args.loads // max(live, 8)  # (the loop body holds max(live, 8) loads)
            u = dev.create_buffer_with_data(data=np.array([iters, 12345, 0, 0], np.uint32).tobytes(),
                                            usage=wgpu.BufferUsage.UNIFORM)
            cells, first = [], None
            for n in (int(x) for x in args.waves.split(",")):
                groups = n * args.sms
                out = dev.create_buffer(size=groups * 256 * 4, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
                ms, timing, _ = measure([(pipe, _group(dev, pipe, {0: u, 1: out}), (groups, 1, 1))], out, 5)
                first = first or ms
                cells.append(f"{groups} wg {ms:.3f} ms ({ms / first:.2f})")
                out.destroy()
            print(f"smem {kib:2d} KiB, {live:3d} live values | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
