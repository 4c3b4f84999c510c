"""The sm_80 tensor-core backward (issue 41; mma.sync m16n8k16, dQ by f32 atomics:
templates/cuda/backward_mma.cu.j2) against attngen.reference_backward. The kernels are built with
profile cuda-sm80, so that they run on any GPU of compute capability 8.0 or newer, the H100
included (the family is chosen by the profile's forward math, mma, and compiled for the device's
arch): odd lengths crossing its key blocks of 64 and steps of 64 rows, Lq != Lk both ways, GQA
groups of 3, causal (both alignments), window, softcap, scale, kv_lens with hidden keys holding
inf / NaN, packed sequences, rows that see no key, f16 and bf16, head dims 32, 64, 96 and 128 (and
qk=128 v=64, qk=96 v=128). Its results agree with the deterministic family's within the dtype's tolerance. The sources
compile anywhere (tests/backends/cuda/test_backward_mma_source.py)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import spec_of
from backward_helpers import check_case, check_families_agree, check_kv_lens_hidden_keys, check_nan_keys, \
    check_packed, family_kernel, qkv


def _sm80(spec):
    """`spec`'s kernel built with profile cuda-sm80 (on this GPU's arch), its backward the mma family."""
    return family_kernel(spec, "mma", profile="cuda-sm80")


# (label, spec body, Hq, Hkv, Lq, Lk, B)
CASES = [
    ("f16 d64 none one row", "head_dim 64\n dtype f16", 2, 2, 1, 7, 2),
    ("f16 d64 none 7", "head_dim 64\n dtype f16", 2, 2, 7, 7, 1),
    ("bf16 d64 causal GQA 3 113", "head_dim 64\n dtype bf16\n mask causal", 6, 2, 113, 113, 1),
    ("f16 d128 none 300x400", "head_dim 128\n dtype f16", 2, 2, 300, 400, 2),
    ("bf16 d128 causal GQA 3 257", "head_dim 128\n dtype bf16\n mask causal", 3, 1, 257, 257, 1),
    ("f16 d64 causal Lq > Lk", "head_dim 64\n dtype f16\n mask causal", 4, 4, 300, 129, 1),
    ("bf16 d64 bottom-right Lq < Lk GQA 3", "head_dim 64\n dtype bf16\n mask causal(bottom_right)", 3, 1, 7, 257, 2),
    ("f16 d128 bottom-right Lq > Lk rows that see no key", "head_dim 128\n dtype f16\n mask causal(bottom_right)",
     2, 2, 257, 113, 1),
    ("f16 d128 window softcap scale", "head_dim 128\n dtype f16\n mask window(left=100, right=7)\n softcap 30\n"
     " scale 0.3", 2, 2, 300, 400, 1),
    ("bf16 d64 window left", "head_dim 64\n dtype bf16\n mask window(left=60)", 3, 3, 257, 257, 1),
    ("bf16 qk128 v64 causal GQA 3", "head_dim qk=128 v=64\n dtype bf16\n mask causal", 3, 1, 200, 200, 1),
    ("f16 d96 causal GQA 3", "head_dim 96\n dtype f16\n mask causal", 6, 2, 257, 300, 1),
    ("bf16 qk96 v128 softcap", "head_dim qk=96 v=128\n dtype bf16\n softcap 20", 2, 2, 113, 257, 1),
    ("f16 d32 window", "head_dim 32\n dtype f16\n mask window(left=30, right=5)", 3, 3, 300, 200, 2),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_matches_reference(case):
    check_case(case, _sm80)


@pytest.mark.parametrize("body", ["head_dim 128\n dtype f16\n mask causal(bottom_right)",
                                  "head_dim 64\n dtype bf16\n mask window(left=60)"])
def test_kv_lens_and_hidden_keys_holding_inf_and_nan(body):
    spec = spec_of(body)
    kernel = _sm80(spec)
    check_kv_lens_hidden_keys(spec, *qkv(spec, np.random.default_rng(6), 4, 70, 300, 6, 2), [0, 137, 300, 1],
                              kernel=kernel)


def test_masked_keys_holding_nan_reach_no_row_that_does_not_see_them():
    """Causal: key 200 holds NaN in k, key 201 inf in v. Rows before 200 do not see them: their dq
    is the reference's; the rows that do see them get NaN (NaN in, NaN out)."""
    spec = spec_of("head_dim 64\n dtype f16\n mask causal")
    kernel = _sm80(spec)
    rng = np.random.default_rng(9)
    q, k, v = qkv(spec, rng, 1, 260, 260, 2, 2)
    k[0, 200] = np.nan
    v[0, 201] = np.inf
    check_nan_keys(spec, kernel, q, k, v, rng, seen=slice(200, None), unseen=slice(None, 200))


@pytest.mark.parametrize("body", ["head_dim 128\n dtype bf16\n mask causal", "head_dim 64\n dtype f16\n"
                                                                              " mask window(left=90, right=3)"])
def test_packed_sequences(body):
    spec = spec_of(body)
    check_packed(spec, [1, 70, 300, 0, 130], [1, 200, 300, 3, 0], np.random.default_rng(5), kernel=_sm80(spec))


def test_agrees_with_the_deterministic_family():
    """The same spec with backward=deterministic (CUDA cores, no atomics) within the dtype's
    tolerance of each other."""
    body = "head_dim 64\n heads q=6 kv=2\n dtype f16\n mask causal"
    fast, slow = spec_of(body), spec_of(body + "\n target cuda { backward=deterministic }")
    fast_kernel = _sm80(fast)
    q, k, v = qkv(fast, np.random.default_rng(11), 1, 300, 300, 6, 2)
    check_families_agree(fast, slow, q, k, v, fast_kernel, family_kernel(slow, "fma", profile="cuda-sm80"))
