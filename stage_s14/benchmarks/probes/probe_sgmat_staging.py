"""The ceiling of subgroup-matrix attention in WGSL with workgroup-memory staging (issue 43's speed
goal: "a matmul-only probe of the same staging"), and the loop the family's redesign uses
(docs/wgsl-variants.md, "Subgroup matrices"), measured stage by stage on the WGSL grid's shapes
(f16, B L = 16384 tokens, H 16, full attention, L a multiple of the tiles):

    ATTNGEN_WGPU=wgpudawn python3 benchmarks/probes/probe_sgmat_staging.py [--null]
        [--dims 64,128] [--lengths 1024,4096] [--stages mm,conv,softmax] [--subgroups 4,8]
        [--tiles 32,64] [--sync barrier,none] [--pads 8] [--repeat 5]

One standalone kernel (16x16x16 f16 -> f32 subgroup matrices, written here, not attngen's): a
workgroup of SUBGROUPS subgroups owns 16 query rows each (Q as left matrices in registers, loaded
once); per key tile all invocations copy K and V into workgroup memory (rows padded by `pad`
halves: the matrix loads' rows then fall in different banks); each subgroup computes its 16 x TS
block of S = Q K^T (TS = 32 keys at a time) as result matrices, stores it column-major to its own
region of workgroup memory, its 32 invocations turn it into P (two per row: invocation r + 16 h
takes row r, keys 2 j + h), store P column-major as f16, and the subgroup loads P as left
matrices for acc += P V. Stages:
  mm       S = Q K^T stored, P V from a P never rewritten: the matrix work and its staging only
  conv     + P = f16(S) written by the invocations (the round trip through workgroup memory)
  softmax  + the online softmax (max by a shuffle, exp2, row sums; acc rescaled through workgroup
           memory only when a row's max grew by more than 8 in log2 units) and out = acc / l;
           its output is checked against numpy for one head
`--sync barrier` orders a subgroup's stores and its invocations' reads with workgroupBarrier (the
spec's way: WGSL has no subgroup barrier); `none` relies on the subgroup running converged
(NVIDIA's warps in practice, not guaranteed by WGSL). TFLOP/s from timestamp queries around
`--repeat` back-to-back dispatches (4 B H L^2 D FLOPs each). --null compiles every kernel on
Dawn's Null backend instead. A probe: it changes nothing in attngen.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

FEATURES = ["shader-f16", "subgroups", "chromium-experimental-subgroup-matrix"]
TOKENS, HEADS = 16384, 16
TS = 32          # keys of S per softmax step (two 16-key result matrices)
S_STRIDE = 20    # f32 per column of a subgroup's S (16 rows + 4): column-major stores spread over banks
P_STRIDE = 24    # f16 per column of a subgroup's P (16 rows + 8)
RESCALE_THRESHOLD = 8.0


def kernel_source(d, subgroups, tile, stage, sync, pad, L, H, len_mode="const", exp="f32"):
    """The probe's WGSL for head dim d, `subgroups` x 16 query rows, `tile` keys per K/V tile."""
    assert tile % TS == 0 and d % 16 == 0
    tq, wg, ks = subgroups * 16, subgroups * 32, d + pad
    nq = d // 16
    sy = "workgroupBarrier();" if sync == "barrier" else "// (subgroup converged: no barrier)"
    q_frags = "".join(f"    let qf{i} = subgroupMatrixLoad<left_t, row_major>(&q, qbase + {16 * i}u, HEADS * HEAD_DIM);\n"
                      for i in range(nq))
    acc_init = "".join(f"    var acc{i} = result_t(0.0);\n" for i in range(nq))
    s_part = ""
    for n in range(TS // 16):
        s_part += f"            var s{n} = result_t(0.0);\n"
        for kk in range(nq):
            s_part += (f"            s{n} = subgroupMatrixMultiplyAccumulate(qf{kk}, subgroupMatrixLoad<right_t, col_major>("
                       f"&sK, (kt + {16 * n}u) * KS + {16 * kk}u, KS), s{n});\n")
        s_part += f"            subgroupMatrixStore<col_major>(&sS, sb + {16 * n}u * S_STRIDE, s{n}, S_STRIDE);\n"
    pv_part = ""
    for kk in range(TS // 16):
        pv_part += f"            let a{kk} = subgroupMatrixLoad<left_t, col_major>(&sP, pb + {16 * kk}u * P_STRIDE, P_STRIDE);\n"
        for i in range(nq):
            pv_part += (f"            acc{i} = subgroupMatrixMultiplyAccumulate(a{kk}, subgroupMatrixLoad<right_t, row_major>("
                        f"&sV, (kt + {16 * kk}u) * KS + {16 * i}u, KS), acc{i});\n")
    half = TS // 2
    if stage == "mm":
        p_part = ""
    elif stage == "conv":
        p_part = "".join(f"            sP[pb + ({2 * j}u + hh) * P_STRIDE + r] = f16(sS[sb + ({2 * j}u + hh) * S_STRIDE + r]);\n"
                         for j in range(half)) + f"            {sy}\n"
    else:
        reads = "".join(f"            let x{j} = sS[sb + ({2 * j}u + hh) * S_STRIDE + r] * SCALE_LOG2;\n" for j in range(half))
        mx = "            var mx = x0;\n" + "".join(f"            mx = max(mx, x{j});\n" for j in range(1, half))
        if exp == "f16":  # two exponentials per f16x2 instruction (x - m_i <= 8: no overflow in f16)
            exps = "".join(f"            let e{j} = exp2(vec2<f16>(vec2<f32>(x{j}, x{j + 1}) - m_i));\n"
                           f"            let p{j} = f32(e{j}.x);\n            let p{j + 1} = f32(e{j}.y);\n"
                           f"            sP[pb + ({2 * j}u + hh) * P_STRIDE + r] = e{j}.x;\n"
                           f"            sP[pb + ({2 * j + 2}u + hh) * P_STRIDE + r] = e{j}.y;\n"
                           for j in range(0, half, 2))
        else:
            exps = "".join(f"            let p{j} = exp2(x{j} - m_i);\n            sP[pb + ({2 * j}u + hh) * P_STRIDE + r] = f16(p{j});\n"
                           for j in range(half))
        sums = " + ".join(f"p{j}" for j in range(half))
        rescale_body = ""
        for i in range(nq):
            rescale_body += (f"                subgroupMatrixStore<col_major>(&sS, sb, acc{i}, S_STRIDE);\n"
                             f"                {sy}\n"
                             + "".join(f"                sS[sb + ({2 * j}u + hh) * S_STRIDE + r] *= alpha;\n" for j in range(8))
                             + f"                {sy}\n"
                             f"                acc{i} = subgroupMatrixLoad<result_t, col_major>(&sS, sb, S_STRIDE);\n"
                             f"                {sy}\n")
        if sync == "barrier":  # the decision made workgroup-uniform (the barrier it takes is the sync before P V)
            decide = ("            if (need) { atomicStore(&sFlag[0], tag); }\n"
                      "            let rescale = workgroupUniformLoad(&sFlag[0]) == tag;\n")
        else:
            decide = "            let rescale = subgroupAny(need);\n"
        p_part = (reads + mx
                  + "            mx = max(mx, subgroupShuffleXor(mx, 16u));  // the row's other invocation\n"
                  "            var alpha = 1.0;\n            var need = false;\n"
                  "            if (m_i <= MASKED) {\n                m_i = mx;\n"
                  "            } else if (mx > m_i + RESCALE_THRESHOLD) {\n"
                  "                alpha = exp2(m_i - mx);\n                m_i = mx;\n                l_i *= alpha;\n"
                  "                need = true;\n            }\n"
                  + exps + f"            l_i += {sums};\n" + decide
                  + f"            if (rescale) {{\n                {sy}  // every read of S done\n" + rescale_body + "            }\n")
        if sync != "barrier":
            p_part += f"            {sy}\n"
    epilogue = ""
    if stage == "softmax":
        epilogue += ("    let l_row = l_i + subgroupShuffleXor(l_i, 16u);\n"
                     "    let inv_l = select(0.0, 1.0 / l_row, l_row > 0.0);\n")
    else:
        epilogue += "    let inv_l = 1.0;\n"
    for i in range(nq):
        epilogue += (f"    {sy}\n    subgroupMatrixStore<col_major>(&sS, sb, acc{i}, S_STRIDE);\n    {sy}\n"
                     + "".join(f"    out[obase + r * HEADS * HEAD_DIM + {16 * i + 2 * j}u + hh] = "
                               f"f16(sS[sb + ({2 * j}u + hh) * S_STRIDE + r] * inv_l);\n" for j in range(8)))
    decls = ""
    if stage == "softmax" and sync == "barrier":
        # 16 bytes, not 4: every workgroup variable a multiple of 16 bytes, so that no placement by
        # the driver can leave the f16 tiles off the 16-byte alignment matrix loads need
        decls = "var<workgroup> sFlag: array<atomic<u32>, 4>;  // [0]: the last sub-tile in which a row needed acc rescaled\n"
    if len_mode == "uniform":  # the length a run-time value, as attngen's kernels have it
        len_decl = "@group(0) @binding(4) var<uniform> lens: vec4<u32>;\n"
        len_let = "    let LEN = lens.x;  // the sequence length, a run-time value\n"
    else:
        len_decl = f"const LEN: u32 = {L}u;  // the sequence length, a compile-time constant\n"
        len_let = ""
    return f"""// probe_sgmat_staging.py: d {d}, {subgroups} subgroups, key tile {tile}, stage {stage}, sync {sync}, pad {pad}, length {len_mode}, exp2 {exp}
enable f16;
enable subgroups;
enable chromium_experimental_subgroup_matrix;
// the lazy rescale branches on a subgroup-uniform condition (subgroupAny), which Tint's analysis
// does not prove: the generator guarantees it
diagnostic(off, chromium.subgroup_matrix_uniformity);

alias left_t = subgroup_matrix_left<f16, 16, 16>;
alias right_t = subgroup_matrix_right<f16, 16, 16>;
alias result_t = subgroup_matrix_result<f32, 16, 16>;
const HEAD_DIM: u32 = {d}u;
const HEADS: u32 = {H}u;
{len_decl}const TILE_Q: u32 = {tq}u;
const TILE_KV: u32 = {tile}u;
const TS: u32 = {TS}u;
const KS: u32 = {ks}u;
const S_STRIDE: u32 = {S_STRIDE}u;
const P_STRIDE: u32 = {P_STRIDE}u;
const WG: u32 = {wg}u;
const SCALE_LOG2: f32 = {1.4426950408889634 / np.sqrt(d):.9g};
const RESCALE_THRESHOLD: f32 = {RESCALE_THRESHOLD};
const MASKED: f32 = -3.0e38;

@group(0) @binding(0) var<storage, read> q: array<f16>;
@group(0) @binding(1) var<storage, read> k4: array<vec4<f16>>;
@group(0) @binding(2) var<storage, read> v4: array<vec4<f16>>;
@group(0) @binding(3) var<storage, read_write> out: array<f16>;

var<workgroup> sK: array<f16, {tile * ks}>;
var<workgroup> sV: array<f16, {tile * ks}>;
var<workgroup> sS: array<f32, {subgroups * TS * S_STRIDE}>;
var<workgroup> sP: array<f16, {subgroups * TS * P_STRIDE}>;
{decls}
@compute @workgroup_size({wg}, 1, 1)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wgid: vec3<u32>,
        @builtin(subgroup_id) sg: u32, @builtin(subgroup_invocation_id) lane: u32) {{
{len_let}    let b = wgid.z;
    let h = wgid.y;
    let row0 = wgid.x * TILE_Q + sg * 16u;
    let qbase = ((b * LEN + row0) * HEADS + h) * HEAD_DIM;
    let obase = qbase;
{q_frags}{acc_init}    let r = lane % 16u;
    let hh = lane / 16u;
    let sb = sg * TS * S_STRIDE;
    let pb = sg * TS * P_STRIDE;
    var m_i = MASKED;
    var l_i = 0.0;
    var tag = 0u;
    for (var j0 = 0u; j0 < LEN; j0 += TILE_KV) {{
        for (var e = lid; e < TILE_KV * (HEAD_DIM / 4u); e += WG) {{
            let key = e / (HEAD_DIM / 4u);
            let d4 = e % (HEAD_DIM / 4u);
            let g = ((b * LEN + j0 + key) * HEADS + h) * (HEAD_DIM / 4u) + d4;
            let kx = k4[g];
            let vx = v4[g];
            let o = key * KS + 4u * d4;
            sK[o] = kx.x; sK[o + 1u] = kx.y; sK[o + 2u] = kx.z; sK[o + 3u] = kx.w;
            sV[o] = vx.x; sV[o + 1u] = vx.y; sV[o + 2u] = vx.z; sV[o + 3u] = vx.w;
        }}
        workgroupBarrier();
        for (var kt = 0u; kt < TILE_KV; kt += TS) {{
            tag += 1u;
{s_part}            {sy}
{p_part}{pv_part}        }}
        workgroupBarrier();
    }}
{epilogue}}}
"""


def smem_bytes(d, subgroups, tile, pad, stage, sync):
    return (2 * tile * (d + pad) * 2 + subgroups * TS * S_STRIDE * 4 + subgroups * TS * P_STRIDE * 2
            + (16 if stage == "softmax" and sync == "barrier" else 0))


def attention_ref(q, k, v, d):
    """Full attention of one (batch, head): q, k, v (L, d) -> (L, d), float64."""
    s = q.astype(np.float64) @ k.astype(np.float64).T / np.sqrt(d)
    s -= s.max(axis=1, keepdims=True)
    p = np.exp(s)
    return (p / p.sum(axis=1, keepdims=True)) @ v.astype(np.float64)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--null", action="store_true", help="compile every kernel on Dawn's Null backend, run none")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--lengths", default="1024,4096")
    ap.add_argument("--stages", default="mm,conv,softmax")
    ap.add_argument("--subgroups", default="4,8")
    ap.add_argument("--tiles", default="32,64")
    ap.add_argument("--sync", default="barrier,none")
    ap.add_argument("--pads", default="8", help="halves of padding per K / V row (8,0: both)")
    ap.add_argument("--len-modes", default="const", help="const (LEN a compile-time constant: the driver may "
                    "unroll the key loop) and/or uniform (a run-time value, as attngen's kernels)")
    ap.add_argument("--exps", default="f32", help="softmax's exp2 in f32 and/or f16 (pairs, vec2<f16>)")
    ap.add_argument("--sg-for-d", default="", help="subgroups per head dim, e.g. 64:8,128:4 (overrides --subgroups)")
    ap.add_argument("--preset", choices=["c"], help="c: issue 43's third-session questions (d128 L1024's slowness, "
                    "d64's softmax cost): the family's configs, stages mm and softmax, length const / uniform, "
                    "exp2 f32 / f16, barrier and none")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    if args.preset == "c":
        args.stages, args.tiles, args.sync, args.sg_for_d = "mm,softmax", "32", "barrier,none", "64:8,128:4"
        args.len_modes, args.exps = "const,uniform", "f32,f16"
    ints = lambda s: [int(x) for x in s.split(",") if x]
    if args.null:
        os.environ["WGPU_BACKEND_TYPE"] = "Null"
    import wgpudawn as wgpu
    from wgpudawn.backends.dawn import extras
    extras.set_instance_extras(enable_toggles=["allow_unsafe_apis", "vulkan_enable_f16_on_nvidia"],
                               disable_toggles=["timestamp_quantization"])
    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    missing = [f for f in FEATURES if f not in adapter.features]
    if missing:
        sys.exit(f"the adapter ({dict(adapter.info)}) lacks {missing}")
    feats = FEATURES + (["timestamp-query"] if "timestamp-query" in adapter.features and not args.null else [])
    limits = {n: adapter.limits[n] for n in ("max-compute-workgroup-storage-size", "max-compute-invocations-per-workgroup",
                                             "max-compute-workgroup-size-x", "max-storage-buffer-binding-size",
                                             "max-buffer-size") if n in adapter.limits}
    dev = adapter.request_device_sync(required_features=feats, required_limits=limits)
    smem_limit = int(dev.limits["max-compute-workgroup-storage-size"])
    print(f"device {adapter.info.get('device', '?')} ({adapter.info.get('backend_type', '?')}); workgroup storage "
          f"{smem_limit} bytes{'; Null: compile only' if args.null else ''}", flush=True)
    print(f"{'d':>4} {'L':>5} {'stage':8} {'sg':>3} {'tile':>4} {'sync':8} {'pad':>3} {'len':7} {'exp':3} {'smem':>6} "
          f"{'ms':>8} {'TFLOP/s':>8}  check")
    sg_for_d = {int(a): int(b) for a, b in (x.split(":") for x in args.sg_for_d.split(",") if x)}
    for d in ints(args.dims):
        for L in ints(args.lengths):
            B = TOKENS // L
            bufs = None
            if not args.null:
                rng = np.random.default_rng(d + L)
                q, k, v = ((rng.standard_normal((B, L, HEADS, d)) * 0.5).astype(np.float16) for _ in range(3))
                usage = wgpu.BufferUsage.STORAGE
                bufs = [dev.create_buffer_with_data(data=x.tobytes(), usage=usage) for x in (q, k, v)]
                bufs.append(dev.create_buffer(size=q.nbytes, usage=usage | wgpu.BufferUsage.COPY_SRC))
                lens = dev.create_buffer_with_data(data=np.array([L, 0, 0, 0], np.uint32).tobytes(),
                                                   usage=wgpu.BufferUsage.UNIFORM)
                ref = attention_ref(q[0, :, 0], k[0, :, 0], v[0, :, 0], d)
            flops = 4.0 * B * HEADS * L * L * d
            variants = [(stage, sg, tile, sync, pad, lm, ex)
                        for stage in args.stages.split(",") for sg in ([sg_for_d[d]] if d in sg_for_d else ints(args.subgroups))
                        for tile in ints(args.tiles) for sync in args.sync.split(",") for pad in ints(args.pads)
                        for lm in args.len_modes.split(",") for ex in (args.exps.split(",") if stage == "softmax" else ["f32"])]
            for stage, sg, tile, sync, pad, lm, ex in variants:
                smem = smem_bytes(d, sg, tile, pad, stage, sync)
                head = f"{d:4d} {L:5d} {stage:8} {sg:3d} {tile:4d} {sync:8} {pad:3d} {lm:7} {ex:3} {smem:6d}"
                if smem > smem_limit and not args.null:
                    print(f"{head} {'':>8} {'':>8}  skip: over the {smem_limit} bytes of workgroup storage")
                    continue
                src = kernel_source(d, sg, tile, stage, sync, pad, L, HEADS, lm, ex)
                try:
                    module = dev.create_shader_module(code=src)
                    pipe = dev.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
                except Exception as e:
                    msg = str(e).strip().splitlines()[0]
                    if args.null and ("maxSubgroupSize" in msg or "workgroup storage" in msg):
                        print(f"{head}  compiled")
                    else:
                        print(f"{head}  ERROR {msg[:300]}")
                    continue
                if args.null:
                    print(f"{head}  compiled")
                    continue
                print(head + " " + run(dev, wgpu, pipe, bufs + ([lens] if lm == "uniform" else []), (L // (sg * 16), HEADS, B),
                                       flops, args.repeat, ref if stage == "softmax" else None, q.shape), flush=True)


def run(dev, wgpu, pipe, bufs, grid, flops, repeat, ref, shape):
    group = dev.create_bind_group(layout=pipe.get_bind_group_layout(0),
                                  entries=[{"binding": i, "resource": {"buffer": b}} for i, b in enumerate(bufs)])
    # (the reference checks out: bufs[3])
    timed = "timestamp-query" in dev.features

    def submit(n):
        enc = dev.create_command_encoder()
        qs = dev.create_query_set(type=wgpu.QueryType.timestamp, count=2) if timed else None
        for i in range(n):
            writes = None
            if qs is not None and i in (0, n - 1):
                writes = {"query_set": qs}
                if i == 0:
                    writes["beginning_of_pass_write_index"] = 0
                if i == n - 1:
                    writes["end_of_pass_write_index"] = 1
            cp = enc.begin_compute_pass(timestamp_writes=writes)
            cp.set_pipeline(pipe)
            cp.set_bind_group(0, group)
            cp.dispatch_workgroups(*grid)
            cp.end()
        stamps = None
        if qs is not None:
            stamps = dev.create_buffer(size=16, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
            enc.resolve_query_set(qs, 0, 2, stamps, 0)
        t = time.perf_counter()
        dev.queue.submit([enc.finish()])
        if stamps is not None:
            t0, t1 = np.frombuffer(dev.queue.read_buffer(stamps), dtype=np.uint64)
            return float(t1 - t0) / 1e6 / n
        dev.queue.on_submitted_work_done_sync()
        return (time.perf_counter() - t) * 1e3 / n

    submit(1)  # warm-up
    ms = submit(repeat)
    check = ""
    if ref is not None:
        out = np.frombuffer(dev.queue.read_buffer(bufs[3]), dtype=np.float16).reshape(shape)
        got = out[0, :, 0].astype(np.float64)
        rel = np.abs(got - ref).max() / np.abs(ref).max()
        check = f"rel. err {rel:.2g} {'OK' if rel < 1e-2 else 'WRONG'}"
    return f"{ms:8.3f} {flops / ms / 1e9:8.1f}  {check}"


if __name__ == "__main__":
    main()
