"""One rank of a ring-attention test (tests/distributed/test_ring.py starts W of them).

    python ring_worker.py RANK WORLD INIT_FILE CASE_JSON OUT_DIR

Builds the case's full q, k, v from its seed (every rank the same), takes this rank's contiguous
shard, runs attngen.distributed.ring_attention with gloo on the WGSL kernel (the software
adapter) — or, for a case with "target": "cuda", with NCCL on the CUDA kernel, one GPU per rank —
and writes out_RANK.npy / lse_RANK.npy, or error_RANK.txt with the LaunchError. CASE_JSON may
also be a list of cases, each with an "out" key: they run in turn in the one process group, each
writing into OUT_DIR/<its "out">/ (the suite's WGSL cases of one world size: one start of the
processes and of the group for all of them)."""

from __future__ import annotations

import datetime
import json
import os
import sys

import numpy as np
import torch.distributed as dist

import attngen
import attngen.distributed


def main():
    rank, world, init, case, out_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4]), sys.argv[5]
    cases = case if isinstance(case, list) else [case]
    target = cases[0].get("target", "wgsl")
    if target == "cuda":
        import torch
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", init_method=f"file://{init}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=60), device_id=torch.device("cuda", rank))
    else:
        dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=30))
    if "die" in case:
        dist.barrier()  # both ranks have finished joining the group
        if case["die"] == rank:  # a rank that dies before the ring
            os._exit(3)
    try:
        for one in cases:
            run_case(one, rank, world, target, os.path.join(out_dir, one.get("out", "")))
    finally:
        if "die" not in case:
            dist.destroy_process_group()
        else:
            # the peer is gone: leave without tearing the group down (gloo's threads may call
            # std::terminate at interpreter exit when a peer died, which made the test flaky under
            # load; what it checks, the error written above, is done)
            sys.stdout.flush()
            os._exit(0)


def run_case(case, rank, world, target, out_dir):
    """One case on this rank: its outputs (or its LaunchError) into out_dir."""
    os.makedirs(out_dir, exist_ok=True)
    spec = attngen.parse(case["spec"])[0]
    kernel = attngen.compile(spec, target=target)
    rng = np.random.default_rng(case["seed"])
    b, L, hq, hkv, d = case["B"], case["L"], case["Hq"], case["Hkv"], spec.head_dim_qk
    dt = np.float16 if spec.dtype == "f16" else np.float32

    def put(x):  # this rank's shard as the kernel takes it: numpy (WGSL), a CUDA tensor (NCCL)
        if target != "cuda":
            return x.astype(dt)
        import torch
        t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).cuda()
        return t.to({"f16": torch.float16, "bf16": torch.bfloat16}.get(spec.dtype, torch.float32))

    def get(y):
        return y.float().cpu().numpy() if hasattr(y, "cpu") else np.asarray(y, np.float32)
    if "cu_seqlens" in case:  # packed: the whole stream of L tokens, this rank's L / W of them
        q, k, v = (rng.standard_normal((L, h, d)).astype(np.float32) for h in (hq, hkv, hkv))
        S = L // world
        sl = slice(rank * S, (rank + 1) * S)
        try:
            out, lse = attngen.distributed.ring_attention(kernel, put(q[sl]), put(k[sl]), put(v[sl]),
                                                          return_lse=True, cu_seqlens=case["cu_seqlens"])
            np.save(os.path.join(out_dir, f"out_{rank}.npy"), get(out))
            np.save(os.path.join(out_dir, f"lse_{rank}.npy"), get(lse))
        except attngen.LaunchError as e:
            with open(os.path.join(out_dir, f"error_{rank}.txt"), "w") as f:
                f.write(str(e))
        return
    q, k, v = (rng.standard_normal((b, L, h, d)).astype(np.float32) for h in (hq, hkv, hkv))
    S = L // world
    sl = slice(rank * S, (rank + 1) * S)
    if case.get("uneven") and rank == 0:
        sl = slice(0, S - 1)
    layout = case.get("layout", "contiguous")
    if layout == "zigzag":
        qs, ks, vs = (attngen.distributed.zigzag_shard(x, rank, world) for x in (q, k, v))
    else:
        qs, ks, vs = q[:, sl], k[:, sl], v[:, sl]
    try:
        out, lse = attngen.distributed.ring_attention(kernel, put(qs), put(ks), put(vs), return_lse=True,
                                                      layout=layout)
        np.save(os.path.join(out_dir, f"out_{rank}.npy"), get(out))
        np.save(os.path.join(out_dir, f"lse_{rank}.npy"), get(lse))
    except attngen.LaunchError as e:
        with open(os.path.join(out_dir, f"error_{rank}.txt"), "w") as f:
            f.write(str(e))


if __name__ == "__main__":
    main()
