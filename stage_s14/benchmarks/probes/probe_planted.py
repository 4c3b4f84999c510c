"""Non-finite K and V planted at visible keys (issue 11 / hardening; a reproduction, not a test):
which CUDA kernels give a non-finite result on rows whose reference result is finite.

    python3 benchmarks/probes/probe_planted.py

Plants (B2 Lq150 Lk170 Hq2 Hkv1, causal): `sep` puts inf / NaN in K at some keys and in V at
others; `kv` puts them in K and V of the same keys, so that a row that sees such a key and whose
score with it is -inf (a -inf in K times a positive q) has p = 0 for a key whose V is not finite.
The reference (attngen/reference.py) lets only keys with p != 0 bring their non-finite values in;
the CUDA kernels cleaned V only in partial tiles (hidden keys), so in a full tile 0 * inf made that
column NaN (found 2026-11-26 in every causal CUDA kernel, both families; the WGSL kernels select
per FMA where a tile has p = 0 keys and a non-finite V, and agree with the reference). Since then
the kernels' cleaning passes clean every tile, mask none included (2026-11-26, sixth session):
the kernels below agree except split_kv and two_pass, whose plain loop has no cleaning pass yet
(docs/language.md, "A key of weight 0 adds nothing").
`under` puts -6e4 in K at key 0 (q's first component made positive) and inf / NaN in its V: a
key every row sees whose weight underflows to exactly 0 (docs/language.md, "A key of weight 0
adds nothing"). Prints, per kernel and plant, the rows that the reference keeps finite and the
kernel does not.
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tests"))
import attngen  # noqa: E402
from attngen.reference import reference  # noqa: E402
from conftest import _to_numpy, random_qkv, to_device  # noqa: E402

BODIES = [
    "head_dim 64\n dtype f16\n mask causal\n target cuda { producer=off }",
    "head_dim 128\n dtype f16\n mask causal",
    "head_dim 256\n dtype f16\n mask causal",
    "head_dim 320\n dtype f16\n mask causal",
    "head_dim 512\n dtype f16\n mask causal",
    "head_dim 64\n dtype f16",
    "head_dim 128\n dtype f16",
    "head_dim 128\n dtype f16\n mask causal\n schedule split_kv(3)",
    "head_dim 128\n dtype f16\n schedule two_pass",
]


def run(body: str, plant: str) -> None:
    spec = attngen.parse("attention planted%d {\n%s\n}\n" % (abs(hash(body)) % 10**6, body))[0]
    b, lq, lk = 2, 150, 170
    q, k, v = random_qkv(spec, b, lq, lk, heads_q=2, heads_kv=1, seed=21)
    dqk, dv = spec.head_dim_qk, spec.head_dim_v
    if plant == "sep":
        k_at = [(lk - 1, dqk - 3, np.inf), (lk - 90, dqk // 2 + 1, -np.inf), (lk - 45, 5, np.nan)]
        v_at = [(lk - 30, dv // 2 + 7, np.nan), (lk - 60, 2, np.inf), (lk - 5, dv - 1, -np.inf)]
    elif plant == "kv":
        k_at = [(lk - 1, dqk - 3, np.inf), (lk - 30, 5, np.nan), (lk - 90, dqk // 2 + 1, -np.inf)]
        v_at = [(lk - 1, dv - 1, np.inf), (lk - 30, dv // 2 + 7, np.nan), (lk - 90, 2, -np.inf)]
    else:  # "under": key 0 (every row sees it) with a finite score far below every row's maximum
        q[..., 0] = np.abs(q[..., 0]) + 0.5
        k_at = [(0, 0, -6e4)]
        v_at = [(0, 0, np.inf), (0, 1, np.nan)]
    for j, c, x in k_at:
        k[:, j, :, c] = x
    for j, c, x in v_at:
        v[:, j, :, c] = x
    kern = attngen.compile(spec, target="cuda")
    out = _to_numpy(kern(*to_device("cuda", spec.dtype, q, k, v)))
    with np.errstate(invalid="ignore", over="ignore"):
        ref = reference(spec, q, k, v)
    bad = np.argwhere(np.isfinite(ref).all(-1) & ~np.isfinite(out).all(-1))
    print(f"{body.replace(chr(10), ' '):60s} {plant:3s} rows finite in the reference, not here: {len(bad)} "
          f"(query rows {sorted(set(bad[:, 1].tolist()))[:8]})", flush=True)


if __name__ == "__main__":
    for body in BODIES:
        for plant in ("sep", "kv", "under"):
            run(body, plant)
