"""Check and time attngen against PyTorch's attention backends on one GPU, in one process.

    python3 benchmarks/run_gpu.py [--out DIR] [--quick] [--only SECTIONS] [--small]   (benchmarks/README.md)

Sections: dense (the cases below), wgsl, models, host, decode_grid, decode_quant (quantized KV caches:
benchmarks/suite/decode_quant.py), varlen (packed prefill:
benchmarks/suite/varlen.py), hf (transformers models: benchmarks/suite/hf.py), backward and training
(benchmarks/suite/backward.py), expressions (score and mask expressions: benchmarks/suite/expressions.py),
fp8 (FP8 prefill beside attngen's f16 kernel and cuDNN's FP8 SDPA: benchmarks/suite/fp8_prefill.py),
and issue 3's masks, decode and head_dims (benchmarks/suite/variants.py); --only takes a comma-separated
subset.

For every case: build the attngen CUDA kernel, check its output against SDPA's flash backend
on the same random inputs (relative L2, fp16 vs fp16), then time attngen, SDPA flash
(FlashAttention-2), SDPA cuDNN, SDPA memory-efficient and FlexAttention (torch.compile) with CUDA events (median after
warm-up, triton.testing.do_bench). Cases follow benchmarks/ANCHORS.md: batch * seqlen = 16384,
heads * head_dim = 2048, fp16 unless said; TFLOP/s counts 4 * B * H * Lq * Lk * D, halved
for causal. A WGSL section (issue 13) times attngen's WGSL kernels through wgpu on the GPU's Vulkan
driver beside a three-pass WGSL attention and the adapter's FMA ceiling (benchmarks/suite/wgsl_peers.py);
`--only wgsl --small` runs it at small shapes on a software adapter (lavapipe), without PyTorch.
Writes results.json, latest.json (the committed benchmarks/results/latest.json form), dense.png
(matplotlib, where installed) and RESULTS.md (date, GPU, commit) into --out; prints the table last.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The suite's modules (benchmarks/suite/); appended: their names (host, variants) shadow nothing.
SUITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "suite")
if SUITE not in sys.path:
    sys.path.append(SUITE)
import attngen  # noqa: E402

try:  # the CUDA sections' stack; without it only `--only wgsl` runs (a machine with lavapipe only)
    import triton.testing  # noqa: F401  (first: where Triton is missing, torch is not loaded for nothing)
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import decode_grid  # noqa: E402  (benchmarks/suite/decode_grid.py)
    import decode_quant  # noqa: E402  (benchmarks/suite/decode_quant.py: quantized KV caches, issue 44)
    import hf  # noqa: E402  (benchmarks/suite/hf.py: transformers models)
    import backward  # noqa: E402  (benchmarks/suite/backward.py: the backward pass, training)
    import expressions  # noqa: E402  (benchmarks/suite/expressions.py: score and mask expressions)
    import fp8_prefill  # noqa: E402  (benchmarks/suite/fp8_prefill.py: FP8 prefill, suite fp8)
    import host  # noqa: E402  (benchmarks/suite/host.py)
    import varlen  # noqa: E402  (benchmarks/suite/varlen.py)
    import variants  # noqa: E402  (benchmarks/suite/variants.py)
    from variants import bench_ms, rel_err  # the suite's one timer and error (CUDA sections only)
    MISSING_STACK = None
except ImportError as e:
    torch = None
    MISSING_STACK = f"{type(e).__name__}: {e}"

# The dense suite (issue 11): f16 and bf16, head dims 64 / 128 / 256, L 1k / 4k / 16k, full and causal.
CASES = [(f"{dtype} d{d} L{L} {'causal' if mask == 'causal' else 'full'}", dtype, d, L, mask)
         for dtype in ("f16", "bf16") for d in (64, 128, 256) for L in (1024, 4096, 16384)
         for mask in ("none", "causal")]
QUICK = {"f16 d128 L4096 full", "f16 d128 L4096 causal", "f16 d64 L4096 full"}
BACKENDS = [
    ("SDPA flash", SDPBackend.FLASH_ATTENTION),
    ("SDPA cuDNN", SDPBackend.CUDNN_ATTENTION),
    ("SDPA mem-eff", SDPBackend.EFFICIENT_ATTENTION),
] if torch is not None else []
TORCH_DTYPE = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32} if torch is not None else {}


def spec_for(dtype, d, mask):
    return attngen.parse(f"attention bench_d{d}_{mask}_{dtype} {{\n head_dim {d}\n dtype {dtype}\n"
                         f" mask {mask}\n}}\n")[0]


def _flex():
    """FlexAttention compiled (Triton), or None where this torch has none. Every (dtype, head dim,
    mask, length) is a recompilation: past dynamo's default limit (8) flex_attention falls back
    to its unfused eager path (seen at 601c14b: 7-25 TFLOP/s), so the limit is raised."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return None, None
    import torch._dynamo
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 512)
    return torch.compile(flex_attention), create_block_mask


def cuda_section(cases, results):
    flex, create_block_mask = _flex()
    for label, dtype, d, seqlen, mask in cases:
        batch, heads = 16384 // seqlen, 2048 // d
        spec = spec_for(dtype, d, mask)
        kernel = attngen.compile(spec, target="cuda")
        g = torch.Generator(device="cuda").manual_seed(0)
        shape = (batch, seqlen, heads, d)
        q, k, v = (torch.randn(shape, device="cuda", dtype=TORCH_DTYPE[dtype], generator=g) for _ in range(3))
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # SDPA's (B, H, L, D) views
        causal = mask == "causal"
        flops = 4.0 * batch * heads * seqlen * seqlen * d * (0.5 if causal else 1.0)
        row = {"case": label, "B": batch, "H": heads, "L": seqlen, "D": d, "dtype": dtype, "mask": mask,
               "plan": kernel.plan.summary()}
        out = kernel(q, k, v)
        torch.cuda.synchronize()
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)
        row["rel_err_vs_flash"] = rel_err(out, ref)
        row["attngen_ms"] = bench_ms(lambda: kernel(q, k, v))
        for name, backend in BACKENDS:
            try:
                with sdpa_kernel([backend]):
                    row[f"{name}_ms"] = bench_ms(
                        lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal))
            except RuntimeError as e:
                row[f"{name}_ms"] = None
                row[f"{name}_error"] = str(e).splitlines()[0][:120]
        if flex is not None:
            try:
                bm = None
                if causal:
                    bm = create_block_mask(lambda b, h, qi, kj: qi >= kj, None, None, seqlen, seqlen, device="cuda")
                fo = flex(qt, kt, vt, block_mask=bm)
                row["flex_rel_err_vs_flash"] = rel_err(fo.transpose(1, 2), ref)
                row["flex_ms"] = bench_ms(lambda: flex(qt, kt, vt, block_mask=bm))
            except Exception as e:  # a peer that cannot run the case is absent, not zero
                row["flex_ms"] = None
                row["flex_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"
        for key in [k for k in row if k.endswith("_ms")]:
            ms = row[key]
            row[key.replace("_ms", "_tflops")] = None if ms is None else flops / (ms * 1e-3) / 1e12
        results.append(row)
        print(f"{label:22s} attngen {row['attngen_tflops']:6.1f} TFLOP/s  "
              f"flash {row['SDPA flash_tflops'] or 0:6.1f}  cuDNN {row['SDPA cuDNN_tflops'] or 0:6.1f}  "
              f"flex {row.get('flex_tflops') or 0:6.1f}  err {row['rel_err_vs_flash']:.1e}", flush=True)


# The WGSL suite (issue 13): head dims 64 / 128 x L 1k / 4k x full and causal x f16 and f32 storage,
# B L = 16384 tokens, 16 heads, beside the three-pass baseline of benchmarks/suite/wgsl_peers.py; --small:
# the same grid at sizes a software adapter (lavapipe) runs in seconds.
WGSL_GRID = {"dims": (64, 128), "lengths": (1024, 4096), "masks": ("none", "causal"), "dtypes": ("f16", "f32"),
             "tokens": 16384, "heads": 16}
WGSL_SMALL = {**WGSL_GRID, "lengths": (64, 256), "tokens": 256, "heads": 4}
WGSL_FMA = {"workgroups": 4096, "iters": 2048}  # 0.55 TFLOP of FMAs: ~12 ms at the H100's 45 TFLOP/s
WGSL_FMA_SMALL = {"workgroups": 8, "iters": 256}


def wgsl_case(dtype, d, seqlen, mask) -> str:
    return f"wgsl {dtype} d{d} L{seqlen} {'causal' if mask == 'causal' else 'full'}"


def _time_wgsl_kernel(kernel, dev, out, runs, budget_s):
    """attngen's kernel: (median ms, timing, runs) of calls into `out`, the GPU time of each call's
    dispatches (launch.gpu_timer) where the adapter has timestamp queries, else wall time to
    completion; up to `runs`, at least 2, fewer once `budget_s` seconds are spent."""
    from attngen.backends import wgsl
    from attngen.backends.base import warm_up
    from attngen.backends.wgsl.launch import gpu_timer, timed_repeats
    import wgsl_peers
    # The GPU idles while the host computes the float64 reference of a new case (seconds, for the
    # first dtype of each case only) and its clocks drop: without this warm-up, those rows were
    # timed 2-3x slow in some runs (benchmarks/NOTES.md, 2026-11-24): attngen's warm_up, as tune's
    def waited():
        kernel(*dev, out=out)
        wgsl.device().queue.read_buffer(out.buffer, 0, 4)  # waits for the dispatches
    warm_up(waited)
    # one timed submission: the call's dispatches repeated back to back for ~25 ms, so that short
    # rows are timed with the GPU busy throughout (launch.gpu_timer)
    repeat = timed_repeats(kernel, lambda: kernel(*dev, out=out))
    times = []
    with gpu_timer(kernel, repeat=repeat) as gpu_times:
        start = time.perf_counter()
        for i in range(runs):
            if gpu_times is not None:
                gpu_times.clear()
            t0 = time.perf_counter()
            kernel(*dev, out=out)
            if gpu_times is None:
                wgsl.device().queue.read_buffer(out.buffer, 0, 4)  # waits for the dispatches
            times.append(sum(gpu_times) if gpu_times is not None else (time.perf_counter() - t0) * 1e3)
            if i >= 1 and time.perf_counter() - start > budget_s:
                break
    timing = (wgsl_peers.GPU_TIMING + (f", {repeat} back to back per submission" if repeat > 1 else "")
              if gpu_times is not None else "wall (call to completion)")
    return statistics.median(times), timing, len(times)


def wgsl_row(dtype, d, mask, dev, host_qkv, refs, runs=5, budget_s=2.0) -> dict:
    """One row: attngen's kernel and the three-pass peer on the same resident inputs `dev`
    (WgslTensors (B, L, H, D)), both checked against the float64 reference on the first and the
    last (batch, head) pair (`host_qkv`: the same values as numpy; `refs` caches the references by
    (d, L, mask): f16 values are exact in f32, so both storage dtypes share them), then timed."""
    import wgsl_peers
    from attngen.backends import wgsl
    from attngen.reference import TOLERANCE, relative_error
    batch, seqlen, heads, _ = dev[0].shape
    causal = mask == "causal"
    spec = spec_for(dtype, d, mask)
    flops = wgsl_peers.attention_flops(batch, heads, seqlen, d, causal)
    pairs = sorted({(0, 0), (batch - 1, heads - 1)})
    key = (d, seqlen, mask)
    if key not in refs:
        refs[key] = [attngen.reference(spec, *(a[b:b + 1, :, h:h + 1] for a in host_qkv)) for b, h in pairs]

    def err(out):
        return max(relative_error(out[b:b + 1, :, h:h + 1], r) for (b, h), r in zip(pairs, refs[key]))

    row = {"case": wgsl_case(dtype, d, seqlen, mask), "dtype": dtype, "D": d, "L": seqlen, "B": batch, "H": heads,
           "mask": mask, "checked_pairs": pairs}
    kernel = attngen.compile(spec, target="wgsl")
    row["plan"] = kernel.plan.summary()
    # an out buffer with COPY_DST: on llvmpipe the checked result is copied into it (launch.py)
    out = wgsl.WgslTensor.from_numpy(np.zeros(dev[0].shape, np.float16 if dtype == "f16" else np.float32))
    kernel(*dev, out=out)  # warm-up (pipelines) and the checked output
    row["rel_err_vs_reference"] = err(out.numpy())
    row["ms"], row["timing"], row["runs"] = _time_wgsl_kernel(kernel, dev, out, runs, budget_s)
    row["tflops"] = flops / (row["ms"] * 1e-3) / 1e12
    del out
    try:
        peer = wgsl_peers.ThreePass(*dev, causal=causal, scale=spec.resolved_scale)
        try:
            peer.run()
            row["three_pass_rel_err"] = e = err(peer.output())
            if not e <= TOLERANCE["f32"]:  # f32 compute on the same values: f32's bound
                raise RuntimeError(f"the three-pass peer is off the reference: relative error {e:.2e}")
            ms, row["three_pass_timing"], row["three_pass_runs"] = peer.time(runs, budget_s, warmup=False)
            row["three_pass_groups"] = peer.chunks
        finally:
            peer.release()
        row["three_pass_ms"], row["three_pass_tflops"] = ms, flops / (ms * 1e-3) / 1e12
        row["vs_three_pass"] = row["tflops"] / row["three_pass_tflops"]
    except Exception as e:  # a peer that cannot run the case is absent, not zero
        row["three_pass_ms"] = row["three_pass_tflops"] = None
        row["three_pass_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
    return row


def wgsl_section(results, grid=None, fma=None, runs=5, budget_s=2.0):
    """attngen's WGSL kernels through wgpu on the same GPU beside a straightforward three-pass
    WGSL attention (benchmarks/suite/wgsl_peers.py), on the same resident inputs, and the adapter's FMA
    ceiling, measured once. Appends {"wgsl_adapter", "wgsl_meta", "wgsl": rows} to `results`."""
    import wgsl_peers
    from attngen.backends import wgsl
    grid = {**WGSL_GRID, **(grid or {})}
    st = wgsl.device_state()
    ceiling = {dt: wgsl_peers.fma_ceiling(dt, **(fma or WGSL_FMA)) for dt in ("f32", "f16")}
    meta = {"adapter": st.info.get("device"), "runtime": st.description(),
            "fma_ceiling_tflops": ceiling["f32"]["tflops"], "fma_ceiling_f16_tflops": ceiling["f16"]["tflops"],
            "fma_ceiling_timing": ceiling["f32"]["timing"], "tokens": grid["tokens"], "heads": grid["heads"]}
    print(f"WGSL on {meta['runtime']}: FMA ceiling {ceiling['f32']['tflops']:.3g} TFLOP/s f32, "
          f"{ceiling['f16']['tflops'] or 0:.3g} f16", flush=True)
    tokens, heads = grid["tokens"], grid["heads"]
    rows, refs = [], {}
    for d in grid["dims"]:
        rng = np.random.default_rng(d)
        # f16 values, exact in f32: both storage dtypes see the same inputs (and references)
        host16 = [rng.standard_normal((tokens, heads, d), dtype=np.float32).astype(np.float16) for _ in range(3)]
        for dtype in grid["dtypes"]:
            flat = [wgsl.WgslTensor.from_numpy(a if dtype == "f16" else a.astype(np.float32)) for a in host16]
            for seqlen in grid["lengths"]:
                if tokens % seqlen:
                    raise ValueError(f"{tokens} tokens are not a whole number of sequences of {seqlen}")
                shape = (tokens // seqlen, seqlen, heads, d)
                dev = [wgsl.WgslTensor(t.buffer, shape, dtype) for t in flat]  # the same buffers, batched
                host_qkv = [a.reshape(shape) for a in host16]
                for mask in grid["masks"]:
                    try:
                        row = wgsl_row(dtype, d, mask, dev, host_qkv, refs, runs, budget_s)
                    except Exception as e:  # report, keep the other rows
                        row = {"case": wgsl_case(dtype, d, seqlen, mask), "ms": None, "tflops": None,
                               "error": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"}
                        print(f"{row['case']:26s} failed: {row['error']}", flush=True)
                    else:
                        print(f"{row['case']:26s} attngen {row['tflops']:8.3g} TFLOP/s {row['ms']:8.3g} ms  "
                              f"three-pass {row['three_pass_tflops'] or 0:8.3g} TFLOP/s  "
                              f"x{row.get('vs_three_pass') or 0:.2f}  err {row['rel_err_vs_reference']:.1e} / "
                              f"{row.get('three_pass_rel_err', float('nan')):.1e}", flush=True)
                    rows.append(row)
            for t in flat:
                t.buffer.destroy()
    results.append({"wgsl_adapter": meta["adapter"], "wgsl_meta": meta, "wgsl": rows})


def markdown(meta, rows, wgsl_rows) -> str:
    lines = [f"## {meta['date']} — {meta['gpu']} — commit {meta['commit']}"]
    if rows:
        lines += [
            "",
            f"PyTorch {meta['torch']}, CUDA {meta['cuda']}; medians of CUDA events (triton do_bench, "
            "25 ms warm-up, 100 ms of runs); TFLOP/s = 4 B H L^2 D (halved for causal); B L = 16384, "
            "H D = 2048. attngen is checked against SDPA flash on the same inputs (rel. error).",
            "",
            "| case | attngen | SDPA flash (FA2) | SDPA cuDNN | SDPA mem-eff | FlexAttention | attngen / flash | "
            "attngen / cuDNN | rel. err | attngen plan |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
    for r in rows:
        def f(key):
            v = r.get(key)
            return "n/a" if v is None else f"{v:.0f}"
        def ratio(peer):
            v = r.get(f"{peer}_tflops")
            return f"{r['attngen_tflops'] / v:.2f}x" if v else "n/a"
        lines.append(f"| {r['case']} | {f('attngen_tflops')} | {f('SDPA flash_tflops')} | "
                     f"{f('SDPA cuDNN_tflops')} | {f('SDPA mem-eff_tflops')} | {f('flex_tflops')} | "
                     f"{ratio('SDPA flash')} | {ratio('SDPA cuDNN')} | {r['rel_err_vs_flash']:.1e} | {r['plan']} |")
    if wgsl_rows:
        lines += [""] + wgsl_markdown(meta.get("wgsl") or {"adapter": meta.get("wgsl_adapter")}, wgsl_rows)
    return "\n".join(lines) + "\n"


def wgsl_markdown(wmeta, wgsl_rows) -> list:
    """The WGSL table's lines: attngen beside the three-pass peer, the FMA ceiling above it."""
    def g(v, unit=""):
        return "n/a" if v is None else f"{v:.3g}{unit}"
    ceiling = wmeta.get("fma_ceiling_tflops")
    lines = [f"WGSL through wgpu on the same GPU ({wmeta.get('adapter')}): attngen beside a straightforward "
             "three-pass WGSL attention (benchmarks/suite/wgsl_peers.py: scores, softmax and P V through memory, f32 "
             f"compute) on the same inputs, resident on the GPU; B L = {wmeta.get('tokens', '?')}, "
             f"H {wmeta.get('heads', '?')}; TFLOP/s = 4 B H L^2 D (halved for causal); median of up to 5 runs "
             "(timing column); rel. err: the first and last (batch, head) vs float64. FMA ceiling (independent "
             f"WGSL FMA chains on this adapter): {g(ceiling)} TFLOP/s f32, "
             f"{g(wmeta.get('fma_ceiling_f16_tflops'))} f16.", "",
             "| case | attngen TFLOP/s | attngen ms | three-pass TFLOP/s | three-pass ms | attngen / three-pass | "
             "attngen / FMA ceiling | rel. err | three-pass rel. err | timing | plan |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in wgsl_rows:
        if r.get("tflops") is None:
            lines.append(f"| {r['case']} | failed: {r.get('error', '?')} | | | | | | | | | |")
            continue
        peer = g(r.get("three_pass_tflops")) if r.get("three_pass_tflops") else f"n/a ({r.get('three_pass_error')})"
        of_ceiling = f"{r['tflops'] / ceiling:.0%}" if ceiling else "n/a"
        p_err = r.get("three_pass_rel_err")
        lines.append(f"| {r['case']} | {g(r['tflops'])} | {g(r['ms'])} | {peer} | {g(r.get('three_pass_ms'))} | "
                     f"{g(r.get('vs_three_pass'), 'x')} | {of_ceiling} | {r['rel_err_vs_reference']:.1e} | "
                     f"{'n/a' if p_err is None else f'{p_err:.1e}'} | {r['timing']} | {r['plan']} |")
    return lines


MODELS = [("llama3_8b.attn", "llama3_8b_prefill"), ("qwen2_7b.attn", "qwen2_7b_prefill"),
          ("gemma2_9b.attn", "gemma2_9b_local"), ("deepseek_v2_lite.attn", "deepseek_v2_lite_mla_prefill"),
          ("phi35_mini.attn", "phi35_mini")]


def models_section(results, seqlen=4096):
    """The example specs of real models at L 4096 (B 1), against SDPA where it runs them (GQA by
    enable_gqa; softcap has no SDPA peer)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for path, name in MODELS:
        spec = attngen.load(os.path.join(root, "examples", path), name)
        kernel = attngen.compile(spec, target="cuda")
        dt = TORCH_DTYPE[spec.dtype]
        g = torch.Generator(device="cuda").manual_seed(3)
        hq, hkv = spec.heads_q or 16, spec.heads_kv or 16
        q = torch.randn((1, seqlen, hq, spec.head_dim_qk), device="cuda", dtype=dt, generator=g)
        k = torch.randn((1, seqlen, hkv, spec.head_dim_qk), device="cuda", dtype=dt, generator=g)
        v = torch.randn((1, seqlen, hkv, spec.head_dim_v), device="cuda", dtype=dt, generator=g)
        causal = spec.mask.kind == "causal" or (spec.mask.kind == "window" and (spec.mask.left or 0) >= seqlen
                                                 and not spec.mask.right)
        flops = 2.0 * hq * seqlen * seqlen * (spec.head_dim_qk + spec.head_dim_v) * (0.5 if causal else 1.0)
        row = {"case": f"{name} L{seqlen}", "plan": kernel.plan.summary(), "dtype": spec.dtype}
        out = kernel(q, k, v)
        row["attngen_ms"] = bench_ms(lambda: kernel(q, k, v))
        row["attngen_tflops"] = flops / (row["attngen_ms"] * 1e-3) / 1e12
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        comparable = spec.softcap is None and spec.mask.kind in ("none", "causal", "window") and (
            spec.mask.kind != "window" or causal)
        for pname, backend in BACKENDS:
            if not comparable:
                break
            try:
                with sdpa_kernel([backend]):
                    ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=hq != hkv,
                                                         scale=spec.scale)
                    row[f"{pname}_ms"] = bench_ms(lambda: F.scaled_dot_product_attention(
                        qt, kt, vt, is_causal=causal, enable_gqa=hq != hkv, scale=spec.scale))
                row[f"{pname}_tflops"] = flops / (row[f"{pname}_ms"] * 1e-3) / 1e12
                row.setdefault("rel_err", rel_err(out, ref.transpose(1, 2)))
            except RuntimeError:
                pass  # a peer that cannot run the case is absent
        results.append(row)
        print(f"{row['case']:40s} attngen {row['attngen_tflops']:6.1f}  cuDNN {row.get('SDPA cuDNN_tflops') or 0:6.1f}"
              f"  err {row.get('rel_err', float('nan')):.1e}", flush=True)


PEERS = {"SDPA flash": "sdpa_flash", "SDPA cuDNN": "sdpa_cudnn", "SDPA mem-eff": "sdpa_mem_efficient",
         "flex": "flex"}


def latest(meta, rows, wgsl_rows, var_rows, model_rows, host_rows=(), grid_rows=(), varlen_rows=(),
           hf_rows=(), bw_rows=(), expr_rows=(), fp8_rows=(), quant_rows=()) -> dict:
    """benchmarks/results/latest.json: one row per case, attngen and the peers that ran it (issue
    11's form; a peer that cannot run a case is absent)."""
    out = []
    for r in rows:
        peers = {}
        for name, key in PEERS.items():
            if r.get(f"{name}_ms") is not None:
                peers[key] = {"ms": r[f"{name}_ms"], "tflops": r[f"{name}_tflops"]}
        out.append({"suite": "dense", "case": r["case"], "target": "cuda", "plan": r["plan"],
                    "rel_err": r["rel_err_vs_flash"],
                    "attngen": {"ms": r["attngen_ms"], "tflops": r["attngen_tflops"]}, "peers": peers})
    for r in wgsl_rows:
        if r.get("tflops") is None:
            continue  # attngen failed the case (the table says why)
        peers = {}
        if r.get("three_pass_ms") is not None:
            peers["three_pass"] = {"ms": r["three_pass_ms"], "tflops": r["three_pass_tflops"],
                                   "rel_err": r["three_pass_rel_err"], "timing": r["three_pass_timing"]}
        out.append({"suite": "wgsl", "case": r["case"], "target": "wgsl", "plan": r["plan"],
                    "rel_err": r["rel_err_vs_reference"], "attngen": {"ms": r["ms"], "tflops": r["tflops"]},
                    "peers": peers, "timing": r["timing"]})
    for r in model_rows:
        peers = {PEERS[n]: {"ms": r[f"{n}_ms"], "tflops": r[f"{n}_tflops"]} for n in PEERS if r.get(f"{n}_ms")}
        out.append({"suite": "models", "case": r["case"], "target": "cuda", "plan": r["plan"],
                    "rel_err": r.get("rel_err"), "attngen": {"ms": r["attngen_ms"], "tflops": r["attngen_tflops"]},
                    "peers": peers})
    if var_rows:
        out += variants.latest_rows(var_rows)
    if host_rows:
        out += host.latest_rows(list(host_rows))
    out += [{k: v for k, v in r.items() if k not in ("batch", "len_k", "layout")} for r in grid_rows]
    if quant_rows:
        out += decode_quant.latest_rows(list(quant_rows))
    if varlen_rows:
        out += varlen.latest_rows(list(varlen_rows))
    if hf_rows:
        out += hf.latest_rows(list(hf_rows))
    out += list(bw_rows)
    out += list(expr_rows)
    out += fp8_prefill.latest_rows(list(fp8_rows)) if fp8_rows else []
    result = {"gpu": meta["gpu"], "commit": meta["commit"], "date": meta["date"], "torch": meta["torch"]}
    if meta.get("wgsl"):  # the WGSL section's adapter and FMA ceiling (fma_ceiling_tflops), once per run
        result["wgsl"] = meta["wgsl"]
    result["rows"] = out
    return result


def plot(rows, path) -> bool:
    """TFLOP/s per dense case, attngen beside the peers (matplotlib PNG); False without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    names = [("attngen", "attngen")] + [(k, k) for k in PEERS]
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.55), 4.5))
    width = 0.8 / len(names)
    for i, (key, label) in enumerate(names):
        ys = [r.get(f"{key}_tflops") or 0 for r in rows]
        ax.bar([x + i * width for x in range(len(rows))], ys, width, label=label)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(rows))])
    ax.set_xticklabels([r["case"] for r in rows], rotation=70, ha="right", fontsize=7)
    ax.set_ylabel("TFLOP/s")
    ax.legend(fontsize=7, ncol=5)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def models_markdown(rows) -> str:
    if not rows:
        return ""
    lines = ["", "Models (the example specs, B 1, L 4096; TFLOP/s = 2 Hq L^2 (Dqk + Dv), halved for causal):", "",
             "| case | attngen | SDPA flash | SDPA cuDNN | SDPA mem-eff | attngen / cuDNN | rel. err | plan |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        def f(key):
            v = r.get(key)
            return "n/a" if v is None else f"{v:.0f}"
        cud = r.get("SDPA cuDNN_tflops")
        ratio = f"{r['attngen_tflops'] / cud:.2f}x" if cud else "n/a"
        err = r.get("rel_err")
        lines.append(f"| {r['case']} | {f('attngen_tflops')} | {f('SDPA flash_tflops')} | {f('SDPA cuDNN_tflops')} | "
                     f"{f('SDPA mem-eff_tflops')} | {ratio} | "
                     f"{'n/a' if err is None else f'{err:.1e}'} | {r['plan']} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true", help="three cases only")
    ap.add_argument("--no-wgsl", action="store_true")
    ap.add_argument("--small", action="store_true",
                    help="the WGSL section at small shapes (a software adapter such as lavapipe)")
    ap.add_argument("--only", default="",
                    help="comma-separated: dense,models,wgsl,masks,decode,head_dims,host,decode_grid,decode_quant,"
                         "varlen,hf,backward,training,wgsl_backward,expressions,fp8")
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # The GPU machine's copy of the repository may carry a stale .git: only ATTNGEN_COMMIT is trusted
    # there (benchmarks/gpu_session.sh passes it); elsewhere git is asked.
    commit = os.environ.get("ATTNGEN_COMMIT")
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                    cwd=root).stdout.strip() or "unknown"
        except OSError:
            commit = "unknown"
    if MISSING_STACK and (not only or only - {"wgsl"}):
        sys.exit(f"the CUDA sections need PyTorch and Triton ({MISSING_STACK}); here only --only wgsl runs")
    cuda = torch is not None and torch.cuda.is_available()
    meta = {"date": datetime.date.today().isoformat(), "gpu": torch.cuda.get_device_name() if cuda else None,
            "torch": getattr(torch, "__version__", None), "cuda": torch.version.cuda if torch else None,
            "commit": commit}
    cases = [c for c in CASES if not args.quick or c[0] in QUICK]
    rows, extra, var_rows = [], [], []
    if not only or "dense" in only:
        cuda_section(cases, rows)
    model_rows, host_rows, grid_rows, varlen_rows, hf_rows, bw_rows, expr_rows, fp8_rows = [], [], [], [], [], [], [], []
    quant_rows = []
    for name, fn, out in (("models", models_section, model_rows), ("host", lambda o: host.host_section(o), host_rows),
                          ("decode_grid", lambda o: decode_grid.run(o), grid_rows),
                          ("decode_quant", lambda o: decode_quant.run(o), quant_rows),
                          ("varlen", lambda o: varlen.section(o), varlen_rows),
                          ("hf", lambda o: hf.section(o), hf_rows),
                          ("backward", lambda o: backward.backward_section(o, quick=args.quick), bw_rows),
                          ("training", lambda o: backward.training_section(o), bw_rows),
                          ("wgsl_backward", lambda o: backward.wgsl_backward_section(o, quick=args.quick), bw_rows),
                          ("expressions", lambda o: expressions.section(o, quick=args.quick), expr_rows),
                          ("fp8", lambda o: fp8_prefill.section(o), fp8_rows)):
        if not only or name in only:
            try:
                fn(out)
            except Exception as e:  # report, keep the other tables
                print(f"{name} section failed: {type(e).__name__}: {e}")
    var_only = only & {"masks", "decode", "head_dims"}
    if not only or var_only:
        variants.run_all(var_rows, var_only or None)
    if not args.no_wgsl and (not only or "wgsl" in only):
        try:
            if args.small:
                wgsl_section(extra, WGSL_SMALL, WGSL_FMA_SMALL)
            else:
                wgsl_section(extra)
        except Exception as e:  # report, keep the CUDA table
            print(f"WGSL section failed: {type(e).__name__}: {e}")
    wgsl_rows = extra[0]["wgsl"] if extra else []
    if extra:
        meta["wgsl_adapter"] = extra[0]["wgsl_adapter"]
        meta["wgsl"] = extra[0]["wgsl_meta"]
    if meta["gpu"] is None:  # no CUDA here: the WGSL adapter names the machine
        meta["gpu"] = meta.get("wgsl_adapter") or "unknown"
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"meta": meta, "cuda": rows, "wgsl": wgsl_rows, "variants": var_rows, "models": model_rows}, f,
                  indent=2)
    with open(os.path.join(args.out, "latest.json"), "w") as f:
        json.dump(latest(meta, rows, wgsl_rows, var_rows, model_rows, host_rows, grid_rows, varlen_rows, hf_rows,
                         bw_rows, expr_rows, fp8_rows, quant_rows), f, indent=1)
    if rows and not plot(rows, os.path.join(args.out, "dense.png")):
        print("no matplotlib here: no plot")
    md = (markdown(meta, rows, wgsl_rows) + models_markdown(model_rows)
          + (host.markdown(host_rows, meta) if host_rows else "")
          + (decode_grid.markdown(grid_rows, meta) if grid_rows else "")
          + (decode_quant.markdown(quant_rows, meta) if quant_rows else "")
          + (varlen.markdown(varlen_rows) if varlen_rows else "")
          + (hf.markdown(hf_rows) if hf_rows else "")
          + (backward.markdown(bw_rows) if bw_rows else "")
          + (expressions.markdown(expr_rows) if expr_rows else "")
          + (fp8_prefill.markdown(fp8_rows) if fp8_rows else "")
          + (variants.markdown(var_rows) if var_rows else ""))
    if grid_rows:
        decode_grid.plot(grid_rows, os.path.join(args.out, "decode.png"))
    with open(os.path.join(args.out, "RESULTS.md"), "w") as f:
        f.write(md)
    print()
    print(md)


if __name__ == "__main__":
    main()
