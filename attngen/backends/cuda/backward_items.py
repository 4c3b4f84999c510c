"""The persistent grid of the fast backward's dK/dV step (templates/cuda/backward_wgmma_dkdv.j2,
docs/backward.md "The fast family's persistent grid"): one block per SM, each taking work items
(key block, KV head, batch entry) x, x + grid, ... from an order fixed here.

The order: the (batch entry, KV head) pairs in chunks of `chunk` pairs, a chunk's items key block
by key block. With a causal mask (either alignment) the first key blocks have the most work (every
row after them sees them), so a chunk's longest items come first; its pairs are as many as keep
their Q, dO and f32 dQ accumulator within ORDER_BYTES of L2 (blocks working at once read the same
rows). Other masks take chunk = 1: every key block of a pair in turn, the order of a grid
(key blocks, Hkv, B).
"""

from __future__ import annotations

import ctypes

from ...plan.kernel_plan import KernelPlan

# The L2 share of a chunk of causal items (as the forward's causal_order_bytes: backends/cuda/tiles.py)
ORDER_BYTES = 16 << 20


class Work(ctypes.Structure):
    """The kernel's `Work` parameter (backward_wgmma_dkdv.j2), field for field."""
    _fields_ = [("n_items", ctypes.c_int), ("n_kb", ctypes.c_int), ("n_pairs", ctypes.c_int),
                ("heads_kv", ctypes.c_int), ("chunk", ctypes.c_int)]


def longest_first(plan: KernelPlan) -> bool:
    """Whether the key blocks' work falls with their index: a causal mask, either alignment."""
    return plan.spec.mask.kind == "causal"


def stage_next(plan: KernelPlan) -> bool:
    """Whether a block copies its next item's V_j, first step and K_j during an item's tail: not
    with a custom mask at head dim 128, where ptxas (NVRTC 13) then spills 224 bytes of stores in
    the dK/dV entry, 36 without."""
    return not (plan.spec.mask.is_custom and plan.d_qk > 64)


def chunk_pairs(plan: KernelPlan, len_q: int, group: int) -> int:
    """The (batch entry, KV head) pairs per chunk: 1, or for a causal mask as many as keep their
    query rows' Q, dO (f16 / bf16, the family's dtypes) and dQ accumulator (f32) within ORDER_BYTES."""
    if not longest_first(plan):
        return 1
    per_pair = max(1, len_q) * group * ((plan.d_qk + plan.d_v) * 2 + 4 * plan.d_qk)  # (f16 / bf16)
    return max(1, ORDER_BYTES // per_pair)


def work(plan: KernelPlan, n_kb: int, heads_kv: int, batch: int, len_q: int, group: int,
         sms: int) -> tuple[Work, tuple[int, int, int]]:
    """The Work parameter and the grid (blocks, 1, 1) of a launch with n_kb key blocks per pair and
    `sms` multiprocessors (one block each: the step takes most of an SM's shared memory)."""
    n_pairs = heads_kv * batch
    items = n_kb * n_pairs
    w = Work(items, n_kb, n_pairs, heads_kv, min(n_pairs, chunk_pairs(plan, len_q, group)) if n_pairs else 1)
    return w, (min(items, sms), 1, 1)


__all__ = ["ORDER_BYTES", "Work", "chunk_pairs", "longest_first", "stage_next", "work"]
