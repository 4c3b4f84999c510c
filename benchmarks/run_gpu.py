"""Check and time attngen against PyTorch's attention backends on one GPU, in one process.

    python3 benchmarks/run_gpu.py [--out DIR] [--quick] [--only SECTIONS]   (benchmarks/README.md)

Sections: dense (the cases below), wgsl, and issue 3's masks, decode and head_dims
(benchmarks/variants.py); --only takes a comma-separated subset.

For every case: build the attngen CUDA kernel, check its output against SDPA's flash backend
on the same random inputs (relative L2, fp16 vs fp16), then time attngen, SDPA flash
(FlashAttention-2), SDPA cuDNN, SDPA memory-efficient and FlexAttention (torch.compile) with CUDA events (median after
warm-up, triton.testing.do_bench). Cases follow benchmarks/ANCHORS.md: batch * seqlen = 16384,
heads * head_dim = 2048, fp16 unless said; TFLOP/s counts 4 * B * H * Lq * Lk * D, halved
for causal. A WGSL section times the same kernels through wgpu on the GPU's Vulkan driver.
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
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import attngen  # noqa: E402
import decode_grid  # noqa: E402  (benchmarks/decode_grid.py)
import host  # noqa: E402  (benchmarks/host.py)
import variants  # noqa: E402  (benchmarks/variants.py)

# The dense suite (issue 11): f16 and bf16, head dims 64 / 128 / 256, L 1k / 4k / 16k, full and causal.
CASES = [(f"{dtype} d{d} L{L} {'causal' if mask == 'causal' else 'full'}", dtype, d, L, mask)
         for dtype in ("f16", "bf16") for d in (64, 128, 256) for L in (1024, 4096, 16384)
         for mask in ("none", "causal")]
QUICK = {"f16 d128 L4096 full", "f16 d128 L4096 causal", "f16 d64 L4096 full"}
BACKENDS = [
    ("SDPA flash", SDPBackend.FLASH_ATTENTION),
    ("SDPA cuDNN", SDPBackend.CUDNN_ATTENTION),
    ("SDPA mem-eff", SDPBackend.EFFICIENT_ATTENTION),
]
TORCH_DTYPE = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}


def spec_for(dtype, d, mask):
    return attngen.parse(f"attention bench_d{d}_{mask}_{dtype} {{\n head_dim {d}\n dtype {dtype}\n"
                         f" mask {mask}\n}}\n")[0]


def bench_ms(fn) -> float:
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def rel_err(a, b) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm())


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


def wgsl_section(results):
    """attngen's WGSL kernels through wgpu on the same GPU (GPU time of the dispatch)."""
    from attngen.backends import wgsl
    info = dict(wgsl.device().adapter.info)
    rows = []
    for label, d, seqlen, batch, heads, mask in [
        ("wgsl d64 L1024 full", 64, 1024, 4, 16, "none"),
        ("wgsl d128 L1024 full", 128, 1024, 4, 16, "none"),
        ("wgsl d128 L4096 causal", 128, 4096, 1, 16, "causal"),
    ]:
        spec = spec_for("f16", d, mask)
        kernel = attngen.compile(spec, target="wgsl")
        rng = np.random.default_rng(0)
        host = [rng.standard_normal((batch, seqlen, heads, d)).astype(np.float16) for _ in range(3)]
        dev = [wgsl.WgslTensor.from_numpy(a) for a in host]
        out = kernel(*dev)
        check = attngen.reference(spec, *(a[:, :, :1] for a in host))  # one head, full length
        err = float(np.linalg.norm(out.numpy()[:, :, :1].astype(np.float64) - check) / np.linalg.norm(check))
        from attngen.backends.wgsl.launch import gpu_timer
        with gpu_timer(kernel) as gpu_times:  # timestamp queries where the adapter has them
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                kernel(*dev, out=out)
                wgsl.device().queue.read_buffer(out.buffer, 0, 4)  # waits for the dispatch
                times.append((time.perf_counter() - t0) * 1e3)
        timing = "GPU (timestamp queries)" if gpu_times else "wall"
        ms = statistics.median(gpu_times or times)
        flops = 4.0 * batch * heads * seqlen * seqlen * d * (0.5 if mask == "causal" else 1.0)
        rows.append({"case": label, "plan": kernel.plan.summary(), "ms": ms, "timing": timing,
                     "tflops": flops / (ms * 1e-3) / 1e12, "rel_err_vs_reference": err})
        print(f"{label:24s} {ms:8.2f} ms {rows[-1]['tflops']:6.2f} TFLOP/s err {err:.1e}", flush=True)
    results.append({"wgsl_adapter": info.get("device"), "wgsl": rows})


def markdown(meta, rows, wgsl_rows) -> str:
    lines = [
        f"## {meta['date']} — {meta['gpu']} — commit {meta['commit']}",
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
        how = wgsl_rows[0].get("timing", "wall")
        lines += ["", f"WGSL through wgpu on the same GPU ({meta.get('wgsl_adapter')}), f16, {how} time "
                  "of the dispatches, median of 5, inputs resident on the GPU:", "",
                  "| case | ms | TFLOP/s | rel. err (one head vs float64) | plan |", "|---|---|---|---|---|"]
        for r in wgsl_rows:
            lines.append(f"| {r['case']} | {r['ms']:.2f} | {r['tflops']:.2f} | {r['rel_err_vs_reference']:.1e} "
                         f"| {r['plan']} |")
    return "\n".join(lines) + "\n"


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


def latest(meta, rows, wgsl_rows, var_rows, model_rows, host_rows=(), grid_rows=()) -> dict:
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
        out.append({"suite": "wgsl", "case": r["case"], "target": "wgsl", "plan": r["plan"],
                    "rel_err": r["rel_err_vs_reference"], "attngen": {"ms": r["ms"], "tflops": r["tflops"]},
                    "peers": {}})
    for r in model_rows:
        peers = {PEERS[n]: {"ms": r[f"{n}_ms"], "tflops": r[f"{n}_tflops"]} for n in PEERS if r.get(f"{n}_ms")}
        out.append({"suite": "models", "case": r["case"], "target": "cuda", "plan": r["plan"],
                    "rel_err": r.get("rel_err"), "attngen": {"ms": r["attngen_ms"], "tflops": r["attngen_tflops"]},
                    "peers": peers})
    out += variants.latest_rows(var_rows)
    out += host.latest_rows(list(host_rows))
    out += [{k: v for k, v in r.items() if k not in ("batch", "len_k", "layout")} for r in grid_rows]
    return {"gpu": meta["gpu"], "commit": meta["commit"], "date": meta["date"], "torch": meta["torch"],
            "rows": out}


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
    ap.add_argument("--only", default="",
                    help="comma-separated: dense,models,wgsl,masks,decode,head_dims,host,decode_grid")
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
    meta = {"date": datetime.date.today().isoformat(), "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__, "cuda": torch.version.cuda, "commit": commit}
    cases = [c for c in CASES if not args.quick or c[0] in QUICK]
    rows, extra, var_rows = [], [], []
    if not only or "dense" in only:
        cuda_section(cases, rows)
    model_rows, host_rows, grid_rows = [], [], []
    for name, fn, out in (("models", models_section, model_rows), ("host", host.host_section, host_rows),
                          ("decode_grid", decode_grid.run, grid_rows)):
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
            wgsl_section(extra)
        except Exception as e:  # report, keep the CUDA table
            print(f"WGSL section failed: {type(e).__name__}: {e}")
    wgsl_rows = extra[0]["wgsl"] if extra else []
    if extra:
        meta["wgsl_adapter"] = extra[0]["wgsl_adapter"]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"meta": meta, "cuda": rows, "wgsl": wgsl_rows, "variants": var_rows, "models": model_rows}, f,
                  indent=2)
    with open(os.path.join(args.out, "latest.json"), "w") as f:
        json.dump(latest(meta, rows, wgsl_rows, var_rows, model_rows, host_rows, grid_rows), f, indent=1)
    if rows and not plot(rows, os.path.join(args.out, "dense.png")):
        print("no matplotlib here: no plot")
    md = (markdown(meta, rows, wgsl_rows) + models_markdown(model_rows)
          + (host.markdown(host_rows, meta) if host_rows else "")
          + (decode_grid.markdown(grid_rows, meta) if grid_rows else "")
          + (variants.markdown(var_rows) if var_rows else ""))
    if grid_rows:
        decode_grid.plot(grid_rows, os.path.join(args.out, "decode.png"))
    with open(os.path.join(args.out, "RESULTS.md"), "w") as f:
        f.write(md)
    print()
    print(md)


if __name__ == "__main__":
    main()
