"""Launches with per-sequence lengths against padded ones: the same tokens attended as B padded
sequences (the main entry point), packed with cu_seqlens (the `_varlen` entry point, as a serving
engine's prefill calls it) and padded with kv_lens (also `_varlen`), beside SDPA flash (FA2) on
the padded shape, in one process. f16, H D = 2048; each output is checked against FA2 (relative
error in brackets); medians of triton do_bench; TFLOP/s = 4 B H L^2 D (halved for causal).
run_gpu.py's `varlen` section is `section()` here (d64 / d128, L 1k / 4k, none and causal).

    python3 benchmarks/suite/varlen.py [--dims 128] [--lengths 1024,4096] [--masks none,causal]
        [--docs 4] [--uneven]

--uneven packs sequences of lengths L/2, L, 3L/2 ... (the same total per batch) instead of B
sequences of L; the padded and FA2 cells are then left out (no padded shape matches).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import attngen


def _ms(fn) -> float:
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def _err(out, ref) -> float:
    return float((out.float() - ref).norm() / ref.norm())


def measure(d: int, mask: str, L: int, docs: int = 4, uneven: bool = False) -> dict:
    """One case: {'case', 'plan', 'flops', and per layout (fa2, padded, kv_lens, packed) its ms and
    rel. error against FA2 (packed only when uneven)}."""
    H = 2048 // d
    causal = mask == "causal"
    spec = attngen.parse(f"attention varlen_probe {{\n head_dim {d}\n heads q={H} kv={H}\n dtype f16\n"
                         f" mask {'causal' if causal else 'none'}\n}}\n")[0]
    kern = attngen.compile(spec, target="cuda")
    lens = [L * (i + 1) // 2 for i in range(docs)] if uneven else [L] * docs
    total = sum(lens)
    g = torch.Generator(device="cuda").manual_seed(5)
    q, k, v = (torch.randn((total, H, d), device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), device="cuda", dtype=torch.int32)
    what = f"{docs} sequences of {'L/2 .. ' if uneven else ''}L{L}"
    row = {"case": f"f16 d{d} {mask} {what}", "plan": kern.plan.details.varlen.doc if kern.plan.details.varlen
           else kern.plan.summary(), "flops": sum(4.0 * H * n * n * d * (0.5 if causal else 1.0) for n in lens)}
    ref = None
    if not uneven:
        qp, kp, vp = (x.view(docs, L, H, d) for x in (q, k, v))
        qt, kt, vt = (x.transpose(1, 2) for x in (qp, kp, vp))
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2).float()
            row["fa2_ms"] = _ms(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal))
        row["padded_err"] = _err(kern(qp, kp, vp), ref)
        row["padded_ms"] = _ms(lambda: kern(qp, kp, vp))
        kv_lens = torch.full((docs,), L, device="cuda", dtype=torch.int32)
        row["kv_lens_err"] = _err(kern(qp, kp, vp, kv_lens=kv_lens), ref)
        row["kv_lens_ms"] = _ms(lambda: kern(qp, kp, vp, kv_lens=kv_lens))
    mx = max(lens)
    call = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=mx, max_seqlen_k=mx)
    out = kern(q, k, v, **call)
    if ref is not None:
        row["packed_err"] = _err(out.view(docs, L, H, d), ref)
    row["packed_ms"] = _ms(lambda: kern(q, k, v, **call))
    return row


def _tflops(row, key):
    ms = row.get(f"{key}_ms")
    return None if ms is None else row["flops"] / ms / 1e9


def line(row) -> str:
    cells = []
    for key, label in (("fa2", "FA2"), ("padded", "padded"), ("kv_lens", "kv_lens"), ("packed", "packed")):
        t = _tflops(row, key)
        if t is not None:
            err = row.get(f"{key}_err")
            cells.append(f"{label} {t:4.0f}" + ("" if err is None else f" ({err:.0e})"))
    return f"{row['case']} TFLOP/s | " + " | ".join(cells)


def section(rows, dims=(64, 128), lengths=(1024, 4096), masks=("none", "causal")) -> None:
    """run_gpu.py's varlen section: rows appended to `rows`, each printed."""
    for d in dims:
        for mask in masks:
            for L in lengths:
                rows.append(measure(d, mask, L))
                print(line(rows[-1]), flush=True)


def latest_rows(rows) -> list:
    """benchmarks/results/latest.json rows: suite varlen, attngen = the packed launch (cu_seqlens),
    peers: SDPA flash on the padded shape, and attngen's own padded and kv_lens launches."""
    out = []
    for r in rows:
        peers = {}
        for key, name in (("fa2", "sdpa_flash"), ("padded", "attngen_padded"), ("kv_lens", "attngen_kv_lens")):
            if r.get(f"{key}_ms") is not None:
                peers[name] = {"ms": r[f"{key}_ms"], "tflops": _tflops(r, key)}
        out.append({"suite": "varlen", "case": r["case"], "target": "cuda", "plan": r["plan"],
                    "rel_err": r.get("packed_err"), "attngen": {"ms": r["packed_ms"], "tflops": _tflops(r, "packed")},
                    "peers": peers})
    return out


def markdown(rows) -> str:
    if not rows:
        return ""
    lines = ["", "Packed prefill (cu_seqlens, the `_varlen` entry) beside the same tokens padded and with kv_lens, "
             "SDPA flash (FA2) on the padded shape (f16, H D = 2048, 4 sequences of L; TFLOP/s = 4 H L^2 D per "
             "sequence, halved for causal):", "",
             "| case | attngen packed | attngen kv_lens | attngen padded | SDPA flash (padded) | packed / FA2 | rel. err |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        def f(key):
            t = _tflops(r, key)
            return "n/a" if t is None else f"{t:.0f}"
        fa2 = _tflops(r, "fa2")
        ratio = f"{_tflops(r, 'packed') / fa2:.2f}x" if fa2 else "n/a"
        err = r.get("packed_err")
        lines.append(f"| {r['case']} | {f('packed')} | {f('kv_lens')} | {f('padded')} | {f('fa2')} | {ratio} | "
                     f"{'n/a' if err is None else f'{err:.1e}'} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dims", default="128")
    ap.add_argument("--lengths", default="1024,4096")
    ap.add_argument("--masks", default="none,causal")
    ap.add_argument("--docs", type=int, default=4, help="sequences per launch")
    ap.add_argument("--uneven", action="store_true")
    args = ap.parse_args()
    for d in (int(x) for x in args.dims.split(",")):
        for mask in args.masks.split(","):
            for L in (int(x) for x in args.lengths.split(",")):
                print(line(measure(d, mask, L, args.docs, args.uneven)), flush=True)


if __name__ == "__main__":
    main()
