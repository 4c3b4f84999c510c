"""The fast CUDA backward at head dim 256 (issue 41; templates/cuda/backward_wgmma_wide.cu.j2:
blocks of 64 keys, steps of 64 rows split between two warpgroups, dQ by atomic f32 reductions)
against attngen.reference_backward, at shapes that cross its blocks and steps: lengths 1, 7, 113,
257, Lq != Lk both ways, GQA groups of 3, every mask kind, softcap and scale, packed sequences,
kv_lens with hidden keys holding inf / NaN, custom masks whose BlockMask tiles straddle the key
blocks, rows that see no key; f16 and bf16. Its results agree with the deterministic family's.
Needs a Hopper GPU (sm_90); the sources compile anywhere
(tests/backends/cuda/test_backward_wide_source.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import spec_of
from backward_helpers import check_case, check_custom_mask_across_key_blocks, check_families_agree, \
    check_kv_lens_hidden_keys, check_nan_keys, check_packed, check_packed_next_sequence_nan, family_kernel, qkv


def _wide(spec):
    return family_kernel(spec, "wgmma", wide=True)


# (label, spec body, Hq, Hkv, Lq, Lk, B)
CASES = [
    ("f16 none 257 x 300", "head_dim 256\n dtype f16", 2, 2, 257, 300, 2),
    ("bf16 causal GQA 3 300 x 400", "head_dim 256\n dtype bf16\n mask causal", 6, 2, 300, 400, 1),
    ("f16 causal Lq > Lk", "head_dim 256\n dtype f16\n mask causal", 3, 3, 400, 113, 1),
    ("bf16 bottom-right Lq < Lk GQA 3", "head_dim 256\n dtype bf16\n mask causal(bottom_right)", 3, 1, 7, 257, 2),
    ("f16 bottom-right rows that see no key", "head_dim 256\n dtype f16\n mask causal(bottom_right)", 2, 1, 113, 7, 1),
    ("f16 window softcap scale", "head_dim 256\n dtype f16\n mask window(left=100, right=7)\n softcap 30\n scale 0.3",
     2, 2, 300, 257, 1),
    ("bf16 none one row", "head_dim 256\n dtype bf16", 3, 1, 1, 113, 1),
    ("f16 causal seven", "head_dim 256\n dtype f16\n mask causal", 3, 1, 7, 7, 2),
    # softcap's one-pass recompute over a long walk: 9 steps per head, the heads of a group of 4
    # in turn (each step's last dQ box is added at the next step's top, at its own head and rows)
    ("bf16 none softcap GQA 4 520 x 130", "head_dim 256\n dtype bf16\n softcap 20", 4, 1, 520, 130, 1),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_matches_reference(case):
    check_case(case, _wide)


@pytest.mark.parametrize("mask", ["causal(bottom_right)", "window(left=60)"])
def test_kv_lens_and_hidden_keys_holding_inf_and_nan(mask):
    spec = spec_of(f"head_dim 256\n dtype f16\n mask {mask}")
    _wide(spec)
    check_kv_lens_hidden_keys(spec, *qkv(spec, np.random.default_rng(6), 4, 70, 300, 3, 1), [0, 137, 300, 1])


def test_masked_keys_holding_nan_reach_no_row_that_does_not_see_them():
    """Causal: key 100 holds NaN in k, key 101 inf in v. Rows before 100 do not see them: their dq
    is the reference's; the rows that do see them get NaN (NaN in, NaN out)."""
    spec = spec_of("head_dim 256\n dtype f16\n mask causal")
    kernel = _wide(spec)
    rng = np.random.default_rng(9)
    q, k, v = qkv(spec, rng, 1, 130, 130, 2, 2)
    k[0, 100] = np.nan
    v[0, 101] = np.inf
    check_nan_keys(spec, kernel, q, k, v, rng, seen=slice(100, None), unseen=slice(None, 100))


@pytest.mark.parametrize("mask", ["causal", "window(left=90, right=3)"])
def test_packed_sequences(mask):
    spec = spec_of(f"head_dim 256\n dtype bf16\n mask {mask}")
    _wide(spec)
    check_packed(spec, [1, 70, 257, 0, 130], [1, 200, 300, 3, 0], np.random.default_rng(5), hq=3, hkv=1)


@pytest.mark.parametrize("kind", ["boolean per head", "additive"])
def test_custom_mask(kind):
    """The BlockMask's kv tiles (the forward's) straddle the key blocks of 64: each step tests the
    mask per element where any overlapped tile is partial or absent."""
    spec = spec_of("head_dim 256\n dtype f16\n mask custom")
    check_custom_mask_across_key_blocks(spec, _wide(spec), kind)


def test_agrees_with_the_deterministic_family():
    body = "head_dim 256\n heads q=3 kv=1\n dtype f16\n mask causal"
    fast, slow = spec_of(body), spec_of(body + "\n target cuda { backward=deterministic }")
    _wide(fast)
    check_families_agree(fast, slow, *qkv(fast, np.random.default_rng(11), 1, 200, 200, 3, 1))



@pytest.mark.parametrize("mask", ["none", "causal"])
def test_packed_rows_of_the_next_sequence_holding_nan_reach_no_gradient(mask):
    spec = spec_of(f"head_dim 256\n dtype f16\n mask {mask}")
    check_packed_next_sequence_nan(spec, _wide(spec))
