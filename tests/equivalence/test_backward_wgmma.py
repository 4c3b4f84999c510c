"""The fast CUDA backward (issue 41; Hopper's wgmma family, dQ by atomic f32 reductions) against
attngen.reference_backward, at shapes that cross its tiles: several key blocks of 128 and query
steps of 64 (128 at head dim 64 with a named mask), odd lengths, Lq != Lk, GQA groups of 3, every
mask kind, softcap, packed sequences, kv_lens with hidden keys holding inf / NaN, custom masks
whose BlockMask tiles (80 keys) straddle its key blocks. Its results agree with the deterministic family's (`target cuda {
backward=deterministic }`) within the dtype's tolerance. Needs a Hopper GPU (sm_90); the sources
compile anywhere (tests/backends/cuda/test_backward_source.py).
"""

from __future__ import annotations

import numpy as np
import pytest

import attngen
from attngen.backends.cuda import backward as cuda_backward

from conftest import spec_of
from backward_helpers import check_backward, check_case, check_custom_mask_across_key_blocks, \
    check_families_agree, check_kv_lens_hidden_keys, check_nan_keys, check_packed, check_packed_next_sequence_nan, \
    device_mask, family_kernel, qkv


def _hopper(spec):
    return family_kernel(spec, "wgmma")


# (label, spec body, Hq, Hkv, Lq, Lk, B)
CASES = [
    ("f16 d128 none", "head_dim 128\n dtype f16", 2, 2, 257, 300, 2),
    ("bf16 d128 causal GQA 3", "head_dim 128\n dtype bf16\n mask causal", 6, 2, 300, 300, 1),
    ("f16 d64 causal Lq > Lk", "head_dim 64\n dtype f16\n mask causal", 4, 4, 1023, 129, 1),
    ("bf16 d64 bottom-right Lq < Lk GQA 3", "head_dim 64\n dtype bf16\n mask causal(bottom_right)", 3, 1, 7, 777, 2),
    ("f16 d128 window softcap scale", "head_dim 128\n dtype f16\n mask window(left=100, right=7)\n softcap 30\n"
     " scale 0.3", 2, 2, 513, 400, 1),
    ("bf16 qk128 v64 causal", "head_dim qk=128 v=64\n dtype bf16\n mask causal", 2, 1, 200, 200, 1),
    ("f16 qk64 v128 none one row", "head_dim qk=64 v=128\n dtype f16", 2, 2, 1, 300, 1),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_matches_reference(case):
    check_case(case, _hopper)


# Head dim 64 with a named mask walks steps of 128 query rows (wgmma_rows): lengths at and around
# the step's edges (1, 7, 113, 127, 129, 257), Lq != Lk both ways, GQA 3.
# (label, mask, Hq, Hkv, Lq, Lk, B)
STEPS_128 = [
    ("f16 none one row", "none", 2, 2, 1, 300, 1),
    ("bf16 causal 127 GQA 3", "causal", 3, 1, 127, 127, 1),
    ("f16 causal 129", "causal", 2, 2, 129, 129, 2),
    ("f16 none 257 GQA 3", "none", 3, 1, 257, 257, 1),
    ("bf16 window 300x400", "window(left=100, right=7)", 2, 2, 300, 400, 1),
    ("f16 bottom-right 113 < 300 GQA 3", "causal(bottom_right)", 3, 1, 113, 300, 1),
    ("bf16 bottom-right 300 > 129", "causal(bottom_right)", 2, 2, 300, 129, 1),
    ("f16 causal 7", "causal", 2, 2, 7, 7, 1),
]


@pytest.mark.parametrize("case", STEPS_128, ids=lambda c: c[0])
def test_head_dim_64_steps_of_128_rows(case):
    name, mask, hq, hkv, lq, lk, b = case
    spec = spec_of(f"head_dim 64\n dtype {name.split()[0]}\n mask {mask}")
    kernel = _hopper(spec)
    assert cuda_backward.wgmma_rows(kernel.plan) == 128
    check_backward(spec, *qkv(spec, np.random.default_rng(lq + lk), b, lq, lk, hq, hkv))


def test_head_dim_64_steps_of_128_rows_kv_lens_and_packed():
    """kv_lens with hidden keys holding inf / NaN, and packed sequences (a row step straddles two
    sequences' rows: the second sequence's rows get the first's zeros), at 128-row steps."""
    spec = spec_of("head_dim 64\n dtype f16\n mask causal(bottom_right)")
    kernel = _hopper(spec)
    assert cuda_backward.wgmma_rows(kernel.plan) == 128
    rng = np.random.default_rng(12)
    check_kv_lens_hidden_keys(spec, *qkv(spec, rng, 4, 200, 300, 6, 2), [0, 137, 300, 1])
    packed = spec_of("head_dim 64\n dtype bf16\n mask causal")
    check_packed(packed, [1, 70, 300, 0, 130], [1, 200, 300, 3, 0], rng)


@pytest.mark.parametrize("mask", ["causal(bottom_right)", "window(left=60)"])
def test_kv_lens_and_hidden_keys_holding_inf_and_nan(mask):
    spec = spec_of(f"head_dim 128\n dtype f16\n mask {mask}")
    _hopper(spec)
    check_kv_lens_hidden_keys(spec, *qkv(spec, np.random.default_rng(6), 4, 70, 300, 6, 2), [0, 137, 300, 1])


def test_masked_keys_holding_nan_reach_no_row_that_does_not_see_them():
    """Causal: key 200 holds NaN in k, key 201 inf in v. Rows before 200 do not see them: their dq
    is the reference's; the rows that do see them get NaN (NaN in, NaN out)."""
    spec = spec_of("head_dim 64\n dtype f16\n mask causal")
    kernel = _hopper(spec)
    rng = np.random.default_rng(9)
    q, k, v = qkv(spec, rng, 1, 260, 260, 2, 2)
    k[0, 200] = np.nan
    v[0, 201] = np.inf
    check_nan_keys(spec, kernel, q, k, v, rng, seen=slice(200, None), unseen=slice(None, 200))


@pytest.mark.parametrize("mask", ["causal", "window(left=90, right=3)"])
def test_packed_sequences(mask):
    spec = spec_of(f"head_dim 128\n dtype bf16\n mask {mask}")
    _hopper(spec)
    check_packed(spec, [1, 70, 300, 0, 130], [1, 200, 300, 3, 0], np.random.default_rng(5))


@pytest.mark.parametrize("body", ["head_dim 64\n dtype f16", "head_dim 128\n dtype f16\n mask causal",
                                  "head_dim 128\n dtype f16\n mask window(left=50, right=2)"])
def test_packed_rows_of_the_next_sequence_holding_nan_reach_no_gradient(body):
    """(head dim 64: steps of 128 rows)"""
    spec = spec_of(body)
    check_packed_next_sequence_nan(spec, _hopper(spec))


@pytest.mark.parametrize("kind", ["boolean per head", "additive"])
def test_custom_mask(kind):
    """The BlockMask's kv tiles (the forward's) straddle the key blocks of 128: each step tests the
    mask per element where any overlapped tile is partial or absent."""
    spec = spec_of("head_dim 128\n dtype f16\n mask custom")
    check_custom_mask_across_key_blocks(spec, _hopper(spec), kind)


@pytest.mark.parametrize("b, lq, lk", [(1, 65, 7), (2, 113, 7), (1, 300, 200)])
def test_custom_mask_steps_full_in_the_list_past_the_keys(b, lq, lk):
    """A step the key-block list calls full (every row of it sees every key: rows past a prefix)
    still tests the mask per element where the block reaches past Lk: its bits must be loaded
    (they were only for partial steps, and such steps read stale words: found by the prefix-LM
    expression's backward, Lq > Lk)."""
    spec = spec_of("head_dim 64\n dtype f16\n mask custom")
    kernel = _hopper(spec)
    rng = np.random.default_rng(lq + lk)
    q, k, v = qkv(spec, rng, b, lq, lk, 6, 2)
    prefix = rng.integers(0, lk, b)
    m = (np.arange(lk)[None, None] <= np.arange(lq)[None, :, None]) | (np.arange(lk)[None, None] < prefix[:, None, None])
    m = m[:, None]
    check_backward(spec, q, k, v, call={"mask": attngen.block_mask(device_mask(m), kernel)}, ref_kw={"mask": m})


def test_agrees_with_the_deterministic_family():
    """The same spec with backward=deterministic (CUDA cores, no atomics): the fast family within
    the dtype's tolerance of it."""
    body = "head_dim 64\n heads q=6 kv=2\n dtype f16\n mask causal"
    fast, slow = spec_of(body), spec_of(body + "\n target cuda { backward=deterministic }")
    _hopper(fast)
    check_families_agree(fast, slow, *qkv(fast, np.random.default_rng(11), 1, 300, 300, 6, 2))
