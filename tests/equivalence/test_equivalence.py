"""Both targets compute the reference's function: every example, odd shapes, every variant.

CUDA runs where a GPU with CuPy is present (the GPU machine); WGSL runs on whatever wgpu
adapter is present (lavapipe in CI). Tolerances are docs/architecture.md's, by dtype.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import attngen
from attngen.api import lower as plan

from conftest import DESIGN_EXAMPLE, VARIANTS, check_against_reference, example_specs, random_qkv, require, spec_of

TARGETS = ["cuda", "wgsl"]
# (batch, Lq, Lk): single tokens, odd lengths, Lq != Lk both ways, a long key sequence.
SHAPES = [(1, 1, 1), (2, 7, 113), (1, 113, 7), (1, 33, 1023)]
GPU_SHAPES = SHAPES + [(1, 1023, 1023), (3, 257, 300)]


def _runnable(spec, target):
    """The spec as run on `target`: bf16 examples run as f16 on WGSL, after checking that the
    WGSL target refuses bf16 with a message that says why."""
    if target == "wgsl" and spec.dtype == "bf16":
        with pytest.raises(attngen.SpecError, match="WGSL has no bf16"):
            plan(spec, "wgsl", "webgpu-core")
        return dataclasses.replace(spec, dtype="f16")
    return spec


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("example", example_specs(), ids=lambda e: e[1].name)
def test_examples(example, target, request):
    require(target)
    _, spec = example
    spec = _runnable(spec, target)
    shapes = GPU_SHAPES if target == "cuda" else SHAPES
    if request.config.getoption("--tint-pass"):
        # the second pass, on Dawn, is for Tint's compile of each example's kernel: its shapes up to
        # 113 keys (several tiles, partial last tiles, Lq != Lk both ways); the 1023-key run of the
        # same module stays on lavapipe (half of each large example's time on SwiftShader)
        shapes = [s for s in shapes if s[2] <= 113]
    for i, (b, lq, lk) in enumerate(shapes):
        # big examples (DeepSeek-V3's 128 heads of 576 dims) skip the shapes whose float64
        # reference (and lavapipe run) would take minutes; their small shapes still run
        work = b * lq * lk * (spec.heads_q or 4) * (spec.head_dim_qk + spec.head_dim_v)
        if i > 1 and work > (4e9 if target == "cuda" else 3e8):
            continue
        q, k, v = random_qkv(spec, b, lq, lk, seed=i)
        check_against_reference(spec, target, q, k, v)


# VARIANTS (conftest.py): the language's generated features: dtypes, head dims, masks, softcap,
# scale, GQA groups (1, 4, 7), accumulators.
VARIANT_SHAPES = [(1, 1, 1), (1, 7, 113), (2, 113, 7), (1, 65, 200)]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v[0])
def test_variants(variant, target):
    require(target)
    label, body, hq, hkv = variant
    spec = spec_of(body, name="v")
    if target == "wgsl" and spec.dtype == "bf16":
        spec = _runnable(spec, target)
    for i, (b, lq, lk) in enumerate(VARIANT_SHAPES):
        q, k, v = random_qkv(spec, b, lq, lk, heads_q=hq, heads_kv=hkv, seed=100 + i)
        check_against_reference(spec, target, q, k, v)


@pytest.mark.parametrize("target", TARGETS)
def test_rows_that_see_no_key(target):
    """causal(bottom_right) with Lq > Lk: the first Lq - Lk rows see nothing -> 0, lse -inf."""
    require(target)
    spec = spec_of("head_dim 32\n dtype f16\n mask causal(bottom_right)")
    q, k, v = random_qkv(spec, 2, 40, 9, heads_q=2, heads_kv=1, seed=7)
    check_against_reference(spec, target, q, k, v)


@pytest.mark.parametrize("target", TARGETS)
def test_large_scores_do_not_overflow(target):
    """Scores far beyond exp's range still give a finite, correct softmax."""
    require(target)
    spec = spec_of("head_dim 64\n dtype f32\n mask causal")
    q, k, v = random_qkv(spec, 1, 50, 50, heads_q=2, heads_kv=2, seed=3, scale=12.0)
    check_against_reference(spec, target, q, k, v)


@pytest.mark.parametrize("target", TARGETS)
def test_output_is_fully_written(target):
    """A poisoned out= buffer is overwritten everywhere (no element left unwritten)."""
    require(target)
    from conftest import kernel_for, to_device
    spec = spec_of("head_dim 64\n dtype f16\n mask causal")
    q, k, v = random_qkv(spec, 2, 37, 51, heads_q=4, heads_kv=2, seed=5)
    dq, dk, dv = to_device(target, "f16", q, k, v)
    kernel = kernel_for(spec, target)
    if target == "wgsl":
        out = np.full((2, 37, 4, 64), np.nan, dtype=np.float16)
    else:
        import cupy
        out = cupy.full((2, 37, 4, 64), cupy.nan, dtype=cupy.float16)
    res = kernel(dq, dk, dv, out=out)
    assert res is out
    from conftest import _to_numpy
    assert not np.isnan(_to_numpy(out)).any()


@pytest.mark.parametrize("target", TARGETS)
def test_design_example(target):
    """The spec of the design example (conftest.DESIGN_EXAMPLE) builds and runs on both targets' devices."""
    require(target)
    spec = attngen.parse(DESIGN_EXAMPLE)[0]
    for i, (b, lq, lk) in enumerate([(1, 7, 113), (1, 130, 130)]):
        q, k, v = random_qkv(spec, b, lq, lk, seed=200 + i)
        check_against_reference(spec, target, q, k, v)


@pytest.mark.parametrize("target", TARGETS)
def test_f16_accumulator_overflow_gives_nan_not_a_wrong_answer(target):
    """With accumulate qk=f16, dot products beyond the f16 range used to saturate at +-65504: a
    finite, wrong output (relative errors of 0.6-17). Rows whose scores leave the range where f16
    sums hold the tolerance (attngen.plan.kernel_plan.F16_SCORE_BOUND) now come out NaN, lse
    too: undefined, never wrong. (Mesa's lavapipe computes f16 at f32 precision, so on CI this
    checks the bound; the GPU machine exercises real f16 overflow.)"""
    require(target)
    from conftest import _to_numpy, kernel_for, to_device
    spec = spec_of("head_dim 128\n dtype f16\n accumulate qk=f16 pv=f32\n mask causal")
    rng = np.random.default_rng(11)
    q, k, v = (np.abs(rng.standard_normal((1, 40, 2, 128))).astype(np.float32) * 100 for _ in range(3))
    out, lse = kernel_for(spec, target)(*to_device(target, "f16", q, k, v), return_lse=True)
    out, lse = _to_numpy(out), _to_numpy(lse)
    assert np.isnan(out).all() and np.isnan(lse).all()
