"""Peers of attngen's WGSL kernels, written by hand, for the wgsl section of run_gpu.py (issue 13).

    python3 benchmarks/suite/wgsl_peers.py [--small]     # checks the three-pass baseline, prints its
                                                   # TFLOP/s and the FMA ceiling

ThreePass: a straightforward three-pass attention, what one writes first without fusing:

  pass 1  S = scale * Q K^T into a storage buffer, one invocation per score (workgroups of 16 x 16:
          16 keys x 16 queries), the dot product in vec4 loads over the head dim; under a causal
          mask the scores a row does not see are neither computed nor read afterwards;
  pass 2  the row softmax in place, one workgroup of 256 invocations per row (strided over the
          row, tree reductions in workgroup memory for the max and the sum);
  pass 3  O = P V, one invocation per 4 output columns of a row, a loop over the row's keys.

No tiling in workgroup memory, no fusion: every score goes through memory three times. Compute
is f32 whatever the storage; q, k and v are the same resident buffers attngen's kernel is timed on
((B, L, H, D) row-major WgslTensors, f32 or f16; f16 is read as u32 words and unpacked, so no
shader-f16 is needed), the output is f32. S is (G, L, L) f32 for G (batch, head) pairs at a time:
G is as many pairs as fit in `s_budget` bytes (at most the device's storage binding size), and
one submission runs every group's three passes in order, so the time covers all B * H pairs.

fma_ceiling: independent FMA chains (8 vec4 chains per invocation, 4 steps of each per loop
iteration, many workgroups), the TFLOP/s a plain WGSL FMA loop reaches on the adapter (2 flops per
FMA lane); f32, or f16 where the device has shader-f16.

Timing: timestamp queries written at the start of the first compute pass and the end of the last
(as attngen.backends.wgsl.launch.dispatch does for attngen's kernels) where the device has
timestamp-query; otherwise wall time from submission to completion (a 4-byte read-back waits for
it). Every result says which. The device is attngen's (attngen.backends.wgsl.device()).
"""

from __future__ import annotations

import math
import statistics
import time

import numpy as np

from attngen.backends.wgsl.devices import WgslTensor, device_state, padded, wgpu

GPU_TIMING = "GPU (timestamp queries)"
WALL_TIMING = "wall (submit to completion)"

# ---- timing -------------------------------------------------------------------------------------


def _submit(passes, wait_buffer, timed: bool):
    """Encode `passes` [(pipeline, bind_group, (x, y, z))], one compute pass each, in one
    submission; wait for it. Returns the GPU milliseconds (timestamp queries around all passes)
    when `timed` and the device has them, else None."""
    st = device_state()
    dev = st.device
    stamps = timed and "timestamp-query" in st.features
    queries = dev.create_query_set(type=wgpu.QueryType.timestamp, count=2) if stamps else None
    enc = dev.create_command_encoder()
    last = len(passes) - 1
    for i, (pipeline, group, grid) in enumerate(passes):
        writes = None
        if queries is not None and (i == 0 or i == last):
            writes = {"query_set": queries}
            if i == 0:
                writes["beginning_of_pass_write_index"] = 0
            if i == last:
                writes["end_of_pass_write_index"] = 1
        cp = enc.begin_compute_pass(timestamp_writes=writes)
        cp.set_pipeline(pipeline)
        cp.set_bind_group(0, group)
        cp.dispatch_workgroups(*grid)
        cp.end()
    if queries is not None:
        resolved = dev.create_buffer(size=16, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
        enc.resolve_query_set(queries, 0, 2, resolved, 0)
    dev.queue.submit([enc.finish()])
    if queries is not None:
        t0, t1 = np.frombuffer(dev.queue.read_buffer(resolved), dtype=np.uint64)
        return float(t1 - t0) / 1e6  # WebGPU timestamps are nanoseconds
    dev.queue.read_buffer(wait_buffer, 0, 4)  # waits for the submission
    return None


def measure(passes, wait_buffer, runs: int = 5, budget_s: float | None = None, warmup: bool = True):
    """Median milliseconds of up to `runs` submissions of `passes` (after one warm-up unless the
    caller has just run them), fewer (at least 2) once `budget_s` seconds of wall time are spent.
    Returns (ms, timing, runs done)."""
    if warmup:
        _submit(passes, wait_buffer, timed=False)
    times, kinds = [], set()
    start = time.perf_counter()
    for n in range(runs):
        t0 = time.perf_counter()
        gpu = _submit(passes, wait_buffer, timed=True)
        wall = (time.perf_counter() - t0) * 1e3
        times.append(wall if gpu is None else gpu)
        kinds.add(WALL_TIMING if gpu is None else GPU_TIMING)
        if budget_s is not None and n >= 1 and time.perf_counter() - start > budget_s:
            break
    return statistics.median(times), " + ".join(sorted(kinds)), len(times)


def _pipeline(dev, module, entry):
    return dev.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": entry})


def _group(dev, pipeline, buffers):
    """A bind group of `buffers` {binding: buffer} for the pipeline's (auto) layout."""
    return dev.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=[
        {"binding": b, "resource": {"buffer": buf, "offset": 0, "size": buf.size}} for b, buf in sorted(buffers.items())])


# ---- the three-pass attention ---------------------------------------------------------------------

_LOAD = {
    "f32": ("vec4<f32>", "fn ld(x: vec4<f32>) -> vec4<f32> { return x; }"),
    "f16": ("vec2<u32>", "fn ld(x: vec2<u32>) -> vec4<f32> { return vec4<f32>(unpack2x16float(x.x), "
                         "unpack2x16float(x.y)); }"),
}

_THREE_PASS = """
// Three-pass attention (benchmarks/suite/wgsl_peers.py): scores, softmax, P V through memory; f32 compute.
struct Params {{ L: u32, H: u32, pair0: u32, causal: u32, scale: f32, pad0: u32, pad1: u32, pad2: u32 }}
const D4: u32 = {d4}u;  // head dim / 4
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> q: array<{word}>;
@group(0) @binding(2) var<storage, read> k: array<{word}>;
@group(0) @binding(3) var<storage, read> v: array<{word}>;
@group(0) @binding(4) var<storage, read_write> s: array<f32>;            // (G, L, L) scores, then P
@group(0) @binding(5) var<storage, read_write> o: array<vec4<f32>>;      // (B, L, H, D) f32
{load}

// the first vec4 of token i of pair z (pair = batch * H + head) in q / k / v / o
fn token(z: u32, i: u32) -> u32 {{
    let pair = P.pair0 + z;
    return (((pair / P.H) * P.L + i) * P.H + pair % P.H) * D4;
}}

@compute @workgroup_size(16, 16, 1)
fn scores(@builtin(global_invocation_id) g: vec3<u32>) {{
    let j = g.x;
    let i = g.y;
    if (i >= P.L || j >= P.L || (P.causal != 0u && j > i)) {{ return; }}  // masked: never read
    let qi = token(g.z, i);
    let kj = token(g.z, j);
    var acc = vec4<f32>(0.0);
    for (var c = 0u; c < D4; c++) {{
        acc = fma(ld(q[qi + c]), ld(k[kj + c]), acc);
    }}
    s[(g.z * P.L + i) * P.L + j] = P.scale * (acc.x + acc.y + acc.z + acc.w);
}}

var<workgroup> red: array<f32, 256>;

@compute @workgroup_size(256, 1, 1)
fn softmax(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {{
    let i = wg.x;
    let n = select(P.L, i + 1u, P.causal != 0u);  // the keys row i sees
    let row = (wg.y * P.L + i) * P.L;
    var m = -3.4e38;
    for (var j = t; j < n; j += 256u) {{ m = max(m, s[row + j]); }}
    red[t] = m;
    workgroupBarrier();
    for (var w = 128u; w > 0u; w >>= 1u) {{
        if (t < w) {{ red[t] = max(red[t], red[t + w]); }}
        workgroupBarrier();
    }}
    let mx = red[0];
    workgroupBarrier();
    var l = 0.0;
    for (var j = t; j < n; j += 256u) {{
        let e = exp(s[row + j] - mx);
        s[row + j] = e;
        l += e;
    }}
    red[t] = l;
    workgroupBarrier();
    for (var w = 128u; w > 0u; w >>= 1u) {{
        if (t < w) {{ red[t] += red[t + w]; }}
        workgroupBarrier();
    }}
    let inv = 1.0 / red[0];
    for (var j = t; j < n; j += 256u) {{ s[row + j] *= inv; }}
}}

@compute @workgroup_size(16, 16, 1)
fn pv(@builtin(global_invocation_id) g: vec3<u32>) {{
    let c = g.x;
    let i = g.y;
    if (c >= D4 || i >= P.L) {{ return; }}
    let n = select(P.L, i + 1u, P.causal != 0u);
    let row = (g.z * P.L + i) * P.L;
    var acc = vec4<f32>(0.0);
    for (var j = 0u; j < n; j++) {{
        acc = fma(vec4<f32>(s[row + j]), ld(v[token(g.z, j) + c]), acc);
    }}
    o[token(g.z, i) + c] = acc;
}}
"""


def three_pass_source(head_dim: int, dtype: str) -> str:
    word, load = _LOAD[dtype]
    return _THREE_PASS.format(d4=head_dim // 4, word=word, load=load)


def attention_flops(batch, heads, seqlen, head_dim, causal) -> float:
    """4 B H L^2 D, halved for causal (the ANCHORS convention, as run_gpu.py counts attngen)."""
    return 4.0 * batch * heads * seqlen * seqlen * head_dim * (0.5 if causal else 1.0)


class ThreePass:
    """The three-pass attention over resident q, k, v (WgslTensors (B, L, H, D), one dtype), scale
    1/sqrt(D) unless given. Build once (pipelines, buffers, bind groups), then `run()` / `time()`;
    `output()` reads O back as float32 (B, L, H, D)."""

    def __init__(self, q: WgslTensor, k: WgslTensor, v: WgslTensor, *, causal: bool = False,
                 scale: float | None = None, s_budget: int | None = None):
        if not (q.shape == k.shape == v.shape and len(q.shape) == 4) or not (q.dtype == k.dtype == v.dtype):
            raise ValueError("the three-pass peer takes q, k, v of one shape (B, L, H, D) and one dtype")
        batch, seqlen, heads, head_dim = q.shape
        if head_dim % 4 or q.dtype not in _LOAD:
            raise ValueError(f"head dim {head_dim} (a multiple of 4) and dtype {q.dtype} (f16 or f32)")
        st = device_state()
        dev = st.device
        self.shape, self.dtype, self.causal = tuple(q.shape), q.dtype, causal
        self.scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
        limit = min(int(dev.limits["max-storage-buffer-binding-size"]), int(dev.limits["max-buffer-size"]))
        budget = min(limit, s_budget or (1 << 30))
        per_pair = seqlen * seqlen * 4
        if per_pair > limit:
            raise ValueError(f"one (L, L) score matrix is {per_pair} bytes, above this device's "
                             f"{limit}-byte storage binding limit")
        pairs = batch * heads
        self.group = max(1, min(pairs, budget // per_pair, int(dev.limits["max-compute-workgroups-per-dimension"])))
        self.chunks = -(-pairs // self.group)
        module = dev.create_shader_module(code=three_pass_source(head_dim, q.dtype))
        pipes = {e: _pipeline(dev, module, e) for e in ("scores", "softmax", "pv")}
        usage = wgpu.BufferUsage.STORAGE
        self.s = dev.create_buffer(size=padded(self.group * per_pair), usage=usage)
        self.o = dev.create_buffer(size=padded(pairs * seqlen * head_dim * 4), usage=usage | wgpu.BufferUsage.COPY_SRC)
        self.passes = []
        self._uniforms = []
        for c in range(self.chunks):
            pair0 = c * self.group
            g = min(self.group, pairs - pair0)
            words = np.array([seqlen, heads, pair0, int(causal), 0, 0, 0, 0], dtype=np.uint32)
            words[4] = np.float32(self.scale).view(np.uint32)
            u = dev.create_buffer_with_data(data=words.tobytes(), usage=wgpu.BufferUsage.UNIFORM)
            self._uniforms.append(u)
            self.passes += [
                (pipes["scores"], _group(dev, pipes["scores"], {0: u, 1: q.buffer, 2: k.buffer, 4: self.s}),
                 (-(-seqlen // 16), -(-seqlen // 16), g)),
                (pipes["softmax"], _group(dev, pipes["softmax"], {0: u, 4: self.s}), (seqlen, g, 1)),
                (pipes["pv"], _group(dev, pipes["pv"], {0: u, 3: v.buffer, 4: self.s, 5: self.o}),
                 (-(-head_dim // 64), -(-seqlen // 16), g)),
            ]

    @property
    def flops(self) -> float:
        b, L, h, d = self.shape
        return attention_flops(b, h, L, d, self.causal)

    def run(self) -> None:
        _submit(self.passes, self.o, timed=False)

    def output(self) -> np.ndarray:
        n = int(np.prod(self.shape))
        raw = device_state().device.queue.read_buffer(self.o, 0, n * 4)
        return np.frombuffer(raw, dtype=np.float32, count=n).reshape(self.shape).copy()

    def time(self, runs: int = 5, budget_s: float | None = None, warmup: bool = True):
        """(median ms, timing, runs) of the whole attention (every pair's three passes)."""
        return measure(self.passes, self.o, runs, budget_s, warmup)

    def release(self) -> None:
        """Free S and O now (S can be a GiB) rather than when the object is collected."""
        for buf in (self.s, self.o):
            buf.destroy()
        self.passes = []


def three_pass(q: WgslTensor, k: WgslTensor, v: WgslTensor, **kw) -> np.ndarray:
    """One run of the three-pass attention; O as float32 numpy (B, L, H, D)."""
    peer = ThreePass(q, k, v, **kw)
    peer.run()
    return peer.output()


# ---- the FMA ceiling ------------------------------------------------------------------------------

CHAINS, STEPS, WORKGROUP = 8, 4, 256  # vec4 chains per invocation, steps of each per loop iteration

_FMA = """
// The FMA ceiling (benchmarks/suite/wgsl_peers.py): {chains} independent vec4 FMA chains per invocation.
{enable}
struct Params {{ iters: u32, a: f32, b: f32, pad: u32 }}
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> out: array<vec4<f32>>;

@compute @workgroup_size({wg}, 1, 1)
fn fma_chains(@builtin(global_invocation_id) g: vec3<u32>) {{
    let a = vec4<{t}>({t}(P.a));
    let b = vec4<{t}>({t}(P.b));
    let x = {t}(f32(g.x % 1024u) * 1e-3);
{init}
    for (var it = 0u; it < P.iters; it++) {{
{body}
    }}
    out[g.x] = vec4<f32>({total});
}}
"""


def fma_source(dtype: str = "f32") -> str:
    t = "f32" if dtype == "f32" else "f16"
    init = "\n".join(f"    var x{c} = vec4<{t}>(x, x + {t}({c}.0 * 0.01), x + {t}(0.5), x - {t}({c}.0 * 0.01));"
                     for c in range(CHAINS))
    body = "\n".join(f"        x{c} = fma(x{c}, a, b);" for _ in range(STEPS) for c in range(CHAINS))
    total = " + ".join(f"x{c}" for c in range(CHAINS))
    return _FMA.format(chains=CHAINS, enable="enable f16;" if dtype == "f16" else "", wg=WORKGROUP, t=t,
                       init=init, body=body, total=total)


def fma_ceiling(dtype: str = "f32", workgroups: int = 4096, iters: int = 2048, runs: int = 5) -> dict:
    """TFLOP/s of independent FMA chains: workgroups x 256 invocations, each `iters` loop
    iterations of 8 chains x 4 steps x 4 lanes (2 flops per lane). None where dtype f16 needs
    shader-f16 and the device has none."""
    st = device_state()
    if dtype == "f16" and "shader-f16" not in st.features:
        return {"dtype": dtype, "tflops": None, "why": "no shader-f16 on this device"}
    dev = st.device
    module = dev.create_shader_module(code=fma_source(dtype))
    pipe = _pipeline(dev, module, "fma_chains")
    words = np.array([iters, 0, 0, 0], dtype=np.uint32)
    words[1:3] = np.array([0.999, 0.001], dtype=np.float32).view(np.uint32)
    u = dev.create_buffer_with_data(data=words.tobytes(), usage=wgpu.BufferUsage.UNIFORM)
    invocations = workgroups * WORKGROUP
    out = dev.create_buffer(size=invocations * 16, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
    group = _group(dev, pipe, {0: u, 1: out})
    ms, timing, done = measure([(pipe, group, (workgroups, 1, 1))], out, runs)
    result = np.frombuffer(dev.queue.read_buffer(out, 0, 16 * min(invocations, 1024)), dtype=np.float32)
    if not np.all(np.isfinite(result)):
        raise RuntimeError("the FMA chains gave non-finite values")
    flops = 2.0 * invocations * iters * CHAINS * STEPS * 4
    return {"dtype": dtype, "tflops": flops / (ms * 1e-3) / 1e12, "ms": ms, "timing": timing, "runs": done,
            "flops": flops, "workgroups": workgroups, "iters": iters}


def main():
    import argparse
    import os
    import sys
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    import attngen
    from attngen.reference import relative_error
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="tiny shapes (a software adapter such as lavapipe)")
    args = ap.parse_args()
    print(device_state().description())
    shapes = [(2, 64, 4, 64), (1, 256, 4, 128)] if args.small else [(16, 1024, 16, 64), (4, 4096, 16, 128)]
    for shape in shapes:
        for causal in (False, True):
            rng = np.random.default_rng(0)
            host = [rng.standard_normal(shape, dtype=np.float32) for _ in range(3)]
            dev = [WgslTensor.from_numpy(a) for a in host]
            peer = ThreePass(*dev, causal=causal)
            peer.run()
            spec = attngen.parse(f"attention p {{\n head_dim {shape[3]}\n dtype f32\n"
                                 f" mask {'causal' if causal else 'none'}\n}}\n")[0]
            one = [a[:1, :, :1] for a in host]
            err = relative_error(peer.output()[:1, :, :1], attngen.reference(spec, *one))
            ms, timing, runs = peer.time()
            print(f"three-pass B{shape[0]} L{shape[1]} H{shape[2]} d{shape[3]} {'causal' if causal else 'full'}: "
                  f"{ms:.3g} ms, {peer.flops / (ms * 1e-3) / 1e12:.3g} TFLOP/s ({timing}, {runs} runs, "
                  f"{peer.chunks} group(s)), err {err:.1e}")
    kw = dict(workgroups=8, iters=256) if args.small else {}
    for dtype in ("f32", "f16"):
        r = fma_ceiling(dtype, **kw)
        print(f"FMA ceiling {dtype}: " + (f"{r['tflops']:.3g} TFLOP/s ({r['timing']})" if r["tflops"] else r["why"]))


if __name__ == "__main__":
    main()
