"""Golden files of generated source: a change to what attngen prints shows up as a diff here.

Regenerate deliberately with `pytest tests/test_golden.py --update-golden` and review the diff.
A refactor that changes no behaviour changes no golden file.
"""

from __future__ import annotations

import os

import pytest

import attngen
from attngen.emit import emit_plan
from attngen.plan import plan

from conftest import ROOT

GOLDEN = os.path.join(ROOT, "tests", "golden")

CASES = [
    # (example file, kernel, target, profile): one per kernel path worth watching
    ("llama3_8b.attn", "llama3_8b_prefill", "cuda", "cuda-sm90"),        # f16 tensor cores, causal
    ("gemma2_9b.attn", "gemma2_9b_local", "cuda", "cuda-sm80"),          # bf16, window, softcap
    ("vit_b16.attn", "vit_b16", "cuda", "cuda-sm80"),                    # f32 on CUDA cores
    ("llama3_8b.attn", "llama3_8b_prefill", "wgsl", "webgpu-core"),      # workgroup-memory reductions
    ("mistral_7b.attn", "mistral_7b_prefill", "wgsl", "wgpu-vulkan-nvidia"),  # subgroups, window
    ("vit_b16.attn", "vit_b16", "wgsl", "wgpu-software"),                # f32, subgroups of 4
]


def _name(case):
    _, kernel, target, profile = case
    return f"{kernel}.{profile}.{'cu' if target == 'cuda' else 'wgsl'}"


@pytest.mark.parametrize("case", CASES, ids=_name)
def test_golden_source(case, update_golden):
    path, kernel, target, profile = case
    spec = attngen.load(os.path.join(ROOT, "examples", path), name=kernel)
    source = emit_plan(plan(spec, target, profile)).source
    golden = os.path.join(GOLDEN, _name(case))
    if update_golden or not os.path.exists(golden):
        if not update_golden:
            pytest.fail(f"missing golden file {golden}: run pytest --update-golden and review it")
        os.makedirs(GOLDEN, exist_ok=True)
        with open(golden, "w") as f:
            f.write(source)
    with open(golden) as f:
        expected = f.read()
    assert source == expected, f"generated source differs from {golden} (run with --update-golden if intended)"


@pytest.mark.parametrize("case", CASES, ids=_name)
def test_deterministic(case):
    path, kernel, target, profile = case
    spec = attngen.load(os.path.join(ROOT, "examples", path), name=kernel)
    a = emit_plan(plan(spec, target, profile)).source
    b = emit_plan(plan(attngen.load(os.path.join(ROOT, "examples", path), name=kernel), target, profile)).source
    assert a == b


@pytest.mark.parametrize("case", CASES, ids=_name)
def test_source_reads_like_the_paper(case):
    """A header carrying the spec, the shared section names, the FA2 names."""
    path, kernel, target, profile = case
    spec = attngen.load(os.path.join(ROOT, "examples", path), name=kernel)
    source = emit_plan(plan(spec, target, profile)).source
    assert source.startswith("// ====")
    assert f"attention {kernel} {{" in source.split("\n// ====", 1)[0]
    for section in ("config", "types", "memory", "matmul primitives", "mask", "score transform",
                    "kernel", "prologue: load Q", "main loop over K/V tiles", "-- S = Q K^T",
                    "-- online softmax: m_i, l_i, alpha", "-- O += P V",
                    "epilogue: normalise and store"):
        assert f"section: {section}" in source or f"// {section}" in source, section
    for name in ("m_i", "l_i", "acc", "alpha"):
        assert name in source
