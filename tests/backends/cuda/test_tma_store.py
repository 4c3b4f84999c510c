"""The output through shared memory with a tensor store (CudaConfig.tma_store, config.py
CudaTiles.tma_store): the plan takes it where the staging buffer fits beside the ring; on the GPU the
stored rows match the reference, rows past Lq are not written, and a given out= with its own
strides is written where it says and nowhere else.
"""

from __future__ import annotations

import numpy as np
import pytest

from attngen.api import emit_plan, get_profile
from attngen.api import lower as plan
from attngen.backends.cuda.config import cuda_config

from conftest import check_against_reference, kernel_for, random_qkv, require, spec_of


@pytest.mark.parametrize("body, stored", [
    ("head_dim 128\n dtype f16\n mask window(left=100)", True),
    ("head_dim 128\n dtype bf16\n mask custom", True),
    ("head_dim 96\n dtype f16\n mask window(left=100)", True),
    ("head_dim 64\n dtype f16", False),                    # head dim 64: measured slower (config.py)
    ("head_dim 128\n dtype f16", False),                   # the ring takes the shared memory
    ("head_dim 128\n dtype f16\n mask causal", False),
    ("head_dim 128\n dtype f16\n softcap 30\n target cuda { producer=off }", False),  # no producer: Q by cp.async
    ("head_dim 128\n dtype f16\n mask window(left=100)\n target cuda { tma=off }", False),
])
def test_the_plan_stages_the_output_where_it_fits(body, stored):
    prof = get_profile("cuda-sm90", "cuda")
    c = cuda_config(spec_of(body), prof)
    assert c.tma_store is stored
    assert ("sO" in [b.name for b in c.buffers]) is stored and c.smem_bytes <= prof.limit("shared_memory_bytes")
    p = plan(spec_of(body), "cuda", "cuda-sm90")
    assert ("tmap_o" in [x.name for x in p.params]) is stored
    source = emit_plan(p).source
    assert ("tma_store_tile<64, kHeadDimVPad>(tmap_o" in source) is stored
    # (sm80 has no tensor copy engine)
    assert not cuda_config(spec_of(body), get_profile("cuda-sm80", "cuda")).tma_store


@pytest.mark.parametrize("body, hq, hkv", [
    ("head_dim 128\n dtype f16\n mask window(left=100)", 6, 2),
    ("head_dim 128\n dtype bf16\n mask custom", 4, 4),
])
def test_stored_rows_match_the_reference(body, hq, hkv):
    """Row tiles that end past Lq (300 rows: the last warpgroup's rows partly outside), several
    items per block (and Lq 1)."""
    require("cuda")
    spec = spec_of(body)
    assert plan(spec, "cuda", "cuda-sm90").config.tma_store
    for b, lq, lk in ((2, 300, 257), (1, 1, 70), (3, 129, 129)):
        q, k, v = random_qkv(spec, b, lq, lk, heads_q=hq, heads_kv=hkv, seed=lq)
        check_against_reference(spec, "cuda", q, k, v)


def test_a_given_out_with_its_own_strides_is_written_there_only():
    """out= a view into a larger tensor (heads 1..4 of 6, rows padded to 320): the kernel writes
    exactly that view (the tensor map takes out's strides); the rest keeps its sentinel."""
    require("cuda")
    import torch
    spec = spec_of("head_dim 128\n dtype f16\n mask window(left=100)")
    kernel = kernel_for(spec, "cuda")
    q, k, v = random_qkv(spec, 2, 300, 300, heads_q=4, heads_kv=2, seed=5)
    dq, dk, dv = (torch.from_numpy(np.ascontiguousarray(x)).to("cuda", torch.float16) for x in (q, k, v))
    big = torch.full((2, 320, 6, 128), 7.0, device="cuda", dtype=torch.float16)
    view = big[:, :300, 1:5]
    kernel(dq, dk, dv, out=view)
    want = kernel(dq, dk, dv)
    torch.cuda.synchronize()
    assert torch.equal(view, want)
    rest = big.clone()
    rest[:, :300, 1:5] = 7.0
    assert bool((rest == 7.0).all())
