"""Where a WGSL kernel's time goes, by timing it with parts of its source taken out (issue 13).

    python3 benchmarks/probes/probe_wgsl_rewrite.py [--lengths 1024,4096] [--dims 64,128] [--dtypes f32,f16]
                                             [--masks causal] [--rewrites noguard,nomask,noguard+nomask]

Each rewrite is a text substitution on the generated source, applied where the pipeline is made
(attngen's kernels are otherwise unchanged); the rewritten kernels compute a different function
(the rel. err. column says how different from the unchanged kernel: a timing probe, not a
variant). Rewrites:
- noguard: O += P V never takes the guarded loop (keys with p = 0 selected out per FMA), which
  the kernels run on partial tiles and on tiles where some p is 0;
- nomask: partial tiles apply no per-element mask (visible());
- nobarrier: no workgroupBarrier() at all (a racy kernel: what the barriers cost);
- noexp: p = t - m instead of exp2(t - m) (what the exponentials cost);
- fmapv: P V's `acc += p * v` written as fma(p, v, acc) (the same function up to rounding:
  whether the driver contracts the multiply and add by itself);
- unrollchunks: the loops over a chunk's dims (Q K^T, `x < DIM_CHUNK_QK`) and key quads
  (P V, `x < KEY_CHUNK`) unrolled as well (attngen/backends/wgsl/unroll.py), which the profile's
  unrolling leaves as loops: the same function, a different schedule for the driver;
- nochecks: the pipeline made with no runtime checks of wgpu's (no index clamps: the profile's
  "bounds" keeps them), the same source.
It changes nothing in attngen.
"""

from __future__ import annotations

import argparse
import re


import attngen
from attngen.backends.wgsl import kernel as wgsl_kernel
from common import Row, add_arguments, cases, spec_text

REWRITES = {
    "noguard": [(r"if \(\(partial \|\| atomicLoad\(&p_zero_tile\) == u32\(it\) \+ 1u\) && atomicLoad\(&v_nonfinite_tile\) "
                 r"== u32\(it\) \+ 1u\) \{", "if (false) {"),
                (r"if \(partial \|\| atomicLoad\(&p_zero_tile\) == u32\(it\) \+ 1u\) \{", "if (false) {"),
                (r"if \(partial \|\| p_zero\) \{", "if (false) {")],
    "nomask": [(r"if \(partial && !visible\(", "if (false && !visible(")],
    "nobarrier": [(r"workgroupBarrier\(\);", "")],
    "noexp": [(r"exp2\(s\[i\]\[u\] - m_use\)", "(s[i][u] - m_use)")],
    "fmapv": [(r"acc\[i\]\[([^\]]*)\] \+= pv_acc_t\(p4\[i\]\[e\]\) \* v;",
               r"acc[i][\1] = fma(vec4<pv_acc_t>(p4[i][e]), v, acc[i][\1]);")],
    "unrollchunks": "unroll",  # not a substitution: see _unroll_chunks
    "nochecks": "checks",  # not a substitution: the pipeline made without wgpu's index clamps
}


def _unroll_chunks(code: str) -> tuple[str, int]:
    from attngen.backends.wgsl import unroll
    saved = dict(unroll.UNROLL_BOUNDS)
    unroll.UNROLL_BOUNDS.update(DIM_CHUNK_QK=16, DIM_CHUNK_V=16, KEY_CHUNK=16)
    try:
        out = unroll.unroll_loops(code)
    finally:
        unroll.UNROLL_BOUNDS.clear()
        unroll.UNROLL_BOUNDS.update(saved)
    return out, int(out != code)


def rewriter(original, names):
    def create(dev, label, code, runtime_checks="all"):
        for name in names:
            found = 0
            if REWRITES[name] == "unroll":
                code, found = _unroll_chunks(code)
            elif REWRITES[name] == "checks":
                runtime_checks, found = "none", 1
            else:
                for pat, rep in REWRITES[name]:
                    code, n = re.subn(pat, rep, code)
                    found += n
            if not found:
                print(f"  (rewrite {name}: nothing to rewrite in {label})")
        return original(dev, label, code, runtime_checks)
    return create


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(ap, masks="causal")
    ap.add_argument("--rewrites", default="noguard,nomask,noguard+nomask")
    args = ap.parse_args()
    original = wgsl_kernel.create_module
    variants = [("unchanged", [])] + [(r, r.split("+")) for r in args.rewrites.split(",") if r]
    for dtype, d, L, mask, dev, flops in cases(args):
        row = Row(dev, flops)
        for label, names in variants + [("unchanged again", [])]:
            wgsl_kernel._PIPELINES.clear()
            wgsl_kernel.create_module = rewriter(original, names) if names else original
            try:
                row.add(label, lambda: attngen.compile(attngen.parse(spec_text(dtype, d, mask))[0], target="wgsl"))
            finally:
                wgsl_kernel.create_module = original
        print(row.line(dtype, d, L, mask), flush=True)
    wgsl_kernel._PIPELINES.clear()


if __name__ == "__main__":
    main()
