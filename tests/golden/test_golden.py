"""Golden files of generated source: a change to what attngen prints shows up as a diff here.

Regenerate deliberately with `pytest tests/golden --update-golden` and review the diff.
A refactor that changes no behaviour changes no golden file.
"""

from __future__ import annotations

import json
import os

import pytest

import attngen
from attngen.api import emit_plan
from attngen.api import lower as plan

from conftest import ROOT

GOLDEN = os.path.join(ROOT, "tests", "golden")

CASES = [
    # (example file, kernel, target, profile): one per kernel path worth watching
    ("llama3_8b.attn", "llama3_8b_prefill", "cuda", "cuda-sm90"),        # f16 wgmma (Hopper family), causal
    ("llama3_8b.attn", "llama3_8b_prefill", "cuda", "cuda-sm80"),        # f16 mma.sync, padded + varlen entries
    ("gemma2_9b.attn", "gemma2_9b_local", "cuda", "cuda-sm80"),          # bf16, window, softcap
    ("vit_b16.attn", "vit_b16", "cuda", "cuda-sm80"),                    # f32 on CUDA cores
    ("llama3_8b.attn", "llama3_8b_prefill", "wgsl", "webgpu-core"),      # workgroup-memory reductions
    ("mistral_7b.attn", "mistral_7b_prefill", "wgsl", "wgpu-vulkan-nvidia"),  # subgroups, window
    ("vit_b16.attn", "vit_b16", "wgsl", "wgpu-software"),                # f32, subgroups of 4
    # every variant on both targets (docs/variants.md)
    ("llama3_8b_decode.attn", "llama3_8b_decode", "cuda", "cuda-sm90"),  # paged, split_kv(auto), GQA packed
    ("llama3_8b_decode.attn", "llama3_8b_decode", "wgsl", "webgpu-core"),
    ("llama3_8b_decode.attn", "llama3_8b_decode_two_pass", "cuda", "cuda-sm80"),  # two_pass, paged
    ("llama3_8b_decode.attn", "llama3_8b_decode_two_pass", "wgsl", "wgpu-vulkan-nvidia"),
    ("packed_documents.attn", "llama3_8b_packed_documents", "cuda", "cuda-sm90"),  # mask custom
    ("packed_documents.attn", "llama3_8b_packed_documents", "wgsl", "webgpu-core"),
    ("deepseek_v3_mla_decode.attn", "deepseek_v3_mla_decode", "cuda", "cuda-sm90"),  # MLA 576/512, tile d, bf16
    ("deepseek_v2_lite.attn", "deepseek_v2_lite_mla_prefill", "cuda", "cuda-sm80"),  # qk 192 / v 128, bf16
    ("qwen2_7b.attn", "qwen2_7b_prefill", "cuda", "cuda-sm90"),          # GQA group of 7, bf16
    ("large_head_dims.attn", "head_dim_1024", "cuda", "cuda-sm90"),      # chunked head dim, column blocks
    ("large_head_dims.attn", "head_dim_640", "cuda", "cuda-sm90"),       # P through memory
    ("large_head_dims.attn", "head_dim_1024", "wgsl", "wgpu-vulkan-nvidia"),
    ("large_head_dims.attn", "head_dim_320", "wgsl", "webgpu-core"),
    ("golden/variants.attn", "mla_decode_f16", "cuda", "cuda-sm80"),     # MLA, tile d=64, paged, split_kv(4)
    ("golden/variants.attn", "mla_decode_f16", "wgsl", "webgpu-core"),
    ("golden/variants.attn", "softcap_window_f16", "cuda", "cuda-sm90"),  # softcap, window with right edge
    ("golden/variants.attn", "softcap_window_f16", "wgsl", "wgpu-software"),
    ("golden/variants.attn", "gqa7_f16_acc", "cuda", "cuda-sm80"),       # GQA 7, f16 accumulators, scale
    ("golden/variants.attn", "gqa7_f16_acc", "wgsl", "wgpu-vulkan-nvidia"),
    ("golden/variants.attn", "custom_two_pass", "cuda", "cuda-sm90"),    # custom mask, two_pass, paged
    ("golden/variants.attn", "custom_two_pass", "wgsl", "webgpu-core"),
    ("golden/variants.attn", "custom_split_f32", "cuda", "cuda-sm80"),   # custom mask, split_kv(auto), f32
    ("golden/variants.attn", "custom_split_f32", "wgsl", "wgpu-software"),
    ("golden/variants.attn", "f16_packed_append", "wgsl", "webgpu-core"),  # f16 in u32 words, append, split
    ("golden/variants.attn", "decode_i8_paged", "wgsl", "wgpu-vulkan-nvidia"),  # the decode kernel, i8, unrolled
    ("golden/variants.attn", "decode_f16_window", "wgsl", "webgpu-core"),  # the decode kernel, packed f16, teams of 4
]
# Manifests are pinned too (without the generator digest, which changes with every edit of the
# package): what a foreign runtime launches must not change by accident either.
MANIFEST_CASES = [c for c in CASES if c[0] != "vit_b16.attn"]


def _name(case):
    _, kernel, target, profile = case
    return f"{kernel}.{profile}.{'cu' if target == 'cuda' else 'wgsl'}"


def _spec(path, kernel):
    where = os.path.join(ROOT, "tests", path) if path.startswith("golden/") else os.path.join(ROOT, "examples", path)
    return attngen.load(where, name=kernel)


def _compare(text, golden, update_golden):
    if update_golden or not os.path.exists(golden):
        if not update_golden:
            pytest.fail(f"missing golden file {golden}: run pytest --update-golden and review it")
        os.makedirs(GOLDEN, exist_ok=True)
        with open(golden, "w") as f:
            f.write(text)
    with open(golden) as f:
        expected = f.read()
    assert text == expected, f"generated text differs from {golden} (run with --update-golden if intended)"


@pytest.mark.parametrize("case", CASES, ids=_name)
def test_golden_source(case, update_golden):
    path, kernel, target, profile = case
    source = emit_plan(plan(_spec(path, kernel), target, profile)).source
    _compare(source, os.path.join(GOLDEN, _name(case)), update_golden)


@pytest.mark.parametrize("case", MANIFEST_CASES, ids=_name)
def test_golden_manifest(case, update_golden):
    path, kernel, target, profile = case
    manifest = dict(emit_plan(plan(_spec(path, kernel), target, profile)).manifest)
    manifest.pop("generator")
    text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    _compare(text, os.path.join(GOLDEN, _name(case) + ".json"), update_golden)


def test_golden_block_mask_builder(update_golden):
    """The WGSL helper kernel that builds BlockMask lists on the GPU."""
    from attngen.backends.wgsl.emit import block_mask_source
    p = plan(_spec("packed_documents.attn", "llama3_8b_packed_documents"), "wgsl", "webgpu-core")
    _compare(block_mask_source(p), os.path.join(GOLDEN, "block_mask.webgpu-core.wgsl"), update_golden)


@pytest.mark.parametrize("case", CASES, ids=_name)
def test_deterministic(case):
    path, kernel, target, profile = case
    a = emit_plan(plan(_spec(path, kernel), target, profile)).source
    b = emit_plan(plan(_spec(path, kernel), target, profile)).source
    assert a == b


@pytest.mark.parametrize("case", CASES[:6], ids=_name)  # the main kernel paths (chunked ones say "prologue")
def test_source_reads_like_the_paper(case):
    """A header carrying the spec, the shared section names, the FA2 names."""
    path, kernel, target, profile = case
    source = emit_plan(plan(_spec(path, kernel), target, profile)).source
    assert source.startswith("// ====")
    assert f"attention {kernel} {{" in source.split("\n// ====", 1)[0]
    for section in ("config", "types", "memory", "matmul primitives", "mask", "score transform",
                    "kernel", "prologue: load Q", "main loop over K/V tiles", "-- S = Q K^T",
                    "-- online softmax: m_i, l_i, alpha", "-- O += P V",
                    "epilogue: normalise and store"):
        assert f"section: {section}" in source or f"// {section}" in source, section
    for name in ("m_i", "l_i", "acc", "alpha"):
        assert name in source
