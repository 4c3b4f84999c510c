"""The CUDA backward of score and mask expressions over indices (issue 42; docs/backward.md), without
a GPU: both families' sources for expression specs compile (nvcc -cubin, sm_90a, and sm_80 for the
deterministic family) without a warning and hold the expression functions (mask_expr,
mask_expr_tile, score_expr, score_expr_ds), scores that read inputs too; `attngen check`'s lines;
`grad` inputs (the fast family; grad_inputs_add run on the host against the reference), and what
stays refused. The deterministic family's results are checked on the CPU by
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
    ("cuda-sm90", "wgmma", "64", "f16", "custom", ALIBI, ""),  # (GATED here: 20 s of nvcc, two dK/dV entries)
    ("cuda-sm90", "wgmma", "64", "f16", "causal", ALIBI, ""),
    ("cuda-sm90", "fma", "64", "f16", GRID, ALIBI, "target cuda { backward=deterministic }"),
    ("cuda-sm90", "fma", "64", "bf16", "custom", GATED, "target cuda { backward=deterministic }"),
    ("cuda-sm80", "fma", "64", "f32", GRID, ALIBI, ""),
    ("cuda-sm80", "fma", "qk=48 v=32", "f16", "k <= q && q - k < 64", "5 * tanh(s / 4.5)", ""),
    # scores that read inputs (ExprInputs, the kernels' last parameter): a derivative that reads them and
    # `grad` inputs (ExprGrads, the fast family's dK/dV step), ALiBi
    ("cuda-sm90", "wgmma", "64", "bf16", "!(k > q)", "s * slopes[h] + bias[b, h, q, k]",
     "input slopes[h] bf16 grad\ninput bias[b, h, q, k] f16 grad"),
    ("cuda-sm90", "fma", "64", "f16", "causal", "s - slopes[h] * abs(q - k)",
     "input slopes[h] f32\ntarget cuda { backward=deterministic }"),
    # `grad` inputs read once per pair in the deterministic family (ExprGrads, its dK/dV step, no atomics)
    ("cuda-sm80", "fma", "64", "f16", "causal", "s + bias[b, hkv, q, k]", "input bias[b, hkv, q, k] f16 grad"),
    # ... and those many pairs read: partial sums per dK/dV block and the grads entry point
    ("cuda-sm80", "fma", "64", "f16", "causal", "s + t[h, clamp(k - q, -31, 31) + 31] - slopes[h] * abs(q - k)",
     "input t[h, 63] f32 grad\ninput slopes[h] f32 grad"),
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
            assert source.count(", const __grid_constant__ ExprInputs in") == (
                1 if family == "wgmma" else 2 + ("_bwd_grads(" in source))  # (the partial sums' entry)
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
    one (as the forward); `grad` inputs the fast family's (the deterministic one refuses them)."""
    from attngen.plan.backward import problems
    cuda = get("cuda")
    alibi = spec_of("head_dim 64\ndtype f16\ninput slopes[h] f32\nscore s - slopes[h] * abs(q - k)", name="e")
    assert problems(alibi, expressions=cuda.backward_expressions) == []
    assert backward.backward_problems(attngen.lower(alibi, "cuda", "cuda-sm90")) == []
    docs = spec_of("head_dim 64\ndtype f16\ninput doc[b, q] i32\nmask k <= q && doc[b, q] == doc[b, k]", name="e")
    assert problems(docs, expressions=cuda.backward_expressions) == []
    grad = spec_of("head_dim 64\ndtype f16\ninput t[h] f32 grad\nscore s + t[h]", name="e")
    assert problems(grad, expressions=cuda.backward_expressions) == []  # (the fast family: below)
    assert [p.message for p in problems(grad, expressions="inputs")] == [
        "the gradient of `grad` input t is not computed by this target's backward kernels yet (issue 42)"]
    both = spec_of("head_dim 64\ndtype f16\ninput doc[b, q] i32\ninput slopes[h] f32\n"
                   "score s - slopes[h] * abs(q - k)\nmask k <= q && doc[b, q] == doc[b, k]", name="e")
    assert backward.backward_problems(attngen.lower(both, "cuda", "cuda-sm90")) == []

# ---- `grad` inputs (the fast family): grad_inputs_add on the host against the reference --------------

GRADS = ("head_dim 16\ndtype f32\nheads q=3 kv=1\ninput slopes[h] f32 grad\ninput table[h, 9] f32 grad\n"
         "score s * slopes[h] + table[h, clamp(k - q, -4, 4) + 4]\nmask k <= q\n")


def test_grad_inputs_compile_in_the_fast_family_and_the_deterministic_one_sums_partials():
    plan = _plan("64", "f16", "k <= q", "s * slopes[h] + table[h, clamp(k - q, -4, 4) + 4]",
                 "input slopes[h] f32 grad\ninput table[h, 9] f32 grad")
    assert backward.family(plan) == "wgmma" and backward.backward_problems(plan) == []
    source = get("cuda").helper_sources(plan)["backward"]
    assert "struct ExprGrads {" in source and ", const __grid_constant__ ExprGrads grads) {" in source
    assert "// d score / d slopes[h] = s\n" in source
    assert any(ln.startswith("backward grad inputs: slopes (h), table (h, 9), f32, added into by the dK/dV step "
                             "with atomicAdd") for ln in get("cuda").describe_backward(plan))
    det = _plan("64", "f16", None, "s + t[h]", "input t[h] f32 grad\ntarget cuda { backward=deterministic }")
    assert backward.backward_problems(det) == [] and backward.partials(det)  # partial sums, no atomics
    source = get("cuda").helper_sources(det)["backward"]
    assert "atomicAdd" not in source and "_bwd_grads(const Args a" in source and "float* t_partials;" in source
    assert any(ln.startswith("backward grad input t: f32 partial sums, a slice of G words per dK/dV block")
               for ln in get("cuda").describe_backward(det))


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ on PATH")
def test_grad_inputs_add_sums_what_the_reference_does(tmp_path):
    """The rendered grad_inputs_add (expr_grads.py), called on the host for every visible pair with
    the float64 dS and s of numpy, step by step as the fast family's warpgroups walk them (64 rows x
    64 keys; grad_stage_flush after each: slopes[h] and the table are summed per step, in registers
    where the step's pairs all read one entry: the slope, the table past its clamp; the table's band
    through grad_band_pair, each pair as the second of its diagonal with nothing kept, one lane: the
    GPU tests check the sums over pairs and lanes), sums the `grad` inputs' gradients of
    attngen.reference_backward."""
    import ctypes

    import numpy as np

    from attngen.backends.cuda import expr as cuda_expr
    from attngen.backends.cuda import expr_grads
    from attngen.reference import reference, reference_backward
    spec = spec_of(GRADS, name="e")
    rng = np.random.default_rng(3)
    b, lq, lk, hq, d = 2, 70, 131, 3, 16
    q, k, v = rng.standard_normal((b, lq, hq, d)), rng.standard_normal((b, lk, 1, d)), rng.standard_normal((b, lk, 1, d))
    dout = rng.standard_normal((b, lq, hq, d))
    inputs = {"slopes": rng.random(hq).astype(np.float32), "table": rng.standard_normal((hq, 9)).astype(np.float32)}
    want = reference_backward(spec, q, k, v, dout, **inputs)[3]
    out = reference(spec, q, k, v, **inputs)
    s = np.einsum("bihd,bjd->bhij", q, k[:, :, 0]) / np.sqrt(d)
    i, j = np.arange(lq)[:, None], np.arange(lk)[None, :]
    table = inputs["table"][np.arange(hq)[:, None, None], (np.clip(j - i, -4, 4) + 4)[None]]  # (hq, lq, lk)
    score = s * inputs["slopes"][None, :, None, None] + table[None]
    score = np.where(j <= i, score, -np.inf)
    p = np.exp(score - score.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dp = np.einsum("bihd,bjd->bhij", dout, v[:, :, 0])
    dd = np.einsum("bihd,bihd->bhi", dout, out)[..., None]
    ds = np.ascontiguousarray(p * (dp - dd), np.float32)
    names = [x.name for x in spec.inputs]
    assert [(i.name, m, s) for i, m, _, s in expr_grads.staged_reads(spec)] == [("slopes", 1, 0), ("table", 1, 1)]
    prog = ("#include <cmath>\n#include <cstdlib>\nusing std::abs; using std::min; using std::max;\n"
            "#define __host__\n#define __device__\n#define __forceinline__ inline\n#define __shared__\n"
            "struct Dim { unsigned x; };\nstatic Dim threadIdx;\nconstexpr int kBlockM = 64;\n"
            "static long long n_atomic = 0;  // (every atomicAdd: here, only the flushes')\n"
            "inline float atomicAdd(float* p, float x) { ++n_atomic; const float old = *p; *p += x; return old; }\n"
            'extern "C" long long atomics() { return n_atomic; }\n'
            "inline void red_shared_add(float* p, float v) { *p += v; }\n"
            "inline float __shfl_xor_sync(unsigned, float, int) { return 0.0f; }  // (one thread holds the warp's sum)\n"
            "inline float __shfl_down_sync(unsigned, float, int) { return 0.0f; }\n"
            + "".join(h + "\n" for h in cuda_expr.helpers_of(spec.score, *expr_grads.derivatives(spec)))
            + cuda_expr.inputs_source(spec) + expr_grads.source(spec)
            + 'extern "C" void run(const float* ds, const float* s, int B, int H, int Lq, int Lk, '
            + ", ".join(f"const float* {n}, float* grad_{n}" for n in names) + ") {\n"
            + f"    const ExprInputs in{{{', '.join(names)}, B, H, 1, Lq, Lk, nullptr, 0}};\n"
            + f"    const ExprGrads g{{{', '.join('grad_' + n for n in names)}}};\n"
            + "    float* sums = &grad_sums[0][0][0];\n    grad_stage_zero();\n"
            + "    for (int b = 0; b < B; ++b) for (int h = 0; h < H; ++h)\n"
            + "    for (int q0 = 0; q0 < Lq; q0 += kBlockM) for (int k0 = 0; k0 < Lk; k0 += 64) {\n"
            + "        const unsigned uni = grad_stage_uniform(in, b, h, 0, q0, k0, Lq, Lk);\n"
            + "        float gacc[kGradStaged] = {};\n"
            + "        GradBand gb = {};\n"
            + "        for (int q = q0; q < q0 + kBlockM && q < Lq; ++q) for (int k = k0; k < k0 + 64 && k <= q && k < Lk; ++k) {\n"
            + "            const long long e = ((long long)(b * H + h) * Lq + q) * Lk + k;\n"
            + "            grad_inputs_add(in, g, ds[e], s[e], b, h, 0, q, k, Lq, Lk, q0, k0, sums, uni, gacc);\n"
            + "            grad_band_pair(in, g, gb, uni, gacc, true, ds[e], s[e], b, h, 0, q, k, Lq, Lk, q0, k0, sums, 2, 0);\n"
            + "        }\n"
            + "        grad_stage_uniform_add(sums, uni, gacc, 0);\n"
            + "        for (threadIdx.x = 0; threadIdx.x < 128; ++threadIdx.x) grad_stage_flush(in, g, sums, b, h, 0, q0, k0, Lq, Lk);\n"
            + "    }\n}\n")
    (tmp_path / "g.cpp").write_text(prog)
    subprocess.run(["g++", "-std=c++17", "-O1", "-shared", "-fPIC", "-o", str(tmp_path / "g.so"),
                    str(tmp_path / "g.cpp")], check=True, capture_output=True)
    lib = ctypes.CDLL(str(tmp_path / "g.so"))
    got = {n: np.zeros(inputs[n].shape, np.float32) for n in names}
    ptr = lambda a: a.ctypes.data_as(ctypes.c_void_p)  # noqa: E731 (contiguous float32 arrays, kept alive)
    s32 = np.ascontiguousarray(s, np.float32)
    lib.run(ptr(ds), ptr(s32), b, hq, lq, lk, *[x for n in names for x in (ptr(inputs[n]), ptr(got[n]))])
    for n in names:
        assert np.allclose(got[n], want[n], rtol=1e-4, atol=1e-5), n
    lib.atomics.restype = ctypes.c_longlong
    steps = b * hq * -(-lq // 64) * -(-lk // 64)
    assert 0 < lib.atomics() <= steps * (1 + 9)  # (one per entry of each step's runs: no pair's own)


def test_the_deterministic_partial_sums_are_sized_and_bounded():
    """The deterministic family's partial sums (expr_grads.py): a block's slice spans only what the
    block can name (k: its tile of keys, b and hkv: one, h: the group's heads), and a call whose
    partial sums pass 4 GiB is refused with a LaunchError naming them."""
    from attngen.backends.cuda import expr_grads
    from attngen.errors import LaunchError
    spec = spec_of("head_dim 64\nheads q=6 kv=2\ndtype f16\ninput t[h, 63] f32 grad\ninput bias[h, q, k] f32 grad\n"
                   "input c[b, hkv, q, k] f32 grad\n"
                   "score s + t[h, clamp(k - q, -31, 31) + 31] + bias[h, q, k] + c[b, hkv, q, k] * c[b, hkv, k, q]",
                   name="e")
    part = expr_grads.partials(spec)
    assert [p.input.name for p in part] == ["t", "bias", "c"]
    shapes = {"t": (6, 63), "bias": (6, 9, 11), "c": (2, 2, 9, 11)}
    assert part[2].owned == ("b", "hkv", None, None)  # (c[.., k, q]: q and k not its own)
    words = expr_grads.partial_words(spec, shapes, 10, 32, 3)
    assert words == {"t_partials": 10 * 3 * 63, "bias_partials": 10 * 3 * 9 * 32, "c_partials": 10 * 9 * 11}
    expr_grads.check_partials("e", words)
    with pytest.raises(LaunchError, match=r"partial sums of the `grad` inputs \(t\) would take 4294967300 bytes"):
        expr_grads.check_partials("e", {"t_partials": (1 << 30) + 1})
