"""Score and mask expressions over indices (issue 42) on target cuda, without a GPU: the source of
expression specs compiles (nvcc -cubin) for every kernel family the chooser picks for them, on
cuda-sm80 and cuda-sm90; the rendered functions, built by nvcc as a host program, agree with the
Python rules: mask_expr_tile with attngen.plan.expr_blocks.classify over random tiles, mask_expr
and score_expr with the float64 reference's evaluation; what the checker takes."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import attngen
from attngen.api import emit_plan
from attngen.backends import get as get_backend
from attngen.backends.cuda import expr as cuda_expr
from attngen.backends.cuda.family import family_name
from attngen.errors import LaunchError
from attngen.lang.expr import INT, Binary, Const, Var, format_expr
from attngen.plan import expr_blocks
from attngen.reference_expr import evaluate

from conftest import spec_of
from expr_strategies import masks, scores

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="no nvcc on PATH")

MASKS = [
    "k <= q && q - k < 64",
    "abs(q // 8 - k // 8) <= 1 && abs(q % 8 - k % 8) <= 1",
    "q // 64 == k // 64",
    "where(h % 3 == 0, k <= q, k >= q) || hkv == b",
    "(q - k) // 3 != -2 && (k - q) % 5 != 4",
    "!(k > q + Lk - Lq) && min(q, k) * 2 >= max(q - 7, 0) - clamp(k, 3, Lk)",
    "q * k % 7 < 3 || k // (q - 10) > 1",
    "(k < q) == (h > 2)",
    "floor(q / 2) < k",
    "!(q < 3) && k <= q",
    "-q + k >= -3 || k % -4 == -1 || where(k < 5, q, k * 3) > 40",
    "-floor(-q) <= k + 1 && clamp(k, 9, 2) == 2",  # not --q (a decrement); clamp with lo > hi: min of max
]
SCORES = [
    "s - 0.125 * abs(q - k)",
    "30 * tanh(s / 30)",
    "where(k % 2 == 0, s, sigmoid(s) + 0.5 * h) - log(1 + k) / 4 + min(q, 3) * 0.1",
    "s * exp(-sqrt(abs(q - k) * 1.0)) + clamp(s, -2, 2) + floor(s) + q // -3",
]


def _expr(text, what="mask"):
    spec = spec_of(f"head_dim 16\nheads q=6 kv=2\ndtype f32\n{what} {text}\n")
    return spec.mask.expr if what == "mask" else spec.score


def _spec(mask=None, score=None, head_dim=64, dtype="f16", heads="q=6 kv=2", extra=""):
    body = f"head_dim {head_dim}\nheads {heads}\ndtype {dtype}\n"
    body += f"mask {mask}\n" if mask else ""
    body += f"score {score}\n" if score else ""
    return spec_of(body + extra)


def _nvcc(args, source, suffix=".cu"):
    """Run nvcc on `source` (in a temporary folder); the output file's path and the folder."""
    tmp = tempfile.mkdtemp()
    path = os.path.join(tmp, "src" + suffix)
    with open(path, "w") as f:
        f.write(source)
    out = os.path.join(tmp, "out")
    run = subprocess.run([NVCC, *args, "-o", out, path], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "warning" not in run.stderr, run.stderr[-4000:]
    return out, tmp


# ---- the kernels' source compiles, every family the chooser picks ----------------------------------

# (profile, target options or schedule lines, the main namespace's family)
FAMILY_CASES = [
    ("cuda-sm80", "", "plain"),                                   # mma.sync
    ("cuda-sm80", "schedule split_kv(3)", "plain"),               # GQA groups packed in a block
    ("cuda-sm80", "schedule two_pass", "plain"),
    ("cuda-sm80", "tile d=32", "plain"),                           # head dims in chunks
    ("cuda-sm90", "", "producer"),                                # the Hopper default (and its _varlen entry)
    ("cuda-sm90", "target cuda { producer=off stages=2 }", "plain"),   # wgmma, the plain loop
    ("cuda-sm90", "target cuda { producer=off stages=3 }", "overlap"),
    ("cuda-sm90", "kv_cache paged(page=16)", "plain"),             # paged: mma.sync
]
# masks whose key ranges have holes at the producer family's tiles (expr_blocks.has_holes)
HOLES = {
    "sink and window": "k < 16 || k <= q && q - k < 200",
    "dilated": "(q - k) % 512 < 40 && k <= q",
    "2d neighbourhood w300": "abs(q // 300 - k // 300) <= 2 && abs(q % 300 - k % 300) <= 2",
    "strided blocks": "(q // 100) % 3 == (k // 100) % 3 && k <= q + 50",
}
BOTH = ("abs(q // 8 - k // 8) <= 1 && abs(q % 8 - k % 8) <= 1", "s - 0.125 * abs(q - k)")
# (profile, extra, family, (mask, score)): each family with a mask and a score expression; and on
# the default families, each alone and a named mask with a score expression (the bit masks' path)
CASES = [(*case, BOTH) for case in FAMILY_CASES] + [
    ("cuda-sm80", "", "plain", ("k <= q && q - k < 64", None)),
    ("cuda-sm90", "", "producer", (None, "30 * tanh(s / 30) - 0.01 * h")),  # (not C * tanh(s / C): softcap)
    ("cuda-sm90", "", "producer", ("causal", "s - 0.125 * abs(q - k)")),
    # holes of the key range on the producer family: each item's list of live tiles (sTiles), with
    # the tensor copy engine and without it; the overlapped loop's list
    ("cuda-sm90", "", "producer", (HOLES["sink and window"], "s - 0.125 * abs(q - k)")),
    ("cuda-sm90", "target cuda { tma=off }", "producer", (HOLES["2d neighbourhood w300"], None)),
    ("cuda-sm90", "target cuda { producer=off stages=3 }", "overlap", (HOLES["dilated"], None)),
]


@needs_nvcc
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1] or 'default'}-{c[3][0]}|{c[3][1]}")
def test_expression_kernels_compile_for_every_family(case):
    profile, extra, family, (mask, score) = case
    spec = _spec(mask, score, extra=extra)
    plan = attngen.lower(spec, "cuda", profile)
    assert family_name(plan.config) == family
    source = emit_plan(plan).source
    if mask not in (None, "causal"):
        assert f"// mask {mask}\n__host__ __device__ __forceinline__ bool mask_expr(int b, int h, int hkv, int q, " \
               "int k, int Lq, int Lk) {\n" in source
        assert "int mask_expr_tile(" in source
    if score is not None:
        assert f"// score {score}\n__host__ __device__ __forceinline__ float score_expr(float s, " in source
    arch = plan.details.arch
    _nvcc(["-cubin", "--std=c++17", f"-gencode=arch=compute_{arch.removeprefix('sm_')},code={arch}"], source)


def test_f32_and_wide_head_dims_take_families_that_compile_expressions():
    """f32 runs on CUDA cores; head dims above 256 never take P through memory with an expression."""
    for spec, profile, family in ((_spec("!(k > q)", dtype="f32"), "cuda-sm80", "plain"),
                                  (_spec(None, "sigmoid(s) * 4", head_dim=512), "cuda-sm90", "plain"),
                                  (_spec("q // 64 == k // 64", head_dim=512), "cuda-sm90", "plain"),
                                  (_spec("!(k > q)", head_dim=256), "cuda-sm90", "producer")):
        plan = attngen.lower(spec, "cuda", profile)
        assert family_name(plan.config) == family, (spec, family_name(plan.config))
        assert "mask_expr" in emit_plan(plan).source or spec.score is not None


@needs_nvcc
def test_f32_source_compiles():
    plan = attngen.lower(_spec("abs(q // 8 - k // 8) <= 1", "s - 0.125 * abs(q - k)", dtype="f32"), "cuda",
                         "cuda-sm80")
    _nvcc(["-cubin", "--std=c++17", "-gencode=arch=compute_80,code=sm_80"], emit_plan(plan).source)


def test_the_plain_loop_over_whole_head_dims_skips_holes():
    """Mask::tile_is_empty and the loop's `hole` in the plain loop over whole head dims only (the
    families docs/language.md names)."""
    mask = "abs(q // 8 - k // 8) <= 1 && abs(q % 8 - k % 8) <= 1"
    for profile, extra, skips in (("cuda-sm80", "", True), ("cuda-sm80", "schedule split_kv(3)", True),
                                  ("cuda-sm80", "tile d=32", False), ("cuda-sm90", "", False),
                                  ("cuda-sm90", "target cuda { producer=off stages=2 }", True),
                                  ("cuda-sm90", "target cuda { producer=off stages=3 }", False)):
        plan = attngen.lower(_spec(mask, extra=extra), "cuda", profile)
        source = emit_plan(plan).source
        assert ("if (hole(it)) continue;" in source) == skips, (profile, extra)
        assert ("tile_is_empty" in source) == skips
    assert "tile_is_empty" not in emit_plan(attngen.lower(_spec(None, "30 * tanh(s / 30)"), "cuda",
                                                          "cuda-sm80")).source


def test_the_producer_family_lists_live_tiles_only_where_the_expression_has_holes():
    """The producer family's and the overlapped loop's list of live K/V tiles (sTiles, tile_list;
    both entry points) for masks with holes; with expr_tile_list="holes" (the default is "always"),
    expressions without holes at its tiles (`k <= q`, a 2D neighbourhood of 64 x 64 whose 80-key
    tiles are all live) keep the contiguous key range."""
    for name, mask in HOLES.items():
        plan = attngen.lower(_spec(mask), "cuda", "cuda-sm90")
        assert family_name(plan.config) == "producer"
        source = emit_plan(plan).source
        assert source.count("int* tile_list = reinterpret_cast<int*>(smem + kOffsetTiles);") == 2, name
        assert source.count("if (ptid == 0) tile_list[0] = n_live;") == 2, name
        assert "sTiles 1x1025 u32" in plan.config.smem_summary
        overlap = emit_plan(attngen.lower(_spec(mask, extra="target cuda { producer=off stages=3 }"), "cuda",
                                           "cuda-sm90")).source  # (the block's first warp lists them)
        assert overlap.count("__syncthreads();  // every entry written") == 2, name
        plain = emit_plan(attngen.lower(_spec(mask, extra="target cuda { producer=off stages=2 }"), "cuda",
                                         "cuda-sm90")).source  # (Mask::tile_is_empty instead)
        assert "tile_list" not in plain and "if (hole(it)) continue;" in plain
    never = get_backend("cuda").profile("cuda-sm90").with_overrides(expr_tile_list="holes")
    for mask in ("!(k > q)", "abs(q // 64 - k // 64) <= 7 && abs(q % 64 - k % 64) <= 7", "q // 64 == k // 64"):
        plan = attngen.lower(_spec(mask), "cuda", never)
        assert family_name(plan.config) == "producer"
        source = emit_plan(plan).source
        assert "tile_list" not in source and "kOffsetTiles" not in source, mask
        assert "sTiles" not in plan.config.smem_summary


def test_the_tile_tables_expr_tile_list_chooses_the_list_or_the_key_range():
    """CudaTiles.expr_tile_list (a profile override, for an A / B: benchmarks/probes/probe_expr_masks.py):
    "always" lists the tiles of every index-only mask expression, "never" of none; named masks
    never. A value outside the three is a ProfileError naming them."""
    from attngen.backends.cuda.tiles import CudaTiles
    from attngen.plan.profiles import ProfileError
    base = get_backend("cuda").profile("cuda-sm90")
    hole = HOLES["sink and window"]
    for way, listed in (("always", {"!(k > q)": True, hole: True}), ("never", {"!(k > q)": False, hole: False}),
                        ("holes", {"!(k > q)": False, hole: True})):
        profile = base.with_overrides(expr_tile_list=way)
        for mask, want in listed.items():
            plan = attngen.lower(_spec(mask), "cuda", profile)
            assert plan.config.tile_list == want and ("tile_list" in emit_plan(plan).source) == want, (way, mask)
        assert not attngen.lower(_spec("causal"), "cuda", profile).config.tile_list
    with pytest.raises(ProfileError, match="'holes', 'always', 'never'"):
        CudaTiles(expr_tile_list="sometimes")


def test_the_source_is_deterministic_and_existing_specs_have_no_expression_code():
    spec = _spec("k <= q && q - k < 64", "30 * tanh(s / 30)")
    assert attngen.emit(spec, target="cuda").source == attngen.emit(spec, target="cuda").source
    plain = attngen.emit(_spec("causal"), target="cuda").source
    assert "mask_expr" not in plain and "ExprIv" not in plain and "score_expr" not in plain
    text = attngen.emit(_spec("!(k > q)"), target="cuda").source
    assert "mask_expr" in text and "expr_floor_div" not in text  # helpers only where used
    # (`k <= q` itself is planned as `mask causal`: plan.check.normalised)
    assert attngen.emit(_spec("k <= q"), target="cuda").source.count("mask_expr") == 0


# ---- the rendered functions against the Python rules (a host program) ------------------------------

def _host_program(masks, scores) -> str:
    helpers = "".join(h + "\n" for h in cuda_expr.helpers_of(*masks, *scores))
    parts = ["#include <cstdio>\n#include <cmath>\n#include <algorithm>\nusing std::min;\nusing std::max;\n",
             helpers, cuda_expr.INTERVAL_HELPERS]
    for n, m in enumerate(masks):
        parts.append(f"namespace m{n} {{\n{cuda_expr.function('mask_expr', m, 'mask')}\n"
                     f"{cuda_expr.tile_function(m)}}}\n")
    for n, s in enumerate(scores):
        parts.append(f"namespace s{n} {{\n{cuda_expr.function('score_expr', s, 'score')}}}\n")
    tile_cases = "\n".join(f"            case {n}: r = m{n}::mask_expr_tile(v[0], v[1], v[2], v[3], v[4], v[5], "
                           f"v[6], v[7], v[8], v[9]); break;" for n in range(len(masks)))
    elem_cases = "\n".join(f"            case {n}: r = m{n}::mask_expr(v[0], v[1], v[2], v[3], v[4], v[5], v[6]); break;"
                           for n in range(len(masks)))
    score_cases = "\n".join(f"            case {n}: x = s{n}::score_expr(s, v[0], v[1], v[2], v[3], v[4], v[5], v[6]); "
                            "break;" for n in range(len(scores)))
    parts.append(f"""
// stdin: lines "T which b h0 h1 hkv q0 q1 k0 k1 Lq Lk", "E which b h hkv q k Lq Lk", "S which s b h hkv q k Lq Lk"
int main() {{
    char mode;
    int which;
    while (scanf(" %c %d", &mode, &which) == 2) {{
        int v[10] = {{0}}, r = -1;
        float s = 0.f, x = 0.f;
        if (mode == 'S' && scanf("%f", &s) != 1) return 1;
        const int n = mode == 'T' ? 10 : 7;
        for (int i = 0; i < n; ++i) if (scanf("%d", &v[i]) != 1) return 1;
        if (mode == 'T') {{
            switch (which) {{
{tile_cases}
            }}
            printf("%d\\n", r);
        }} else if (mode == 'E') {{
            switch (which) {{
{elem_cases}
            }}
            printf("%d\\n", r);
        }} else {{
            switch (which) {{
{score_cases}
            }}
            printf("%.9g\\n", x);
        }}
    }}
    return 0;
}}
""")
    return "".join(parts)


@pytest.fixture(scope="module")
def host_program():
    if NVCC is None:
        pytest.skip("no nvcc on PATH")
    masks = [_expr(m) for m in MASKS]
    scores = [_expr(s, "score") for s in SCORES]
    exe, tmp = _nvcc(["-x", "cu", "--std=c++17"], _host_program(masks, scores))

    def run(lines):
        out = subprocess.run([exe], input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=120,
                             check=True).stdout.split()
        assert len(out) == len(lines)
        return out

    yield masks, scores, run
    shutil.rmtree(tmp, ignore_errors=True)


def _random_tile(rng, big: bool):
    lq, lk = (int(rng.integers(1, 2**30)), int(rng.integers(1, 2**30))) if big else \
        (int(rng.integers(1, 300)), int(rng.integers(1, 300)))
    q0 = int(rng.integers(0, lq))
    q1 = min(lq - 1, q0 + int(rng.integers(0, 80)))
    k0 = int(rng.integers(0, lk))
    k1 = min(lk - 1, k0 + int(rng.integers(0, 80)))
    h0 = int(rng.integers(0, 7))
    h1 = h0 + int(rng.integers(0, 3)) * int(rng.integers(0, 2))
    return int(rng.integers(0, 5)), h0, h1, int(rng.integers(0, 4)), q0, q1, k0, k1, lq, lk


@needs_nvcc
def test_the_tile_function_agrees_with_classify(host_program):
    masks, _, run = host_program
    rng = np.random.default_rng(42)
    lines, want = [], []
    for n, m in enumerate(masks):
        for trial in range(300):
            b, h0, h1, hkv, q0, q1, k0, k1, lq, lk = _random_tile(rng, big=trial % 5 == 4)
            lines.append(f"T {n} {b} {h0} {h1} {hkv} {q0} {q1} {k0} {k1} {lq} {lk}")
            want.append(expr_blocks.classify(m, (q0, q1), (k0, k1), lq, lk, b=(b, b), h=(h0, h1), hkv=(hkv, hkv)))
    got = [int(x) for x in run(lines)]
    bad = [(lines[i], MASKS[int(lines[i].split()[1])], got[i], want[i]) for i in range(len(got)) if got[i] != want[i]]
    assert not bad, bad[:5]
    assert {0, 1, 2} <= set(want)  # every answer is exercised


def _indices(rng):
    """b, h, hkv, Lq, Lk at random (small)."""
    return tuple(int(x) for x in rng.integers(0, 5, 3)) + tuple(int(x) for x in rng.integers(1, 200, 2))


@needs_nvcc
def test_mask_and_score_functions_agree_with_the_reference(host_program):
    masks, scores, run = host_program
    rng = np.random.default_rng(7)
    lines, cases = [], []
    for n, m in enumerate(masks):
        for _ in range(200):
            b, h, hkv, lq, lk = _indices(rng)
            q, k = int(rng.integers(0, lq)), int(rng.integers(0, lk))
            lines.append(f"E {n} {b} {h} {hkv} {q} {k} {lq} {lk}")
            cases.append(("E", m, (b, h, hkv, q, k, lq, lk), 0.0))
    for n, e in enumerate(scores):
        for _ in range(200):
            b, h, hkv, lq, lk = _indices(rng)
            q, k = int(rng.integers(0, lq)), int(rng.integers(0, lk))
            s = float(np.float32(rng.normal() * 4))
            lines.append(f"S {n} {s!r} {b} {h} {hkv} {q} {k} {lq} {lk}")
            cases.append(("S", e, (b, h, hkv, q, k, lq, lk), s))
    got = run(lines)
    checked = 0
    for text, line, (mode, e, idx, s) in zip(got, lines, cases):
        names = dict(zip(("b", "h", "hkv", "q", "k", "Lq", "Lk"), (np.int64(x) for x in idx)), s=np.float64(s))
        try:
            want = evaluate(e, names, where="mask" if mode == "E" else "score")
        except LaunchError:  # an integer division by zero: the reference raises, the kernels give a value
            continue
        checked += 1
        if mode == "E":
            assert int(text) == int(bool(want)), line
        else:
            assert float(text) == pytest.approx(float(want), rel=1e-5, abs=1e-5), line
    assert checked > 0.9 * len(lines)


def test_floor_division_and_modulo_render_as_helpers():
    r = cuda_expr.render
    assert r(Binary("//", Var("q", INT), Const(-8, INT), INT)) == "expr_floor_div(q, (-8))"
    assert r(Binary("%", Var("q", INT), Const(8, INT), INT)) == "expr_floor_mod(q, 8)"
    assert r(Const(-2**31, INT)) == "(-2147483647 - 1)"
    text = r(_expr("s * 2 + q / 3 - exp(-k) + floor(s) + clamp(q, 0, 5) * 1e-3", "score"))
    assert "(float)(q) / 3.0f" in text and "expf((float)(-k))" in text and "(float)((int)floorf(s))" in text
    assert "0.001f" in text and "min(max(q, 0), 5)" in text


# ---- what stays refused ----------------------------------------------------------------------------

def test_the_checker_takes_expressions_with_inputs_and_the_backward_index_only_ones():
    cuda = get_backend("cuda")
    spec = spec_of("head_dim 16\nheads q=2 kv=2\ndtype f16\ninput doc[b, q] i32\nmask k <= q && doc[b, q] > 0\n")
    assert cuda.expression_problems(spec) == []  # inputs: test_expr_inputs_source.py
    assert cuda.expression_problems(_spec("k <= q", "30 * tanh(s / 30)")) == []
    assert cuda.backward_expressions  # index-only: tests/backends/cuda/test_backward_expr_source.py


# ---- random expressions (tests/expr_strategies.py, as the wgsl fuzzer's) in the host program -------

@needs_nvcc
@settings(max_examples=1, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(ms=st.lists(masks(), min_size=24, max_size=24), ss=st.lists(scores(), min_size=24, max_size=24))
def test_random_expressions_render_as_the_reference_evaluates(ms, ss):
    """24 random masks and 24 random scores (one derandomized draw: the same every run) rendered
    into one host program: mask_expr and score_expr against the float64 evaluator, mask_expr_tile
    against classify. The strategies keep integers far from 32 bits, divisors nonzero and every
    discontinuity on values exact in f32 (their docstring)."""
    masks_ir = [_expr(m.text) for m in ms]
    scores_ir = [_expr(s.text, "score") for s in ss]
    exe, tmp = _nvcc(["-x", "cu", "--std=c++17"], _host_program(masks_ir, scores_ir))
    try:
        rng = np.random.default_rng(11)
        lines, cases = [], []
        for n, m in enumerate(masks_ir):
            for _ in range(40):
                b, h, hkv, lq, lk = _indices(rng)
                q, k = int(rng.integers(0, lq)), int(rng.integers(0, lk))
                lines.append(f"E {n} {b} {h} {hkv} {q} {k} {lq} {lk}")
                cases.append(("E", m, (b, h, hkv, q, k, lq, lk), 0.0))
            for _ in range(40):
                tile = _random_tile(rng, big=False)
                lines.append(f"T {n} " + " ".join(map(str, tile)))
                cases.append(("T", m, tile, 0.0))
        for n, e in enumerate(scores_ir):
            for _ in range(40):
                b, h, hkv, lq, lk = _indices(rng)
                q, k = int(rng.integers(0, lq)), int(rng.integers(0, lk))
                s = float(np.float32(rng.normal() * 4))
                lines.append(f"S {n} {s!r} {b} {h} {hkv} {q} {k} {lq} {lk}")
                cases.append(("S", e, (b, h, hkv, q, k, lq, lk), s))
        got = subprocess.run([exe], input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=120,
                             check=True).stdout.split()
        assert len(got) == len(lines)
        for text, line, (mode, e, idx, s) in zip(got, lines, cases):
            if mode == "T":
                b, h0, h1, hkv, q0, q1, k0, k1, lq, lk = idx
                want = expr_blocks.classify(e, (q0, q1), (k0, k1), lq, lk, b=(b, b), h=(h0, h1), hkv=(hkv, hkv))
                assert int(text) == want, (line, format_expr(e))
                continue
            names = dict(zip(("b", "h", "hkv", "q", "k", "Lq", "Lk"), (np.int64(x) for x in idx)), s=np.float64(s))
            want = evaluate(e, names, where="mask" if mode == "E" else "score")
            if mode == "E":
                assert int(text) == int(bool(want)), (line, format_expr(e))
            else:
                assert float(text) == pytest.approx(float(want), rel=1e-4, abs=1e-4), (line, format_expr(e))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_negated_floor_of_a_negation_is_no_decrement():
    """-floor(-q) renders as -(-q): `--q` would compile, as a decrement of the parameter q."""
    assert cuda_expr.render(_expr("-floor(-q) <= k")) == "(-(-q)) <= k"
