"""The split schedules' K and V tiles in unpadded 128-byte rows with permuted 16-byte chunks
(CudaTiles.swizzle_kv, docs/cuda-variants.md): which plans take them, and what the source says.
Their results are checked on the GPU by the split and paged equivalence tests."""

from __future__ import annotations

import pytest

from attngen.api import emit_plan, get_profile
from attngen.api import lower as plan
from attngen.backends.cuda.config import cuda_config

from conftest import spec_of

DECODE = "heads q=32 kv=8\n dtype f16\n schedule split_kv(auto)"


@pytest.mark.parametrize("body, profile, swizzled", [
    (f"head_dim 128\n {DECODE}", "cuda-sm90", True),
    (f"head_dim 64\n {DECODE}", "cuda-sm80", True),
    (f"head_dim 256\n {DECODE}", "cuda-sm90", True),
    (f"head_dim 128\n {DECODE}\n kv_cache paged(page=16)", "cuda-sm90", True),
    (f"head_dim 128\n {DECODE}\n mask causal(bottom_right)\n kv_cache paged(page=64)", "cuda-sm80", True),
    ("head_dim 128\n heads q=32 kv=8\n dtype bf16\n schedule two_pass", "cuda-sm80", True),
    # not measured or not a whole number of 128-byte lines: the padded rows
    (f"head_dim 192\n {DECODE}", "cuda-sm90", False),
    (f"head_dim 96\n {DECODE}", "cuda-sm90", False),
    ("head_dim 128\n dtype f16", "cuda-sm80", False),                 # prefill
    ("head_dim 128\n dtype f32\n schedule split_kv(auto)", "cuda-sm80", False),  # f32: CUDA cores
    ("head_dim qk=576 v=512\n heads q=16 kv=1\n dtype bf16\n schedule split_kv(auto)", "cuda-sm90", False),
])
def test_which_plans_take_the_permuted_rows(body, profile, swizzled):
    cfg = cuda_config(spec_of(body, name="swz"), get_profile(profile, "cuda"))
    assert cfg.swizzle_kv is swizzled
    strides = {b.name: b.cols for b in cfg.buffers}
    if swizzled:  # unpadded: the rows are the head dims
        assert strides["sK"] == cfg.d_qk_pad and strides["sV"] == cfg.d_v_pad
        assert strides["sQ"] > cfg.d_qk_pad  # Q keeps its padded rows
    elif "sK" in strides:
        assert strides["sK"] > cfg.d_qk_pad


def test_the_source_says_so_and_uses_the_permutation_everywhere_it_reads_k_and_v():
    src = emit_plan(plan(spec_of(f"head_dim 128\n {DECODE}", name="swz"), "cuda", "cuda-sm90")).source
    assert "chunks permuted" in src and "constexpr bool kSwizzleKV = true;" in src
    assert src.count("^ key)") == 2  # the K and the V ldmatrix addresses
    assert "kv_at<kSwz, kStride>(r, col)" in src
    plain = emit_plan(plan(spec_of("head_dim 128\n dtype f16", name="plain"), "cuda", "cuda-sm80")).source
    assert "kSwizzleKV" not in plain and "kv_key" not in plain
