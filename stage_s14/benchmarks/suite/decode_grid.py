"""Issue 12's decode grid: split_kv(auto) decode over batch sizes, key lengths and cache layouts.

    python3 benchmarks/suite/decode_grid.py [--out DIR]

32 query heads over 8 KV heads, d128, f16, Lq 1; B 1 / 8 / 64; Lk 1k-128k (B64 to 32k); the
cache contiguous, paged with pages of 16 and of 64 keys (a shuffled block table; kv_lens and
the table as int32 CUDA tensors). attngen: the kernels' launches alone (kernel.prepared) and a
whole call, median of triton do_bench; SDPA flash and cuDNN (enable_gqa) on the contiguous
cache (they take no block table), timed as calls; every function timed ROUNDS times in turn
(median). TB/s = K+V bytes read / time. Writes
decode_grid.json, decode_grid.md and decode.png (TB/s per row) to --out; run_gpu.py takes the
rows into latest.json (suite decode, cases like "B8 32q/8kv d128 Lk32768 paged16").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import attngen

HQ, HKV, D = 32, 8, 128
GRID = [(1, (1024, 4096, 16384, 32768, 131072)), (8, (1024, 4096, 16384, 32768, 131072)),
        (64, (1024, 4096, 16384, 32768))]
LAYOUTS = ("contiguous", "paged16", "paged64")
# Each kernel and peer of a case is timed ROUNDS times, the cases' functions in turn, and its
# median taken: one do_bench each let the clocks of the moment decide the small cases (B1 Lk 1024
# paged16 read 1.32x of contiguous in one run and 1.10x in benchmarks/probes/probe_paged.py the next).
ROUNDS = 3


def _ms(fn) -> float:
    return do_bench(fn, warmup=10, rep=60, return_mode="median")


def _kernel(layout: str):
    cache = "" if layout == "contiguous" else f"\n kv_cache paged(page={layout[5:]})"
    text = (f"attention decode_{layout} {{\n head_dim {D}\n heads q={HQ} kv={HKV}\n dtype f16\n"
            f" schedule split_kv(auto){cache}\n}}")
    return attngen.compile(attngen.parse(text)[0], target="cuda")


def run(rows: list):
    kernels = {layout: _kernel(layout) for layout in LAYOUTS}
    for b, lks in GRID:
        for lk in lks:
            g = torch.Generator(device="cuda").manual_seed(b * 7 + lk)
            q = torch.randn((b, 1, HQ, D), device="cuda", dtype=torch.float16, generator=g)
            k = torch.randn((b, lk, HKV, D), device="cuda", dtype=torch.float16, generator=g)
            v = torch.randn((b, lk, HKV, D), device="cuda", dtype=torch.float16, generator=g)
            nbytes = 2 * k.numel() * 2
            lens = torch.full((b,), lk, device="cuda", dtype=torch.int32)
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
            base = f"B{b} 32q/8kv d128 Lk{lk}"
            timed = {}  # name: the function timed; every one is timed ROUNDS times, in turn
            for key, backend in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
                def call(backend=backend):
                    with sdpa_kernel(backend):
                        return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
                try:
                    call()
                    timed[key] = call
                except RuntimeError:
                    pass  # this backend does not take the case: the peer is absent
            ref = F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True).transpose(1, 2)
            errs = {}
            for layout, kern in kernels.items():
                if layout == "contiguous":
                    args, opts = (q, k, v), {"kv_lens": lens}
                else:
                    page = int(layout[5:])
                    n = lk // page
                    perm = torch.randperm(b * n, device="cuda", generator=g).to(torch.int32)
                    table = perm.reshape(b, n)
                    kp = torch.empty((b * n, page, HKV, D), device="cuda", dtype=torch.float16)
                    vp = torch.empty_like(kp)
                    kp[perm.long()] = k.reshape(b * n, page, HKV, D)
                    vp[perm.long()] = v.reshape(b * n, page, HKV, D)
                    args, opts = (q, kp, vp), {"kv_lens": lens, "block_table": table}
                launch = kern.prepared(*args, **opts)
                out = launch()
                errs[layout] = float(((out.float() - ref.float()).norm() / ref.float().norm()).item())
                timed[layout] = launch
                timed[layout + " call"] = lambda kern=kern, args=args, opts=opts: kern(*args, **opts)
            times = {name: [] for name in timed}
            for _ in range(ROUNDS):
                for name, fn in timed.items():
                    times[name].append(_ms(fn))
            ms_of = {name: statistics.median(ts) for name, ts in times.items()}
            peers = {key: {"ms": round(ms_of[key], 5), "tbs": round(nbytes / ms_of[key] / 1e9, 3)}
                     for key in ("sdpa_flash", "sdpa_cudnn") if key in ms_of}
            for layout, kern in kernels.items():
                ms, call_ms = ms_of[layout], ms_of[layout + " call"]
                row = {"suite": "decode", "case": f"{base} {layout}", "target": "cuda",
                       "plan": kern.plan.summary(), "rel_err": round(errs[layout], 7),
                       "attngen": {"ms": round(ms, 5), "tbs": round(nbytes / ms / 1e9, 3), "call_ms": round(call_ms, 5)},
                       "peers": peers, "batch": b, "len_k": lk, "layout": layout}
                rows.append(row)
                print(f"{row['case']:40s} {ms:.4f} ms {nbytes / ms / 1e9:5.2f} TB/s call {call_ms:.4f} ms  "
                      + "  ".join(f"{p} {v['tbs']:.2f}" for p, v in peers.items()), flush=True)
            del k, v, q
            torch.cuda.empty_cache()


def markdown(rows: list, meta: dict) -> str:
    out = [f"### Decode grid ({meta.get('date')}, {meta.get('gpu')}, commit {meta.get('commit')})", "",
           "split_kv(auto), 32q/8kv d128 f16, Lq 1; TB/s of K+V read by the kernels' launches alone (call: a whole "
           "kernel(...) call in ms); SDPA flash / cuDNN on the contiguous cache (enable_gqa), timed as calls; "
           "paged: shuffled block table, kv_lens and table as int32 CUDA tensors.", "",
           "| case | attngen TB/s | call ms | launches ms | SDPA flash TB/s | SDPA cuDNN TB/s | paged / contiguous |",
           "|---|---|---|---|---|---|---|"]
    contiguous = {(r["batch"], r["len_k"]): r["attngen"]["ms"] for r in rows if r["layout"] == "contiguous"}

    def tbs(peers, key):
        return f"{peers[key]['tbs']:.2f}" if key in peers else "n/a"
    for r in rows:
        a, p = r["attngen"], r["peers"]
        ratio = a["ms"] / contiguous[(r["batch"], r["len_k"])]
        out.append(f"| {r['case']} | {a['tbs']:.2f} | {a['call_ms']:.4f} | {a['ms']:.4f} | {tbs(p, 'sdpa_flash')} | "
                   f"{tbs(p, 'sdpa_cudnn')} | {ratio:.2f} |")
    return "\n".join(out) + "\n\n"


def plot(rows: list, path: str) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, len(GRID), figsize=(5 * len(GRID), 4), sharey=True)
    for ax, (b, lks) in zip(axes, GRID):
        for layout, style in zip(LAYOUTS, ("-o", "--s", ":^")):
            ys = [next(r["attngen"]["tbs"] for r in rows if r["batch"] == b and r["len_k"] == lk and r["layout"] == layout)
                  for lk in lks]
            ax.plot(lks, ys, style, label=f"attngen {layout}")
        for key, style in (("sdpa_flash", "-x"), ("sdpa_cudnn", "-+")):
            ys = [next((r["peers"].get(key, {}).get("tbs") for r in rows if r["batch"] == b and r["len_k"] == lk
                        and r["layout"] == "contiguous"), None) for lk in lks]
            ax.plot(lks, [y if y is not None else float("nan") for y in ys], style, label=key.replace("_", " "))
        ax.set_xscale("log", base=2)
        ax.set_title(f"decode B{b} 32q/8kv d128")
        ax.set_xlabel("Lk")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("TB/s (K+V)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    rows = []
    run(rows)
    meta = {"date": __import__("datetime").date.today().isoformat(), "gpu": torch.cuda.get_device_name(),
            "commit": os.environ.get("ATTNGEN_COMMIT", "unknown")}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "decode_grid.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    md = markdown(rows, meta)
    with open(os.path.join(args.out, "decode_grid.md"), "w") as f:
        f.write(md)
    plot(rows, os.path.join(args.out, "decode.png"))
    print(md)


if __name__ == "__main__":
    main()
