"""Does wgpu's experimental cooperative-matrix feature reach the tensor cores (issue 13)?

    python3 benchmarks/probes/probe_wgsl_coop.py [--n 4096]

wgpu 0.32 (wgpu-native) offers the native-only feature "cooperative-matrix": WGSL with
`enable wgpu_cooperative_matrix;`, the type coop_mat8x8<f32, A|B|C> and coopLoad / coopStore /
coopMultiplyAdd, lowered to SPIR-V's KHR cooperative matrices on Vulkan (8 x 8 x 8 f32 only, in
wgpu 0.32). This probe, on the live adapter:
  1. lists the adapter's features and whether a device with cooperative-matrix can be had;
  2. compiles small shaders to learn which builtins naga takes (coopLoad from storage and from
     workgroup memory, coopLoadT, a zero constructor, scalar multiply);
  3. times C = A B (f32, n x n x n) with cooperative matrices, two ways (tiles read from the storage
     buffers; tiles staged in workgroup memory), checks each against numpy, and prints TFLOP/s
     beside the FMA ceiling of benchmarks/suite/wgsl_peers.py.
It changes nothing in attngen; what it prints decides whether a WGSL kernel family on cooperative
matrices is worth building (benchmarks/NOTES.md).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import wgpu

FEATURE = "cooperative-matrix"


def gemm_global(wm: int, wn: int) -> str:
    """One subgroup per workgroup computes (8 wm) x (8 wn) of C, reading A and B from storage."""
    decl = "\n".join(f"    var c{i}_{j} = coopLoad<coop_mat8x8<f32, C>>(&c[(r0 + {8 * i}u) * n + c0 + {8 * j}u], n);"
                     for i in range(wm) for j in range(wn))
    body_a = "\n".join(f"        let a{i} = coopLoad<coop_mat8x8<f32, A>>(&a[(r0 + {8 * i}u) * n + k], n);" for i in range(wm))
    body_b = "\n".join(f"        let b{j} = coopLoad<coop_mat8x8<f32, B>>(&b[k * n + c0 + {8 * j}u], n);" for j in range(wn))
    mad = "\n".join(f"        c{i}_{j} = coopMultiplyAdd(a{i}, b{j}, c{i}_{j});" for i in range(wm) for j in range(wn))
    store = "\n".join(f"    coopStore(c{i}_{j}, &c[(r0 + {8 * i}u) * n + c0 + {8 * j}u], n);" for i in range(wm) for j in range(wn))
    return f"""
enable wgpu_cooperative_matrix;
@group(0) @binding(0) var<uniform> dims: vec4<u32>;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> c: array<f32>;
@compute @workgroup_size(32)
fn main(@builtin(workgroup_id) wg: vec3<u32>) {{
    let n = dims.x;
    let r0 = wg.y * {8 * wm}u;
    let c0 = wg.x * {8 * wn}u;
{decl}
    for (var k = 0u; k < n; k += 8u) {{
{body_a}
{body_b}
{mad}
    }}
{store}
}}
"""


def gemm_shared(wm: int, wn: int, sub: int, kc: int) -> str:
    """`sub` subgroups per workgroup in a column of blocks: the workgroup computes
    (8 wm sub) x (8 wn) of C, A and B chunks of kc columns / rows staged in workgroup memory."""
    rows = 8 * wm * sub
    cols = 8 * wn
    inv = 32 * sub
    decl = "\n".join(f"    var c{i}_{j} = coopLoad<coop_mat8x8<f32, C>>(&c[(r0 + {8 * i}u) * n + c0 + {8 * j}u], n);"
                     for i in range(wm) for j in range(wn))
    body_a = "\n".join(f"            let a{i} = coopLoad<coop_mat8x8<f32, A>>(&sa[(sr + {8 * i}u) * {kc}u + kk], {kc}u);" for i in range(wm))
    body_b = "\n".join(f"            let b{j} = coopLoad<coop_mat8x8<f32, B>>(&sb[kk * {cols}u + {8 * j}u], {cols}u);" for j in range(wn))
    mad = "\n".join(f"            c{i}_{j} = coopMultiplyAdd(a{i}, b{j}, c{i}_{j});" for i in range(wm) for j in range(wn))
    store = "\n".join(f"    coopStore(c{i}_{j}, &c[(r0 + {8 * i}u) * n + c0 + {8 * j}u], n);" for i in range(wm) for j in range(wn))
    return f"""
enable wgpu_cooperative_matrix;
@group(0) @binding(0) var<uniform> dims: vec4<u32>;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> c: array<f32>;
var<workgroup> sa: array<f32, {rows * kc}>;
var<workgroup> sb: array<f32, {kc * cols}>;
@compute @workgroup_size({inv})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
    let n = dims.x;
    let wr0 = wg.y * {rows}u;
    let c0 = wg.x * {cols}u;
    let sr = (lid / 32u) * {8 * wm}u;      // this subgroup's first row in the block
    let r0 = wr0 + sr;
{decl}
    for (var k = 0u; k < n; k += {kc}u) {{
        for (var e = lid; e < {rows * kc}u; e += {inv}u) {{
            sa[e] = a[(wr0 + e / {kc}u) * n + k + e % {kc}u];
        }}
        for (var e = lid; e < {kc * cols}u; e += {inv}u) {{
            sb[e] = b[(k + e / {cols}u) * n + c0 + e % {cols}u];
        }}
        workgroupBarrier();
        for (var kk = 0u; kk < {kc}u; kk += 8u) {{
{body_a}
{body_b}
{mad}
        }}
        workgroupBarrier();
    }}
{store}
}}
"""


SNIPPETS = {
    "coopLoadT from storage": "let m = coopLoadT<coop_mat8x8<f32, B>>(&a[0], 8u); coopStore(coopMultiplyAdd(coopLoad<coop_mat8x8<f32, A>>(&a[0], 8u), m, coopLoad<coop_mat8x8<f32, C>>(&c[0], 8u)), &c[0], 8u);",
    "zero constructor": "let z = coop_mat8x8<f32, C>(); coopStore(z, &c[0], 8u);",
    "var without initializer": "var z: coop_mat8x8<f32, C>; coopStore(z, &c[0], 8u);",
    "scalar multiply": "let z = coopLoad<coop_mat8x8<f32, C>>(&c[0], 8u) * 2.0; coopStore(z, &c[0], 8u);",
    "matrix add": "let z = coopLoad<coop_mat8x8<f32, C>>(&c[0], 8u); coopStore(z + z, &c[0], 8u);",
    "coopStore to workgroup": "let z = coopLoad<coop_mat8x8<f32, C>>(&c[0], 8u); coopStore(z, &w[0], 8u); c[1] = w[3];",
    "coopLoad A from workgroup": "w[lid] = 1.0; workgroupBarrier(); let x = coopLoad<coop_mat8x8<f32, A>>(&w[0], 8u); coopStore(coopMultiplyAdd(x, coopLoad<coop_mat8x8<f32, B>>(&a[0], 8u), coopLoad<coop_mat8x8<f32, C>>(&c[0], 8u)), &c[0], 8u);",
    "f16 matrices": "let x = coopLoad<coop_mat8x8<f16, A>>(&h[0], 8u);",
    "16x16 type": "let x = coopLoad<coop_mat16x16<f32, A>>(&a[0], 16u);",
}


def snippet_source(body: str, f16: bool) -> str:
    return ("enable f16;\n" if f16 else "") + """enable wgpu_cooperative_matrix;
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read_write> c: array<f32>;
""" + ("@group(0) @binding(2) var<storage, read> h: array<f16>;\n" if f16 else "") + """var<workgroup> w: array<f32, 64>;
@compute @workgroup_size(32)
fn main(@builtin(local_invocation_index) lid: u32) {
    """ + body + """
}
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=4096)
    args = ap.parse_args()
    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    print("adapter:", dict(adapter.info))
    print("features:", sorted(adapter.features))
    if FEATURE not in adapter.features:
        print(f"no {FEATURE} on this adapter: nothing to probe")
        return
    wanted = [f for f in (FEATURE, "timestamp-query", "shader-f16", "subgroup") if f in adapter.features]
    dev = adapter.request_device_sync(required_features=wanted)
    print("device features:", sorted(dev.features))

    for label, body in SNIPPETS.items():
        try:
            dev.create_shader_module(code=snippet_source(body, "f16" in label))
            print(f"  compiles: {label}")
        except Exception as e:  # noqa: BLE001 -- a probe: report every refusal
            print(f"  refused:  {label}: {str(e).splitlines()[0][:200]}")

    n = args.n
    rng = np.random.default_rng(0)
    A = rng.standard_normal((n, n), dtype=np.float32)
    B = rng.standard_normal((n, n), dtype=np.float32)
    ref = (A.astype(np.float64) @ B.astype(np.float64))
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
    ba = dev.create_buffer_with_data(data=A.tobytes(), usage=usage)
    bb = dev.create_buffer_with_data(data=B.tobytes(), usage=usage)
    bc = dev.create_buffer(size=4 * n * n, usage=usage)
    dims = dev.create_buffer_with_data(data=np.array([n, 0, 0, 0], np.uint32).tobytes(),
                                       usage=wgpu.BufferUsage.UNIFORM)
    stamps = "timestamp-query" in dev.features
    flops = 2.0 * n ** 3
    variants = [(f"global {wm}x{wn} tiles per subgroup", gemm_global(wm, wn), (n // (8 * wn), n // (8 * wm)))
                for wm, wn in ((2, 2), (2, 4), (4, 4))]
    variants += [(f"workgroup memory {sub} subgroups x {wm}x{wn} tiles, k chunk {kc}", gemm_shared(wm, wn, sub, kc),
                  (n // (8 * wn), n // (8 * wm * sub)))
                 for wm, wn, sub, kc in ((2, 4, 4, 32), (4, 4, 2, 32), (2, 8, 4, 16))]
    for label, code, grid in variants:
        try:
            module = dev.create_shader_module(code=code)
            pipe = dev.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
            group = dev.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[
                {"binding": 0, "resource": {"buffer": dims}}, {"binding": 1, "resource": {"buffer": ba}},
                {"binding": 2, "resource": {"buffer": bb}}, {"binding": 3, "resource": {"buffer": bc}}])
        except Exception as e:  # noqa: BLE001
            print(f"{label}: refused: {str(e).splitlines()[0][:300]}")
            continue

        def run(timed):
            dev.queue.write_buffer(bc, 0, np.zeros(n * n, np.float32).tobytes())
            enc = dev.create_command_encoder()
            qs = dev.create_query_set(type=wgpu.QueryType.timestamp, count=2) if (timed and stamps) else None
            cp = enc.begin_compute_pass(timestamp_writes={"query_set": qs, "beginning_of_pass_write_index": 0,
                                                          "end_of_pass_write_index": 1} if qs else None)
            cp.set_pipeline(pipe)
            cp.set_bind_group(0, group)
            cp.dispatch_workgroups(*grid)
            cp.end()
            if qs:
                res = dev.create_buffer(size=16, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
                enc.resolve_query_set(qs, 0, 2, res, 0)
            t0 = time.perf_counter()
            dev.queue.submit([enc.finish()])
            if qs:
                t = np.frombuffer(dev.queue.read_buffer(res), np.uint64)
                return float(t[1] - t[0]) / 1e6
            dev.queue.read_buffer(bc, 0, 4)
            return (time.perf_counter() - t0) * 1e3

        try:
            run(False)
            out = np.frombuffer(dev.queue.read_buffer(bc), np.float32).reshape(n, n)
            err = float(np.abs(out - ref).max() / np.abs(ref).max())
            ms = statistics.median(run(True) for _ in range(5))
            print(f"{label}: {ms:.3f} ms, {flops / ms / 1e9:.1f} TFLOP/s, max rel. err {err:.2e}"
                  f" ({'GPU timestamps' if stamps else 'wall'})")
        except Exception as e:  # noqa: BLE001
            print(f"{label}: failed: {str(e).splitlines()[0][:300]}")


if __name__ == "__main__":
    main()
