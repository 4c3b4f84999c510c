"""Non-finite values of V in partial tiles under compute-sanitizer racecheck (the zeroing of
clean_values is shared by every warp of a block; templates/cuda/nonfinite.j2).

    compute-sanitizer --tool racecheck --error-exitcode 1 python3 benchmarks/tools/racecheck_values.py ["spec body" ...]

Causal, window and custom-mask kernels of the Hopper family on sm_90a (the producer warpgroup's
persistent blocks: its K/V ring, a custom mask's words staged beside K and V, the redone items;
head dims 320 and 512: output column blocks and split Q K^T), V with inf / NaN on keys that the
rows of a diagonal tile see only in part, and one key with -inf in K and inf in V (rows whose score
with it is -inf must keep its V out: the redone items clean every tile); the results are compared
with the float64 reference (NaN exactly where a row sees a bad key)."""

from __future__ import annotations

import sys

import numpy as np
import torch

import attngen
from attngen.reference import reference, relative_error, tolerance


def main() -> int:
    ok = True
    n = 300
    i = np.arange(n)
    window = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - 100)  # a band, as a custom mask
    bodies = [b.replace("\\n", "\n") for b in sys.argv[1:]] or [
        "head_dim 64\n dtype f16\n mask causal", "head_dim 64\n dtype bf16\n mask window(left=40)",
        "head_dim 128\n dtype f16\n mask custom", "head_dim 320\n dtype f16\n mask causal",
        "head_dim 512\n dtype bf16\n mask causal"]
    for body in bodies:
        spec = attngen.parse("attention r {\n" + body + "\n}")[0]
        kern = attngen.compile(spec, target="cuda")
        rng = np.random.default_rng(0)
        d = spec.head_dim_qk
        q, k, v = (rng.standard_normal((1, n, 4, d)).astype(np.float32) for _ in range(3))
        v[0, 70, 1, 5] = np.inf
        v[0, 133, 2, 9] = np.nan
        v[0, 250, 3, 1] = np.inf
        v[0, 200, 0, d - 2] = -np.inf  # (the second column block, the other warpgroup's columns)
        k[0, 180, :, 3] = -np.inf  # a key whose score is -inf for some rows that see it ...
        v[0, 180, :, 7] = np.inf   # ... and whose V is not finite (a full tile for rows past 192)
        dt = torch.bfloat16 if "bf16" in body else torch.float16
        extra = {"mask": torch.from_numpy(window).cuda()} if "custom" in body else {}
        out = kern(*(torch.from_numpy(a).cuda().to(dt) for a in (q, k, v)), **extra)
        got = out.float().cpu().numpy()
        ref = reference(spec, q, k, v, **({"mask": window} if extra else {}))
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
