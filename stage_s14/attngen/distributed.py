"""attngen.distributed: context-parallel (ring) attention over torch.distributed (docs/distributed.md).

    import torch.distributed as dist, attngen, attngen.distributed
    dist.init_process_group("nccl")                       # or "gloo" on CPUs (WGSL kernels)
    kernel = attngen.compile(spec, target=...)
    out = attngen.distributed.ring_attention(kernel, q, k, v)   # this rank's shard of the sequence

Each rank holds one contiguous shard of the sequence (rank r: positions r S .. r S + S - 1 of q,
k and v, the same S on every rank). The K/V shards travel round the ring (rank r sends to
r + 1, receives from r - 1) with isend / irecv, overlapped with the kernel on the shard in
hand; the partial results are merged by their lse (attngen.merge) on the device, in f32. With
`mask causal` a shard from a later rank is skipped, the rank's own shard is attended causally
and earlier ones fully (the same spec with `mask none`, compiled once); with `mask window` each
pair of chunks runs the block the window reaches with its own window (window_block). torch.distributed is the
engine (NCCL between GPUs, gloo on CPUs); only point-to-point operations and one all-gather of
the specs' hashes and shapes (14 integers) are used: never NVLink or symmetric-memory multicast (the environment variables
below are set before any communicator exists).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os

import numpy as np

from .errors import LaunchError
from .merge import merge
from .plan.masks import window_block  # (the window's geometry is the masks' rule; exported here too)

# No NVLink SHARP / multicast objects in any process that imports this module (the project's
# rule for multi-GPU hosts): NCCL, PyTorch's symmetric memory and NVSHMEM read these at start.
for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                      ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_name, _value)

_VARIANTS: dict = {}  # (spec, target, profile, window) -> the spec's kernel with mask none or that window


def _dist():
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        raise LaunchError("attngen.distributed needs PyTorch (torch.distributed): pip install torch") from None
    if not dist.is_available() or not dist.is_initialized():
        raise LaunchError("attngen.distributed: initialise torch.distributed first "
                          "(torch.distributed.init_process_group('nccl' or 'gloo'))")
    return torch, dist


def _kernel_with(kernel, window=None):
    """The kernel's spec with `mask none` (window None) or `mask window(left, right)` (window a
    pair), compiled once for the same target."""
    from . import api
    key = (kernel.spec, kernel.target, kernel.plan.profile, window)
    if key not in _VARIANTS:
        mask = (dataclasses.replace(kernel.spec.mask, kind="none", left=None, right=None, bottom_right=False)
                if window is None else dataclasses.replace(kernel.spec.mask, kind="window", left=window[0],
                                                           right=window[1], bottom_right=False))
        _VARIANTS[key] = api.compile(dataclasses.replace(kernel.spec, mask=mask), target=kernel.target)
    return _VARIANTS[key]


def _as_torch(torch, x):
    """A torch tensor sharing x's memory (numpy arrays on the host; torch tensors as they are)."""
    return torch.from_numpy(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x.contiguous()


def _like(x, t):
    """t back in x's kind (numpy for numpy inputs)."""
    return t.numpy() if isinstance(x, np.ndarray) else t


def _f32(x):
    return x.astype(np.float32) if isinstance(x, np.ndarray) else x.float()


def _accumulate(out, lse, part, row0, row1=None):
    """Merge a kernel's (out, lse) into the running ones: all rows (row0 None) or rows row0 ..
    row1 - 1 (row1 None: to the end; zigzag: a second chunk's, windows: a block's). The first
    part seen is all rows."""
    o, l = part
    o = _f32(o)
    if out is None:  # (copies: later merges write rows of them in place)
        return o, (l.copy() if isinstance(l, np.ndarray) else l.clone())
    if not isinstance(out, np.ndarray):  # torch: in place, two passes over out (merge's stack is five)
        rows = slice(row0, row1)  # (all rows when row0 is None)
        _merge_into(out[:, rows], lse[:, :, rows], part)
        return out, lse
    if row0 is None:
        return merge([out, o], [lse, l])
    rows = slice(row0, row1)
    mo, ml = merge([out[:, rows], o], [lse[:, :, rows], l])
    out[:, rows] = mo
    lse[:, :, rows] = ml
    return out, lse


def _merge_into(out, lse, part):
    """attngen.merge of (out, lse) (f32 torch tensors, written in place) with a kernel's part (o, l):
    lse' = log(exp(lse) + exp(l)), out' = exp(lse - lse') out + exp(l - lse') o; rows neither saw
    keep out 0 and lse -inf (logaddexp(-inf, -inf) = -inf, and their weights are set to 0); a
    NaN lse gives NaN out and lse for its row (its weights are NaN), as merge does."""
    import torch
    o, l = part
    new = torch.logaddexp(lse, l)
    seen = new != -float("inf")  # NaN counts as seen: exp(x - NaN) = NaN poisons the row's out
    def weight(x):  # (..., H, L) -> (..., L, H, 1), 0 where no part saw a key
        return torch.where(seen, torch.exp(x - new), 0.0).transpose(-1, -2).unsqueeze(-1)
    out.mul_(weight(lse)).addcmul_(o, weight(l))
    lse.copy_(new)


def _nothing_seen(q, v, heads_q):
    """(out, lse) of rows that have seen no key yet: zeros and -inf, f32, of q's kind."""
    b, s = q.shape[0], q.shape[1]
    if isinstance(q, np.ndarray):
        return np.zeros((b, s, heads_q, v.shape[3]), np.float32), np.full((b, heads_q, s), -np.inf, np.float32)
    import torch
    return (torch.zeros((b, s, heads_q, v.shape[3]), dtype=torch.float32, device=q.device),
            torch.full((b, heads_q, s), float("-inf"), dtype=torch.float32, device=q.device))


def _check_ranks(torch, dist, group, kernel, q, k, v, world, cu_seqlens=None):
    """Every rank learns every rank's spec and shard shapes; any difference is the same
    LaunchError on every rank (no rank is left waiting in the ring). One all-gather of 14
    integers per call, on the group's device (q's for NCCL, the host for gloo), and one wait
    for its result (not all_gather_object: pickling, two collectives and two waits)."""
    spec_hash = int(hashlib.sha256(repr(kernel.spec).encode()).hexdigest()[:15], 16)
    target_hash = int(hashlib.sha256(kernel.target.encode()).hexdigest()[:15], 16)
    if cu_seqlens is not None:  # the boundaries too: every rank must pass the same (as part of the spec's word)
        spec_hash ^= int(hashlib.sha256(np.asarray(cu_seqlens, np.int64).tobytes()).hexdigest()[:15], 16)
    shapes = [(-1,) * (4 - len(x.shape)) + tuple(x.shape) for x in (q, k, v)]  # packed: (-1, S, H, D)
    words = [spec_hash, target_hash] + [int(n) for sh in shapes for n in sh]
    # NCCL gathers device tensors (q's device: the kernels of such a group take device tensors), gloo host ones
    device = q.device if dist.get_backend(group) == "nccl" and hasattr(q, "device") else torch.device("cpu")
    mine = torch.tensor(words, dtype=torch.int64, device=device)
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine, group=group)
    seen = [(w[0], w[1], tuple(w[2:6]), tuple(w[6:10]), tuple(w[10:14])) for w in torch.stack(gathered).cpu().tolist()]
    specs = {s[0] for s in seen}
    if len(specs) > 1:
        raise LaunchError(f"ring_attention: the ranks run different specs ({len(specs)} distinct): every rank "
                          "must call it with the same kernel" + (" and the same cu_seqlens" if cu_seqlens is not None
                                                                 else ""))
    if len({s[1] for s in seen}) > 1:
        raise LaunchError("ring_attention: the ranks use kernels of different targets")
    for what, i in (("q", 2), ("k", 3), ("v", 4)):
        shapes = [s[i] for s in seen]
        if len(set(shapes)) > 1:
            raise LaunchError(f"ring_attention: {what} shards differ between ranks ({', '.join(map(str, shapes))}): "
                              "every rank holds a contiguous shard of the same length")
    seq = 0 if cu_seqlens is not None else 1
    if q.shape[seq] != k.shape[seq]:
        raise LaunchError(f"ring_attention: each rank's q and k shards must cover the same positions (q has "
                          f"{q.shape[seq]} rows, k {k.shape[seq]})")


def zigzag_shard(x, rank: int, world: int, axis: int = 1):
    """Rank `rank`'s zigzag shard of a whole sequence x: its chunks rank and 2 world - 1 - rank of
    2 world equal chunks along `axis`, concatenated (numpy arrays and torch tensors)."""
    n = x.shape[axis]
    if n % (2 * world):
        raise LaunchError(f"zigzag_shard: the sequence length {n} is not a multiple of 2 x {world} ranks")
    c = n // (2 * world)
    idx = [slice(None)] * x.ndim
    parts = []
    for chunk in (rank, 2 * world - 1 - rank):
        idx[axis] = slice(chunk * c, (chunk + 1) * c)
        parts.append(x[tuple(idx)])
    return np.concatenate(parts, axis=axis) if isinstance(x, np.ndarray) else __import__("torch").cat(parts, dim=axis)


def ring_attention(kernel, q, k, v, *, group=None, return_lse: bool = False, layout: str = "contiguous",
                   cu_seqlens=None):
    """Attention over the whole sequence for this rank's shard of the queries (docstring of the
    module). q (B, S, Hq, Dqk), k / v (B, S, Hkv, D): this rank's shard, in the kernel's dtype,
    as the kernel takes them (CUDA tensors with NCCL; numpy arrays for WGSL kernels with gloo).
    layout "contiguous": rank r holds positions r S .. r S + S - 1; "zigzag" (causal masks: every
    rank gets the same work): the sequence is 2 W chunks of S / 2 and rank r holds chunks r and
    2 W - 1 - r, concatenated (zigzag_shard). Returns out (B, S, Hq, Dv) (and lse (B, Hq, S) with
    return_lse) in the same layout, of q's kind.

    Packed sequences: with `cu_seqlens` (B + 1 boundaries of the whole packed stream of T tokens,
    the same on every rank, on the host: a list, numpy array or CPU tensor), q (S, Hq, Dqk) and
    k / v (S, Hkv, D) are this rank's S = T / W consecutive tokens of the stream (contiguous
    layout; a sequence may span ranks) and attention stays inside each sequence (masks none and
    causal); out (S, Hq, Dv), lse (Hq, S)."""
    spec = kernel.spec
    packed = cu_seqlens is not None
    if packed:
        cu_seqlens = _host_boundaries(cu_seqlens)
        if layout != "contiguous":
            raise LaunchError("ring_attention: packed sequences (cu_seqlens) take the contiguous layout")
        if spec.mask.kind not in ("none", "causal"):
            raise LaunchError(f"ring_attention: mask {spec.mask.kind} with packed sequences (cu_seqlens) is not "
                              "supported yet (none and causal are); docs/distributed.md")
    if layout not in ("contiguous", "zigzag"):
        raise LaunchError(f"ring_attention: layout must be 'contiguous' or 'zigzag', not {layout!r}")
    if spec.mask.kind not in ("none", "causal", "window"):
        raise LaunchError(f"ring_attention: mask {spec.mask.kind} is not supported yet (none, causal and window "
                          "are); docs/distributed.md")
    if spec.kv_cache.is_paged:
        raise LaunchError("ring_attention: a paged KV cache is not a sequence shard (use kv_cache contiguous)")
    for name, x, dims in (("q", q, "Hq, Dqk"), ("k", k, "Hkv, Dqk"), ("v", v, "Hkv, Dv")):
        if len(getattr(x, "shape", ())) != (3 if packed else 4):
            raise LaunchError(f"ring_attention: {name} must be ({'' if packed else 'B, '}S, {dims})"
                              f"{' with cu_seqlens' if packed else ''}, got shape {tuple(getattr(x, 'shape', ()))}")
    torch, dist = _dist()
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if packed and int(cu_seqlens[-1]) != q.shape[0] * world:
        raise LaunchError(f"ring_attention: cu_seqlens ends at {int(cu_seqlens[-1])} tokens, but {world} ranks of "
                          f"{q.shape[0]} tokens hold {q.shape[0] * world}: every rank holds T / W consecutive tokens")
    try:
        return _ring(torch, dist, kernel, q, k, v, group, return_lse, layout, world, rank, cu_seqlens)
    except LaunchError:
        raise
    except RuntimeError as e:  # torch.distributed's errors (DistBackendError and timeouts among them)
        raise LaunchError(f"ring_attention on rank {rank} of {world}: the ring's communication failed (a rank "
                          f"that died, timed out or left the group?): {type(e).__name__}: {str(e)[:300]}") from None


def _host_boundaries(cu):
    """cu_seqlens of the whole packed stream as a host int64 array, checked (ascending from 0)."""
    if hasattr(cu, "device") and getattr(cu.device, "type", "cpu") != "cpu":
        raise LaunchError("ring_attention: cu_seqlens must be on the host (a list, numpy array or CPU tensor): the "
                          "ring cuts it into each step's boundaries")
    a = np.asarray(cu.numpy() if hasattr(cu, "numpy") else cu, dtype=np.int64)
    if a.ndim != 1 or a.size < 2 or a[0] != 0 or (np.diff(a) < 0).any():
        raise LaunchError("ring_attention: cu_seqlens must be 1-d, start at 0 and never decrease "
                          f"(got {a.tolist()[:8]}{' ...' if a.size > 8 else ''})")
    return a


def packed_pieces(cu, q_start: int, k_start: int, n: int):
    """The packed boundaries of one ring step: this rank's tokens q_start .. q_start + n - 1 and the
    key shard's k_start .. k_start + n - 1 of a stream whose sequences are cu (B + 1 boundaries).
    Returns (cu_q, cu_k): int32 boundaries over the same list of sequences (those that reach
    either range), each sequence's piece of the query shard and of the key shard (pieces may be
    empty; both tile their shard in order)."""
    first = int(np.searchsorted(cu, min(q_start, k_start), side="right")) - 1
    last = int(np.searchsorted(cu, max(q_start, k_start) + n - 1, side="right")) - 1
    first, last = max(first, 0), min(last, len(cu) - 2)
    bounds = cu[first:last + 2]
    cu_q = np.clip(bounds, q_start, q_start + n) - q_start  # (first 0, last n: bounds span both ranges)
    cu_k = np.clip(bounds, k_start, k_start + n) - k_start
    return cu_q.astype(np.int32), cu_k.astype(np.int32)


def _ring(torch, dist, kernel, q, k, v, group, return_lse, layout, world, rank, cu_seqlens=None):
    """ring_attention once the inputs are checked locally (see there)."""
    spec = kernel.spec
    _check_ranks(torch, dist, group, kernel, q, k, v, world, cu_seqlens)
    if layout == "zigzag" and q.shape[1] % 2:
        raise LaunchError(f"ring_attention: a zigzag shard is two equal chunks, but q has {q.shape[1]} rows")
    causal = spec.mask.kind == "causal"
    window = spec.mask.kind == "window"
    full = _kernel_with(kernel) if causal else kernel
    half = q.shape[1] // 2
    out = lse = None
    if window:
        # chunks of positions each rank holds: (global start, local start), n positions each
        n = half if layout == "zigzag" else q.shape[1]
        def chunks(r):
            if layout == "zigzag":
                return [(r * n, 0), ((2 * world - 1 - r) * n, n)]
            return [(r * n, 0)]
        out, lse = _nothing_seen(q, v, spec.heads_q)
    nxt = dist.get_global_rank(group, (rank + 1) % world) if group is not None else (rank + 1) % world
    prv = dist.get_global_rank(group, (rank - 1) % world) if group is not None else (rank - 1) % world
    kt, vt = _as_torch(torch, k), _as_torch(torch, v)
    for step in range(world):
        src = (rank - step) % world  # whose K/V shard is in hand
        pending = []
        if step < world - 1:  # pass it on while computing with it
            k_in, v_in = torch.empty_like(kt), torch.empty_like(vt)
            pending = dist.batch_isend_irecv([dist.P2POp(dist.isend, kt, nxt, group), dist.P2POp(dist.isend, vt, nxt, group),
                                              dist.P2POp(dist.irecv, k_in, prv, group), dist.P2POp(dist.irecv, v_in, prv, group)])
        kc, vc = _like(k, kt), _like(v, vt)
        if cu_seqlens is not None:  # packed: within each sequence; an earlier shard's keys are all seen (causal)
            n = q.shape[0]
            if not (causal and src > rank):
                cu_q, cu_k = packed_pieces(cu_seqlens, rank * n, src * n, n)
                kern = kernel if src == rank else full
                part = kern(q, kc, vc, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, return_lse=True)
                out, lse = _accumulate(out, lse, part, None)
        elif window:  # every (query chunk, key chunk) pair: the block of it the window sees
            for q_off, qa in chunks(rank):
                for k_off, ka in chunks(src):
                    blk = window_block(spec.mask.left, spec.mask.right, q_off, k_off, n)
                    if blk is None:
                        continue
                    q0, q1, k0, k1, a, b = blk
                    if (a, b) == (spec.mask.left, spec.mask.right):
                        kern = kernel
                    else:  # a = b = n - 1: every pair of the block, mask none
                        kern = _kernel_with(kernel, None if a == b == n - 1 else (a, b))
                    part = kern(q[:, qa + q0:qa + q1], kc[:, ka + k0:ka + k1], vc[:, ka + k0:ka + k1], return_lse=True)
                    out, lse = _accumulate(out, lse, part, qa + q0, qa + q1)
        elif not causal:
            out, lse = _accumulate(out, lse, kernel(q, kc, vc, return_lse=True), None)
        elif src == rank:  # its own positions: causal (zigzag too: chunk r, then chunk 2W-1-r)
            out, lse = _accumulate(out, lse, kernel(q, kc, vc, return_lse=True), None)
        elif layout == "contiguous":
            if src < rank:  # an earlier shard: every key is seen (a later one: none is)
                out, lse = _accumulate(out, lse, full(q, kc, vc, return_lse=True), None)
        elif src < rank:  # zigzag: both q chunks see all of the sender's first chunk, none of its second
            out, lse = _accumulate(out, lse, full(q, kc[:, :half], vc[:, :half], return_lse=True), None)
        else:  # zigzag, src > rank: the second q chunk sees both of the sender's chunks, the first none
            out, lse = _accumulate(out, lse, full(q[:, half:], kc, vc, return_lse=True), half)
        for req in pending:
            req.wait()
        if step < world - 1:
            kt, vt = k_in, v_in
    out = out.astype(q.dtype) if isinstance(q, np.ndarray) else out.to(q.dtype)
    return (out, lse) if return_lse else out


__all__ = ["packed_pieces", "ring_attention", "window_block", "zigzag_shard"]
