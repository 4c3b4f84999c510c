"""attngen.distributed.ring_attention (docs/distributed.md) in 2 and 3 processes with gloo on
the software adapter (WGSL kernels), against the float64 reference of the whole sequence.
Needs PyTorch (scripts/test.sh installs the CPU build) and a wgpu adapter."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import attngen
from attngen.reference import reference, relative_error, tolerance

from conftest import ROOT, require

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                                reason="this PyTorch has no gloo")

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ring_worker.py")


def _run(tmp_path, world, case, timeout=300, codes=None):
    init = tmp_path / "pg_init"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, WORKER, str(r), str(world), str(init), json.dumps(case), str(tmp_path)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    logs = []
    for r, p in enumerate(procs):
        out, _ = p.communicate(timeout=timeout)
        logs.append(out)
        assert p.returncode == (codes or {}).get(r, 0), "\n".join(logs)
    return logs


def _case_json(case):
    """The worker's case of a CASES / PACKED / NCCL entry."""
    name, world, body, *rest = case
    spec = attngen.parse("attention ring {\n" + body + "\n}")[0]
    c = {"spec": "attention ring {\n" + body + "\n}", "Hq": spec.heads_q, "Hkv": spec.heads_kv,
         "target": "cuda" if name.startswith("nccl") else "wgsl"}
    if len(rest) == 2:  # packed: total tokens, cu_seqlens
        return {**c, "seed": 5, "B": 1, "L": rest[0], "cu_seqlens": rest[1]}
    return {**c, "seed": 7, "B": rest[0], "L": rest[1], "layout": rest[2]}


def _outputs(tmp_path, case):
    """The folder holding the ranks' out_R.npy / lse_R.npy of `case`. The WGSL cases of one world
    size run together, in one group of worker processes (their start, PyTorch's import and gloo's
    rendezvous dominate a case's time), once for the session: the first test of that size runs
    them all into the suite's cache directory, which the pytest-xdist workers share, under a lock
    (as conftest.nvrtc_compile); the NCCL cases run each in its own group, into tmp_path."""
    import fcntl
    name, world = case[:2]
    if name.startswith("nccl"):
        _run(tmp_path, world, _case_json(case))
        return tmp_path
    folder = os.path.join(os.environ["ATTNGEN_CACHE_DIR"], f"tests-ring-{world}")
    os.makedirs(folder, exist_ok=True)
    with open(folder + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(os.path.join(folder, "done")):
            batch = [{**_case_json(c), "out": str(i)} for i, c in enumerate(CASES + PACKED) if c[1] == world]
            _run(tmp_path, world, batch, timeout=600)
            for c in batch:
                shutil.move(tmp_path / c["out"], os.path.join(folder, c["out"]))
            open(os.path.join(folder, "done"), "w").close()
    return os.path.join(folder, str((CASES + PACKED).index(case)))


CASES = [
    ("none f32 2 ranks", 2, "head_dim 32\n heads q=6 kv=2\n dtype f32", 1, 26, "contiguous"),
    ("causal f32 3 ranks", 3, "head_dim 32\n heads q=6 kv=2\n dtype f32\n mask causal", 2, 39, "contiguous"),
    ("causal f16 2 ranks gqa 3", 2, "head_dim 64\n heads q=6 kv=2\n dtype f16\n mask causal", 1, 14, "contiguous"),
    ("none f16 3 ranks", 3, "head_dim 64\n heads q=4 kv=4\n dtype f16", 1, 21, "contiguous"),
    ("causal zigzag f32 2 ranks", 2, "head_dim 32\n heads q=6 kv=2\n dtype f32\n mask causal", 1, 28, "zigzag"),
    ("causal zigzag f16 3 ranks", 3, "head_dim 64\n heads q=4 kv=2\n dtype f16\n mask causal", 2, 42, "zigzag"),
    # windows: narrower than a shard, wider than one (3 ranks of 13), with keys to the right, zigzag
    ("window f32 2 ranks", 2, "head_dim 32\n heads q=6 kv=2\n dtype f32\n mask window(left=5)", 1, 26, "contiguous"),
    ("window wide f16 3 ranks", 3, "head_dim 64\n heads q=6 kv=3\n dtype f16\n mask window(left=17, right=4)",
     2, 39, "contiguous"),
    ("window zigzag f32 3 ranks", 3, "head_dim 32\n heads q=4 kv=4\n dtype f32\n mask window(left=9, right=2)",
     1, 42, "zigzag"),
]


PACKED = [
    # (name, world, spec body, total tokens, cu_seqlens): sequences across rank boundaries, of one
    # token, one longer than a shard, and (3 ranks) one that spans all three
    ("packed causal f32 2 ranks", 2, "head_dim 32\n heads q=6 kv=2\n dtype f32\n mask causal", 30,
     [0, 1, 9, 22, 23, 30]),
    ("packed none f16 3 ranks", 3, "head_dim 64\n heads q=4 kv=2\n dtype f16", 33, [0, 5, 6, 33]),
    ("packed causal f16 3 ranks", 3, "head_dim 64\n heads q=7 kv=1\n dtype f16\n mask causal", 33,
     [0, 2, 12, 13, 32, 33]),
]


PACKED_NCCL = [
    ("nccl packed causal f16 2 ranks", 2, "head_dim 128\n heads q=8 kv=2\n dtype f16\n mask causal", 600,
     [0, 1, 250, 251, 590, 600]),
]


@pytest.mark.parametrize("case", PACKED + PACKED_NCCL, ids=lambda c: c[0])
def test_packed_sequences_across_ranks(case, tmp_path):
    """cu_seqlens over the whole stream, each rank T / W consecutive tokens: attention stays inside
    each sequence, also where a sequence spans ranks (vs the reference of the whole packed stream)."""
    name, world, body, total, cu = case
    cuda = name.startswith("nccl")
    if cuda and not _two_gpus():
        pytest.skip("NCCL cases need two CUDA GPUs with CuPy")
    require("cuda" if cuda else "wgsl")
    spec = attngen.parse("attention ring {\n" + body + "\n}")[0]
    folder = _outputs(tmp_path, case)
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((total, h, spec.head_dim_qk)).astype(np.float32)
               for h in (spec.heads_q, spec.heads_kv, spec.heads_kv))
    if spec.dtype == "f16":
        q, k, v = (x.astype(np.float16).astype(np.float32) for x in (q, k, v))
    cu = np.asarray(cu, np.int32)
    ref, ref_lse = reference(spec, q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, return_lse=True)
    out = np.concatenate([np.load(os.path.join(folder, f"out_{r}.npy")) for r in range(world)], axis=0)
    lse = np.concatenate([np.load(os.path.join(folder, f"lse_{r}.npy")) for r in range(world)], axis=1)
    assert relative_error(out, ref) <= tolerance(spec)
    assert np.abs(lse - ref_lse).max() <= 1e-2 * max(1.0, np.abs(ref_lse).max())


def test_packed_pieces():
    from attngen.distributed import packed_pieces
    cu = np.array([0, 1, 9, 22, 23, 30])
    # rank 1 of 2 (tokens 15 .. 29) against rank 0's keys (0 .. 14): sequences 2 .. 4 reach either
    cu_q, cu_k = packed_pieces(cu, 15, 0, 15)
    assert cu_q.tolist() == [0, 0, 0, 7, 8, 15] and cu_k.tolist() == [0, 1, 9, 15, 15, 15]
    cu_q, cu_k = packed_pieces(cu, 0, 0, 15)
    assert cu_q.tolist() == cu_k.tolist() == [0, 1, 9, 15]


@pytest.mark.parametrize("left, right, n", [(5, 0, 13), (17, 4, 13), (0, 0, 7), (9, 2, 7), (40, 40, 7)])
def test_window_blocks_cover_exactly_the_window(left, right, n):
    """window_block's square block with its window holds exactly the pairs of two chunks that
    the window sees, for every chunk offset (brute force)."""
    from attngen.distributed import window_block
    for q_off in range(0, 6 * n, n):
        for k_off in range(0, 6 * n, n):
            want = {(i, j) for i in range(n) for j in range(n) if -left <= (k_off + j) - (q_off + i) <= right}
            blk = window_block(left, right, q_off, k_off, n)
            if blk is None:
                assert not want, (q_off, k_off)
                continue
            q0, q1, k0, k1, a, b = blk
            assert q1 - q0 == k1 - k0 > 0
            got = {(q0 + i, k0 + j) for i in range(q1 - q0) for j in range(k1 - k0) if -a <= j - i <= b}
            assert got == want, (q_off, k_off, blk)


def _unshard(parts, world, layout, axis):
    """The whole sequence from the ranks' shards (zigzag: chunks r and 2W-1-r of rank r)."""
    if layout == "contiguous":
        return np.concatenate(parts, axis=axis)
    chunks = [None] * (2 * world)
    for r, p in enumerate(parts):
        a, b = np.split(p, 2, axis=axis)
        chunks[r], chunks[2 * world - 1 - r] = a, b
    return np.concatenate(chunks, axis=axis)


def _two_gpus() -> bool:
    return (torch.cuda.is_available() and torch.cuda.device_count() >= 2 and torch.distributed.is_nccl_available()
            and require_ok("cuda"))


def require_ok(target) -> bool:
    try:
        require(target)
        return True
    except pytest.skip.Exception:
        return False


# NCCL on two GPUs (the CUDA kernels), where the machine has them: skipped elsewhere
NCCL_CASES = [
    ("nccl none f16 2 ranks", 2, "head_dim 64\n heads q=6 kv=2\n dtype f16", 2, 256, "contiguous"),
    ("nccl causal zigzag bf16 2 ranks", 2, "head_dim 128\n heads q=8 kv=2\n dtype bf16\n mask causal", 1, 500,
     "zigzag"),
    ("nccl window f16 2 ranks", 2, "head_dim 64\n heads q=7 kv=1\n dtype f16\n mask window(left=100, right=9)", 1,
     402, "contiguous"),
]


@pytest.mark.parametrize("case", CASES + NCCL_CASES, ids=lambda c: c[0])
def test_ring_attention_equals_one_process(case, tmp_path):
    name, world, body, batch, length, layout = case
    cuda = name.startswith("nccl")
    if cuda and not _two_gpus():
        pytest.skip("NCCL cases need two CUDA GPUs with CuPy")
    require("cuda" if cuda else "wgsl")
    spec = attngen.parse("attention ring {\n" + body + "\n}")[0]
    folder = _outputs(tmp_path, case)
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((batch, length, h, spec.head_dim_qk)).astype(np.float32)
               for h in (spec.heads_q, spec.heads_kv, spec.heads_kv))
    if spec.dtype == "f16":
        q, k, v = (x.astype(np.float16).astype(np.float32) for x in (q, k, v))
    ref, ref_lse = reference(spec, q, k, v, return_lse=True)
    out = _unshard([np.load(os.path.join(folder, f"out_{r}.npy")) for r in range(world)], world, layout, 1)
    lse = _unshard([np.load(os.path.join(folder, f"lse_{r}.npy")) for r in range(world)], world, layout, 2)
    assert relative_error(out, ref) <= tolerance(spec)
    assert np.abs(lse - ref_lse).max() <= 1e-2 * max(1.0, np.abs(ref_lse).max())


def test_zigzag_shards():
    from attngen.distributed import zigzag_shard
    x = np.arange(12).reshape(1, 12, 1, 1)
    assert zigzag_shard(x, 0, 3).ravel().tolist() == [0, 1, 10, 11]
    assert zigzag_shard(x, 1, 3).ravel().tolist() == [2, 3, 8, 9]
    assert zigzag_shard(torch.from_numpy(x), 2, 3).flatten().tolist() == [4, 5, 6, 7]
    with pytest.raises(attngen.LaunchError, match="not a multiple of 2 x 5 ranks"):
        zigzag_shard(x, 0, 5)


def test_unequal_shards_are_an_error_on_every_rank(tmp_path):
    require("wgsl")
    body = "head_dim 32\n heads q=2 kv=2\n dtype f32"
    _run(tmp_path, 2, {"spec": "attention ring {\n" + body + "\n}", "seed": 1, "B": 1, "L": 16, "Hq": 2, "Hkv": 2,
                       "uneven": True})
    for r in range(2):
        text = (tmp_path / f"error_{r}.txt").read_text()
        assert "shards differ between ranks" in text, text


def test_a_rank_that_dies_is_an_error_on_the_others(tmp_path):
    """Rank 1 exits after joining the group: rank 0 gets a LaunchError (no hang past the
    group's timeout, 30 s in the worker)."""
    require("wgsl")
    body = "head_dim 32\n heads q=2 kv=2\n dtype f32"
    _run(tmp_path, 2, {"spec": "attention ring {\n" + body + "\n}", "seed": 1, "B": 1, "L": 16, "Hq": 2, "Hkv": 2,
                       "die": 1}, timeout=120, codes={1: 3})
    text = (tmp_path / "error_0.txt").read_text()
    assert "ring_attention on rank 0 of 2: the ring's communication failed" in text, text


def test_unsupported_inputs_are_refused_before_any_communication():
    import attngen.distributed as ad

    class Kernel:  # what ring_attention reads of a kernel before it communicates
        def __init__(self, body):
            self.spec = attngen.parse("attention w {\n" + body + "\n}")[0]
    with pytest.raises(attngen.LaunchError, match="mask custom is not supported yet"):
        ad.ring_attention(Kernel("head_dim 32\n dtype f32\n mask custom"), None, None, None)
    with pytest.raises(attngen.LaunchError, match="paged KV cache is not a sequence shard"):
        ad.ring_attention(Kernel("head_dim 32\n dtype f32\n kv_cache paged(page=16)"), None, None, None)
    with pytest.raises(attngen.LaunchError, match=r"q must be \(B, S, Hq, Dqk\)"):
        ad.ring_attention(Kernel("head_dim 32\n dtype f32"), np.zeros((3, 2)), None, None)
    with pytest.raises(attngen.LaunchError, match="packed sequences .cu_seqlens. take the contiguous layout"):
        ad.ring_attention(Kernel("head_dim 32\n dtype f32\n mask causal"), None, None, None, layout="zigzag",
                          cu_seqlens=[0, 4])
    with pytest.raises(attngen.LaunchError, match="mask window with packed sequences"):
        ad.ring_attention(Kernel("head_dim 32\n dtype f32\n mask window(left=3)"), None, None, None, cu_seqlens=[0, 4])
    with pytest.raises(attngen.LaunchError, match="never decrease"):
        ad.ring_attention(Kernel("head_dim 32\n dtype f32"), None, None, None, cu_seqlens=[0, 4, 2])
    with pytest.raises(attngen.LaunchError, match=r"q must be \(S, Hq, Dqk\) with cu_seqlens"):
        ad.ring_attention(Kernel("head_dim 32\n dtype f32"), np.zeros((1, 4, 2, 32)), None, None, cu_seqlens=[0, 4])
    x = np.zeros((1, 2, 2, 32))
    with pytest.raises(attngen.LaunchError, match=r"v must be \(B, S, Hkv, Dv\), got shape \(2, 32\)"):
        ad.ring_attention(Kernel("head_dim 32\n dtype f32"), x, x, np.zeros((2, 32)))
    if not torch.distributed.is_initialized():
        with pytest.raises(attngen.LaunchError, match="initialise torch.distributed"):
            ad.ring_attention(Kernel("head_dim 32\n dtype f32"), x, x, x)
