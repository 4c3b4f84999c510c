"""The mask modes' rules, once, for everything on the Python side.

Which keys a query row sees (diagonals, the one statement of the structured masks' rule:
key_interval and visible for the reference and `attngen run`, window_block for context
parallelism's blocks), the words that describe a mask in generated headers, and the planner's
clamping of window sizes. The kernels
carry the same rules in their own languages (the mask sections of templates/cuda/mask.j2 and
templates/wgsl/mask.j2: visible, key_range, tile_is_full), tested against these.

  none                 every key j < Lk
  causal               j <= i                      (top-left aligned, torch's is_causal)
  causal(bottom_right) j <= i + (Lk - Lq)
  window(left, right)  i + (Lk - Lq) - left <= j <= i + (Lk - Lq) + right
  custom               a mask tensor given at run time (attngen.runtime.blockmask)
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..lang.expr import format_expr
from ..lang.spec import Mask
from ..limits import MAX_SEQ_LEN

# Window sizes at or above this are unbounded for every sequence the runtimes accept
# (they refuse lengths above MAX_SEQ_LEN), and keep the kernels' index arithmetic in 32 bits.
WINDOW_CAP = MAX_SEQ_LEN


def clamp(mask: Mask) -> Mask:
    """The mask as the kernels hold it: window sizes capped at WINDOW_CAP."""
    if mask.kind != "window":
        return mask
    return replace(mask, left=min(mask.left, WINDOW_CAP), right=min(mask.right, WINDOW_CAP))


def hides_loaded_keys(mask: Mask) -> bool:
    """Whether some rows of a block may not see keys of a tile the kernel loads: every mask but
    none (which only bounds keys by Lk; the loads zero-fill rows past it). Such keys must
    contribute nothing whatever their values, inf and NaN included: the CUDA kernels' first pass
    cleans V of such tiles (partial tiles), their cleaning pass every tile."""
    return mask.kind != "none"


def describe(mask: Mask) -> str:
    """One sentence for source headers."""
    m = mask
    if m.kind == "none":
        return "mask none: every query row sees every key j < Lk."
    if m.kind == "expr":
        return (f"mask {format_expr(m.expr)}: query i sees key j iff j < Lk and the expression holds (positions "
                "0-based, top-left, within the sequence); every element is tested.")
    if m.kind == "custom":
        return ("mask custom: a boolean or additive mask given at run time, applied per tile from a "
                "BlockMask's lists (empty tiles skipped, full tiles unmasked); keys j < Lk.")
    if m.kind == "causal" and not m.bottom_right:
        return "mask causal (top-left aligned, torch's is_causal): query i sees key j iff j <= i."
    if m.kind == "causal":
        return "mask causal(bottom_right): query i sees key j iff j <= i + (Lk - Lq)."
    return (f"mask window(left={m.left}, right={m.right}), bottom-right aligned: query i sees key j "
            f"iff i + (Lk - Lq) - {m.left} <= j <= i + (Lk - Lq) + {m.right}.")


def diagonals(mask: Mask, len_q: int, len_k: int) -> tuple[int | None, int | None]:
    """The structured masks' rule, once: (lo, hi) such that row i sees key j iff
    lo <= j - i <= hi (None: no bound on that side but the keys 0 .. len_k - 1). causal:
    (None, 0), bottom_right (None, Lk - Lq); window: (Lk - Lq - left, Lk - Lq + right); none
    and custom (whose elements are given at run time): (None, None)."""
    off = len_k - len_q
    if mask.kind == "causal":
        return None, (off if mask.bottom_right else 0)
    if mask.kind == "window":
        return off - mask.left, off + mask.right
    return None, None


def key_interval(mask: Mask, rows, len_q: int, len_k: int):
    """(lo, hi) arrays: row i sees the keys lo[i] <= j <= hi[i] (empty when hi < lo), within
    0 .. len_k - 1. A structured mask gives every row one interval (diagonals); none and custom
    (whose elements are given at run time) give all keys."""
    i = np.asarray(rows, dtype=np.int64)
    d_lo, d_hi = diagonals(mask, len_q, len_k)
    lo = np.zeros_like(i) if d_lo is None else i + d_lo
    hi = np.full_like(i, len_k - 1) if d_hi is None else i + d_hi
    return np.maximum(lo, 0), np.minimum(hi, len_k - 1)


def window_block(left: int, right: int, q_off: int, k_off: int, n: int):
    """Where a chunk of n keys at position k_off of a sequence meets a chunk of n of its queries
    at q_off under `mask window(left, right)` (diagonals: one sequence, Lq = Lk, so key j_g is
    seen by query i_g iff -left <= j_g - i_g <= right). None: no pair is visible; else (q0, q1,
    k0, k1, a, b): query rows q0 .. q1 - 1 and keys k0 .. k1 - 1 of the chunks, a square block
    in which key j' is seen by row i' iff -a <= j' - i' <= b, so the block is `mask
    window(left=a, right=b)` (0 <= a, b < its size; a = b = n - 1: every pair, `mask none`).
    Context parallelism cuts its blocks with it (attngen.distributed)."""
    band_lo, band_hi = diagonals(Mask("window", left=left, right=right), n, n)
    d = k_off - q_off  # a chunk pair's j' - i' is the sequence's j - i less d
    lo, hi = max(band_lo - d, -(n - 1)), min(band_hi - d, n - 1)  # the visible j' - i' of the chunks
    if lo > hi:
        return None
    if lo > 0:  # keys after their queries only: the last n - lo keys, the first n - lo rows
        q0, q1, k0, k1, a, b = 0, n - lo, lo, n, 0, hi - lo
    elif hi < 0:  # keys before their queries only: the last n + hi rows, the first n + hi keys
        q0, q1, k0, k1, a, b = -hi, n, 0, n + hi, hi - lo, 0
    else:
        q0, q1, k0, k1, a, b = 0, n, 0, n, -lo, hi
    m = q1 - q0
    if a >= m - 1 and b >= m - 1:  # every pair of the block
        return q0, q1, k0, k1, n - 1, n - 1
    return q0, q1, k0, k1, min(a, m - 1), min(b, m - 1)


def visible(mask: Mask, len_q: int, len_k: int) -> np.ndarray | None:
    """(Lq, Lk) boolean visibility of a structured mask (None: every key is visible, or the
    mask is given at run time: custom, or an expression, which attngen.reference evaluates)."""
    if mask.kind in ("none", "custom", "expr"):
        return None
    lo, hi = key_interval(mask, np.arange(len_q), len_q, len_k)
    j = np.arange(len_k)[None, :]
    return (j >= lo[:, None]) & (j <= hi[:, None])


def visible_pairs(mask: Mask, len_q: int, len_k: int) -> int:
    """How many (query, key) pairs the mask lets through (the work that counts as FLOPs; custom
    counts every pair, as does an expression). Each row sees one interval of keys: a sum over
    rows, in chunks."""
    if mask.kind in ("none", "custom", "expr"):
        return len_q * len_k
    total = 0
    for r0 in range(0, len_q, 1 << 20):
        lo, hi = key_interval(mask, np.arange(r0, min(len_q, r0 + (1 << 20))), len_q, len_k)
        total += int(np.maximum(hi - lo + 1, 0).sum())
    return total
