"""`score C * tanh(s / C)` is planned as `softcap C`, and a mask expression that is a named mask as that
mask (attngen.plan.check.normalised; issue 42):
the same plan and the same kernels, forward and backward, on both targets."""

from __future__ import annotations

import dataclasses

import pytest

import attngen
from attngen.backends import get as get_backend
from attngen.plan.check import normalised

from conftest import spec_of


@pytest.mark.parametrize("target", ["wgsl", "cuda"])
@pytest.mark.parametrize("written", ["30 * tanh(s / 30)", "tanh(s / 30.0) * 30.0"])
def test_a_softcap_expression_gets_softcaps_plan_and_kernels(written, target):
    body = "head_dim 64\ndtype f16\nmask causal\n"
    a, b = spec_of(body + f"score {written}"), spec_of(body + "softcap 30")
    pa, pb = attngen.lower(a, target=target), attngen.lower(b, target=target)
    assert pa == pb and pa.spec.score is None and pa.softcap == 30.0
    assert len(pa.notes) == 1 and pa.notes[0].startswith(f"score {written} is planned as softcap 30 ") and not pb.notes
    assert attngen.emit(a, target=target).source == attngen.emit(b, target=target).source
    backend = get_backend(target)
    assert backend.helper_sources(pa)["backward"] == backend.helper_sources(pb)["backward"]


@pytest.mark.parametrize("score", ["30 * tanh(s / 29)", "30 * tanh(s / 30) + 1", "-30 * tanh(s / -30)",
                                   "30 * tanh(2 * s / 30)", "1e13 * tanh(s / 1e13)"])
def test_other_scores_stay_expressions(score):
    spec = spec_of(f"head_dim 64\ndtype f32\nscore {score}")
    assert normalised(spec) is spec


@pytest.mark.parametrize("target", ["wgsl", "cuda"])
@pytest.mark.parametrize("written, named", [
    ("k <= q", "causal"), ("q >= k", "causal"), ("k - q < 1", "causal"), ("2 * k <= 2 * q + 1", "causal"),
    ("k <= q && q >= k", "causal"),
    ("k <= q + Lk - Lq", "causal(bottom_right)"), ("k - Lk < q - Lq + 1", "causal(bottom_right)"),
    ("q + Lk - Lq - 1024 <= k && k <= q + Lk - Lq", "window(left=1024, right=0)"),
    ("k - (q + Lk - Lq) >= -20 && k - (q + Lk - Lq) <= 3", "window(left=20, right=3)")])
def test_a_mask_expression_that_is_a_named_mask_gets_its_plan_and_kernels(written, named, target):
    """plan.check.normalised: linear inequalities of q, k, Lq, Lk in any arrangement."""
    body = "head_dim 64\ndtype f16\n"
    a, b = spec_of(body + f"mask {written}"), spec_of(body + f"mask {named}")
    pa, pb = attngen.lower(a, target=target), attngen.lower(b, target=target)
    assert pa == pb and pa.spec.mask.kind != "expr"
    assert attngen.emit(a, target=target).source == attngen.emit(b, target=target).source
    assert pa.notes == (f"mask {written} is planned as mask {named} (the same pairs for every Lq and Lk: the named "
                        "mask's kernels)",) and pb.notes == ()


@pytest.mark.parametrize("mask", ["k < q", "k <= q + 1", "k <= q && q - k <= 1024",  # (top-left: no named window)
                                  "!(k > q)", "k <= q || k < 4", "k <= q + Lk - Lq && k >= q + Lk - Lq + 1",
                                  "q + Lk - Lq + 5 <= k && k <= q + Lk - Lq", "k <= q && h <= 3", "k * k <= q"])
def test_other_masks_stay_expressions(mask):
    spec = spec_of(f"head_dim 64\ndtype f32\nmask {mask}")
    assert normalised(spec) is spec and attngen.lower(spec, target="wgsl").notes == ()
