"""Context-parallel attention on the GPUs of one host (issue 15): attngen's ring_attention vs one
GPU running the whole sequence with attngen. Started once per host; it starts one process per GPU.

    python3 benchmarks/context_parallel.py [--gpus 2] [--lens 32768,65536,131072,262144]

B 1, 32 heads, d128, f16, causal (zigzag layout) and full. Each process holds L / gpus positions; the ring's
time is the slowest rank's (events around the call, median of 5 after a warm-up). The one-GPU
row runs the whole sequence on GPU 0. Prints one JSON row per case (suite context_parallel,
peers one_gpu) for benchmarks/results/latest.json. NVLink multicast stays off (NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1: attngen.distributed sets them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import attngen
import attngen.distributed

H, D = 32, 128


def _kernel(mask: str):
    return attngen.compile(attngen.parse(f"attention cp_{mask} {{\n head_dim {D}\n heads q={H} kv={H}\n dtype f16\n"
                                         f" mask {mask}\n}}")[0], target="cuda")


def _time(fn, reps=5):
    fn()
    torch.cuda.synchronize()
    ms = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ms.append(a.elapsed_time(b))
    return statistics.median(ms)


def _rank(rank, world, lens, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    rows = []
    for mask in ("none", "causal"):
        kern = _kernel(mask)
        for L in lens:
            S = L // world
            g = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn((1, S, H, D), device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
            layout = "zigzag" if mask == "causal" else "contiguous"  # (random data: the shard's contents are moot)
            ms = torch.tensor([_time(lambda: attngen.distributed.ring_attention(kern, q, k, v, layout=layout))],
                              device="cuda")
            dist.all_reduce(ms, op=dist.ReduceOp.MAX)
            if rank == 0:
                one = None
                if torch.cuda.mem_get_info()[0] > 6 * L * H * D * 2:
                    qf, kf, vf = (torch.randn((1, L, H, D), device="cuda", dtype=torch.float16) for _ in range(3))
                    one = _time(lambda: kern(qf, kf, vf))
                    del qf, kf, vf
                flops = 4 * H * L * L * D / (2 if mask == "causal" else 1)
                row = {"suite": "context_parallel", "case": f"{'causal' if mask == 'causal' else 'full'} L{L} "
                       f"{world} ranks", "target": "cuda", "attngen": {"ms": round(float(ms), 4),
                       "tflops": round(flops / float(ms) / 1e9, 1)}, "peers": {}}
                if one is not None:
                    row["peers"]["one_gpu"] = {"ms": round(one, 4), "tflops": round(flops / one / 1e9, 1)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(rows, f, indent=1)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=torch.cuda.device_count())
    ap.add_argument("--lens", default="32768,65536,131072,262144")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "context_parallel.json"))
    args = ap.parse_args()
    if args.gpus < 2:
        raise SystemExit("context_parallel.py needs two GPUs or more")
    lens = [int(x) for x in args.lens.split(",")]
    mp.spawn(_rank, args=(args.gpus, lens, 29517, args.out), nprocs=args.gpus, join=True)


if __name__ == "__main__":
    main()
