"""Non-finite values of V in partial tiles under compute-sanitizer racecheck (the zeroing of
clean_values is shared by every warp of a block; templates/cuda/nonfinite.j2).

    compute-sanitizer --tool racecheck --error-exitcode 1 python3 benchmarks/racecheck_values.py

Causal kernels of both families (wgmma for d64 f16 on sm_90a, mma.sync for f32 accumulators'
neighbours), V with inf / NaN on keys that the rows of a diagonal tile see only in part; the
results are compared with the float64 reference (NaN exactly where a row sees a bad key)."""

from __future__ import annotations

import sys

import numpy as np
import torch

import attngen
from attngen.reference import reference, relative_error, tolerance


def main() -> int:
    ok = True
    for body in ("head_dim 64\n dtype f16\n mask causal", "head_dim 64\n dtype bf16\n mask window(left=40)"):
        spec = attngen.parse("attention r {\n" + body + "\n}")[0]
        kern = attngen.compile(spec, target="cuda")
        rng = np.random.default_rng(0)
        q, k, v = (rng.standard_normal((1, 150, 4, 64)).astype(np.float32) for _ in range(3))
        v[0, 70, 1, 5] = np.inf
        v[0, 133, 2, 9] = np.nan
        dt = torch.bfloat16 if "bf16" in body else torch.float16
        out = kern(*(torch.from_numpy(a).cuda().to(dt) for a in (q, k, v)))
        got = out.float().cpu().numpy()
        ref = reference(spec, q, k, v)
        # the contract (docs): a row that sees a non-finite value is non-finite, every other row
        # is finite and within tolerance
        rows_ref, rows_got = np.isfinite(ref).all(-1), np.isfinite(got).all(-1)
        same_nan = bool((rows_ref == rows_got).all()) and bool((~rows_ref).any())
        err = relative_error(got[rows_ref], ref[rows_ref])
        close = err <= tolerance(spec)
        print(f"{body.splitlines()[-1]}: non-finite rows as the reference {same_nan}, finite rows within tolerance {close} ({err:.2e})")
        ok &= bool(same_nan and close)
    torch.cuda.synchronize()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
