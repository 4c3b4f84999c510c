"""Paged against contiguous decode at small B and Lk (issue 12: paged caches within 10% of
contiguous), the launches alone, several runs of each so that the spread shows.

    python3 benchmarks/probes/probe_paged.py [--batch 1] [--lk 1024,4096] [--runs 3] [--extra "spec line"] [--hnd]

The cases of benchmarks/suite/decode_grid.py (32 q heads over 8 KV heads, d128, f16, split_kv(auto),
kv_lens on the GPU; paged: a shuffled block table), each timed `runs` times by triton's
do_bench (median) in turn, so that drifting clocks hit every layout alike.
"""

from __future__ import annotations

import argparse

import torch

from common import decode_spec, median_ms, randn  # (and benchmarks/suite/ on sys.path)
import decode_grid  # noqa: E402  (benchmarks/suite/decode_grid.py)

HKV, D, HQ = decode_grid.HKV, decode_grid.D, decode_grid.HQ


def kernel(layout: str, extra: str, schedule: str = "split_kv(auto)", cluster: str = ""):
    """The decode kernel of `layout`; cluster "X,Y,Z": its entry points get __cluster_dims__(X, Y, Z)
    (a rewrite of the generated source, for timing: the blocks of a cluster run at once on one GPC)."""
    import attngen
    name = f"decode_{layout}" + (f"_c{cluster.replace(',', '_')}" if cluster else "")
    spec = decode_spec(layout, extra, schedule, name)
    if not cluster:
        return attngen.compile(spec, target="cuda")
    from common import compile_with
    return compile_with(spec, [("__launch_bounds__(kThreads, 1)\n", f"__launch_bounds__(kThreads, 1) __cluster_dims__({cluster})\n")])


def placement(how: str, b: int, n: int, page: int, g) -> torch.Tensor:
    """The pool index of page i of sequence s at [s * n + i] (see --placement)."""
    if how == "sequential":
        return torch.arange(b * n, device="cuda")
    if how == "interleaved":
        return (torch.arange(n, device="cuda")[None, :] * b + torch.arange(b, device="cuda")[:, None]).reshape(-1)
    if how == "local":
        group = max(1, (2 << 20) // (page * HKV * D * 2))  # pages per 2 MiB
        idx = torch.arange(b * n, device="cuda")
        keys = (idx // group) * (b * n) + torch.randperm(b * n, device="cuda", generator=g)
        return idx[torch.argsort(keys)]  # a random order inside each group of `group` pages
    if how == "sorted":
        perm = torch.randperm(b * n, device="cuda", generator=g).reshape(b, n)
        return perm.sort(dim=1).values.reshape(-1)  # scattered over the pool, in address order per sequence
    return torch.randperm(b * n, device="cuda", generator=g)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--lk", default="1024,4096")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--extra", default="", help="a line added to every spec, e.g. 'target cuda { stages=3 }'")
    ap.add_argument("--sequential", action="store_true",
                    help="pages in order (block table 0, 1, 2, ...) instead of shuffled (= --placement sequential)")
    ap.add_argument("--placement", default="shuffled", choices=("shuffled", "sequential", "local", "interleaved", "sorted"),
                    help="where the pages lie: shuffled over the whole pool (the default, as decode_grid.py), "
                         "in order, shuffled only within each 2 MiB of the pool (`local`: the address translations "
                         "of contiguous), or the sequences' pages interleaved (page i of sequence b at i * B + b, "
                         "what an allocator gives sequences that grow one token at a time), or `sorted`: shuffled over the "
                         "whole pool, then each sequence's pages in address order")
    ap.add_argument("--schedule", default="split_kv(auto)", help="the specs' schedule, e.g. 'split_kv(4)'")
    ap.add_argument("--hnd", action="store_true",
                    help="the pools in HND order (page, KV head, slot, dim: each head's slots of a page one "
                         "contiguous run, as FlashInfer's HND layout), passed as their (page, slot, head, dim) "
                         "view; the kernels read it through the strides")
    ap.add_argument("--cluster", default="", help="X,Y,Z: time the kernels with __cluster_dims__(X, Y, Z) beside them "
                    "(grid: splits, KV heads, batch)")
    args = ap.parse_args()
    if args.sequential:
        args.placement = "sequential"
    kernels = {layout: kernel(layout, args.extra, args.schedule) for layout in decode_grid.LAYOUTS}
    if args.cluster:
        kernels.update({f"{layout} cluster": kernel(layout, args.extra, args.schedule, args.cluster)
                        for layout in decode_grid.LAYOUTS})
    b = args.batch
    for lk in (int(x) for x in args.lk.split(",")):
        g = torch.Generator(device="cuda").manual_seed(lk)
        q = randn((b, 1, HQ, D), generator=g)
        k = randn((b, lk, HKV, D), generator=g)
        v = randn((b, lk, HKV, D), generator=g)
        lens = torch.full((b,), lk, device="cuda", dtype=torch.int32)
        launches, pools = {}, {}
        for layout, kern in kernels.items():
            if layout.startswith("contiguous"):
                launches[layout] = kern.prepared(q, k, v, kv_lens=lens)
                continue
            page = int(layout.split()[0][5:])
            n = lk // page
            if page not in pools:  # one pool per page size: the cluster variant reads the same pages
                perm = placement(args.placement, b, n, page, g).to(torch.int32)
                if args.hnd:
                    kp = torch.empty((b * n, HKV, page, D), device="cuda", dtype=torch.float16).permute(0, 2, 1, 3)
                    vp = torch.empty((b * n, HKV, page, D), device="cuda", dtype=torch.float16).permute(0, 2, 1, 3)
                else:
                    kp = torch.empty((b * n, page, HKV, D), device="cuda", dtype=torch.float16)
                    vp = torch.empty_like(kp)
                kp[perm.long()] = k.reshape(b * n, page, HKV, D)
                vp[perm.long()] = v.reshape(b * n, page, HKV, D)
                pools[page] = (kp, vp, perm.reshape(b, n))
            kp, vp, table = pools[page]
            launches[layout] = kern.prepared(q, kp, vp, kv_lens=lens, block_table=table)
        ref = launches["contiguous"]().clone()
        diffs = {layout: float((f() - ref).abs().max()) for layout, f in launches.items()}
        times = {layout: [] for layout in launches}
        for _ in range(args.runs):
            for layout, f in launches.items():
                times[layout].append(median_ms(f, 10, 100) * 1e3)
        base = min(times["contiguous"])
        nbytes = 2 * k.numel() * 2
        print(f"B{b} Lk{lk} {args.extra}{' pages ' + args.placement}{' HND' if args.hnd else ''} {args.schedule}: " + " | ".join(
            f"{layout} {' / '.join(f'{t:.1f}' for t in ts)} us ({min(ts) / base:.2f}x, {nbytes / min(ts) / 1e6:.2f} TB/s, "
            f"max diff {diffs[layout]:.1e})"
            for layout, ts in times.items()),
            flush=True)


if __name__ == "__main__":
    main()
