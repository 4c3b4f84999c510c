"""WGSL plan variants side by side on the live adapter (issue 13): the profile's default plan
beside spec-given tiles and workgroup sizes, for the suite's shapes (B L = 16384 tokens, H 16),
f16 and f32 storage. Each variant is checked against the default plan's output (relative error)
and timed as `attngen tune` times (GPU time from timestamp queries after 0.3 s of warm-up calls,
median of 5). What it prints is the evidence behind a profile default; it changes nothing.

    python3 benchmarks/probes/probe_wgsl_plans.py [--lengths 1024,4096] [--dims 64,128] [--dtypes f32,f16]
                                           [--masks none,causal] [--tokens 16384]
                                           [--variants spec|profile|prefetch|occupancy|kv|wg512]
"""

from __future__ import annotations

import argparse
import dataclasses


import attngen
from attngen.backends import wgsl
from common import Row, add_arguments, cases, spec_text


def _row(q: int, kv: int, tpr: int, rows: int):
    """A variant given by a profile row: tile q, tile kv, invocations per row, rows per invocation."""
    return (f"q{q} kv{kv} tpr{tpr} r{rows}", "",
            {"tile_q": q, "threads_per_row": tpr, "tile_kv": kv, "rows_per_invocation": rows})


# (label, spec lines, profile [[defaults]] keys replaced): the spec gives tiles and the workgroup
# (tile q x invocations per row, one row each); a profile row gives what a spec cannot (invocations
# per row with several rows each, rows per invocation)
VARIANTS = {
    "spec": [
        ("default", "", None),
        ("q32 kv16 wg128", "tile q=32 kv=16\n target wgsl { workgroup=128 }", None),
        ("q32 kv32 wg128", "tile q=32 kv=32\n target wgsl { workgroup=128 }", None),
        ("q64 kv16", "tile q=64 kv=16", None),
    ],
    "profile": [
        ("default", "", None),
        ("tpr4", "", {"threads_per_row": 4}),
        ("q64 kv64", "", {"tile_kv": 64}),
        ("q128 kv32", "", {"tile_q": 128}),
        ("tpr4 kv64", "", {"threads_per_row": 4, "tile_kv": 64}),
        _row(128, 32, 8, 4),
        ("default again", "", None),  # the first timing of a row can read low (see NOTES.md)
    ],
    # the next step's tiles prefetched into registers (the profile's default) or plain copies
    "prefetch": [
        ("default", "", None),
        ("prefetch=off", "target wgsl { prefetch=off }", None),
        ("default again", "", None),
    ],
    # the f16 row's 64 keys per tile against the 32 of the f32 row
    "kv": [
        ("default", "", None),
        _row(128, 32, 8, 4),
        _row(128, 64, 8, 4),
        ("default again", "", None),
    ],
    # workgroups of 512 invocations (16 warps) on the default's 48 KiB: the H100's Vulkan driver keeps
    # one workgroup per multiprocessor once a workgroup takes 32 KiB or more (probe_wgsl_residency.py),
    # so more warps per multiprocessor come only from larger workgroups
    "wg512": [
        ("default", "", None),
        _row(128, 64, 8, 2),
        _row(128, 32, 8, 2),
        _row(64, 64, 8, 1),
        _row(128, 32, 16, 4),
        ("default again", "", None),
    ],
    # around the q128 default (8 invocations per row, 4 rows each): workgroups of 128 (more of them
    # per SM where registers allow), longer K/V tiles (fewer barriers per key), 8 rows per invocation
    "occupancy": [
        ("default", "", None),
        _row(64, 32, 8, 4),
        _row(128, 32, 8, 4),
        _row(128, 64, 8, 4),
        _row(128, 32, 16, 4),
        _row(128, 16, 8, 4),
        _row(64, 64, 8, 2),
        ("default again", "", None),
    ],
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(ap)
    ap.add_argument("--variants", default="spec", choices=sorted(VARIANTS))
    args = ap.parse_args()
    base = wgsl.adapter_profile()
    for dtype, d, L, mask, dev, flops in cases(args):
        row = Row(dev, flops)
        for label, extra, tiles in VARIANTS[args.variants]:
            def make(extra=extra, tiles=tiles):
                profile = None
                if tiles:
                    new = {**base.default_row(d, dtype=dtype), **tiles, "max_head_dim": d, "dtype": dtype}
                    profile = dataclasses.replace(base, defaults=(new,) + tuple(base.defaults))
                return attngen.compile(attngen.parse(spec_text(dtype, d, mask, extra))[0], target="wgsl",
                                       profile=profile)
            row.add(label, make, (lambda k: k.plan.config.sub_block) if tiles else None)
        print(row.line(dtype, d, L, mask), flush=True)


if __name__ == "__main__":
    main()
