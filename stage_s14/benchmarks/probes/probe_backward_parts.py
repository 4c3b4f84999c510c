"""Probe (issue 41): what the fast CUDA backward's dK/dV step spends its time on, by timing
variants of its generated source with parts removed (the results are wrong on purpose): the
atomic dQ reductions, the whole dQ product, the per-step barrier. f16, B 4, H 16, L 4096, d128
and d64, mask none; TFLOP/s counted as the full backward's."""

import sys

import torch

import attngen
from attngen.backends.cuda import backward as bw
from attngen.backends.cuda import backward_launch as bl
from attngen.backends.cuda import nvrtc

sys.path.insert(0, "benchmarks/suite")
from variants import bench_ms  # noqa: E402

# Each edit: (old, new) pairs for the 64-row steps and head dim 64's 128-row steps, each applied where
# the source holds its old text (at least one per edit).
VARIANTS = {
    "as generated": [],
    "no dQ reductions": [[("                add_dq(dq_map, seq, map_batch, prev_h, prev_i0, dq, stage, w, wi, lane);\n", ""),
                          ("                add_dq(dq_map, seq, map_batch, prev_h, prev_i0 + 64 * w, dq, stage, w, wi, lane);\n",
                           "")]],
    "no dQ": [[("if (prev_h >= 0 && (kDqSplitCols", "if (false && (kDqSplitCols"), ("if (prev_h >= 0) {", "if (false) {")],
              [("        if (kDqSplitCols || w == (n_steps & 1)) {", "        if (false) {"),
               ("        if (kDqSplitRows || kDqSplitCols || w == (n_steps & 1)) {", "        if (false) {")]],
    "no softmax math": [[("            if (elem) probabilities<true>", "            if (false) probabilities<true>")],
                        [("            else probabilities<false>(s", "            else if (false) probabilities<false>(s")],
                        [("            score_grads(s, dp, lse2 + kBlockM, lane);\n", ""),
                         ("            score_grads(s, dp, lse2 + kBlockM, lane, 0);\n", ""),
                         ("            score_grads(s, dp, lse2 + kBlockM, lane, 1);\n", "")]],
}

for d in (128, 64):
    L, H, B = 4096, 2048 // d, 4
    kernel = attngen.compile(attngen.parse(f"attention p{d} {{\n head_dim {d}\n dtype f16\n}}\n")[0], target="cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (torch.randn((B, L, H, d), device="cuda", dtype=torch.float16, generator=g) for _ in range(4))
    out, lse = kernel(q, k, v, return_lse=True)
    flops = 2.5 * 4.0 * B * H * L * L * d
    source = bw.render_backward(kernel.plan)
    for name, edits in VARIANTS.items():
        text = source
        for choices in edits:
            assert any(old in text for old, _ in choices), (name, choices)
            for old, new in choices:
                text = text.replace(old, new)
        cubin = nvrtc.compile_cubin(text, kernel.plan.details.arch)[0]
        bl._cubin = lambda plan, c=cubin: c
        kernel.__dict__.pop("_backward_functions", None)
        ms = bench_ms(lambda: kernel.backward(q, k, v, out, lse, dout))
        print(f"d{d} {name:18s} {ms:7.3f} ms  {flops / ms / 1e9:6.1f} TFLOP/s", flush=True)
