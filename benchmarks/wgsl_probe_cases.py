"""The cases the WGSL probes (probe_wgsl_checks.py, probe_wgsl_plans.py, probe_wgsl_rewrite.py)
run: the shapes of run_gpu.py's WGSL suite (B L = 16384 tokens, H 16, random f16 values), by
head dim, storage dtype, length and mask, each uploaded once and freed after its rows."""

from __future__ import annotations

import numpy as np

from attngen.backends import wgsl

TOKENS, HEADS = 16384, 16


def add_arguments(ap, masks: str = "none,causal") -> None:
    """--lengths, --dims, --dtypes, --masks and --tokens."""
    ap.add_argument("--lengths", default="1024,4096")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--dtypes", default="f32,f16")
    ap.add_argument("--masks", default=masks)
    ap.add_argument("--tokens", type=int, default=TOKENS, help="B L (default %(default)s)")


def spec_text(dtype: str, d: int, mask: str, extra: str = "") -> str:
    lines = [f"head_dim {d}", f"heads q={HEADS} kv={HEADS}", f"dtype {dtype}"]
    if mask != "none":
        lines.append(f"mask {mask}")
    if extra:
        lines.append(extra)
    return "attention probe {\n " + "\n ".join(lines) + "\n}\n"


def cases(args):
    """(dtype, d, L, mask, the inputs q, k, v on the adapter, attention FLOPs) per case."""
    for d in (int(x) for x in args.dims.split(",")):
        rng = np.random.default_rng(d)
        host = [rng.standard_normal((args.tokens, HEADS, d), dtype=np.float32).astype(np.float16) for _ in range(3)]
        for dtype in args.dtypes.split(","):
            np_dt = np.float16 if dtype == "f16" else np.float32
            for L in (int(x) for x in args.lengths.split(",")):
                shape = (args.tokens // L, L, HEADS, d)
                dev = [wgsl.WgslTensor.from_numpy(a.reshape(shape).astype(np_dt)) for a in host]
                for mask in args.masks.split(","):
                    flops = 4.0 * shape[0] * HEADS * L * L * d / (2 if mask == "causal" else 1)
                    yield dtype, d, L, mask, dev, flops
                for t in dev:
                    t.buffer.destroy()
