"""Variants of one model example's spec side by side with SDPA's backends (issue 11: MLA and GQA
rows against cuDNN). Each variant is the example's block with extra spec lines; each output is
checked against SDPA's memory-efficient kernel (relative error in brackets). B 1, L 4096 (the
models section of run_gpu.py), medians of triton do_bench, TFLOP/s = 2 Hq L^2 (Dqk + Dv), halved
for causal.

    python3 benchmarks/probes/probe_models.py deepseek_v2_lite.attn deepseek_v2_lite_mla_prefill \\
        --variants "kv96p=tile q=128 kv=96;target cuda { producer=on }" [--lengths 4096]
"""

from __future__ import annotations

import argparse
import os
import re

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attngen
from common import ROOT, attention_flops, median_ms, randn, rel_err

DT = {"f16": torch.float16, "bf16": torch.bfloat16}


def spec_with(path: str, name: str, extra: str):
    """The block `name` of examples/`path` (or of `path` as given, where that is a file) with the
    spec lines `extra` (';' separated) added."""
    text = open(path if os.path.isfile(path) else os.path.join(ROOT, "examples", path)).read()
    m = re.search(r"attention\s+" + re.escape(name) + r"\s*\{(.*?)\n\}", text, re.S)
    if m is None:
        raise SystemExit(f"no block {name} in examples/{path}")
    lines = "".join(f"\n    {x.strip()}" for x in extra.split(";") if x.strip())
    return attngen.parse(f"attention {name}_{abs(hash(extra)) % 10**6} {{{m.group(1)}{lines}\n}}\n")[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path")
    ap.add_argument("name")
    ap.add_argument("--variants", default="", help="name=spec lines (';' between lines), ',' between variants")
    ap.add_argument("--lengths", default="4096")
    args = ap.parse_args()
    variants = [("default", "")] + [tuple(v.split("=", 1)) for v in args.variants.split(",") if v.strip()]
    for length in (int(x) for x in args.lengths.split(",")):
        base = spec_with(args.path, args.name, "")
        hq, hkv = base.heads_q or 16, base.heads_kv or 16
        g = torch.Generator(device="cuda").manual_seed(3)
        dt = DT[base.dtype]
        q = randn((1, length, hq, base.head_dim_qk), dt, g)
        k = randn((1, length, hkv, base.head_dim_qk), dt, g)
        v = randn((1, length, hkv, base.head_dim_v), dt, g)
        causal = base.mask.kind == "causal"
        flops = attention_flops(1, hq, length, length, base.head_dim_qk, base.head_dim_v, causal)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):  # (GQA: K and V repeated, it has no enable_gqa)
            kr, vr = (x.repeat_interleave(hq // hkv, dim=1) for x in (kt, vt))
            ref = F.scaled_dot_product_attention(qt, kr, vr, is_causal=causal, scale=base.scale).transpose(1, 2).float()
        cells = []
        for pname, backend in (("cuDNN", SDPBackend.CUDNN_ATTENTION), ("FA2", SDPBackend.FLASH_ATTENTION)):
            try:
                with sdpa_kernel([backend]):
                    ms = median_ms(lambda: F.scaled_dot_product_attention(
                        qt, kt, vt, is_causal=causal, enable_gqa=hq != hkv, scale=base.scale))
                cells.append(f"{pname} {flops / ms / 1e9:4.0f}")
            except RuntimeError:
                cells.append(f"{pname} n/a")
        for vname, extra in variants:
            try:
                kern = attngen.compile(spec_with(args.path, args.name, extra), target="cuda")
            except attngen.SpecError as e:
                cells.append(f"{vname}: refused ({str(e).splitlines()[0][:80]})")
                continue
            err = rel_err(kern(q, k, v), ref)
            ms = median_ms(lambda: kern(q, k, v))
            c = kern.plan.config
            cells.append(f"{vname} [q{c.tile_q} kv{c.tile_kv} p={int(c.producer)} pers={int(c.persistent)} "
                         f"tma={int(c.tma)}] {flops / ms / 1e9:4.0f} ({err:.0e})")
        print(f"{args.name} L{length} TFLOP/s | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
