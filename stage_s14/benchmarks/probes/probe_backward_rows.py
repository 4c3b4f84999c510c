"""Probe (issue 41 / 42): attngen's fast CUDA backward alone on chosen rows, no peers, for an A / B
of a template change in one device call:
    git archive <base> templates attngen | (mkdir -p ab-base && tar -x -C ab-base)
    bash benchmarks/ab.sh ab-base python3 benchmarks/probes/probe_backward_rows.py ROW...

A ROW is `d<D>-L<L>-<mask>[-bf16]`, mask one of full, causal, window (the named window 1024),
window_custom, doc_custom (the masks section's two BlockMasks, benchmarks/suite/variants.py), or
`reltable-L<L>` (suite expressions' relative-bias table with its `grad` input, d128). The dense
suite's shape (B L = 16384, H D = 2048); TFLOP/s = 2.5x the forward's FLOPs on live pairs. Each
row is timed twice, interleaved with the others (the second pass says how noisy the first was).
"""

from __future__ import annotations

import sys

import torch

import attngen
from common import median_ms

DEFAULT = ["d64-L1024-causal", "d128-L1024-causal", "d128-L1024-full", "d128-L16384-causal",
           "d128-L16384-window", "d128-L16384-window_custom", "d128-L16384-doc_custom"]


def setup(row: str):
    """(label, thunk, flops) for one row."""
    parts = row.split("-")
    gen = torch.Generator(device="cuda").manual_seed(0)
    if parts[0] == "reltable":
        seqlen, heads, d = int(parts[1][1:]), 16, 128
        batch = 16384 // seqlen
        spec = attngen.parse(f"attention rel_{seqlen} {{\n head_dim {d}\n heads q={heads} kv={heads}\n dtype f16\n"
                             " input table[h, 2047] f32 grad\n score s + table[h, clamp(k - q, -1023, 1023) + 1023]\n}\n")[0]
        kern = attngen.compile(spec, target="cuda")
        q, k, v, dout = (torch.randn((batch, seqlen, heads, d), device="cuda", dtype=torch.float16, generator=gen)
                         for _ in range(4))
        table = torch.randn((heads, 2047), device="cuda", generator=gen) * 0.5
        out, lse = kern(q, k, v, return_lse=True, table=table)
        return lambda: kern.backward(q, k, v, out, lse, dout, table=table), 10.0 * batch * heads * seqlen ** 2 * d
    d, seqlen, mask = int(parts[0][1:]), int(parts[1][1:]), parts[2]
    dtype = "bf16" if parts[-1] == "bf16" else "f16"
    heads, batch = 2048 // d, 16384 // seqlen
    line = {"full": "none", "window": "window(left=1023, right=0)", "window_custom": "custom",
            "doc_custom": "custom"}.get(mask, mask)
    spec = attngen.parse(f"attention r_{mask} {{\n head_dim {d}\n heads q={heads} kv={heads}\n dtype {dtype}\n"
                         f" mask {line}\n}}\n")[0]
    kern = attngen.compile(spec, target="cuda")
    tdt = torch.float16 if dtype == "f16" else torch.bfloat16
    q, k, v, dout = (torch.randn((batch, seqlen, heads, d), device="cuda", dtype=tdt, generator=gen) for _ in range(4))
    kw, live = {}, 1.0
    i = torch.arange(seqlen, device="cuda")
    if mask in ("causal",):
        live = 0.5
    elif mask == "window":
        live = float(((i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - 1024)).float().mean())
    elif mask.endswith("_custom"):
        sys.path.insert(0, "benchmarks/suite")
        from variants import mask_cases
        masks, _ = mask_cases(seqlen)
        m = masks["window 1024" if mask == "window_custom" else "document-causal"]
        kw["mask"] = attngen.block_mask(m, kern)
        live = float(m.float().mean())
    out, lse = kern(q, k, v, return_lse=True, **kw)
    return lambda: kern.backward(q, k, v, out, lse, dout, **kw), 10.0 * batch * heads * seqlen ** 2 * d * live


def main():
    rows = sys.argv[1:] or DEFAULT
    thunks = {r: setup(r) for r in rows}
    for rnd in range(2):
        for r, (fn, flops) in thunks.items():
            ms = median_ms(fn)
            print(f"{r:28s} round {rnd}: {ms:8.3f} ms {flops / ms / 1e9:7.1f} TFLOP/s", flush=True)


if __name__ == "__main__":
    main()
