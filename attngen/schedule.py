"""KV splits of the split_kv / two_pass schedules: how many a launch uses.

split_kv(N) uses N; split_kv(auto) and two_pass choose at launch from the run-time shapes and
the device's multiprocessors (compute units). The runtimes call choose_splits; the emitters
print split_rule in manifests, so foreign launchers can apply the same rule.
"""

from __future__ import annotations

from .ir import KernelPlan

MAX_SPLITS = 64  # split_kv(auto) and two_pass never pick more; split_kv(N) is bounded by the language
# split_kv(auto) aims at this many blocks (workgroups) per multiprocessor (compute unit), rounded
# down: decode is bound by memory bandwidth, and one wave of blocks that all run at once beats a
# second, partial wave. Measured on the H100 (benchmarks/NOTES.md, decode B8 32q/8kv d128): 4
# splits (256 one-warp blocks on 132 SMs) 1.67 / 2.60 TB/s at Lk 4096 / 32768; 5 splits 1.37 /
# 1.86; 8 splits 1.26 / 1.72; 16 splits 1.29 / 2.01.
BLOCKS_PER_CORE = 2
MIN_TILES_PER_SPLIT = 2


def choose_splits(plan: KernelPlan, batch: int, len_q: int, len_k: int, heads_q: int, heads_kv: int,
                  cores: int) -> int:
    """KV splits: 1 for fused; N for split_kv(N); for split_kv(auto) and two_pass, at most
    BLOCKS_PER_CORE blocks per multiprocessor of the device (`cores`), with at least
    MIN_TILES_PER_SPLIT key tiles per split and at most MAX_SPLITS splits."""
    sched = plan.spec.schedule
    if sched.kind == "fused":
        return 1
    if sched.splits is not None:
        return sched.splits
    rows = plan.tile_q
    if plan.spec.mask.kind == "custom":  # block lists are per query head: one head's rows per block
        blocks = batch * heads_q * max(1, -(-len_q // rows))
    else:  # the query heads of a GQA group are processed together (rows = Lq x group)
        blocks = batch * heads_kv * max(1, -(-(len_q * (heads_q // max(heads_kv, 1))) // rows))
    want = max(1, BLOCKS_PER_CORE * cores // max(blocks, 1))
    most = max(1, len_k // (MIN_TILES_PER_SPLIT * plan.tile_kv))
    return int(min(want, most, MAX_SPLITS))


def split_rule(tile_q: int, tile_kv: int) -> str:
    """choose_splits as a formula, for manifests (S = KV splits of a launch)."""
    return (f"S = min(max(1, floor({BLOCKS_PER_CORE} * compute_units / blocks)), "
            f"max(1, floor(Lk / ({MIN_TILES_PER_SPLIT} * {tile_kv}))), {MAX_SPLITS}) with blocks = "
            f"B * Hkv * ceil(Lq * (Hq / Hkv) / {tile_q}) (mask custom: B * Hq * ceil(Lq / {tile_q}))")
