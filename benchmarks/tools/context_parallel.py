"""Context-parallel attention on the GPUs of one host (issue 15): attngen's ring_attention vs one
GPU running the whole sequence with attngen, and vs PyTorch's context_parallel (SDPA underneath,
its own ring) in the same run. Started once per host; it starts one process per GPU.

    python3 benchmarks/tools/context_parallel.py [--gpus 2] [--lens 32768,65536,131072,262144] [--heads 8]

B 1, H heads (default 8), d128, f16, causal (zigzag layout for attngen; PyTorch balances causal
shards its own way) and full. Each process holds L / gpus positions; a ring's time is the slowest
rank's (CUDA events around the call, median of --reps after a warm-up). The one-GPU row runs the
whole sequence on GPU 0. Before timing, the ring's output at the first length is gathered and
compared with the one-GPU output (rel. error in the row). Full rows also time the ring's kernels
alone (`kernels_alone_ms`: the same calls on the local shard, no transfer, no merge). Peak memory per rank of the ring call is
reported (O(L / ranks)). Prints one JSON row per case (suite context_parallel, peers one_gpu and
torch_context_parallel) for benchmarks/results/latest.json, and writes them to --out.

NVLink multicast stays off: NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and
NVSHMEM_DISABLE_NVLS=1 are set here before any process group exists (attngen.distributed sets them
too); nothing here calls cuMulticastCreate.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
os.environ.update(NO_MULTICAST)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import attngen  # noqa: E402
import attngen.distributed  # noqa: E402
from attngen.distributed import zigzag_shard  # noqa: E402

D = 128


def _kernel(mask: str, heads: int):
    return attngen.compile(attngen.parse(f"attention cp_{mask}_{heads} {{\n head_dim {D}\n heads q={heads} kv={heads}\n"
                                         f" dtype f16\n mask {mask}\n}}")[0], target="cuda")


def _time(fn, reps):
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


def _shard(x, rank, world, layout):
    if layout == "zigzag":
        return zigzag_shard(x, rank, world, axis=1).contiguous()
    s = x.shape[1] // world
    return x[:, rank * s:(rank + 1) * s].contiguous()


def _unshard(parts, world, layout):
    """The whole sequence from every rank's output shard (rank order)."""
    if layout == "contiguous":
        return torch.cat(parts, dim=1)
    half = parts[0].shape[1] // 2
    chunks = [None] * (2 * world)
    for r, p in enumerate(parts):
        chunks[r], chunks[2 * world - 1 - r] = p[:, :half], p[:, half:]
    return torch.cat(chunks, dim=1)


def _max_over_ranks(x: float) -> float:
    t = torch.tensor([x], device="cuda", dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def _torch_cp(mesh, L, heads, causal, reps):
    """PyTorch's context_parallel around F.scaled_dot_product_attention: (ms, backend) or (None, why)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    try:
        from torch.distributed.tensor.experimental import context_parallel
    except ImportError as e:
        return None, f"no context_parallel in torch {torch.__version__}: {e}"
    try:  # its causal load balancing refuses full attention ("Load balancing requires is_causal=True")
        from torch.distributed.tensor.experimental._attention import _cp_options
        _cp_options.enable_load_balance = causal
    except (ImportError, AttributeError):
        pass
    last = ""
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                          ("mem-eff", SDPBackend.EFFICIENT_ATTENTION)):
        g = torch.Generator(device="cuda").manual_seed(1)
        q, k, v = (torch.randn((1, heads, L, D), device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
        try:
            with sdpa_kernel(backend), context_parallel(mesh, buffers=(q, k, v), buffer_seq_dims=(2, 2, 2)):
                ms = _time(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), reps)
            return ms, name
        except Exception as e:  # noqa: BLE001  (a backend this torch's context_parallel refuses: try the next)
            last = f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
        finally:
            del q, k, v
            torch.cuda.empty_cache()
    return None, last


def _rank(rank, world, lens, heads, reps, port, out):
    os.environ.update(NO_MULTICAST, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    mesh = None
    try:
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cuda", (world,), mesh_dim_names=("cp",))
    except Exception as e:  # noqa: BLE001
        if rank == 0:
            print(f"no device mesh: {e}", flush=True)
    rows = []
    for mask in ("none", "causal"):
        kern = _kernel(mask, heads)
        layout = "zigzag" if mask == "causal" else "contiguous"
        for n, L in enumerate(lens):
            g = torch.Generator(device="cuda").manual_seed(0)
            whole = [torch.randn((1, L, heads, D), device="cuda", dtype=torch.float16, generator=g) for _ in range(3)]
            q, k, v = (_shard(x, rank, world, layout) for x in whole)
            rel_err = None
            if n == 0:  # the ring's result against one GPU's on the whole sequence
                mine = attngen.distributed.ring_attention(kern, q, k, v, layout=layout)
                parts = [torch.empty_like(mine) for _ in range(world)]
                dist.all_gather(parts, mine)
                if rank == 0:
                    ref = kern(*whole).float()
                    got = _unshard(parts, world, layout).float()
                    rel_err = float((got - ref).norm() / ref.norm())
            if rank != 0:
                del whole
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            ms = _max_over_ranks(_time(lambda: attngen.distributed.ring_attention(kern, q, k, v, layout=layout), reps))
            peak_gb = _max_over_ranks((torch.cuda.max_memory_allocated() - base) / 2**30)
            kernels_ms = None
            if mask == "none":  # the ring's kernels alone (world calls on the local shard; no transfer, no merge)
                def kernels_only():
                    for _ in range(world):
                        kern(q, k, v, return_lse=True)
                kernels_ms = _max_over_ranks(_time(kernels_only, reps))
            del q, k, v
            one = None
            if rank == 0:
                one = _time(lambda: kern(*whole), reps)
                del whole
            torch.cuda.empty_cache()
            dist.barrier()
            cp_ms, cp_how = (None, "no device mesh") if mesh is None else _torch_cp(mesh, L, heads, mask == "causal",
                                                                                    reps)
            if cp_ms is not None:
                cp_ms = _max_over_ranks(cp_ms)
            if rank == 0:
                flops = 4 * heads * L * L * D / (2 if mask == "causal" else 1)
                tf = lambda t: round(flops / t / 1e9, 1)  # noqa: E731
                row = {"suite": "context_parallel", "case": f"{'causal' if mask == 'causal' else 'full'} L{L} "
                       f"{world} ranks", "target": "cuda", "plan": f"ring_attention, layout {layout}, B1 H{heads} d{D} f16",
                       "attngen": {"ms": round(ms, 3), "tflops": tf(ms), "peak_gib_per_rank": round(peak_gb, 3)},
                       "peers": {"one_gpu": {"ms": round(one, 3), "tflops": tf(one)}}}
                if rel_err is not None:
                    row["rel_err"] = rel_err
                if kernels_ms is not None:
                    row["attngen"]["kernels_alone_ms"] = round(kernels_ms, 3)
                if cp_ms is not None:
                    row["peers"]["torch_context_parallel"] = {"ms": round(cp_ms, 3), "tflops": tf(cp_ms),
                                                              "sdpa_backend": cp_how}
                else:
                    row["torch_context_parallel_missing"] = cp_how
                row["speedup_vs_one_gpu"] = round(one / ms, 3)
                rows.append(row)
                print(json.dumps(row), flush=True)
    if rank == 0:
        meta = {"gpu": torch.cuda.get_device_name(0), "gpus": world, "torch": torch.__version__,
                "commit": os.environ.get("ATTNGEN_COMMIT", "unknown")}
        with open(out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=torch.cuda.device_count())
    ap.add_argument("--lens", default="32768,65536,131072,262144")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "context_parallel.json"))
    args = ap.parse_args()
    if args.gpus < 2:
        raise SystemExit("context_parallel.py needs two GPUs or more")
    lens = [int(x) for x in args.lens.split(",")]
    bad = [L for L in lens if L % (2 * args.gpus)]
    if bad:
        raise SystemExit(f"lengths must be multiples of 2 x {args.gpus} GPUs (the zigzag layout): {bad}")
    mp.spawn(_rank, args=(args.gpus, lens, args.heads, args.reps, 29517, args.out), nprocs=args.gpus, join=True)


if __name__ == "__main__":
    main()
