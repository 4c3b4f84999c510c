"""Hardware counters of the decode kernels beside the peers' (issue 12: why B8 decode sits ~3%
below SDPA flash and cuDNN). Run under Nsight Compute on the GPU machine:

    ncu --clock-control none --profile-from-start off --section SpeedOfLight \
        --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
        --section WarpStateStats python3 benchmarks/probes/ncu_decode.py [--lk 32768] [--batch 8]

Each kernel (attngen's launches alone through kernel.prepared, SDPA flash, SDPA cuDNN) is warmed
up outside the profiled range, then run once inside it (torch.cuda.profiler.start / stop).
Extra attngen variants: --variants "name=spec lines;name2=..." (lines added to the spec body).
"""

from __future__ import annotations

import argparse

import torch
from torch.nn.attention import SDPBackend

import attngen
from common import profiled_once, randn, sdpa

HQ, HKV, D = 32, 8, 128


def kernel(name: str, extra: str):
    text = (f"attention {name} {{\n head_dim {D}\n heads q={HQ} kv={HKV}\n dtype f16\n"
            f" schedule split_kv(auto)\n{extra}\n}}")
    return attngen.compile(attngen.parse(text)[0], target="cuda")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lk", type=int, default=32768)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--variants", default="")
    ap.add_argument("--paged", type=int, default=0, help="also the kernel on a paged cache of this page size")
    args = ap.parse_args()
    B, lk = args.batch, args.lk
    q = randn((B, 1, HQ, D))
    k = randn((B, lk, HKV, D))
    v = torch.randn_like(k)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

    def peer(backend):
        return lambda: sdpa(qt, kt, vt, backend, enable_gqa=True)

    runs = [("attngen", kernel("decode_default", "").prepared(q, k, v))]
    for item in filter(None, args.variants.split(";")):
        name, _, lines = item.partition("=")
        runs.append((name, kernel(f"decode_{name}", lines.replace("\\n", "\n")).prepared(q, k, v)))
    if args.paged:
        page, n = args.paged, lk // args.paged
        perm = torch.randperm(B * n, device="cuda").to(torch.int32)
        kp = torch.empty((B * n, page, HKV, D), device="cuda", dtype=torch.float16)
        vp = torch.empty_like(kp)
        kp[perm.long()] = k.reshape(B * n, page, HKV, D)
        vp[perm.long()] = v.reshape(B * n, page, HKV, D)
        lens = torch.full((B,), lk, device="cuda", dtype=torch.int32)
        paged = kernel(f"decode_paged{page}", f" kv_cache paged(page={page})")
        runs.append((f"paged{page}", paged.prepared(q, kp, vp, kv_lens=lens, block_table=perm.reshape(B, n))))
        # the same kernel with the pages in order (block table 0, 1, 2, ...): what the shuffle costs
        ks, vs = k.reshape(B * n, page, HKV, D), v.reshape(B * n, page, HKV, D)
        order = torch.arange(B * n, device="cuda", dtype=torch.int32).reshape(B, n)
        runs.append((f"paged{page}_in_order", paged.prepared(q, ks, vs, kv_lens=lens, block_table=order)))
        runs.append(("contiguous_lens", kernel("decode_default", "").prepared(q, k, v, kv_lens=lens)))
    runs += [("sdpa_flash", peer(SDPBackend.FLASH_ATTENTION)), ("sdpa_cudnn", peer(SDPBackend.CUDNN_ATTENTION))]
    profiled_once(runs, warmup=5)
    print("profiled:", ", ".join(n for n, _ in runs))


if __name__ == "__main__":
    main()
