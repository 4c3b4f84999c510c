"""The schedules' rules, once: how rows are grouped into blocks, how many KV splits a launch
uses, and the workspaces' fill.

- fused: a block (workgroup) per tile of query rows of one query head.
- split_kv / two_pass: the key tiles of each row tile are divided over S blocks, whose partial
  results a combine merges. These schedules serve decode, so a block's rows are (query row,
  head in group) pairs of one KV head ("GQA packing": each K/V tile is read once per group),
  except with `mask custom`, whose block lists are per query head.

split_kv(N) uses N splits; split_kv(auto) and two_pass choose at launch from the run-time
shapes and the device's multiprocessors (compute units). The rule is one SplitRule
(split_rule_for(plan)): the runtimes call choose_splits, which applies it, and the manifests
print its numbers and its formula (SplitRule.fields, SplitRule.text), so foreign launchers apply
the same rule (tests/plan/test_split_rule.py evaluates the printed rule against choose_splits).
"""

from __future__ import annotations

from dataclasses import dataclass

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
    """KV splits: 1 for fused; N for split_kv(N); for split_kv(auto) and two_pass, the plan's
    SplitRule (split_rule_for): at most blocks_per_core(plan) blocks per multiprocessor of the
    device (`cores`), with at least MIN_TILES_PER_SPLIT key tiles per split and at most
    MAX_SPLITS splits. `plan`: the kernel's KernelPlan (its spec and tiles)."""
    sched = plan.spec.schedule
    if not sched.is_split:
        return 1
    if sched.splits is not None:
        return sched.splits
    return split_rule_for(plan).splits(batch, len_q, len_k, heads_q, heads_kv, cores)


def blocks_per_core(plan) -> int:
    """Blocks of the main kernel split_kv(auto) counts on per core: BLOCKS_PER_CORE, or fewer
    when the backend says fewer fit at once (one wave of blocks that all run beats a second).
    Every target's rule takes it from here (split_rule_for): WGSL plans leave resident_blocks
    at 0 (no target reckoning of what a compute unit holds), so theirs is BLOCKS_PER_CORE."""
    return min(BLOCKS_PER_CORE, plan.resident_blocks) if plan.resident_blocks else BLOCKS_PER_CORE


# The rule's formula, with the numbers (split_rule) or with the names of the manifest's fields
# (SplitRule.fields' note) in the braces: one text, so the two cannot say different things.
_S_FORMULA = ("S = min(max(1, floor({per_core} * compute_units / blocks)), "
              "max(1, floor(Lk / ({min_tiles} * {tile_kv}))), {max_splits})")


@dataclass(frozen=True)
class SplitRule:
    """split_kv(auto) / two_pass's choice of S (KV splits) for one plan, as numbers: what
    choose_splits computes and what the manifests print (fields(), text) for launchers
    outside Python. blocks: B * Hkv * ceil(Lq * G / tile_q) when rows_per_kv_head (GQA
    packing), else B * Hq * ceil(Lq / tile_q)."""

    blocks_per_core: int
    min_tiles_per_split: int
    max_splits: int
    tile_q: int
    tile_kv: int
    rows_per_kv_head: bool

    def blocks(self, batch: int, len_q: int, heads_q: int, heads_kv: int) -> int:
        """Blocks of the main kernel before the splits (at least one row tile per head)."""
        if self.rows_per_kv_head:  # the query heads of a GQA group are processed together (rows = Lq x group)
            group = heads_q // max(heads_kv, 1)
            return batch * heads_kv * max(1, -(-(len_q * group) // self.tile_q))
        # block lists are per query head: one head's rows per block
        return batch * heads_q * max(1, -(-len_q // self.tile_q))

    def splits(self, batch: int, len_q: int, len_k: int, heads_q: int, heads_kv: int, cores: int) -> int:
        """S for a launch of these sizes on a device of `cores` multiprocessors / compute units."""
        want = max(1, self.blocks_per_core * cores // max(self.blocks(batch, len_q, heads_q, heads_kv), 1))
        most = max(1, len_k // (self.min_tiles_per_split * self.tile_kv))
        return int(min(want, most, self.max_splits))

    @property
    def text(self) -> str:
        """The rule as a formula with its numbers, both row groupings given (manifests' "splits")."""
        return (_S_FORMULA.format(per_core=self.blocks_per_core, min_tiles=self.min_tiles_per_split,
                                  tile_kv=self.tile_kv, max_splits=self.max_splits)
                + f" with blocks = B * Hkv * ceil(Lq * (Hq / Hkv) / {self.tile_q}) "
                  f"(mask custom: B * Hq * ceil(Lq / {self.tile_q}))")

    def fields(self) -> dict:
        """The rule as a manifest's numbers, and a note with the formula over their names."""
        return {"blocks_per_core": self.blocks_per_core, "min_tiles_per_split": self.min_tiles_per_split,
                "max_splits": self.max_splits, "tile_q": self.tile_q, "tile_kv": self.tile_kv,
                "rows_per_kv_head": self.rows_per_kv_head,
                "note": _S_FORMULA.format(per_core="blocks_per_core", min_tiles="min_tiles_per_split",
                                          tile_kv="tile_kv", max_splits="max_splits")
                        + ", blocks = B * Hkv * ceil(Lq * G / tile_q) when rows_per_kv_head, else "
                          "B * Hq * ceil(Lq / tile_q)"}


def split_rule_for(plan) -> SplitRule:
    """The SplitRule of a plan (its tiles, its spec's row grouping, blocks_per_core(plan))."""
    return SplitRule(blocks_per_core(plan), MIN_TILES_PER_SPLIT, MAX_SPLITS, plan.tile_q, plan.tile_kv,
                     pack_gqa(plan.spec))


def split_rule(tile_q: int, tile_kv: int, per_core: int = BLOCKS_PER_CORE) -> str:
    """choose_splits as a formula, for manifests (S = KV splits of a launch): SplitRule.text for
    these numbers (split_rule_for(plan).text gives a plan's)."""
    return SplitRule(per_core, MIN_TILES_PER_SPLIT, MAX_SPLITS, tile_q, tile_kv, True).text
