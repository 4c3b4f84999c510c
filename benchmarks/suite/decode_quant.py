"""Issue 44's quantized decode: the KV cache in e4m3, e5m2 and i8 beside the f16 cache.

    python3 benchmarks/suite/decode_quant.py [--out DIR] [--lengths 4096,32768] [--kv e4m3,e5m2,i8]
                                             [--layouts contiguous,paged16] [--schedule 'split_kv(auto)']

B8, 32 query heads over 8 KV heads, d128, one query row per sequence, f16 queries; the cache
contiguous or paged with pages of 16 keys (a shuffled block table; kv_lens and the table as int32
CUDA tensors), Lk 4096 and 32768. Every cache holds the same standard normal values: in f16, or
quantized on the GPU as attngen.quantize_kv would (cache()). Every kernel's launches alone (kernel.prepared) are timed by triton's do_bench (median),
all of a case's kernels in turn ROUNDS times (median); tokens per second = B / time; TB/s = the
cache's bytes read (K and V, with i8's scales) / time. The ratio is against the f16 cache of the same
layout and length ("f16_cache", the peer of latest.json's rows). At the first length each kernel's
output is checked against the float64 reference on the same bytes (relative L2), on sequences 0 and
1 only (the reference is numpy). run_gpu.py takes the rows into latest.json (suite decode_quant,
cases like "B8 32q/8kv d128 Lk32768 paged16 e4m3"); issue 44's must: >= 1.8x the f16 cache's
tokens per second at Lk 32768, contiguous and paged (an i8 cache reads 1.125 bytes per value: its
ceiling is 2 / 1.125 = 1.78x).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import numpy as np

B, HQ, HKV, D, PAGE = 8, 32, 8, 128, 16
LENGTHS = (4096, 32768)
KV = ("e4m3", "e5m2", "i8")
LAYOUTS = ("contiguous", "paged16")
ROUNDS = 3


def _ms(fn) -> float:
    from triton.testing import do_bench
    return do_bench(fn, warmup=10, rep=60, return_mode="median")


def kernel(kv: str, layout: str, schedule: str = "split_kv(auto)", extra: str = "", profile=None):
    """The case's kernel (kv "f16": the cache in f16); `extra`: spec lines for the quantized
    caches' kernels only (an A / B of their tiles, e.g. "target cuda { stages=3 }"); `profile`: theirs
    (a probe's CudaTiles overrides), likewise."""
    import attngen
    lines = [f"head_dim {D}", f"heads q={HQ} kv={HKV}", "dtype f16", f"schedule {schedule}"]
    if extra and kv != "f16":
        lines.append(extra)
    if layout != "contiguous":
        lines.append(f"kv_cache paged(page={layout[5:]})")
    if kv != "f16":
        lines.append(f"kv_dtype {kv}")
    tag = "" if not extra or kv == "f16" else "_x" + __import__("hashlib").sha1(extra.encode()).hexdigest()[:8]
    name = f"decode_quant_{kv}_{layout}_{schedule.replace('(', '_').replace(')', '')}{tag}"
    return attngen.compile(attngen.parse(f"attention {name} {{\n " + "\n ".join(lines) + "\n}\n")[0], target="cuda",
                           profile=None if kv == "f16" else profile)


def cache(kv: str, shape, g):
    """A cache of `shape` on the GPU (torch) from standard normal values, as a model's cache is
    quantized: f16, or its stored values and scales (attngen.quantize_kv's rules, on the GPU: FP8 by
    torch's casts with scale max|x| / largest per (sequence, KV head), i8 by blocks of 32). (Random
    bytes were not: e5m2's large values made the scores so peaked that most weights underflowed to
    0, and the kernels cleaned V in every tile: benchmarks/NOTES.md.)"""
    import torch
    x = torch.randn(shape, device="cuda", generator=g)
    if kv == "f16":
        return x.half(), None
    if kv == "i8":
        blocks = x.view(*shape[:-1], shape[-1] // 32, 32)
        scale = blocks.abs().amax(dim=-1) / 127
        q = torch.round(blocks / scale[..., None]).clamp(-127, 127).to(torch.int8)
        return q.view(shape), scale
    largest, fmt = {"e4m3": (448.0, torch.float8_e4m3fn), "e5m2": (57344.0, torch.float8_e5m2)}[kv]
    scale = x.abs().amax(dim=(1, 3)) / largest  # (B, Hkv)
    return (x / scale[:, None, :, None]).to(fmt).view(torch.uint8), scale


def inputs(kv: str, layout: str, lk: int, seed: int):
    """(q, k, v, options) of a case: the same q for every kv; FP8 scales per (sequence, KV head)."""
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn((B, 1, HQ, D), device="cuda", dtype=torch.float16, generator=g)
    g.manual_seed(seed + 1)
    (k, ks), (v, vs) = cache(kv, (B, lk, HKV, D), g), cache(kv, (B, lk, HKV, D), g)
    opts = {"kv_lens": torch.full((B,), lk, device="cuda", dtype=torch.int32)}
    if layout != "contiguous":
        page = int(layout[5:])
        n = lk // page
        perm = torch.randperm(B * n, device="cuda", generator=g)
        opts["block_table"] = perm.to(torch.int32).reshape(B, n)

        def scatter(x):
            out = torch.empty((B * n, page) + tuple(x.shape[2:]), device="cuda", dtype=x.dtype)
            out[perm] = x.reshape((B * n, page) + tuple(x.shape[2:]))
            return out
        k, v = scatter(k), scatter(v)
        if kv == "i8":
            ks, vs = scatter(ks), scatter(vs)
    if ks is not None:
        opts.update(k_scale=ks, v_scale=vs)
    return q, k, v, opts


def cache_bytes(k, v, opts) -> int:
    n = k.numel() * k.element_size() + v.numel() * v.element_size()
    return n + sum(opts[s].numel() * 4 for s in ("k_scale", "v_scale") if s in opts and opts[s].dim() > 2)


def check(kern, q, k, v, opts) -> float:
    """Relative L2 error of the kernel's output against the float64 reference on sequences 0 and 1."""
    from attngen.reference import reference, relative_error
    out = kern(q, k, v, **opts).float().cpu().numpy()[:2]
    host = {n: x.cpu().numpy() for n, x in opts.items()}
    q2 = q[:2].cpu().numpy()
    paged = "block_table" in host
    host["kv_lens"] = host["kv_lens"][:2]
    if paged:  # (the pages stay whole: the table's first two rows name theirs)
        host["block_table"] = host["block_table"][:2]
        kk, vv = k.cpu().numpy(), v.cpu().numpy()
    else:
        kk, vv = k[:2].cpu().numpy(), v[:2].cpu().numpy()
    for s in ("k_scale", "v_scale"):  # FP8's (B, Hkv), and a contiguous i8 cache's, by sequence
        if s in host and (host[s].ndim == 2 or not paged):
            host[s] = np.ascontiguousarray(host[s][:2])
    return relative_error(out, reference(kern.spec, q2, kk, vv, **host))


def run(rows: list, lengths=LENGTHS, kvs=KV, layouts=LAYOUTS, schedule: str = "split_kv(auto)", verbose=True,
        extra: str = "", profile=None):
    import torch
    for layout in layouts:
        kernels = {kv: kernel(kv, layout, schedule, extra, profile) for kv in ("f16",) + tuple(kvs)}
        for lk in lengths:
            case = {kv: inputs(kv, layout, lk, seed=lk) for kv in kernels}
            launches = {kv: kernels[kv].prepared(*c[:3], **c[3]) for kv, c in case.items()}
            times = {kv: [] for kv in kernels}
            for _ in range(ROUNDS):
                for kv, fn in launches.items():
                    times[kv].append(_ms(fn))
            ms = {kv: statistics.median(t) for kv, t in times.items()}
            nbytes = {kv: cache_bytes(c[1], c[2], c[3]) for kv, c in case.items()}
            base = {"ms": round(ms["f16"], 5), "tokens_per_s": round(B / ms["f16"] * 1e3, 1),
                    "tbs": round(nbytes["f16"] / ms["f16"] / 1e9, 3)}
            for kv in kvs:
                err = check(kernels[kv], *case[kv]) if lk == lengths[0] else None
                tps = B / ms[kv] * 1e3
                row = {"suite": "decode_quant", "case": f"B{B} 32q/8kv d128 Lk{lk} {layout} {kv}", "target": "cuda",
                       "plan": kernels[kv].plan.summary(), "rel_err": None if err is None else round(err, 7),
                       "attngen": {"ms": round(ms[kv], 5), "tokens_per_s": round(tps, 1),
                                   "tbs": round(nbytes[kv] / ms[kv] / 1e9, 3)},
                       "peers": {"f16_cache": base}, "ratio_vs_f16": round(tps / base["tokens_per_s"], 3),
                       "kv_dtype": kv, "len_k": lk, "layout": layout, "schedule": schedule}
                rows.append(row)
                if verbose:
                    print(f"{row['case']:44s} {ms[kv]:.4f} ms {tps:>10.0f} tok/s  f16 {ms['f16']:.4f} ms  "
                          f"{row['ratio_vs_f16']:.2f}x  {row['attngen']['tbs']:.2f} TB/s"
                          + (f"  rel err {err:.1e}" if err is not None else ""), flush=True)
            del case, launches
            torch.cuda.empty_cache()


def latest_rows(rows: list) -> list:
    """The rows in latest.json's form (the kv_dtype, length, layout and schedule are in the case)."""
    return [{k: v for k, v in r.items() if k not in ("kv_dtype", "len_k", "layout", "schedule")} for r in rows]


def markdown(rows: list, meta: dict) -> str:
    out = [f"### Quantized decode ({meta.get('date')}, {meta.get('gpu')}, commit {meta.get('commit')})", "",
           "B8 32q/8kv d128 Lq 1, split_kv(auto); tokens/s of the kernels' launches; the cache's TB/s (i8: with its "
           "scales); the ratio against the f16 cache of the same layout and length (issue 44's must: >= 1.8x at "
           "Lk 32768; i8's ceiling 1.78x).", "",
           "| case | ms | tokens/s | TB/s | f16 cache tokens/s | vs f16 | rel. err |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        a, p = r["attngen"], r["peers"]["f16_cache"]
        err = "" if r["rel_err"] is None else f"{r['rel_err']:.1e}"
        out.append(f"| {r['case']} | {a['ms']:.4f} | {a['tokens_per_s']:.0f} | {a['tbs']:.2f} | "
                   f"{p['tokens_per_s']:.0f} | {r['ratio_vs_f16']:.2f}x | {err} |")
    return "\n".join(out) + "\n\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    ap.add_argument("--kv", default=",".join(KV))
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--schedule", default="split_kv(auto)")
    args = ap.parse_args()
    import torch
    rows = []
    run(rows, [int(x) for x in args.lengths.split(",")], args.kv.split(","), args.layouts.split(","), args.schedule)
    meta = {"date": __import__("datetime").date.today().isoformat(), "gpu": torch.cuda.get_device_name(),
            "commit": os.environ.get("ATTNGEN_COMMIT", "unknown")}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "decode_quant.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    md = markdown(rows, meta)
    with open(os.path.join(args.out, "decode_quant.md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
