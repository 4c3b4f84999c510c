"""The WGSL family on subgroup matrices (issue 43; `target wgsl { matrix=on }`) beside attngen's
scalar WGSL kernel (`matrix=off`, the profile's default plan) on the WGSL grid rows of the suite
(f16, d64 / d128 x L 1024 / 4096 x full / causal, B L = 16384 tokens, H 16): TFLOP/s of each
(GPU time from timestamp queries, as `attngen tune` times: warm-up, median of 5), and the
subgroup-matrix kernel's relative error against the scalar kernel's output, and the ratio of the
two (issue 43's must: >= 2.5x on every row); `auto` is the spec without `matrix` (the default),
which plans the family on such an adapter: its time is sgmat's. Needs an adapter with
f16 subgroup matrices: Dawn on NVIDIA's Vulkan driver,

    ATTNGEN_WGPU=wgpudawn python3 benchmarks/probes/probe_wgsl_sgmat.py [--lengths 1024,4096]
                                  [--dims 64,128] [--masks none,causal] [--tokens 16384]

(the runtime sets Dawn's f16 toggle itself). About a minute on the H100; it changes nothing.
"""

from __future__ import annotations

import argparse
import sys

import attngen
from attngen.backends import wgsl
from common import Row, add_arguments, cases, spec_text

VARIANTS = [
    ("scalar", "target wgsl { matrix=off }"),
    ("sgmat", "target wgsl { matrix=on }"),
    ("auto", ""),  # the spec without `matrix` (auto, the default): the family where the adapter has it
    ("scalar again", "target wgsl { matrix=off }"),  # the first timing of a row can read low (NOTES.md)
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(ap)
    ap.set_defaults(dtypes="f16")
    args = ap.parse_args()
    from attngen.backends.wgsl.matrix import choose
    profile = wgsl.adapter_profile()
    config = choose(profile)
    print(f"adapter profile {profile.name}; subgroup matrix: {config.summary if config else 'none'}", flush=True)
    if config is None:
        sys.exit("this adapter offers no f16 subgroup matrices: run with ATTNGEN_WGPU=wgpudawn on the NVIDIA machine")
    for dtype, d, L, mask, dev, flops in cases(args):
        row = Row(dev, flops)
        for label, extra in VARIANTS:
            row.add(label, lambda extra=extra: attngen.compile(
                attngen.parse(spec_text(dtype, d, mask, extra))[0], target="wgsl"))
        print(row.line(dtype, d, L, mask) + " | " + ratio(row.cells), flush=True)


def ratio(cells) -> str:
    """sgmat's TFLOP/s over the better scalar timing's (the must: >= 2.5 on every row)."""
    tf = {c.split(" ")[0] + (" again" if " again " in c else ""): float(c.split("TFLOP/s")[0].split()[-1])
          for c in cells if "TFLOP/s" in c}
    scalar = max(tf.get("scalar", 0.0), tf.get("scalar again", 0.0))
    if "sgmat" not in tf or not scalar:
        return "sgmat / scalar n/a"
    x = tf["sgmat"] / scalar
    return f"sgmat / scalar {x:.2f}x {'(>= 2.5: ok)' if x >= 2.5 else '(below 2.5)'}"


if __name__ == "__main__":
    main()
