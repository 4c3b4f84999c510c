"""The CUDA backward of score and mask expressions over indices (issue 42; docs/backward.md), without
a GPU: both families' sources for expression specs compile (nvcc -cubin, sm_90a, and sm_80 for the
deterministic family) without a warning and hold the expression functions (mask_expr,
mask_expr_tile, score_expr, score_expr_ds), scores that read inputs too; `attngen check`'s lines;
what stays refused (`grad` inputs). The deterministic family's results are checked on the CPU by
tests/backends/cuda/test_backward_emulated.py; both families on a GPU by
tests/equivalence/test_backward_cuda_expr.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

import pytest

import attngen
from attngen.backends import get
from attngen.backends.cuda import backward

from conftest import spec_of

NVCC = shutil.which("nvcc")

GRID = "abs(q // 8 - k // 8) <= 1 && abs(q % 8 - k % 8) <= 1"  # a 2D neighbourhood on an 8-wide grid
ALIBI = "s - 0.25 * abs(q - k)"
GATED = "where(k % 2 == 0, s, sigmoid(s) * 3 + 0.1 * h)"

# (profile, family, head dims, dtype, mask, score, extra lines); the deterministic family's larger
# head dims take nvcc 10-20 s each, so they are left to the GPU tests.
CASES = [
    ("cuda-sm90", "wgmma", "128", "f16", GRID, ALIBI, ""),
    ("cuda-sm90", "wgmma", "64", "bf16", "k <= q && q - k < 64", None, ""),
    ("cuda-sm90", "wgmma", "128", "bf16", None, "5 * tanh(s / 4.5)", ""),
    ("cuda-sm90", "wgmma", "64", "f16", "custom", GATED, ""),
    ("cuda-sm90", "wgmma", "64", "f16", "causal", ALIBI, ""),
    ("cuda-sm90", "fma", "64", "f16", GRID, ALIBI, "target cuda { backward=deterministic }"),
    ("cuda-sm90", "fma", "64", "bf16", "custom", GATED, "target cuda { backward=deterministic }"),
    ("cuda-sm80", "fma", "64", "f32", GRID, ALIBI, ""),
    ("cuda-sm80", "fma", "qk=48 v=32", "f16", "k <= q && q - k < 64", "5 * tanh(s / 4.5)", ""),
    # scores that read inputs (ExprInputs, the kernels' last parameter): ALiBi, and a derivative that reads them
    ("cuda-sm90", "wgmma", "64", "bf16", "k <= q", "s * slopes[h] + bias[b, h, q, k]",
     "input slopes[h] bf16\ninput bias[b, h, q, k] f16"),
    ("cuda-sm90", "fma", "64", "f16", "causal", "s - slopes[h] * abs(q - k)",
     "input slopes[h] f32\ntarget cuda { backward=deterministic }"),
    # a mask and a score that both read inputs: the mask tested per element, as the forward does
    ("cuda-sm90", "wgmma", "64", "f16", "k <= q && doc[b, q] == doc[b, k]", "s - slopes[h] * abs(q - k)",
     "input doc[b, q] i32\ninput slopes[h] f32"),
]


def _plan(head_dim, dtype, mask, score, extra="", profile="cuda-sm90"):
    body = (f"head_dim {head_dim}\nheads q=6 kv=2\ndtype {dtype}\n" + (f"mask {mask}\n" if mask else "")
            + (f"score {score}\n" if score else "") + extra)
    return attngen.lower(spec_of(body, name="e"), "cuda", profile)


@pytest.mark.skipif(NVCC is None, reason="no nvcc on PATH")
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-d{c[2]}-{c[3]}-{c[4]}|{c[5]}")
def test_expression_backward_compiles(case):
    profile, family, head_dim, dtype, mask, score, extra = case
    plan = _plan(head_dim, dtype, mask, score, extra, profile)
    assert backward.family(plan) == family
    source = get("cuda").helper_sources(plan)["backward"]
    if mask not in (None, "causal", "custom"):
        assert ("bool mask_expr(" + ("const ExprInputs& in, " if "doc" in mask else "")
                + "int b, int h, int hkv, int q, int k, int Lq, int Lk)") in source
        assert "int mask_expr_tile(" in source
    if score is not None:
        assert f"// score {score}\n" in source and "// d score / d s = " in source
        reads = "s * slopes[h]" in score  # (then score_expr_ds reads them too: d/ds = slopes[h])
        assert ("float score_expr_ds(" + ("const ExprInputs& in, " if reads else "")
                + "float s, int b, int h, int hkv, int q, int k, int Lq, int Lk)") in source
        if "input" in extra:  # the dK/dV and dQ steps take the inputs as their last parameter
            assert source.count(", const __grid_constant__ ExprInputs in) {") == (1 if family == "wgmma" else 2)
        assert f"score {score}; " in source.split("\n*/")[0].replace("\n", " ").replace("//", "")  # the header
    arch = plan.details.arch
    tmp = tempfile.mkdtemp()
    path = os.path.join(tmp, "backward.cu")
    with open(path, "w") as f:
        f.write(source)
    run = subprocess.run([NVCC, "-cubin", "--std=c++17", f"-gencode=arch=compute_{arch.removeprefix('sm_')},code={arch}",
                          "-o", os.path.join(tmp, "out.cubin"), path], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "warning" not in run.stderr, run.stderr[-4000:]


def test_the_derivative_is_rendered():
    """d score / d s from attngen.plan.expr_grad, under a comment quoting it: ALiBi's is 1, tanh's
    1 - tanh^2, an integer one (`s * abs(q - k)`) converted to float."""
    for score, ds in ((ALIBI, "1.0"), ("5 * tanh(s / 4.5)", "1.1111111111111112 * (1.0 - tanh(s / 4.5) * tanh(s / 4.5))"),
                      ("s * abs(q - k)", "1.0 * abs(q - k)")):
        source = backward.render_backward(_plan("64", "f16", None, score))
        assert f"// d score / d s = {ds}\n" in source, score
    assert "return 1.0f * (float)(abs(q - k));" in source


def test_check_describes_the_expression_backward():
    for extra, rows in (("", 64), ("target cuda { backward=deterministic }", None)):
        plan = _plan("128", "f16", GRID, ALIBI, extra)
        text = "\n".join(get("cuda").describe_backward(plan))
        rows = rows or backward.backward_config(plan).tile
        assert f"the {rows}-row tiles from the first to the last the mask expression may show (mask_expr_tile)" in text
        assert "backward: none" not in text


def test_the_backward_of_inputs_and_what_stays_refused():
    """A score that reads inputs has a cuda backward (both families), a mask over inputs the `mask
    custom` one (the builder's BlockMask), a mask and a score that both read inputs the per-element
    one (as the forward); `grad` inputs are refused with the reason."""
    from attngen.plan.backward import problems
    cuda = get("cuda")
    alibi = spec_of("head_dim 64\ndtype f16\ninput slopes[h] f32\nscore s - slopes[h] * abs(q - k)", name="e")
    assert problems(alibi, expressions=cuda.backward_expressions) == []
    assert backward.backward_problems(attngen.lower(alibi, "cuda", "cuda-sm90")) == []
    docs = spec_of("head_dim 64\ndtype f16\ninput doc[b, q] i32\nmask k <= q && doc[b, q] == doc[b, k]", name="e")
    assert problems(docs, expressions=cuda.backward_expressions) == []
    grad = spec_of("head_dim 64\ndtype f16\ninput t[h] f32 grad\nscore s + t[h]", name="e")
    assert [p.message for p in problems(grad, expressions=cuda.backward_expressions)] == [
        "the gradient of `grad` input t is not computed by the backward kernels yet (issue 42)"]
    both = spec_of("head_dim 64\ndtype f16\ninput doc[b, q] i32\ninput slopes[h] f32\n"
                   "score s - slopes[h] * abs(q - k)\nmask k <= q && doc[b, q] == doc[b, k]", name="e")
    assert backward.backward_problems(attngen.lower(both, "cuda", "cuda-sm90")) == []