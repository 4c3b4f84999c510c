"""Issue 12's host rows for run_gpu.py (suite `host`): what a call costs on the host.

Cases (f16, PyTorch tensors, one process, SDPA beside each):
- prefill B1 H32 Lq=Lk=128 d128: a kernel of a few microseconds, so a call's time is its host time;
- decode B8 32q/8kv d128 Lk 4096, split_kv(auto), kv_lens on the GPU.
Each is timed as calls per second over 1000 calls (one synchronisation at the end: `ms` per
call), plainly, through attngen.torch's operator, and replayed from a CUDA graph that holds
one call (`graph`); `kernels` is the GPU time of the launches alone (events, median).

The host's speed drifts by 30-50% between runs and within one (NOTES.md, issue 12), so every
column is measured in ROUNDS rounds, each round timing every function of the case once in
turn (attngen, then SDPA, ...), and each column is the median of its rounds: a slow stretch of
the host hits attngen and SDPA alike instead of whichever was timed during it.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F

import attngen
import attngen.torch

CALLS = 1000
ROUNDS = 9


def per_call_ms(fn, calls: int = CALLS) -> float:
    """Wall time per call over `calls` calls and one synchronisation (one round)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e3


def host_ms(fn, calls: int = 100) -> float:
    """Host time per call: `calls` calls issued without waiting (fewer than the launch queue
    holds), median of 4 runs (of one round), the GPU drained between runs."""
    for _ in range(10):
        fn()
    times = []
    for _ in range(4):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e3)
    torch.cuda.synchronize()
    return float(np.median(times))


def graph_of(fn):
    """The replay of a CUDA graph holding one call of fn (per_call_ms times it)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay  # timed by per_call_ms in the rounds


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
    """fn with SDPA held to its FlashAttention backend (the context is entered once per timing,
    outside the timed loop)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def flash():
        return sdpa_kernel(SDPBackend.FLASH_ATTENTION)
    return fn, flash


def _plain(fn):
    import contextlib
    return fn, contextlib.nullcontext


def in_rounds(columns: dict) -> dict:
    """{column: median over ROUNDS rounds}; columns maps a name to (measure, (fn, context)), and
    each round measures every column once, in turn."""
    times = {name: [] for name in columns}
    for _ in range(ROUNDS):
        for name, (measure, (fn, context)) in columns.items():
            with context():
                times[name].append(measure(fn))
    return {name: float(np.median(t)) for name, t in times.items()}


def _case(name: str, call, op_call, sdpa, prepared) -> dict:
    """One row: the attngen call, its operator, SDPA (flash), each plainly and in a graph."""
    with _flash(None)[1]():
        sdpa_graph = graph_of(sdpa)
    row = {"case": name}
    row.update(in_rounds({
        "attngen host": (host_ms, _plain(call)),
        "sdpa host": (host_ms, _flash(sdpa)),
        "attngen": (per_call_ms, _plain(call)),
        "sdpa": (per_call_ms, _flash(sdpa)),
        "attngen operator": (per_call_ms, _plain(op_call)),
        "attngen graph": (per_call_ms, _plain(graph_of(call))),
        "sdpa graph": (per_call_ms, _plain(sdpa_graph)),
    }))
    row["attngen kernels"] = kernel_ms(prepared)
    return row


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
    row = _case("B1 H32 Lq=Lk=128 d128 prefill", lambda: kern(q, k, v), lambda: op(q, k, v),
                lambda: F.scaled_dot_product_attention(qt, kt, vt), kern.prepared(q, k, v))
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
    row = _case(f"B8 32q/8kv d128 Lk{lk} decode split_kv(auto)", lambda: kern(q, k, v, kv_lens=lens),
                lambda: op(q, k, v, kv_lens=lens),
                lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True),
                kern.prepared(q, k, v, kv_lens=lens))
    rows.append(row)
    print(row)


def markdown(rows: list, meta: dict) -> str:
    cols = ["attngen host", "sdpa host", "attngen", "attngen operator", "attngen graph", "attngen kernels", "sdpa",
            "sdpa graph"]
    # SDPA runs its FlashAttention backend here (sdpa_kernel entered once, outside the loop)
    out = [f"### Host cost per call ({meta['date']}, {meta['gpu']}, commit {meta['commit']})", "",
           "`host`: host time to issue one call (100 calls without waiting, median of 4 runs); the other "
           f"columns: wall time per call over {CALLS} calls with one synchronisation at the end; every "
           f"column the median of {ROUNDS} rounds that time attngen and SDPA in turn "
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
