"""The Hopper family's producer warpgroup (issue 11) against the float64 reference, one case per
process with a time limit, so that a kernel that hangs is named instead of stopping the run.

    python3 benchmarks/check_producer.py [--timeout 60] [--only NAME,...]

Each case: random inputs (odd lengths, Lq != Lk, GQA groups of 7), the output poisoned with NaN
before the launch, relative error vs attngen.reference (float64) against the spec's tolerance,
and lse where asked. Prints one line per case (ok / FAIL / HANG / ERROR) and exits 1 if any case
is not ok.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name: (spec body, (B, Lq, Lk, Hq, Hkv))
CASES = {
    "d128 none": ("head_dim 128\n dtype f16\n mask none", (2, 1023, 1023, 2, 2)),
    "d128 none Lq13 Lk1023": ("head_dim 128\n dtype f16\n mask none", (1, 13, 1023, 2, 2)),
    "d128 none L7": ("head_dim 128\n dtype f16\n mask none", (1, 7, 7, 1, 1)),
    "d128 none L1": ("head_dim 128\n dtype f16\n mask none", (3, 1, 1, 1, 1)),
    "d128 none stages2": ("head_dim 128\n dtype f16\n mask none\n target cuda { stages=2 }", (2, 1023, 1023, 2, 2)),
    "d128 gqa7 bf16": ("head_dim 128\n heads q=14 kv=2\n dtype bf16\n mask none", (1, 300, 777, 14, 2)),
    "d128 causal q128": ("head_dim 128\n dtype f16\n mask causal\n tile q=128 kv=128\n target cuda { producer=on }", (2, 1023, 1023, 2, 2)),
    "d128 causal q128 grid": ("head_dim 128\n dtype f16\n mask causal\n tile q=128 kv=128\n target cuda { producer=on }", (4, 1024, 1024, 8, 8)),
    "d64 causal q128 kv64": ("head_dim 64\n dtype f16\n mask causal\n tile q=128 kv=64\n target cuda { producer=on }", (4, 1024, 1024, 8, 8)),
    "d128 causal br": ("head_dim 128\n dtype f16\n mask causal(bottom_right)\n tile q=128 kv=128\n target cuda { producer=on }", (1, 113, 1023, 2, 2)),
    "d128 window": ("head_dim 128\n dtype f16\n mask window(left=100)\n target cuda { producer=on }", (1, 1023, 1023, 2, 2)),
    "d128 softcap": ("head_dim 128\n dtype f16\n mask causal\n softcap 30\n tile q=128 kv=128\n target cuda { producer=on }", (1, 777, 777, 2, 2)),
    "d256 bf16": ("head_dim 256\n dtype bf16\n mask none\n target cuda { producer=on }", (1, 1023, 1023, 2, 2)),
    "d256 causal": ("head_dim 256\n dtype f16\n mask causal\n target cuda { producer=on }", (1, 1023, 1023, 2, 2)),
    "mla 192/128": ("head_dim qk=192 v=128\n dtype bf16\n mask causal\n tile q=128 kv=128\n target cuda { producer=on }", (1, 513, 513, 2, 2)),
    "d64 producer 1wg": ("head_dim 64\n dtype f16\n mask none\n target cuda { producer=on }", (2, 1023, 1023, 2, 2)),
    "d64 q128": ("head_dim 64\n dtype f16\n mask causal\n tile q=128 kv=128\n target cuda { producer=on }", (2, 1023, 1023, 2, 2)),
    "d96": ("head_dim 96\n dtype f16\n mask none", (1, 500, 500, 2, 2)),
    "d128 causal auto gqa7": ("head_dim 128\n heads q=7 kv=1\n dtype bf16\n mask causal(bottom_right)", (2, 300, 1023, 7, 1)),
    "d128 window auto gqa7": ("head_dim 128\n heads q=14 kv=2\n dtype bf16\n mask window(left=100, right=20)",
                              (1, 777, 1023, 14, 2)),
    "d96 causal auto": ("head_dim 96\n dtype f16\n mask causal", (2, 1023, 1023, 3, 3)),
}


def run_case(name: str) -> int:
    import numpy as np
    import torch

    import attngen
    from attngen.reference import reference, relative_error, tolerance

    body, (B, Lq, Lk, Hq, Hkv) = CASES[name]
    if "heads" not in body:
        body += f"\n heads q={Hq} kv={Hkv}"
    spec = attngen.parse(f"attention t {{\n {body}\n}}\n")[0]
    kernel = attngen.compile(spec, target="cuda")
    dt = {"f16": torch.float16, "bf16": torch.bfloat16}[spec.dtype]
    g = torch.Generator(device="cuda").manual_seed(7)
    q = torch.randn(B, Lq, Hq, spec.head_dim_qk, device="cuda", dtype=dt, generator=g)
    k = torch.randn(B, Lk, Hkv, spec.head_dim_qk, device="cuda", dtype=dt, generator=g)
    v = torch.randn(B, Lk, Hkv, spec.head_dim_v, device="cuda", dtype=dt, generator=g)
    out = torch.full((B, Lq, Hq, spec.head_dim_v), float("nan"), device="cuda", dtype=dt)
    res = kernel(q, k, v, out=out, return_lse=True)
    lse = res[1] if isinstance(res, tuple) else None
    torch.cuda.synchronize()
    np_ = [x.float().cpu().numpy() for x in (q, k, v)]
    ref, ref_lse = reference(spec, *np_, return_lse=True)
    o = out.float().cpu().numpy()
    err = relative_error(o, ref)
    lerr = float(np.nanmax(np.abs(lse.float().cpu().numpy() - ref_lse))) if lse is not None else 0.0
    ok = np.isfinite(o).all() and err <= tolerance(spec) and lerr < 1e-2
    print(f"{name:24} {kernel.plan.config.summary()[:60]:60} err {err:.1e} (tol {tolerance(spec):.0e}) "
          f"lse {lerr:.1e} {'ok' if ok else 'FAIL'}", flush=True)
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--only", default="")
    ap.add_argument("--case", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.case:
        sys.exit(run_case(a.case))
    names = [n for n in CASES if not a.only or n in a.only.split(",")]
    bad = 0
    for name in names:
        try:
            r = subprocess.run([sys.executable, __file__, "--case", name], timeout=a.timeout, capture_output=True,
                               text=True, cwd=ROOT)
        except subprocess.TimeoutExpired:
            print(f"{name:24} HANG (over {a.timeout:g} s)", flush=True)
            bad += 1
            continue
        if r.returncode not in (0, 1) or not r.stdout.strip():
            print(f"{name:24} ERROR rc={r.returncode}: {(r.stderr.strip().splitlines() or [''])[-1][:150]}", flush=True)
            bad += 1
            continue
        print(r.stdout.strip(), flush=True)
        bad += r.returncode
    print(f"{len(names) - bad} of {len(names)} cases ok")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
