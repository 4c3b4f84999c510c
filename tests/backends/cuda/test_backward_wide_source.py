"""The fast CUDA backward at head dim 256 (issue 41; templates/cuda/backward_wgmma_wide.cu.j2,
docs/backward.md, "The fast family at head dim 256"): which specs the planner gives it, what
`attngen check` says, and NVRTC compiles for sm_90a with ptxas's registers and spills of the
dK/dV step (no GPU needed; the runs are tests/equivalence/test_backward_wide.py)."""

from __future__ import annotations

import re

import pytest

from attngen.api import lower
from attngen.backends import get
from attngen.backends.cuda import backward, nvrtc

from conftest import nvrtc_compile, spec_of


def _plan(body: str, profile: str = "cuda-sm90"):
    return lower(spec_of(body, name="w"), "cuda", profile)


def test_auto_and_fast_take_it_at_head_dim_256():
    for body in ("head_dim 256\n dtype f16\n mask causal", "head_dim 256\n heads q=6 kv=2\n dtype bf16\n mask custom",
                 "head_dim 256\n dtype f16\n target cuda { backward=fast }"):
        plan = _plan(body)
        assert backward.family(plan) == "wgmma" and backward.wide(plan), body
        assert backward.backward_problems(plan) == []
        assert backward.block_keys(plan) == 64
    source = backward.render_backward(_plan("head_dim 256\n dtype f16\n mask causal"))
    assert "m64n128k16" in source and "cp.reduce.async.bulk.tensor" in source
    assert "kBlockN = 64" in source and "static_assert(kSmemBytes == 224336" in source


def test_others_stay_on_the_deterministic_family():
    slow = _plan("head_dim 256\n dtype f16\n target cuda { backward=deterministic }")
    assert backward.family(slow) == "fma"
    for body in ("head_dim 256\n dtype f32", "head_dim qk=256 v=128\n dtype f16", "head_dim 192\n dtype bf16"):
        assert backward.family(_plan(body)) == "fma", body
    assert backward.family(_plan("head_dim 256\n dtype f16", "cuda-sm80")) == "fma"
    # expressions: the deterministic family, and `attngen check` says why
    expr = _plan("head_dim 256\n dtype f16\n mask k <= q\n score s - 0.5 * abs(q - k)")
    assert backward.family(expr) == "fma"
    text = "\n".join(get("cuda").describe_backward(expr))
    assert "not a fast family: the wgmma family: its kernel for head dim 256 takes no score or mask expression" in text
    refused = _plan("head_dim 256\n dtype f16\n score s * 0.5\n target cuda { backward=fast }")
    assert any("head dim 256 takes no score or mask expression" in p.message
               for p in backward.backward_problems(refused))


def test_check_describes_it():
    text = "\n".join(get("cuda").describe_backward(_plan("head_dim 256\n heads q=6 kv=2\n dtype bf16\n mask custom")))
    assert "fast: Hopper tensor cores" in text
    assert "grid (ceil(Lk / 64), Hkv, B) x 256 threads (2 warpgroups" in text
    assert "224336 bytes of shared memory (backward_wgmma_wide.cu.j2)" in text
    assert "per key block of 64, the steps of 64 rows that see it" in text
    assert "dQ's accumulator, 4 * B * Lq * Hq * 256 bytes" in text


def _dkdv_report(log: str) -> tuple[int, int]:
    """(registers, spill store bytes) of the dK/dV entry point in ptxas's report."""
    at = log.index("_bwd_dkdv' for 'sm_90a'")
    regs = int(re.search(r"Used (\d+) registers", log[at:]).group(1))
    spills = int(re.search(r"(\d+) bytes spill stores", log[at:]).group(1))
    return regs, spills


# (label, spec body, spill store bytes of dkdv at most: ptxas 13.5 through NVRTC)
COMPILED = [
    ("f16 causal", "head_dim 256\n dtype f16\n mask causal", 0),
    ("bf16 causal bottom-right GQA 3", "head_dim 256\n heads q=6 kv=2\n dtype bf16\n mask causal(bottom_right)", 0),
    ("f16 custom", "head_dim 256\n dtype f16\n mask custom", 32),
    ("bf16 window softcap scale",
     "head_dim 256\n dtype bf16\n mask window(left=100, right=7)\n softcap 30\n scale 0.3", 0),
]


@pytest.mark.skipif(not nvrtc.available(), reason="NVRTC not installed (pip install -e '.[test]')")
@pytest.mark.parametrize("case", COMPILED, ids=lambda c: c[0])
def test_it_compiles_for_sm_90a(case):
    _, body, most = case
    source = get("cuda").helper_sources(_plan(body))["backward"]
    assert "backward_wgmma_wide.cu.j2" in source
    cubin, log = nvrtc_compile(source, "sm_90a")
    assert cubin[:4] == b"\x7fELF"
    assert "warning" not in log.lower(), log
    regs, spills = _dkdv_report(log)
    print(f"{case[0]}: dkdv {regs} registers, {spills} bytes of spill stores")
    assert regs <= 255 and spills <= most, log
