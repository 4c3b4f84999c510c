"""Check and time attngen against PyTorch's attention backends on one GPU, in one process.

    python3 benchmarks/run_gpu.py [--out DIR] [--quick] [--only SECTIONS]   (benchmarks/README.md)

Sections: dense (the cases below), wgsl, and issue 3's masks, decode and head_dims
(benchmarks/variants.py); --only takes a comma-separated subset.

For every case: build the attngen CUDA kernel, check its output against SDPA's flash backend
on the same random inputs (relative L2, fp16 vs fp16), then time attngen, SDPA flash
(FlashAttention-2), SDPA cuDNN and SDPA memory-efficient with CUDA events (median after
warm-up, triton.testing.do_bench). Cases follow benchmarks/ANCHORS.md: batch * seqlen = 16384,
heads * head_dim = 2048, fp16 unless said; TFLOP/s counts 4 * B * H * Lq * Lk * D, halved
for causal. A WGSL section times the same kernels through wgpu on the GPU's Vulkan driver.
Writes results.json and RESULTS.md (date, GPU, commit) into --out; prints the table last.
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
import variants  # noqa: E402  (benchmarks/variants.py)

CASES = [
    # (label, dtype, head_dim, L, mask)
    ("d64 L4096 full", "f16", 64, 4096, "none"),
    ("d64 L4096 causal", "f16", 64, 4096, "causal"),
    ("d128 L1024 full", "f16", 128, 1024, "none"),
    ("d128 L4096 full", "f16", 128, 4096, "none"),
    ("d128 L4096 causal", "f16", 128, 4096, "causal"),
    ("d128 L16384 full", "f16", 128, 16384, "none"),
    ("d128 L16384 causal", "f16", 128, 16384, "causal"),
    ("d256 L4096 full", "f16", 256, 4096, "none"),
    ("d256 L16384 causal", "f16", 256, 16384, "causal"),
    ("bf16 d128 L4096 full", "bf16", 128, 4096, "none"),
]
QUICK = {"d128 L4096 full", "d128 L4096 causal", "d64 L4096 full"}
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


def cuda_section(cases, results):
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
        for key in [k for k in row if k.endswith("_ms")]:
            ms = row[key]
            row[key.replace("_ms", "_tflops")] = None if ms is None else flops / (ms * 1e-3) / 1e12
        results.append(row)
        print(f"{label:22s} attngen {row['attngen_tflops']:6.1f} TFLOP/s  "
              f"flash {row['SDPA flash_tflops'] or 0:6.1f}  cuDNN {row['SDPA cuDNN_tflops'] or 0:6.1f}  "
              f"err {row['rel_err_vs_flash']:.1e}", flush=True)


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
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            kernel(*dev, out=out)
            wgsl.device().queue.read_buffer(out.buffer, 0, 4)  # waits for the dispatch
            times.append((time.perf_counter() - t0) * 1e3)
        ms = statistics.median(times)
        flops = 4.0 * batch * heads * seqlen * seqlen * d * (0.5 if mask == "causal" else 1.0)
        rows.append({"case": label, "plan": kernel.plan.summary(), "ms": ms,
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
        "| case | attngen | SDPA flash (FA2) | SDPA cuDNN | SDPA mem-eff | attngen / flash | rel. err | attngen plan |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        def f(key):
            v = r.get(key)
            return "n/a" if v is None else f"{v:.0f}"
        ratio = (r["attngen_tflops"] / r["SDPA flash_tflops"]) if r.get("SDPA flash_tflops") else None
        lines.append(f"| {r['case']} | {f('attngen_tflops')} | {f('SDPA flash_tflops')} | "
                     f"{f('SDPA cuDNN_tflops')} | {f('SDPA mem-eff_tflops')} | "
                     f"{'n/a' if ratio is None else f'{ratio:.2f}x'} | {r['rel_err_vs_flash']:.1e} | {r['plan']} |")
    if wgsl_rows:
        lines += ["", f"WGSL through wgpu on the same GPU ({meta.get('wgsl_adapter')}), f16, wall time "
                  "of dispatch + completion, median of 5, inputs resident on the GPU:", "",
                  "| case | ms | TFLOP/s | rel. err (one head vs float64) | plan |", "|---|---|---|---|---|"]
        for r in wgsl_rows:
            lines.append(f"| {r['case']} | {r['ms']:.2f} | {r['tflops']:.2f} | {r['rel_err_vs_reference']:.1e} "
                         f"| {r['plan']} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true", help="three cases only")
    ap.add_argument("--no-wgsl", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated: dense,wgsl,masks,decode,head_dims")
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
        json.dump({"meta": meta, "cuda": rows, "wgsl": wgsl_rows, "variants": var_rows}, f, indent=2)
    md = markdown(meta, rows, wgsl_rows) + (variants.markdown(var_rows) if var_rows else "")
    with open(os.path.join(args.out, "RESULTS.md"), "w") as f:
        f.write(md)
    print()
    print(md)


if __name__ == "__main__":
    main()
