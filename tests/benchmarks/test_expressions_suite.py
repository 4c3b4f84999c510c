"""benchmarks/suite/expressions.py (suite `expressions`, issue 42) on the CPU: its rows, the
specs it times and the checker's refusals it records, and that its peers compute the spec's
function: FlexAttention (eager, float64, on the CPU) with the suite's score_mod / mask_mod and
block mask, SDPA with the suite's float attn_mask, and attngen's named equivalents, each against
attngen.reference of the row's spec on small inputs built by the suite's own input builders."""

from __future__ import annotations

import os
import sys
import warnings

import numpy as np
import pytest

import attngen
from attngen.reference import reference

from conftest import ROOT

torch = pytest.importorskip("torch")
SUITE = os.path.join(ROOT, "benchmarks", "suite")
if SUITE not in sys.path:
    sys.path.append(SUITE)  # appended: the suite's module names shadow nothing
import expressions  # noqa: E402

SMALL_L, SMALL_W = 160, 16  # ten 16-wide rows: the radius-7 neighbourhood leaves keys out


def test_rows():
    full = [label for label, _, _ in expressions.case_rows()]
    assert len(full) == 12 and len(set(full)) == 12
    assert "2d neighbourhood 64x64 L4096" in full and "2d neighbourhood 128x128 L16384" in full
    quick = [label for label, _, _ in expressions.case_rows(quick=True)]
    assert sorted(quick) == sorted(expressions.QUICK) and set(quick) <= set(full)


@pytest.mark.parametrize("label, case, seqlen", expressions.case_rows(), ids=lambda x: x if isinstance(x, str) else "")
def test_specs_plan_or_are_refused_with_the_checkers_message(label, case, seqlen, monkeypatch):
    spec = expressions.spec_of(case, seqlen)
    for body in (case.named, "mask none"):  # attngen's own kernels beside it always plan
        attngen.lower(expressions.spec_of(case, seqlen, body), "cuda", "cuda-sm90")
    # the suite's compile_or_refusal with the GPU's planner (CuPy is not here)
    monkeypatch.setattr(attngen, "compile", lambda s, target: attngen.lower(s, target, "cuda-sm90"))
    planned, refused = expressions.compile_or_refusal(spec)
    if refused is not None:  # (a refusal, where the CUDA target does not compile an expression yet)
        assert planned is None
        assert "error: target cuda (profile cuda-sm90): " in refused and refused.endswith("(issue 42)"), refused
        assert "\n" not in refused


def _small(case, batch=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn((batch, SMALL_L, expressions.HEADS, expressions.HEAD_DIM), generator=gen,
                           dtype=torch.float64).half().double() for _ in range(3))  # exact in f16
    inp = case.inputs(batch, SMALL_L, expressions.HEADS, gen, "cpu")
    return q, k, v, inp


@pytest.mark.parametrize("case", expressions.CASES, ids=lambda c: c.name)
def test_peers_compute_the_specs_function(case, monkeypatch):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    import torch.nn.functional as F
    monkeypatch.setitem(expressions.IMAGE_WIDTH, SMALL_L, SMALL_W)
    spec = expressions.spec_of(case, SMALL_L)
    q, k, v, inp = _small(case)
    batch = q.shape[0]
    expected = reference(spec, q.numpy(), k.numpy(), v.numpy(), **{n: t.numpy() for n, t in inp.items()})
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    inp = {n: t.double() if t.is_floating_point() else t for n, t in inp.items()}  # f32 values, f64 math
    # FlexAttention, as the suite calls it (eager here)
    sm, mm = case.score_mod(inp, SMALL_L), case.mask_mod(inp, SMALL_L)
    bm = (create_block_mask(mm, batch if case.per_batch else None, None, SMALL_L, SMALL_L, device="cpu")
          if mm is not None else None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager flex_attention's "use torch.compile" warning
        flex = flex_attention(qt, kt, vt, score_mod=sm, block_mask=bm).transpose(1, 2).numpy()
    np.testing.assert_allclose(flex, expected, rtol=1e-9, atol=1e-10)
    visible = expressions.dense_visible(mm, batch, SMALL_L, "cpu")
    if visible is not None:
        assert 0 < float(visible.double().mean()) < 1
    # SDPA given the bias as a float attn_mask
    if case.bias:
        bias = expressions.dense_bias(case, inp, batch, SMALL_L, expressions.HEADS, torch.float64, "cpu")
        sdpa = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=bias).transpose(1, 2).numpy()
        np.testing.assert_allclose(sdpa, expected, rtol=1e-9, atol=1e-10)
    # attngen's named equivalent: the same function where it has no score of its own to drop
    named = expressions.spec_of(case, SMALL_L, case.named)
    call = {"mask": visible[:, None].numpy()} if case.custom else {}
    if case.custom or not case.bias:
        got = reference(named, q.numpy(), k.numpy(), v.numpy(), **call)
        np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-10)


def test_the_suites_markdown_and_rows_say_refused():
    """A refused attngen row keeps its peers and prints as refused, with the checker's message."""
    row = {"suite": "expressions", "case": "alibi causal L4096 forward", "live_fraction": 0.5, "rel_err": None,
           "attngen": {"error": "x.attn:3:5: error: target cuda (profile cuda-sm90): ... (issue 42)",
                       "refused": True},
           "peers": {"flex": expressions._entry(1.0, 2e12), "attngen_plain": expressions._entry(2.0, 4e12)}}
    md = expressions.markdown([row])
    assert "| alibi causal L4096 forward | 0.500 | refused | 2000.0 | n/a | n/a | 2000.0 | - | n/a |" in md
    assert "- x.attn:3:5: error: target cuda" in md
    expressions._print(row)
