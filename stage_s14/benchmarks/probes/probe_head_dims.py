"""Head dims above 256 (issue 11: d320 / 512 / 1024 at B1 H48 L4096 against SDPA's memory-efficient
kernel): attngen's plans side by side, each variant a set of fields of the planner's tile table
(CudaTiles, attngen/backends/cuda/tiles.py) overridden for the compile (an A/B of planner choices in one process)
and / or spec lines (tile, target cuda { ... }).
Each output is checked against the memory-efficient kernel (relative error in brackets); medians of
triton do_bench; TFLOP/s = 4 B H L^2 D (halved for causal).

    python3 benchmarks/probes/probe_head_dims.py --dims 384,512 \\
        --variants "split=split_qk:True | blocks=split_qk:False" [--mask causal]
    python3 benchmarks/probes/probe_head_dims.py --dims 1024 --variants "s4=target cuda { stages=4 }"
"""

from __future__ import annotations

import argparse
import ast
import re

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import attngen
from common import with_tiles  # noqa: E402  (benchmarks/probes/common.py)


def variants(text: str) -> list:
    """'name=field:value;spec line;... | name2=...' -> [(name, {field: value}, [spec lines])]
    (fields of CudaTiles, values Python literals; a part that is not field:value is a spec line);
    '' -> the defaults."""
    out = []
    for item in filter(None, (x.strip() for x in text.split("|"))):
        name, _, rest = item.partition("=")
        patch, lines = {}, []
        for part in filter(None, (p.strip() for p in rest.split(";"))):
            key, colon, value = part.partition(":")
            if colon and re.fullmatch(r"[a-z0-9_]+", key.strip()):
                patch[key.strip()] = ast.literal_eval(value.strip())
            else:
                lines.append(part)
        out.append((name.strip(), patch, lines))
    return out or [("default", {}, [])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dims", default="320,512,1024")
    ap.add_argument("--mask", default="none")
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=48)
    ap.add_argument("--dtype", default="f16")
    ap.add_argument("--variants", default="")
    args = ap.parse_args()
    dt = {"f16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    causal = args.mask == "causal"
    L, H = args.length, args.heads
    for d in (int(x) for x in args.dims.split(",")):
        g = torch.Generator(device="cuda").manual_seed(2)
        q, k, v = (torch.randn((1, L, H, d), device="cuda", dtype=dt, generator=g) for _ in range(3))
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        flops = 4.0 * H * L * L * d * (0.5 if causal else 1.0)
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
            ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
            peer = do_bench(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal),
                            warmup=25, rep=100, return_mode="median")
        ref = ref.transpose(1, 2).float()
        cells = [f"mem-eff {flops / peer / 1e9:6.1f}"]
        for name, patch, lines in variants(args.variants):
            extra = "".join(f" {line}\n" for line in lines)
            try:
                spec = attngen.parse(f"attention hd{d}_{name} {{\n head_dim {d}\n dtype {args.dtype}\n"
                                     f" mask {args.mask}\n{extra}}}\n")[0]
                kern = attngen.compile(spec, target="cuda", profile=with_tiles(None, **patch) if patch else None)
            except attngen.SpecError as e:
                cells.append(f"{name}: refused ({str(e).splitlines()[0][:80]})")
                continue
            out = kern(q, k, v).float()
            err = float((out - ref).norm() / ref.norm())
            ms = do_bench(lambda: kern(q, k, v), warmup=25, rep=100, return_mode="median")
            cells.append(f"{name} {flops / ms / 1e9:6.1f} [{err:.1e}] ({kern.plan.summary()[:60]})")
        print(f"d{d} {args.mask} L{L} H{H}: " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
