"""When an index-only mask expression is better evaluated once into bits (issue 42): a plan-level,
target-neutral rule about the expression's tile classes; a target that has the path (cuda:
`target cuda { mask_expr=auto|inline|bits }`) decides with it whether a call runs

- *inline*: the spec's own kernel, which skips the tiles interval analysis hides, takes the full
  ones whole and evaluates the expression on every element of the partial ones; or
- *bits*: the block-mask builder of masks over inputs (mask_inputs.py) evaluates the expression
  once per call signature into a BlockMask, and the spec with `mask custom` runs on it, testing
  one staged bit per element of a partial tile instead of the expression.

Per element the bits cost less than any expression but the simplest, and the build is paid once
per signature, so the bits win where most live tiles are partial (a 2D neighbourhood: every live
tile is), and inline where most are full (`k <= q`, windows, sinks + window). `prefers_bits` is
the rule of `mask_expr=auto`; `fits` the memory bound of both `auto` and `bits`.
"""

from __future__ import annotations

import functools

import numpy as np

from .expr_blocks import FULL, PARTIAL, classify, index_only

# Below this many (row, key) pairs auto keeps the inline path: a short call's time is mostly its
# launch, and a build for each new pair of lengths is not worth it there.
MIN_PAIRS = 1 << 22  # e.g. 2048 x 2048
# At most this many elements in the byte mask the builder writes, (mask batch x mask heads x Lq x
# Lk): 512 MiB while the BlockMask is made, whose bits (an eighth: 64 MiB) the kernel then keeps.
MAX_ELEMENTS = 1 << 29
# The estimate classifies at most this many tiles: whole rows of query tiles, evenly spaced.
SAMPLE_TILES = 4096


def applies(spec) -> bool:
    """Whether the spec's mask is an index-only expression, the one kind this choice is about."""
    return spec.mask.kind == "expr" and index_only(spec.mask.expr)


@functools.lru_cache(maxsize=256)
def live_tiles(expr, len_q: int, len_k: int, tile_q: int, tile_k: int) -> tuple[int, int]:
    """(partial, full) live tiles of the mask expression at these lengths and tiles, every batch
    index and head together (classify's defaults): exact up to SAMPLE_TILES tiles, beyond that
    counted on evenly spaced whole rows of query tiles and scaled to all rows."""
    nq, nk = -(-len_q // tile_q), -(-len_k // tile_k)
    step = max(1, -(-nq * nk // SAMPLE_TILES))
    rows = range(0, nq, step)
    counts = {PARTIAL: 0, FULL: 0}
    for i in rows:
        q = (i * tile_q, min(len_q, (i + 1) * tile_q) - 1)
        for j in range(nk):
            c = classify(expr, q, (j * tile_k, min(len_k, (j + 1) * tile_k) - 1), len_q, len_k)
            if c in counts:
                counts[c] += 1
    scale = nq / len(rows)
    return int(round(counts[PARTIAL] * scale)), int(round(counts[FULL] * scale))


def prefers_bits(expr, len_q: int, len_k: int, tile_q: int, tile_k: int) -> bool:
    """`mask_expr=auto`'s rule at a call's lengths (the padded ones; the kernel's tiles): bits
    where the call has at least MIN_PAIRS pairs and more of its live tiles are partial than full."""
    if len_q * len_k < MIN_PAIRS:
        return False
    partial, full = live_tiles(expr, len_q, len_k, tile_q, tile_k)
    return partial > full


def elements(slices: tuple[int, int], len_q: int, len_k: int) -> int:
    """The builder's byte mask for (mask batch, mask heads) slices of Lq x Lk."""
    return int(np.prod((*slices, len_q, len_k), dtype=np.int64))


def fits(slices: tuple[int, int], len_q: int, len_k: int) -> bool:
    """Whether the bits path may build the mask of a call: at most MAX_ELEMENTS elements."""
    return elements(slices, len_q, len_k) <= MAX_ELEMENTS


def describe(spec, tile_q: int, tile_k: int, mode: str, length: int = 4096) -> str:
    """`attngen check`'s words for the choice at Lq = Lk = `length` (with the plan's tiles)."""
    partial, full = live_tiles(spec.mask.expr, length, length, tile_q, tile_k)
    bits = mode == "bits" or (mode == "auto" and prefers_bits(spec.mask.expr, length, length, tile_q, tile_k))
    how = ("bits: a generated builder evaluates the mask once per call signature into a BlockMask and the "
           "spec with mask custom runs on it (its partial tiles test bits)" if bits else
           "inline: this kernel (its partial tiles evaluate the expression per element)")
    rule = {"auto": f"mask_expr=auto: bits where a call has at least {MIN_PAIRS} pairs and more partial than full "
                    "live tiles", "bits": "mask_expr=bits", "inline": "mask_expr=inline"}[mode]
    return (f"{rule}; at Lq = Lk = {length}, {partial} partial and {full} full live tiles: {how}; a backward "
            "takes its forward's path; packed sequences, k_new/v_new, kv_lens on the GPU and masks above "
            f"{MAX_ELEMENTS} elements run inline")
