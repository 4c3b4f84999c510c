"""The structured masks' geometry is one rule (attngen.plan.masks.diagonals): key_interval (the
reference, `attngen run`'s counts) and window_block (context parallelism's blocks,
attngen.distributed) both derive from it. These tests compare each with a visibility matrix
built by brute force from the mask's definition (docs/language.md), so neither can drift.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from attngen.lang.spec import Mask
from attngen.plan.masks import key_interval, visible, visible_pairs, window_block

MASKS = [Mask("causal"), Mask("causal", bottom_right=True), Mask("window", left=0, right=0),
         Mask("window", left=3, right=0), Mask("window", left=2, right=5), Mask("window", left=40, right=1),
         Mask("none")]


def _brute(mask: Mask, len_q: int, len_k: int) -> np.ndarray:
    """(Lq, Lk) visibility from the definition, pair by pair."""
    off = len_k - len_q
    out = np.zeros((len_q, len_k), bool)
    for i in range(len_q):
        for j in range(len_k):
            if mask.kind == "causal":
                out[i, j] = j <= i + (off if mask.bottom_right else 0)
            elif mask.kind == "window":
                out[i, j] = i + off - mask.left <= j <= i + off + mask.right
            else:
                out[i, j] = True
    return out


@pytest.mark.parametrize("mask", MASKS, ids=str)
def test_key_interval_is_the_definition(mask):
    for len_q, len_k in itertools.product((1, 2, 7, 13), (1, 5, 7, 20)):
        want = _brute(mask, len_q, len_k)
        lo, hi = key_interval(mask, np.arange(len_q), len_q, len_k)
        j = np.arange(len_k)[None, :]
        assert ((j >= lo[:, None]) & (j <= hi[:, None]) == want).all(), (len_q, len_k)
        got = visible(mask, len_q, len_k)
        assert (want.all() if got is None else (got == want).all())
        assert visible_pairs(mask, len_q, len_k) == int(want.sum())


@pytest.mark.parametrize("left, right, n", [(5, 0, 13), (17, 4, 13), (0, 0, 7), (9, 2, 7), (40, 40, 7), (0, 9, 5),
                                            (3, 3, 1), (6, 0, 6)])
def test_window_blocks_are_the_sequences_visibility(left, right, n):
    """Over a sequence of 6 chunks, every pair of chunks' block (window_block), run as the
    block's own `mask window(a, b)` (masks.visible), covers exactly the pairs the whole
    sequence's visibility matrix (brute force) has in that pair of chunks."""
    mask = Mask("window", left=left, right=right)
    total = 6 * n
    whole = _brute(mask, total, total)
    for q_off, k_off in itertools.product(range(0, total, n), repeat=2):
        want = whole[q_off:q_off + n, k_off:k_off + n]
        got = np.zeros((n, n), bool)
        blk = window_block(left, right, q_off, k_off, n)
        if blk is not None:
            q0, q1, k0, k1, a, b = blk
            m = q1 - q0
            assert m == k1 - k0 > 0 and 0 <= a and 0 <= b and (a < m and b < m or a == b == n - 1)
            got[q0:q1, k0:k1] = visible(Mask("window", left=a, right=b), m, m)
        assert (got == want).all(), (q_off, k_off, blk)
