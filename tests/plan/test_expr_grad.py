"""attngen.plan.expr_grad: symbolic derivatives of score expressions (issue 42), simplified, and
the subgradients PyTorch's autograd takes at the points where a function is not differentiable."""

from __future__ import annotations

import numpy as np
import pytest

from attngen.lang.expr import Var, format_expr
from attngen.plan.expr_grad import derivative, input_derivatives, score_ds
from attngen.reference_expr import evaluate

from conftest import spec_of


def _score(body: str):
    return spec_of("head_dim 16\ndtype f32\n" + body).score


@pytest.mark.parametrize("body, ds", [
    ("input slopes[h] f32\nscore s - slopes[h] * abs(q - k)", "1.0"),
    ("score 30 * tanh(s / 30)", "1.0 - tanh(s / 30) * tanh(s / 30)"),
    ("score s * abs(q - k)", "abs(q - k)"),
    ("score -s + 2 * s", "1.0"),
    ("score sigmoid(s)", "sigmoid(s) * (1.0 - sigmoid(s))"),
    ("score exp(s / 2)", "0.5 * exp(s / 2)"),
    ("score log(s) + sqrt(s)", "1.0 / s + 1.0 / (2.0 * sqrt(s))"),
    ("score where(k <= q, s, 0.5 * s)", "where(k <= q, 1.0, 0.5)"),
    ("score s + floor(s) + q", "1.0"),
])
def test_derivatives_are_simplified(body, ds):
    assert format_expr(score_ds(_score(body))) == ds


def test_input_derivatives_one_per_distinct_read():
    score = _score("input t[h, 9] f32 grad\nscore s + t[h, q - k + 4] * 2 - t[h, 4] * s + t[h, q - k + 4]")
    got = [(format_expr(ld), format_expr(d)) for ld, d in input_derivatives(score, "t")]
    assert got == [("t[h, q - k + 4]", "3.0"), ("t[h, 4]", "-s")]
    assert format_expr(score_ds(score)) == "1.0 - t[h, 4]"


def test_subgradients_are_pytorchs():
    torch = pytest.importorskip("torch")
    xs = np.array([-2.0, -1.0, 0.0, 1.0, 2.0])
    cases = [("abs(s)", lambda s: s.abs()),
             ("max(s, 1)", lambda s: torch.maximum(s, torch.ones_like(s))),
             ("min(s, 1)", lambda s: torch.minimum(s, torch.ones_like(s))),
             ("max(s, s)", lambda s: torch.maximum(s, s)),
             ("clamp(s, -1, 1)", lambda s: s.clamp(-1, 1)),
             ("where(s > 0, s * s, -s)", lambda s: torch.where(s > 0, s * s, -s)),
             ("sqrt(s * s + 1)", lambda s: torch.sqrt(s * s + 1))]
    for text, fn in cases:
        e = _score(f"score {text}")
        ours = evaluate(derivative(e, Var("s", "real")), {"s": xs}, {}, np.ones(5, bool), "score")
        st = torch.tensor(xs, requires_grad=True)
        fn(st).sum().backward()
        np.testing.assert_allclose(np.broadcast_to(ours, xs.shape), st.grad.numpy(), err_msg=text)
