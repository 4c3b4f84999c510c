"""How fast can one kernel stream a paged KV cache, by access pattern alone (issue 12)?

    python3 benchmarks/probes/probe_page_reads.py [--batch 8] [--lk 32768] [--page 16] [--runs 3]
        [--allocations 2] [--peers] [--elem 1]

No attention: each block copies its share of K and V into shared memory with cp.async through
a ring of stages, as attngen's decode kernel does (the block's block-table entries read once
into shared memory first, as the kernel reads them a tile ahead), and reads one word of each
stage. The cache
is decode_grid.py's (B x Lk tokens x 8 KV heads x d128, f16, [pages, page, heads, d]), pages in
order ("contiguous") or shuffled over the pool. Patterns:

- `heads 1`: one block per (batch, KV head, split), a stage = `rows` tokens of its head
  (256-byte rows 2 KiB apart): attngen's decode kernel today (kv128, 2 splits at B8 -> 128
  blocks);
- `heads H`: one block per (batch, H KV heads, split), a stage = `rows` tokens of H heads
  (H x 256 contiguous bytes per token; H = 8: whole pages, 32 KiB contiguous per 16 tokens):
  the layout a block that owns several of a sequence's KV heads would read.

Same bytes per block and blocks per SM in both; only the addresses differ. --elem 1 streams
128-byte rows 1 KiB apart (an FP8 / i8 cache's K and V, issue 44): attngen's quantized decode
reads its cache at 3.64 TB/s where the f16 cache's 256-byte rows go at 4.3 (H200): whether the
shorter rows alone cost that is what its `heads 1` rows against `heads 2` (256 contiguous bytes
again) tell. --peers adds
attngen's decode kernel (contiguous and paged, split_kv(auto)) and SDPA flash / cuDNN on the same
cache; --allocations repeats everything on new caches (where 1 GB lands moves the figures).
Prints us per call (median of do_bench) and TB/s. Findings: benchmarks/NOTES.md, 2026-11-27.
"""

from __future__ import annotations

import argparse

import cupy as cp
import numpy as np
import torch

from common import decode_spec, median_ms, randn, sdpa

HKV, D = 8, 128

SOURCE = r"""
#include <cuda_fp16.h>
extern "C" __global__ void __launch_bounds__(128) stream(
        const char* __restrict__ kc, const char* __restrict__ vc, const int* __restrict__ table,
        int pages_per_seq, int page, int splits, int rows, int stages, int heads, int head_bytes, unsigned* out) {
    extern __shared__ __align__(128) char smem[];
    const int tid = threadIdx.x;
    // block = (batch, group of `heads` KV heads, split), split fastest
    const int groups = 8 / heads;
    const int split = blockIdx.x % splits, head = (blockIdx.x / splits) % groups * heads, batch = blockIdx.x / (splits * groups);
    const int tokens = pages_per_seq * page, share = tokens / splits, t0 = split * share;
    const int tiles = share / rows;
    // bytes per stage (K or V): rows x heads x head_bytes (256: f16 d128; 128: an FP8 / i8 cache)
    const int row_bytes = heads * head_bytes;
    const int stage_bytes = rows * row_bytes;
    // the block's block-table entries, read once into shared memory (after the stages): the
    // copies' addresses then cost no global load each (attngen's kernel reads them a tile ahead)
    int* pages = reinterpret_cast<int*>(smem + stages * 2 * stage_bytes);
    for (int i = tid; i < share / page; i += 128) pages[i] = table[batch * pages_per_seq + t0 / page + i];
    __syncthreads();
    auto issue = [&](int tile) {
        char* dst = smem + (tile % stages) * 2 * stage_bytes;
        for (int c = tid; c < stage_bytes / 16; c += 128) {
            const int r = c / (row_bytes / 16), col = c % (row_bytes / 16);
            const int t = tile * rows + r;  // the block's token t (t0 + t in the sequence)
            const long long pid = pages[t / page];
            const long long off = (pid * page + (t0 + t) % page) * 8LL * head_bytes + head * head_bytes + col * 16;
            unsigned sk = (unsigned)__cvta_generic_to_shared(dst + c * 16);
            unsigned sv = (unsigned)__cvta_generic_to_shared(dst + stage_bytes + c * 16);
            asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" :: "r"(sk), "l"(kc + off));
            asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" :: "r"(sv), "l"(vc + off));
        }
    };
    unsigned acc = 0;
    for (int s = 0; s < stages - 1; ++s) { if (s < tiles) issue(s); asm volatile("cp.async.commit_group;\n"); }
    for (int tile = 0; tile < tiles; ++tile) {
        if (tile + stages - 1 < tiles) issue(tile + stages - 1);
        asm volatile("cp.async.commit_group;\n");
        if (stages == 2) asm volatile("cp.async.wait_group 1;\n");  // this tile's group done, the next may fly
        else if (stages == 3) asm volatile("cp.async.wait_group 2;\n");
        else asm volatile("cp.async.wait_group 3;\n");
        __syncthreads();
        const unsigned* w = (const unsigned*)(smem + (tile % stages) * 2 * stage_bytes);
        acc ^= w[tid * 7 % (2 * stage_bytes / 4)];
        __syncthreads();
    }
    out[blockIdx.x * 128 + tid] = acc;
}
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lk", type=int, default=32768)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--allocations", type=int, default=1,
                    help="time everything on this many caches in turn (where the allocator puts 1 GB moves "
                         "the figures by up to 10%%)")
    ap.add_argument("--elem", type=int, default=2, choices=(1, 2),
                    help="bytes per value: 2 (an f16 cache, 256-byte rows) or 1 (an FP8 / i8 cache, 128-byte rows "
                         "1 KiB apart: does the row length alone cost bandwidth?)")
    ap.add_argument("--peers", action="store_true",
                    help="also attngen's decode kernel (contiguous, paged) and SDPA flash / cuDNN on each cache")
    args = ap.parse_args()
    b, lk, page = args.batch, args.lk, args.page
    head_bytes = D * args.elem
    if args.peers and args.elem != 2:
        ap.error("--peers times f16 caches: leave --elem at 2 (suite decode_quant times the quantized kernels)")
    n = lk // page
    kern = cp.RawModule(code=SOURCE, options=("-std=c++17", "-arch=sm_90a")).get_function("stream")
    kern.max_dynamic_shared_size_bytes = 227 * 1024
    i32 = np.int32
    g = torch.Generator(device="cuda").manual_seed(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    # (heads per block, rows per stage, stages, splits)
    variants = [(1, 128, 2, 2), (1, 64, 3, 2), (2, 64, 2, 4), (2, 64, 3, 4), (4, 32, 2, 8), (4, 32, 3, 8),
                (8, 16, 2, 16), (8, 16, 3, 16), (8, 8, 4, 16)]
    if args.elem == 1:  # attngen's quantized decode today: 128 keys a stage, 2 stages, 4 splits (2 blocks per SM)
        variants = [(1, 128, 2, 4), (1, 128, 3, 4), (1, 128, 4, 4), (1, 256, 2, 4), (1, 128, 2, 2), (2, 128, 2, 4),
                    (2, 64, 3, 8), (4, 64, 2, 8), (8, 32, 2, 16), (8, 16, 3, 16)]
    if args.peers:
        from torch.nn.attention import SDPBackend

        import attngen
        ours = {layout: attngen.compile(decode_spec(layout), target="cuda") for layout in ("contiguous", f"paged{page}")}
    out = cp.zeros(1 << 22, dtype=cp.uint32)
    times: dict = {}
    for a in range(args.allocations):
        k = randn((b * n, page, HKV, head_bytes // 2), generator=g)  # (f16 elements: head_bytes a head)
        v = torch.randn_like(k)
        nbytes = 2 * k.numel() * 2
        tables = {"contiguous": torch.arange(b * n, device="cuda", dtype=torch.int32),
                  "shuffled": torch.randperm(b * n, device="cuda", generator=g).to(torch.int32)}
        launches = {}
        for heads, rows, stages, splits in variants:
            blocks = b * splits * (HKV // heads)
            smem = stages * 2 * rows * heads * head_bytes + 4 * (n // splits)
            if smem > 227 * 1024:
                continue
            for name, table in tables.items():
                def launch(table=table, blocks=blocks, smem=smem, rows=rows, stages=stages, splits=splits,
                           heads=heads, k=k, v=v):
                    kern((blocks,), (128,), (np.uint64(k.data_ptr()), np.uint64(v.data_ptr()),
                                             np.uint64(table.data_ptr()), i32(n), i32(page), i32(splits), i32(rows),
                                             i32(stages), i32(heads), i32(head_bytes), out), shared_mem=smem)
                launches[f"| {heads} | {rows} | {stages} | {splits} | {blocks} | {name} "] = launch
        if args.peers:
            q = randn((b, 1, HKV * 4, D), generator=g)
            lens = torch.full((b,), lk, device="cuda", dtype=torch.int32)
            kc, vc = k.view(b, lk, HKV, D), v.view(b, lk, HKV, D)
            launches["| attngen | 128 | 2 | auto | | contiguous "] = ours["contiguous"].prepared(q, kc, vc, kv_lens=lens)
            launches["| attngen | 128 | 2 | auto | | shuffled "] = ours[f"paged{page}"].prepared(
                q, k, v, kv_lens=lens, block_table=tables["shuffled"].view(b, n))
            qt, kt, vt = q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2)
            for key, backend in (("sdpa flash", SDPBackend.FLASH_ATTENTION), ("sdpa cudnn", SDPBackend.CUDNN_ATTENTION)):
                def call(backend=backend, qt=qt, kt=kt, vt=vt):
                    return sdpa(qt, kt, vt, backend, enable_gqa=True)
                call()
                launches[f"| {key} | | | | | contiguous "] = call
        for _ in range(args.runs):
            for key, f in launches.items():
                times.setdefault(key, [[] for _ in range(args.allocations)])[a].append(
                    median_ms(f, 10, 100) * 1e3)
        del k, v, tables, launches
        torch.cuda.empty_cache()
    print(f"B{b} Lk{lk} page {page}, {head_bytes}-byte rows, {nbytes / 1e9:.2f} GB of K and V, {sms} SMs; us per call, the median of "
          f"{args.runs} runs on each of {args.allocations} cache(s)")
    print("| heads/block | rows/stage | stages | splits | blocks | pages | us per cache | TB/s (best) |")
    print("|---|---|---|---|---|---|---|---|")
    for key, per in times.items():
        meds = [sorted(ts)[len(ts) // 2] for ts in per]
        print(f"{key}| {' / '.join(f'{t:.1f}' for t in meds)} | {nbytes / min(meds) / 1e6:.2f} |", flush=True)


if __name__ == "__main__":
    main()
