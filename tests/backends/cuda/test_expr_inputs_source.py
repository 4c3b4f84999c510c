"""Expression inputs (issue 42: `input NAME[AXES] DTYPE`) on target cuda, without a GPU: the
source of the issue's examples (ALiBi, prefix-LM, document ids, Swin, T5, a full f16 bias, and
bf16 / u8 / bool inputs) compiles (nvcc -cubin) on cuda-sm80 and cuda-sm90 across the kernel
families the chooser picks; the loaders, built by nvcc as a host program, read each dtype
row-major and report a read out of bounds (0 read, its site in the flag word), and `&&`, `||`
and `where` keep a read the language does not make from being made (or reported). The GPU
side: tests/equivalence/test_cuda_inputs.py."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

import attngen
from attngen.api import emit_plan
from attngen.backends.cuda import expr as cuda_expr
from attngen.backends.cuda.family import family_name
from attngen.errors import LaunchError
from attngen.reference_expr import evaluate

from conftest import spec_of
from test_expr_source import NVCC, _nvcc, needs_nvcc

T5 = ("score s + table[h, where(k > q, 16, 0) + where(abs(k - q) < 8, abs(k - q), "
      "min(8 + floor(log(abs(k - q) / 8) / log(16) * 8), 15))]")
EXAMPLES = {
    "alibi": "input slopes[h] f32\nscore s - slopes[h] * abs(q - k)\nmask causal",
    "prefix_lm": "input prefix[b] i32\nmask k <= q || k < prefix[b]",
    "documents": "input doc[b, q] i32\nmask k <= q && doc[b, q] == doc[b, k]",
    "swin": "input table[h, 169] f32\nscore s + table[h, (q // 7 - k // 7 + 6) * 13 + (q % 7 - k % 7 + 6)]\n"
            "mask q // 49 == k // 49",
    "t5": f"input table[h, 32] f32\n{T5}",
    "bias": "input bias[b, h, q, k] f16\nscore s + bias[b, h, q, k]",
    "dtypes": "input w[h] bf16\ninput allow[hkv, k] bool\ninput shift[b] u8\n"
              "mask allow[hkv, k] || k + shift[b] <= q\nscore s * w[h]",
}

# (profile, schedule / target lines, the main namespace's family, example)
CASES = [
    ("cuda-sm80", "", "plain", "swin"),                                     # mma.sync
    ("cuda-sm80", "schedule split_kv(3)", "plain", "documents"),            # GQA groups packed in a block
    ("cuda-sm80", "schedule two_pass", "plain", "t5"),
    ("cuda-sm80", "tile d=32", "plain", "prefix_lm"),                       # head dims in chunks
    ("cuda-sm90", "", "producer", "alibi"),                                 # a named mask's bit masks
    ("cuda-sm90", "", "producer", "dtypes"),
    ("cuda-sm90", "target cuda { producer=off stages=2 }", "plain", "bias"),
    ("cuda-sm90", "target cuda { producer=off stages=3 }", "overlap", "documents"),
]


def _spec(body, dtype="f16", extra=""):
    return spec_of(f"head_dim 64\nheads q=6 kv=2\ndtype {dtype}\n{body}\n{extra}")


@needs_nvcc
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1] or 'default'}-{c[3]}")
def test_input_kernels_compile_for_every_family(case):
    profile, extra, family, name = case
    spec = _spec(EXAMPLES[name], extra=extra)
    plan = attngen.lower(spec, "cuda", profile)
    assert family_name(plan.config) == family
    source = emit_plan(plan).source
    for inp in spec.inputs:
        assert f" in_{inp.name}(const ExprInputs& in, int site, " in source
        assert f"const {cuda_expr.C_TYPES[inp.dtype]}* __restrict__ input_{inp.name}" in source  # a parameter
    assert "const ExprInputs expr_in{input_" in source
    arch = plan.details.arch
    _nvcc(["-cubin", "--std=c++17", f"-gencode=arch=compute_{arch.removeprefix('sm_')},code={arch}"], source)


@needs_nvcc
def test_f32_with_a_custom_mask_compiles():
    """f32 on CUDA cores, and a score that reads inputs beside a BlockMask (mask custom)."""
    plan = attngen.lower(_spec("input bias[b, h, q, k] f32\nscore s + bias[b, h, q, k]\nmask custom", dtype="f32"),
                         "cuda", "cuda-sm80")
    _nvcc(["-cubin", "--std=c++17", "-gencode=arch=compute_80,code=sm_80"], emit_plan(plan).source)


def test_parameters_and_manifest():
    spec = _spec(EXAMPLES["documents"])
    plan = attngen.lower(spec, "cuda", "cuda-sm90")
    names = [p.name for p in plan.params]
    assert {"input_doc", "ext_b", "ext_h", "ext_hkv", "ext_q", "ext_k", "expr_site0"} <= set(names)
    doc = next(p for p in plan.params if p.name == "input_doc")
    assert doc.shape == ("B", "Lq") and doc.dtype == "i32"
    assert attngen.emit(spec, target="cuda").source == attngen.emit(spec, target="cuda").source
    plain = attngen.emit(_spec("mask k <= q"), target="cuda").source  # no inputs: none of their code
    assert "ExprInputs" not in plain and "expr_site0" not in plain


def test_the_torch_operator_refuses_inputs():
    from attngen.backends.cuda.torch_op import TorchOperator

    class Kernel:  # what TorchOperator reads before it needs PyTorch
        spec = _spec(EXAMPLES["alibi"])
    with pytest.raises(LaunchError, match=r"reads expression inputs \(slopes\), which the operator does not take"):
        TorchOperator(Kernel(), "x")


# ---- the loaders and the short-circuits, on the host -----------------------------------------------

EXT = {"b": 2, "h": 3, "hkv": 1, "q": 5, "k": 4}
LOADS = ("input a[b, h, 3] i32\ninput w[k] f16\ninput z[h, q] bf16\ninput m[hkv, k] bool\ninput u[q] u8\n"
         "input f[b, q, k] f32\n"
         "mask (k <= q && a[b, h, q - k] > 0) || (q - k > 2 && m[hkv, k]) || u[q] == where(k < 2, u[k], 7)\n"
         "score s + f[b, q, k] * w[k] + where(q < 5, z[h, q], 0)")


def _data(spec, rng):
    out = {}
    for inp in spec.inputs:
        shape = tuple(EXT[x] if isinstance(x, str) else x for x in inp.axes)
        if inp.dtype == "i32":
            out[inp.name] = rng.integers(-3, 4, shape).astype(np.int32)
        elif inp.dtype == "u8":
            out[inp.name] = rng.integers(0, 9, shape).astype(np.uint8)
        elif inp.dtype == "bool":
            out[inp.name] = rng.random(shape) < 0.5
        elif inp.dtype == "bf16":  # values bf16 holds exactly: its bits are the upper half of the f32's
            out[inp.name] = (rng.standard_normal(shape).astype(np.float32).view(np.uint32) & 0xffff0000).view(np.float32)
        else:
            out[inp.name] = rng.standard_normal(shape).astype(np.float16 if inp.dtype == "f16" else np.float32)
    out["w"][0] = np.float16(6e-6)  # a subnormal f16 (the host's widening by its fields)
    return out


def _c_array(inp, a) -> str:
    if inp.dtype == "bf16":
        vals = (a.view(np.uint32) >> 16).ravel()
    elif inp.dtype == "f16":
        vals = a.view(np.uint16).ravel()
    elif inp.dtype == "bool":
        vals = a.astype(np.uint8).ravel()
    elif inp.dtype == "f32":
        return "{" + ", ".join(f"{float(x)!r}f" for x in a.ravel()) + "}"
    else:
        vals = a.ravel()
    return "{" + ", ".join(str(int(x)) for x in vals) + "}"


def _host_program(spec, data) -> str:
    arrays = "\n".join(f"static const {cuda_expr.C_TYPES[i.dtype]} d_{i.name}[] = {_c_array(i, data[i.name])};"
                       for i in spec.inputs)
    site_of = cuda_expr.site_numbers(spec)
    loads = "\n".join(f"        case {n}: printf(\"%.9g\", (double)in_{i.name}(in, 7, "
                      + ", ".join(f"v[{d}]" for d in range(len(i.axes))) + ")); break;"
                      for n, i in enumerate(spec.inputs))
    return f"""#include <cstdio>
#include <cmath>
#include <algorithm>
using std::min;
using std::max;
{"".join(h + chr(10) for h in cuda_expr.helpers_of(spec.mask.expr, spec.score))}
{cuda_expr.inputs_source(spec)}
{cuda_expr.function("mask_expr", spec.mask.expr, "mask", site_of)}
{cuda_expr.function("score_expr", spec.score, "score", site_of)}
{arrays}

// stdin: "L which i0 i1 i2" (a loader), "E b h hkv q k" (mask_expr), "S s b h hkv q k" (score_expr);
// each answer is followed by the flag word (then cleared)
int main() {{
    int errors[8] = {{0}};
    const ExprInputs in{{{", ".join("d_" + i.name for i in spec.inputs)}, {EXT["b"]}, {EXT["h"]}, {EXT["hkv"]}, {EXT["q"]},
                        {EXT["k"]}, errors, 100}};
    char mode;
    while (scanf(" %c", &mode) == 1) {{
        int v[5] = {{0}}, which = 0;
        float s = 0.f;
        if (mode == 'L' && scanf("%d", &which) != 1) return 1;
        if (mode == 'S' && scanf("%f", &s) != 1) return 1;
        for (int i = 0; i < (mode == 'L' ? 3 : 5); ++i) if (scanf("%d", &v[i]) != 1) return 1;
        if (mode == 'L') {{
            switch (which) {{
{loads}
            }}
        }} else if (mode == 'E') {{
            printf("%d", (int)mask_expr(in, v[0], v[1], v[2], v[3], v[4], {EXT["q"]}, {EXT["k"]}));
        }} else {{
            printf("%.9g", (double)score_expr(in, s, v[0], v[1], v[2], v[3], v[4], {EXT["q"]}, {EXT["k"]}));
        }}
        printf(" %d\\n", errors[kErrExprRead]);
        errors[kErrExprRead] = 0;
    }}
    return 0;
}}
"""


@pytest.fixture(scope="module")
def host_program():
    if NVCC is None:
        pytest.skip("no nvcc on PATH")
    spec = _spec(LOADS)
    data = _data(spec, np.random.default_rng(3))
    exe, tmp = _nvcc(["-x", "cu", "--std=c++17"], _host_program(spec, data))

    def run(lines):
        out = subprocess.run([exe], input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=120,
                             check=True).stdout.splitlines()
        assert len(out) == len(lines)
        return [(float(np.float32(a)), int(b)) for a, b in (x.split() for x in out)]  # (%.9g: the f32 exactly)

    yield spec, data, run
    shutil.rmtree(tmp, ignore_errors=True)


@needs_nvcc
def test_loaders_read_row_major_and_report_reads_out_of_bounds(host_program):
    spec, data, run = host_program
    rng = np.random.default_rng(5)
    lines, want = [], []
    for n, inp in enumerate(spec.inputs):
        a = data[inp.name]
        for _ in range(60):
            idx = [int(rng.integers(-2, d + 2)) for d in a.shape]
            lines.append(f"L {n} " + " ".join(map(str, idx + [0] * (3 - len(idx)))))
            inside = all(0 <= i < d for i, d in zip(idx, a.shape))
            want.append((float(np.float32(a[tuple(idx)])) if inside else 0.0, 0 if inside else 107))  # site0 100 + site 7
    got = run(lines)
    assert got == want
    assert any(f for _, f in want) and not all(f for _, f in want)


@needs_nvcc
def test_expressions_read_only_where_the_language_does(host_program):
    """mask_expr and score_expr against the reference's evaluation, over every pair of the
    sequence: the same values, and a read out of bounds flagged exactly where the reference raises
    (`q - k` out of a's axis only where `k <= q` does not decide, `u[k]` only where k < 2, ...)."""
    spec, data, run = host_program
    lines, cases = [], []
    rng = np.random.default_rng(9)
    for b in range(EXT["b"]):
        for h in range(EXT["h"]):
            for q in range(EXT["q"]):
                for k in range(EXT["k"]):
                    lines.append(f"E {b} {h} 0 {q} {k}")
                    s = float(np.float32(rng.normal()))
                    lines.append(f"S {s!r} {b} {h} 0 {q} {k}")
                    cases += [("mask", spec.mask.expr, (b, h, q, k), 0.0), ("score", spec.score, (b, h, q, k), s)]
    flagged = 0
    for (value, flag), (what, e, (b, h, q, k), s) in zip(run(lines), cases):
        names = dict(b=np.int64(b), h=np.int64(h), hkv=np.int64(0), q=np.int64(q), k=np.int64(k),
                     Lq=np.int64(EXT["q"]), Lk=np.int64(EXT["k"]), s=np.float64(s))
        try:
            ref = evaluate(e, names, {n: a.astype(np.float64) if a.dtype.kind == "f" else a for n, a in data.items()},
                           where=what)
        except LaunchError:
            assert flag > 100, (what, b, h, q, k)
            flagged += 1
            continue
        assert flag == 0, (what, b, h, q, k)
        if what == "mask":
            assert bool(value) == bool(ref)
        else:
            assert value == pytest.approx(float(ref), rel=1e-5, abs=1e-5)
    assert flagged > 0  # a[b, h, q - k] with q - k >= 3 is read, and out of bounds, where k <= q


def test_the_calls_checks_name_the_input():
    """attngen/backends/cuda/args.py's device_inputs, without a GPU: what it refuses before it
    reads a device array (the GPU's checks: tests/equivalence/test_cuda_inputs.py)."""
    import re
    from types import SimpleNamespace

    from attngen.backends.cuda.args import device_inputs
    spec = _spec(EXAMPLES["documents"])
    launch = SimpleNamespace(layout="padded", batch=2, heads_q=6, heads_kv=2, len_q=7, capacity=9)
    doc = np.zeros((2, 7), np.int32)
    who = "kernel 'docs' (cuda)"
    for given, message in [
            ({}, "kernel 'docs' (cuda): spec t reads input 'doc' (i32, axes [b, q]): pass doc=..."),
            ({"doc": doc, "x": doc}, "unknown input x (spec t declares: doc)"),
            ({"doc": doc[:, :3]}, "input 'doc' has shape (2, 3); its axes [b=2, q=7] need (2, 7)"),
            ({"doc": doc}, "input 'doc' is a numpy array in host memory; the cuda target reads inputs on the GPU"),
            ({"doc": memoryview(doc)}, "input 'doc' is a memoryview; the cuda target takes CuPy arrays")]:
        with pytest.raises(LaunchError, match=re.escape(message)):
            device_inputs(spec, given, launch, 0, who)
    with pytest.raises(LaunchError, match="which take a padded batch"):
        device_inputs(spec, {"doc": doc}, SimpleNamespace(**{**vars(launch), "layout": "packed"}), 0, who)
    torch = pytest.importorskip("torch")
    with pytest.raises(LaunchError, match=re.escape("input 'doc' is a PyTorch tensor on cpu; the cuda target needs "
                                                    "CUDA tensors")):
        device_inputs(spec, {"doc": torch.zeros((2, 7), dtype=torch.int32)}, launch, 0, who)
