"""DeepSeek-V3's absorbed MLA decode (examples/deepseek_v3_mla_decode.attn: 128 query heads over one
latent KV head, keys 576-dim, values 512, bf16, paged cache of 64 tokens, split_kv(auto)) on the
GPU: what it streams, for the issue 12 note (no SDPA backend runs this shape: head dims 576 / 512).

    python3 benchmarks/probes/probe_mla_decode.py [--batch 1,8,32] [--lk 4096,32768]
                                           [--tiles "q=64 kv=32 d=64,q=128 kv=32 d=64"]

Bytes counted: K and V as the kernel reads them, B x Lk x (576 + 512) x 2 (the latent V is the
first 512 dims of K in FlashMLA, which reads the cache once; attngen takes K and V apart, so it
reads both). Each case is checked against a float32 torch reference on one batch row (relative L2
error), then timed with triton's do_bench (median, the prepared launch: the kernels alone) and as
a full call. Pages are shuffled over the pool, as in decode_grid.py. --tiles: the example's `tile`
line replaced, one kernel per entry (`default`: the example as it is), timed side by side.
"""

from __future__ import annotations

import argparse
import os
import re

import torch

import attngen
from common import ROOT, median_ms, randn, rel_err


def reference(q, k, v, scale):
    """Causal (bottom right) decode of one query row per head: every key is seen."""
    s = torch.einsum("hd,ld->hl", q.float(), k.float()) * scale
    return torch.softmax(s, dim=-1) @ v.float()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", default="1,8,32")
    ap.add_argument("--lk", default="4096,32768")
    ap.add_argument("--tiles", default="default")
    args = ap.parse_args()
    path = os.path.join(ROOT, "examples", "deepseek_v3_mla_decode.attn")
    text = open(path).read()
    kernels = {}
    for tile in args.tiles.split(","):
        body = text if tile == "default" else re.sub(r"\n\s*tile\s+d=64\n", f"\n    tile {tile}\n", text)
        if tile != "default":  # (a name of its own: the disk cache is keyed by the plan)
            body = body.replace("attention deepseek_v3_mla_decode", "attention mla_" + re.sub(r"\W+", "_", tile))
        spec = attngen.parse(body)[0]
        kernels[tile] = attngen.compile(spec, target="cuda")
        print(f"{tile}: {kernels[tile].plan.summary()}", flush=True)
    hq, dqk, dv, page = spec.heads_q, spec.head_dim_qk, spec.head_dim_v, spec.kv_cache.page
    for b in (int(x) for x in args.batch.split(",")):
        for lk in (int(x) for x in args.lk.split(",")):
            g = torch.Generator(device="cuda").manual_seed(b * 7 + lk)
            n = lk // page
            q = randn((b, 1, hq, dqk), torch.bfloat16, g)
            kp = randn((b * n, page, 1, dqk), torch.bfloat16, g)
            vp = randn((b * n, page, 1, dv), torch.bfloat16, g)
            table = torch.randperm(b * n, device="cuda", generator=g).to(torch.int32).reshape(b, n)
            lens = torch.full((b,), lk, device="cuda", dtype=torch.int32)
            k0 = kp[table[0].long()].reshape(lk, dqk)
            v0 = vp[table[0].long()].reshape(lk, dv)
            ref = reference(q[0, 0], k0, v0, spec.scale or dqk ** -0.5)
            nbytes = b * lk * (dqk + dv) * 2
            for tile, kern in kernels.items():
                launch = kern.prepared(q, kp, vp, kv_lens=lens, block_table=table)
                out = launch()
                err = rel_err(out[0, 0], ref)
                ms = median_ms(launch)
                call_ms = median_ms(lambda: kern(q, kp, vp, kv_lens=lens, block_table=table))
                print(f"B{b} Lk{lk} {tile:18s}: kernels {ms * 1e3:8.1f} us {nbytes / ms / 1e9:5.2f} TB/s | call "
                      f"{call_ms * 1e3:8.1f} us {nbytes / call_ms / 1e9:5.2f} TB/s | rel. err {err:.1e}", flush=True)


if __name__ == "__main__":
    main()
