"""Every example spec's CUDA kernel once at a small odd shape, checked against the float64
reference: the program to run under compute-sanitizer (issue 11 asks for memcheck and racecheck
clean on the examples).

    compute-sanitizer --tool racecheck --error-exitcode 1 python3 benchmarks/tools/racecheck_examples.py
    compute-sanitizer --tool memcheck --error-exitcode 1 python3 benchmarks/tools/racecheck_examples.py

Shapes: B 1, Lq = Lk = 150 (decode schedules: Lq 1, Lk 300), the spec's heads (or 4 over 2);
custom masks and paged caches get their run-time inputs from attngen.harness.runner. Prints a
line per kernel; exits 1 if any kernel differs from the reference beyond its tolerance.
"""

from __future__ import annotations

import glob
import os
import sys

import numpy as np

import attngen
from attngen.reference import reference, relative_error, to_numpy, tolerance
from attngen.harness.runner import runtime_inputs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _device(spec, *arrays):
    if spec.dtype == "bf16":
        import torch
        return [torch.from_numpy(a).cuda().to(torch.bfloat16) for a in arrays]
    import cupy
    return [cupy.asarray(a.astype(np.float16 if spec.dtype == "f16" else np.float32)) for a in arrays]


def main() -> int:
    ok = True
    for path in sorted(glob.glob(os.path.join(ROOT, "examples", "*.attn"))):
        with open(path) as f:
            specs = attngen.parse(f.read(), path)
        for spec in specs:
            rng = np.random.default_rng(0)
            hq, hkv = spec.heads_q or 4, spec.heads_kv or (spec.heads_q or 4) // 2 or 1
            lq, lk = (1, 300) if spec.schedule.is_split else (150, 150)
            q = rng.standard_normal((1, lq, hq, spec.head_dim_qk)).astype(np.float32)
            k = rng.standard_normal((1, lk, hkv, spec.head_dim_qk)).astype(np.float32)
            v = rng.standard_normal((1, lk, hkv, spec.head_dim_v)).astype(np.float32)
            k, v, opts = runtime_inputs(spec, q, k, v, rng)
            call = dict(opts)
            if "mask" in call:
                import cupy
                call["mask"] = cupy.asarray(call["mask"])
            kernel = attngen.compile(spec, target="cuda")
            out = kernel(*_device(spec, q, k, v), **call)
            got = np.asarray(to_numpy(out), np.float64)
            err = relative_error(got, reference(spec, q, k, v, **opts))
            good = bool(np.isfinite(got).all()) and err <= tolerance(spec)
            ok &= good
            print(f"{os.path.basename(path)} {spec.name}: rel. err {err:.2e} {'ok' if good else 'BAD'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
