"""Where a WGSL kernel's time goes, by timing it with parts of its source taken out (issue 13).

    python3 benchmarks/probe_wgsl_rewrite.py [--lengths 1024,4096] [--dims 64,128] [--dtypes f32,f16]
                                             [--masks causal] [--rewrites noguard,nomask,noguard+nomask]

Each rewrite is a text substitution on the generated source, applied where the pipeline is made
(attngen's kernels are otherwise unchanged); the rewritten kernels compute a different function
(the rel. err. column says how different from the unchanged kernel: a timing probe, not a
variant). Rewrites:
- noguard: O += P V never takes the guarded loop (keys with p = 0 selected out per FMA), which
  the kernels run on partial tiles and on tiles where some p is 0;
- nomask: partial tiles apply no per-element mask (visible()).
It changes nothing in attngen.
"""

from __future__ import annotations

import argparse
import re

import numpy as np

import attngen
from attngen.backends import wgsl
from attngen.backends.wgsl import kernel as wgsl_kernel
from attngen.reference import relative_error

TOKENS, HEADS = 16384, 16
REWRITES = {
    "noguard": [(r"if \(partial \|\| atomicLoad\(&p_zero_tile\) == u32\(it\) \+ 1u\) \{", "if (false) {"),
                (r"if \(partial \|\| p_zero\) \{", "if (false) {")],
    "nomask": [(r"if \(partial && !visible\(", "if (false && !visible(")],
}


def rewriter(original, names):
    def create(dev, label, code, runtime_checks="all"):
        for name in names:
            found = 0
            for pat, rep in REWRITES[name]:
                code, n = re.subn(pat, rep, code)
                found += n
            if not found:
                print(f"  (rewrite {name}: nothing to rewrite in {label})")
        return original(dev, label, code, runtime_checks)
    return create


def spec_text(dtype: str, d: int, mask: str) -> str:
    lines = [f"head_dim {d}", f"heads q={HEADS} kv={HEADS}", f"dtype {dtype}"]
    if mask != "none":
        lines.append(f"mask {mask}")
    return "attention probe {\n " + "\n ".join(lines) + "\n}\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="1024,4096")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--dtypes", default="f32,f16")
    ap.add_argument("--masks", default="causal")
    ap.add_argument("--rewrites", default="noguard,nomask,noguard+nomask")
    ap.add_argument("--tokens", type=int, default=TOKENS, help="B L (default %(default)s)")
    args = ap.parse_args()
    backend = wgsl.BACKEND
    original = wgsl_kernel.create_module
    variants = [("unchanged", [])] + [(r, r.split("+")) for r in args.rewrites.split(",") if r]
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
                    ref, cells = None, []
                    for label, names in variants + [("unchanged again", [])]:
                        try:
                            wgsl_kernel._PIPELINES.clear()
                            wgsl_kernel.create_module = rewriter(original, names) if names else original
                            kern = attngen.compile(attngen.parse(spec_text(dtype, d, mask))[0], target="wgsl")
                            out = kern(*dev).numpy()
                            ref = out if ref is None else ref
                            err = relative_error(out.astype(np.float32), ref.astype(np.float32))
                            ms = backend.time_call(kern, tuple(dev), {}, 5)
                            cells.append(f"{label} {flops / ms / 1e9:6.2f} TFLOP/s {ms:.3g} ms ({err:.0e})")
                        except Exception as e:  # noqa: BLE001 - a failing variant: say so, go on
                            cells.append(f"{label} n/a ({type(e).__name__}: {str(e).splitlines()[0][:80]})")
                        finally:
                            wgsl_kernel.create_module = original
                    print(f"{dtype} d{d} L{L} {mask:6s} | " + " | ".join(cells), flush=True)
                for t in dev:
                    t.buffer.destroy()
    wgsl_kernel._PIPELINES.clear()


if __name__ == "__main__":
    main()
