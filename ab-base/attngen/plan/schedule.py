"""The schedules' rules, once: how rows are grouped into blocks, how many KV splits a launch
uses, and the workspaces' fill.

- fused: a block (workgroup) per tile of query rows of one query head.
- split_kv / two_pass: the key tiles of each row tile are divided over S blocks, whose partial
  results a combine merges. These schedules serve decode, so a block's rows are (query row,
  head in group) pairs of one KV head ("GQA packing": each K/V tile is read once per group),
  except with `mask custom`, whose block lists are per query head.

split_kv(N) uses N splits; split_kv(auto) and two_pass choose at launch from the run-time
shapes and the device's multiprocessors (compute units). The runtimes call choose_splits;
the emitters print split_rule in manifests, so foreign launchers can apply the same rule.
"""

from __future__ import annotations

from ..lang.spec import AttentionSpec

MAX_SPLITS = 64  # split_kv(auto) and two_pass never pick more; split_kv(N) is bounded by the language
# split_kv(auto) aims at this many blocks (workgroups) per multiprocessor (compute unit), rounded
# down: decode is bound by memory bandwidth, and one wave of blocks that all run at once beats a
# second, partial wave. Measured on the H100 (benchmarks/NOTES.md, decode B8 32q/8kv d128): 4
# splits (256 one-warp blocks on 132 SMs) 1.67 / 2.60 TB/s at Lk 4096 / 32768; 5 splits 1.37 /
# 1.86; 8 splits 1.26 / 1.72; 16 splits 1.29 / 2.01.
BLOCKS_PER_CORE = 2  # at most; fewer when a block's shared memory leaves room for fewer (KernelPlan.resident_blocks)
MIN_TILES_PER_SPLIT = 2
# Written to every word of the workspaces that must show which rows a split wrote (a quiet NaN
# with an odd payload): a block that a driver cut short leaves it there, and the combine or the
# runtime notices (targets say where they use it).
WORKSPACE_FILL = 0x7FC0DEAD


def pack_gqa(spec: AttentionSpec) -> bool:
    """Split schedules process a GQA group's query heads together: a block's rows are
    (query row, head in group) pairs of one KV head. Not with `mask custom`, whose block lists
    are per query head."""
    return spec.schedule.is_split and not spec.mask.is_custom


def max_splits(spec: AttentionSpec) -> int:
    """The most KV splits a launch of `spec` uses: N of split_kv(N), else the auto bound."""
    return spec.schedule.splits or MAX_SPLITS


def row_blocks(spec: AttentionSpec, tile_q: int) -> tuple[str, str]:
    """(row tiles, heads) of the blocks of one sequence, as formulas: the x and y of the main
    grid before KV splits and output-column blocks."""
    if pack_gqa(spec):
        return f"ceil(Lq * G / {tile_q})", "Hkv"
    return f"ceil(Lq / {tile_q})", "Hq"


def main_grid(spec: AttentionSpec, tile_q: int, column_blocks: int = 1) -> tuple[str, str, str]:
    """The main kernel's grid as formulas. x: tiles of rows times splits (split index =
    x % S); y: heads (KV heads when GQA groups are packed) times output-column blocks,
    head-major; z: batch."""
    rows, heads = row_blocks(spec, tile_q)
    x = f"{rows} * S" if spec.schedule.is_split else rows
    y = f"{heads} * {column_blocks}" if column_blocks > 1 else heads
    return (x, y, "B")


def choose_splits(plan, batch: int, len_q: int, len_k: int, heads_q: int, heads_kv: int, cores: int) -> int:
    """KV splits: 1 for fused; N for split_kv(N); for split_kv(auto) and two_pass, at most
    BLOCKS_PER_CORE blocks per multiprocessor of the device (`cores`), with at least
    MIN_TILES_PER_SPLIT key tiles per split and at most MAX_SPLITS splits. `plan`: the kernel's
    KernelPlan (its spec and tiles)."""
    spec, tile_q, tile_kv = plan.spec, plan.tile_q, plan.tile_kv
    sched = spec.schedule
    if not sched.is_split:
        return 1
    if sched.splits is not None:
        return sched.splits
    group = heads_q // max(heads_kv, 1)
    if pack_gqa(spec):  # the query heads of a GQA group are processed together (rows = Lq x group)
        blocks = batch * heads_kv * max(1, -(-(len_q * group) // tile_q))
    else:  # block lists are per query head: one head's rows per block
        blocks = batch * heads_q * max(1, -(-len_q // tile_q))
    want = max(1, blocks_per_core(plan) * cores // max(blocks, 1))
    most = max(1, len_k // (MIN_TILES_PER_SPLIT * tile_kv))
    return int(min(want, most, MAX_SPLITS))


def blocks_per_core(plan) -> int:
    """Blocks of the main kernel split_kv(auto) counts on per core: BLOCKS_PER_CORE, or fewer
    when the backend says fewer fit at once (one wave of blocks that all run beats a second)."""
    return min(BLOCKS_PER_CORE, plan.resident_blocks) if plan.resident_blocks else BLOCKS_PER_CORE


def split_rule(tile_q: int, tile_kv: int, per_core: int = BLOCKS_PER_CORE) -> str:
    """choose_splits as a formula, for manifests (S = KV splits of a launch)."""
    return (f"S = min(max(1, floor({per_core} * compute_units / blocks)), "
            f"max(1, floor(Lk / ({MIN_TILES_PER_SPLIT} * {tile_kv}))), {MAX_SPLITS}) with blocks = "
            f"B * Hkv * ceil(Lq * (Hq / Hkv) / {tile_q}) (mask custom: B * Hq * ceil(Lq / {tile_q}))")
