"""Issue 12's host rows for run_gpu.py (suite `host`): what a call costs on the host.

Cases (f16, PyTorch tensors, one process, SDPA beside each):
- prefill B1 H32 Lq=Lk=128 d128: a kernel of a few microseconds, so a call's time is its host time;
- decode B8 32q/8kv d128 Lk 4096, split_kv(auto), kv_lens on the GPU.
Each is timed as calls per second over 1000 calls (one synchronisation at the end: `ms` per
call), plainly, through attngen.torch's operator, and replayed from a CUDA graph that holds
one call (`graph`); `kernels` is the GPU time of the launches alone (events, median).
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F

import attngen
import attngen.torch

CALLS = 1000


def per_call_ms(fn, calls: int = CALLS) -> float:
    """Wall time per call over `calls` calls and one synchronisation (best of three runs)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / calls * 1e3)
    return best


def host_ms(fn, calls: int = 100) -> float:
    """Host time per call: `calls` calls issued without waiting (fewer than the launch queue
    holds), median of 20 runs, the GPU drained between runs."""
    for _ in range(10):
        fn()
    times = []
    for _ in range(20):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e3)
    torch.cuda.synchronize()
    return float(np.median(times))


def graph_ms(fn) -> float:
    """Host time per replay of a CUDA graph holding one call of fn."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return per_call_ms(g.replay)


def kernel_ms(fn) -> float:
    for _ in range(10):
        fn()
    times = []
    for _ in range(50):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return float(np.median(times))


def _spec(name: str, body: str):
    return attngen.parse(f"attention {name} {{\n{body}\n}}")[0]


def _flash(fn):
    """fn with SDPA held to its FlashAttention backend (the context is entered once, outside the timing)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def timed(measure):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return measure(fn)
    return timed


def host_section(rows: list):
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, device=dev, dtype=torch.float16)

    # prefill, tiny
    spec = _spec("host_prefill", "head_dim 128\n heads q=32 kv=32\n dtype f16")
    kern = attngen.compile(spec, target="cuda")
    op = attngen.torch.operator(kern)
    q, k, v = rnd(1, 128, 32, 128), rnd(1, 128, 32, 128), rnd(1, 128, 32, 128)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # SDPA's (B, H, L, D) views of the same data
    row = {"case": "B1 H32 Lq=Lk=128 d128 prefill",
           "attngen host": host_ms(lambda: kern(q, k, v)),
           "sdpa host": _flash(lambda: F.scaled_dot_product_attention(qt, kt, vt))(host_ms),
           "attngen": per_call_ms(lambda: kern(q, k, v)),
           "attngen operator": per_call_ms(lambda: op(q, k, v)),
           "attngen graph": graph_ms(lambda: kern(q, k, v)),
           "attngen kernels": kernel_ms(kern.prepared(q, k, v)),
           "sdpa": _flash(lambda: F.scaled_dot_product_attention(qt, kt, vt))(per_call_ms),
           "sdpa graph": _flash(lambda: F.scaled_dot_product_attention(qt, kt, vt))(graph_ms)}
    rows.append(row)
    print(row)

    # decode, split_kv(auto), kv_lens on the GPU
    spec = _spec("host_decode", "head_dim 128\n heads q=32 kv=8\n dtype f16\n schedule split_kv(auto)")
    kern = attngen.compile(spec, target="cuda")
    op = attngen.torch.operator(kern)
    lk = 4096
    q, k, v = rnd(8, 1, 32, 128), rnd(8, lk, 8, 128), rnd(8, lk, 8, 128)
    lens = torch.full((8,), lk, dtype=torch.int32, device=dev)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    row = {"case": f"B8 32q/8kv d128 Lk{lk} decode split_kv(auto)",
           "attngen host": host_ms(lambda: kern(q, k, v, kv_lens=lens)),
           "sdpa host": _flash(lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True))(host_ms),
           "attngen": per_call_ms(lambda: kern(q, k, v, kv_lens=lens)),
           "attngen operator": per_call_ms(lambda: op(q, k, v, kv_lens=lens)),
           "attngen graph": graph_ms(lambda: kern(q, k, v, kv_lens=lens)),
           "attngen kernels": kernel_ms(kern.prepared(q, k, v, kv_lens=lens)),
           "sdpa": _flash(lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True))(per_call_ms),
           "sdpa graph": _flash(lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True))(graph_ms)}
    rows.append(row)
    print(row)


def markdown(rows: list, meta: dict) -> str:
    cols = ["attngen host", "sdpa host", "attngen", "attngen operator", "attngen graph", "attngen kernels", "sdpa",
            "sdpa graph"]
    # SDPA runs its FlashAttention backend here (sdpa_kernel entered once, outside the loop)
    out = [f"### Host cost per call ({meta['date']}, {meta['gpu']}, commit {meta['commit']})", "",
           "`host`: host time to issue one call (100 calls without waiting, median of 20 runs); the other "
           f"columns: wall time per call over {CALLS} calls with one synchronisation at the end (best of 3) "
           "- `operator`: through attngen.torch, `graph`: replaying a CUDA graph that holds one call; "
           "`kernels`: GPU time of the launches (events, median). PyTorch f16 tensors; SDPA on its "
           "FlashAttention backend.", "",
           "| case | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for r in rows:
        out.append(f"| {r['case']} | " + " | ".join(f"{r[c] * 1e3:.1f} µs" for c in cols) + " |")
    return "\n".join(out) + "\n\n"


def latest_rows(rows: list) -> list:
    """Suite `host` rows of latest.json: attngen and SDPA per call, plain and in a CUDA graph."""
    out = []
    for r in rows:
        for how, a, s in (("host", "attngen host", "sdpa host"), ("call", "attngen", "sdpa"),
                          ("graph", "attngen graph", "sdpa graph"), ("operator", "attngen operator", "sdpa")):
            out.append({"suite": "host", "case": f"{r['case']} {how}", "target": "cuda",
                        "attngen": {"ms": round(r[a], 5)}, "peers": {"sdpa_flash": {"ms": round(r[s], 5)}},
                        "kernels_ms": round(r["attngen kernels"], 5)})
    return out
