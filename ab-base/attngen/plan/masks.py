"""The mask modes' rules, once, for everything on the Python side.

Which keys a query row sees (the reference and `attngen run` count them), the words that
describe a mask in generated headers, and the planner's clamping of window sizes. The kernels
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

from ..lang.spec import Mask

# Window sizes at or above this are unbounded for every sequence the runtimes accept
# (they refuse lengths above MAX_SEQ_LEN), and keep the kernels' index arithmetic in 32 bits.
MAX_SEQ_LEN = 2**30
WINDOW_CAP = 2**30


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
    if m.kind == "custom":
        return ("mask custom: a boolean or additive mask given at run time, applied per tile from a "
                "BlockMask's lists (empty tiles skipped, full tiles unmasked); keys j < Lk.")
    if m.kind == "causal" and not m.bottom_right:
        return "mask causal (top-left aligned, torch's is_causal): query i sees key j iff j <= i."
    if m.kind == "causal":
        return "mask causal(bottom_right): query i sees key j iff j <= i + (Lk - Lq)."
    return (f"mask window(left={m.left}, right={m.right}), bottom-right aligned: query i sees key j "
            f"iff i + (Lk - Lq) - {m.left} <= j <= i + (Lk - Lq) + {m.right}.")


def key_interval(mask: Mask, rows, len_q: int, len_k: int):
    """(lo, hi) arrays: row i sees the keys lo[i] <= j <= hi[i] (empty when hi < lo), within
    0 .. len_k - 1. A structured mask gives every row one interval; none and custom (whose
    elements are given at run time) give all keys."""
    i = np.asarray(rows, dtype=np.int64)
    off = len_k - len_q
    if mask.kind == "causal":
        lo, hi = np.zeros_like(i), i + (off if mask.bottom_right else 0)
    elif mask.kind == "window":
        lo, hi = i + off - mask.left, i + off + mask.right
    else:
        lo, hi = np.zeros_like(i), np.full_like(i, len_k - 1)
    return np.maximum(lo, 0), np.minimum(hi, len_k - 1)


def visible(mask: Mask, len_q: int, len_k: int) -> np.ndarray | None:
    """(Lq, Lk) boolean visibility of a structured mask (None: every key is visible)."""
    if mask.kind in ("none", "custom"):
        return None
    lo, hi = key_interval(mask, np.arange(len_q), len_q, len_k)
    j = np.arange(len_k)[None, :]
    return (j >= lo[:, None]) & (j <= hi[:, None])


def visible_pairs(mask: Mask, len_q: int, len_k: int) -> int:
    """How many (query, key) pairs the mask lets through (the work that counts as FLOPs; custom
    counts every pair). Each row sees one interval of keys: a sum over rows, in chunks."""
    if mask.kind in ("none", "custom"):
        return len_q * len_k
    total = 0
    for r0 in range(0, len_q, 1 << 20):
        lo, hi = key_interval(mask, np.arange(r0, min(len_q, r0 + (1 << 20))), len_q, len_k)
        total += int(np.maximum(hi - lo + 1, 0).sum())
    return total
