"""A / B of attngen's CUDA kernels between two versions of the generator, in one device call.

Times attngen alone (no peers) over a broad set of cases: the dense grid (f16 / bf16 x d64 / d128
/ d256 x L 1k / 4k / 16k x full / causal, B L = 16384, H D = 2048), the real models of examples/
at L 4096, head dims 320-1024, decode (split_kv and two_pass over a paged cache), packed
sequences (the _varlen entry), the mma.sync family (profile cuda-sm80 on the same GPU) and f32 on
CUDA cores; plus the host cost of a call (a tiny decode step, no synchronisation inside the loop).
Kernel times are CUDA events by triton's do_bench (25 ms warm-up, median of 100 ms); host times
the median of 9 rounds of 200 calls.

    bash benchmarks/ab.sh ab-base python3 benchmarks/tools/ab_kernels.py --out $OUT/ab   # writes ab-base.json, ab-head.json
    python3 benchmarks/tools/ab_kernels.py --compare A.json B.json [A2.json B2.json ...]

ab.sh runs it once per side (base first, then head), each in its own checkout copy and kernel
cache; the side is read from ATTNGEN_CACHE_DIR's suffix (ab.sh sets it), or --side. Only the
public API is used, so the base may be any earlier version. With several pairs (run ab.sh twice
in one call), --compare takes each side's fastest median per case (noise is one-sided).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cases():
    """(label, spec text or (example file, kernel), shape dict, profile or None)."""
    out = []
    for dtype in ("f16", "bf16"):
        for d in (64, 128, 256):
            for L in (1024, 4096, 16384):
                for mask in ("none", "causal"):
                    out.append((f"dense {dtype} d{d} L{L} {mask}",
                                f"attention ab_d{d}_{mask}_{dtype} {{\n head_dim {d}\n dtype {dtype}\n mask {mask}\n}}\n",
                                {"B": 16384 // L, "L": L, "Hq": 2048 // d, "Hkv": 2048 // d}, None))
    for path, name in (("llama3_8b.attn", "llama3_8b_prefill"), ("qwen2_7b.attn", "qwen2_7b_prefill"),
                       ("gemma2_9b.attn", "gemma2_9b_local"), ("deepseek_v2_lite.attn", "deepseek_v2_lite_mla_prefill"),
                       ("phi35_mini.attn", "phi35_mini")):
        out.append((f"model {name} L4096", (path, name), {"B": 1, "L": 4096}, None))
    for name in ("head_dim_320", "head_dim_512", "head_dim_640", "head_dim_1024"):
        out.append((f"head dims {name} L4096", ("large_head_dims.attn", name), {"B": 1, "L": 4096, "Hq": 16, "Hkv": 16},
                    None))
    out.append(("decode llama3 paged split_kv B8 Lk32768", ("llama3_8b_decode.attn", "llama3_8b_decode"),
                {"B": 8, "Lq": 1, "Lk": 32768, "decode": True}, None))
    out.append(("decode llama3 paged two_pass B8 Lk8192", ("llama3_8b_decode.attn", "llama3_8b_decode_two_pass"),
                {"B": 8, "Lq": 1, "Lk": 8192, "decode": True}, None))
    out.append(("decode MLA B8 Lk4096", ("deepseek_v3_mla_decode.attn", "deepseek_v3_mla_decode"),
                {"B": 8, "Lq": 1, "Lk": 4096, "decode": True}, None))
    out.append(("varlen llama3 8 x 1024 packed", ("llama3_8b.attn", "llama3_8b_prefill"),
                {"B": 8, "L": 1024, "varlen": True}, None))
    out.append(("mma.sync (cuda-sm80) f16 d128 L4096 causal",
                "attention ab_sm80 {\n head_dim 128\n dtype f16\n mask causal\n}\n",
                {"B": 4, "L": 4096, "Hq": 16, "Hkv": 16}, "cuda-sm80"))
    out.append(("CUDA cores f32 d64 L2048", "attention ab_f32 {\n head_dim 64\n dtype f32\n mask none\n}\n",
                {"B": 4, "L": 2048, "Hq": 16, "Hkv": 16}, None))
    return out


def _spec(attngen, source):
    if isinstance(source, tuple):
        return attngen.load(os.path.join(ROOT, "examples", source[0]), source[1])
    return attngen.parse(source)[0]


def _inputs(torch, spec, shape):
    dt = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[spec.dtype]
    g = torch.Generator(device="cuda").manual_seed(1)
    hq = spec.heads_q or shape.get("Hq", 16)
    hkv = spec.heads_kv or shape.get("Hkv", hq)
    dqk, dv = spec.head_dim_qk, spec.head_dim_v

    def randn(*s):
        return torch.randn(s, device="cuda", dtype=dt, generator=g)
    if shape.get("decode"):
        b, lk = shape["B"], shape["Lk"]
        q = randn(b, 1, hq, dqk)
        lens = torch.full((b,), lk, dtype=torch.int32, device="cuda")
        if spec.kv_cache.is_paged:
            page = spec.kv_cache.page
            pages = b * (lk // page)
            k, v = randn(pages, page, hkv, dqk), randn(pages, page, hkv, dv)
            table = torch.randperm(pages, device="cuda", generator=g).to(torch.int32).reshape(b, lk // page)
            return (q, k, v), {"kv_lens": lens, "block_table": table}, 4.0 * b * hq * lk * (dqk + dv) / 2
        return (q, randn(b, lk, hkv, dqk), randn(b, lk, hkv, dv)), {"kv_lens": lens}, 4.0 * b * hq * lk * (dqk + dv) / 2
    b, L = shape["B"], shape["L"]
    causal = spec.mask.kind == "causal"
    flops = 2.0 * b * hq * L * L * (dqk + dv) * (0.5 if causal else 1.0)
    if shape.get("varlen"):
        q, k, v = randn(b * L, hq, dqk), randn(b * L, hkv, dqk), randn(b * L, hkv, dv)  # packed: (total, H, D)
        cu = torch.arange(0, (b + 1) * L, L, dtype=torch.int32, device="cuda")
        return (q, k, v), {"cu_seqlens_q": cu, "cu_seqlens_k": cu, "max_seqlen_q": L, "max_seqlen_k": L}, flops
    return (randn(b, L, hq, dqk), randn(b, L, hkv, dqk), randn(b, L, hkv, dv)), {}, flops


def host_us(torch, attngen, kernel, args, opts) -> float:
    """The host's cost of one call in microseconds: 200 calls without waiting, median of 9 rounds."""
    for _ in range(50):
        kernel(*args, **opts)
    torch.cuda.synchronize()
    rounds = []
    for _ in range(9):
        t0 = time.perf_counter()
        for _ in range(200):
            kernel(*args, **opts)
        rounds.append((time.perf_counter() - t0) / 200 * 1e6)
        torch.cuda.synchronize()
    return statistics.median(rounds)


def measure(out_dir: str, side: str) -> None:
    import torch
    from triton.testing import do_bench

    import attngen
    rows = []
    for label, source, shape, profile in cases():
        row = {"case": label}
        try:
            spec = _spec(attngen, source)
            kernel = attngen.compile(spec, target="cuda", profile=profile) if profile else \
                attngen.compile(spec, target="cuda")
            args, opts, flops = _inputs(torch, spec, shape)
            kernel(*args, **opts)
            torch.cuda.synchronize()
            ms = do_bench(lambda: kernel(*args, **opts), warmup=25, rep=100, return_mode="median")
            row.update(ms=ms, tflops=flops / (ms * 1e-3) / 1e12, plan=kernel.plan.summary())
        except Exception as e:  # a case one side cannot run is reported, not fatal
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        rows.append(row)
        print(f"  {side} {label}: " + (f"{row['ms']:.4f} ms" if "ms" in row else row["error"]), flush=True)
    # host cost: a decode step of 1 query row (B1, Lk 256, f16): the kernel is a few microseconds
    try:
        spec = attngen.parse("attention ab_host {\n head_dim 128\n heads q=32 kv=8\n dtype f16\n"
                             " mask causal(bottom_right)\n}\n")[0]
        kernel = attngen.compile(spec, target="cuda")
        q = torch.randn(1, 1, 32, 128, device="cuda", dtype=torch.float16)
        k = torch.randn(1, 256, 8, 128, device="cuda", dtype=torch.float16)
        v = torch.randn(1, 256, 8, 128, device="cuda", dtype=torch.float16)
        rows.append({"case": "host us per call (decode B1 Lk256)", "host_us": host_us(torch, attngen, kernel, (q, k, v), {})})
    except Exception as e:
        rows.append({"case": "host us per call (decode B1 Lk256)", "error": f"{type(e).__name__}: {e}"})
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"ab-{side}.json")
    if os.path.exists(path):  # a second round of the same side: keep both
        n = 2
        while os.path.exists(os.path.join(out_dir, f"ab-{side}-{n}.json")):
            n += 1
        path = os.path.join(out_dir, f"ab-{side}-{n}.json")
    with open(path, "w") as f:
        json.dump({"side": side, "gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    print(f"wrote {path}")


def compare(paths: list[str], slower: float) -> int:
    """A table of base vs head (each side's best over its rounds); exit 1 if a kernel is slower
    than `slower` (a fraction) beyond the rounds' own spread."""
    sides = {"base": [], "head": []}
    for p in paths:
        with open(p) as f:
            data = json.load(f)
        sides[data["side"]].append({r["case"]: r for r in data["rows"]})
    key = lambda r: r.get("ms", r.get("host_us"))  # noqa: E731
    lines = ["| case | base | head | head / base | base spread | head spread |", "|---|---|---|---|---|---|"]
    worst, bad = 0.0, []
    for case in sides["base"][0]:
        vals = {s: [key(run[case]) for run in sides[s] if case in run and key(run[case]) is not None] for s in sides}
        if not vals["base"] or not vals["head"]:
            err = sides["head"][0].get(case, {}).get("error") or sides["base"][0].get(case, {}).get("error")
            lines.append(f"| {case} | - | - | {err} | | |")
            if vals["base"] and not vals["head"]:
                bad.append(case)
            continue
        b, h = min(vals["base"]), min(vals["head"])
        spread = lambda v: (max(v) / min(v) - 1) if len(v) > 1 else 0.0  # noqa: E731
        unit = "us" if "host" in case else "ms"
        ratio = h / b
        worst = max(worst, ratio)
        noise = max(spread(vals["base"]), spread(vals["head"]))
        if ratio > 1 + slower + noise:
            bad.append(case)
        lines.append(f"| {case} | {b:.4f} {unit} | {h:.4f} {unit} | {ratio:.3f} | {spread(vals['base']):.1%} | "
                     f"{spread(vals['head']):.1%} |")
    print("\n".join(lines))
    print(f"\nworst head / base: {worst:.3f}; slower than {slower:.0%} beyond the rounds' spread: "
          f"{', '.join(bad) if bad else 'none'}")
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--side", default=None, help="base or head (default: from ATTNGEN_CACHE_DIR, as ab.sh sets it)")
    ap.add_argument("--compare", nargs="+", metavar="JSON")
    ap.add_argument("--slower", type=float, default=0.03, help="the fraction a head kernel may be slower (0.03)")
    args = ap.parse_args(argv)
    if args.compare:
        return compare(args.compare, args.slower)
    side = args.side or ("base" if os.environ.get("ATTNGEN_CACHE_DIR", "").endswith("-ab-base") else "head")
    measure(args.out, side)
    return 0


if __name__ == "__main__":
    sys.exit(main())
