"""The probes' shared helpers (benchmarks/probes/README.md). Importing it puts benchmarks/suite/
on sys.path: some probes reuse the maintained suite's modules (decode_grid, host, variants,
wgsl_peers).

The cases the WGSL probes (probe_wgsl_checks.py, probe_wgsl_plans.py, probe_wgsl_rewrite.py)
run: the shapes of run_gpu.py's WGSL suite (B L = 16384 tokens, H 16, random f16 values), by
head dim, storage dtype, length and mask, each uploaded once and freed after its rows."""

from __future__ import annotations

import os
import sys

import numpy as np

BENCHMARKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(BENCHMARKS)
SUITE = os.path.join(BENCHMARKS, "suite")
if SUITE not in sys.path:
    sys.path.append(SUITE)  # appended: its module names (host, variants) shadow nothing

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
    from attngen.backends import wgsl
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


class Row:
    """One case's cells: each variant's kernel is checked against the first one's output (rel.
    error) and timed as `attngen tune` times (GPU time, warm-up, median of 5)."""

    def __init__(self, dev, flops: float):
        self.dev, self.flops, self.ref, self.cells = dev, flops, None, []

    def add(self, label: str, make, note=None) -> None:
        """make(): the compiled kernel; note(kernel): text after the figures (or None). A variant
        that fails or is refused is a cell saying so."""
        from attngen.backends import wgsl
        from attngen.reference import relative_error

        try:
            kern = make()
            out = kern(*self.dev).numpy()
            self.ref = out if self.ref is None else self.ref
            err = relative_error(out.astype(np.float32), self.ref.astype(np.float32))
            ms = wgsl.BACKEND.time_call(kern, tuple(self.dev), {}, 5)
            extra = f" [{note(kern)}]" if note else ""
            self.cells.append(f"{label} {self.flops / ms / 1e9:6.2f} TFLOP/s {ms:.3g} ms ({err:.0e}){extra}")
        except Exception as e:  # noqa: BLE001 - a refused or failing variant: say so, go on
            self.cells.append(f"{label} n/a ({type(e).__name__}: {str(e).splitlines()[0][:80]})")

    def line(self, dtype: str, d: int, L: int, mask: str) -> str:
        return f"{dtype} d{d} L{L} {mask:6s} | " + " | ".join(self.cells)
