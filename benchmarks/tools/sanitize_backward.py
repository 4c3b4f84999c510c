"""The CUDA backward's kernels (issue 41) at small odd shapes, checked against
attngen.reference_backward: the program to run under compute-sanitizer.

    compute-sanitizer --tool memcheck --error-exitcode 1 python3 benchmarks/tools/sanitize_backward.py
    compute-sanitizer --tool racecheck --error-exitcode 1 python3 benchmarks/tools/sanitize_backward.py
    (case names as arguments run only those: `... sanitize_backward.py "d128 grad table 200x300"`)

Variants: causal GQA 3, window + softcap + scale, unequal head dims 192/128 (bf16), kv_lens with
inf / NaN past them, packed sequences, custom masks (boolean and additive), the fast families'
kernels (128-key blocks with 64- and 128-row steps, head dim 256, mma.sync on cuda-sm80), a `grad`
table at a clamped k - q. Prints a line per case; exits 1 if a gradient differs from the reference
beyond twice the forward's tolerance.
"""

from __future__ import annotations

import sys

import numpy as np

import attngen
from attngen.backends.cuda.backward import family as backward_family
from attngen.reference import relative_error, tolerance

CASES = [
    ("causal gqa3", "head_dim 64\n heads q=6 kv=2\n dtype f16\n mask causal", {}),
    ("window softcap scale", "head_dim 64\n heads q=4 kv=4\n dtype f16\n mask window(left=20, right=3)\n"
                             " softcap 10.0\n scale 0.2", {}),
    ("192/128 bf16", "head_dim qk=192 v=128\n heads q=4 kv=4\n dtype bf16\n mask causal(bottom_right)", {}),
    ("kv_lens", "head_dim 64\n heads q=4 kv=2\n dtype f16\n mask causal(bottom_right)", {"kv_lens": [37, 70]}),
    ("packed", "head_dim 64\n heads q=4 kv=2\n dtype f16\n mask causal", {"cu": [0, 29, 29, 70]}),
    ("custom", "head_dim 64\n heads q=4 kv=2\n dtype f16\n mask custom", {"mask": True}),
    # several key blocks and query steps of the fast family (wgmma: 128 keys, 64-row steps)
    ("d128 causal 300x400", "head_dim 128\n heads q=3 kv=1\n dtype f16\n mask causal(bottom_right)",
     {"shape": (300, 400)}),
    ("d64 bf16 257x513", "head_dim 64\n heads q=2 kv=2\n dtype bf16\n mask none", {"shape": (257, 513)}),
    ("d128 custom 200x300", "head_dim 128\n heads q=2 kv=1\n dtype f16\n mask custom",
     {"mask": True, "shape": (200, 300)}),
    ("deterministic", "head_dim 64\n heads q=4 kv=2\n dtype f16\n mask causal\n target cuda { backward=deterministic }",
     {"shape": (150, 260)}),
    # d64's 128-row steps, the additive custom mask's entry (dkdv_add), the head-dim-256 kernel
    # (64-key blocks), and the mma.sync family (profile cuda-sm80, as an A100 runs it)
    ("d64 causal 300x260", "head_dim 64\n heads q=3 kv=1\n dtype f16\n mask causal", {"shape": (300, 260)}),
    ("d128 additive 200x300", "head_dim 128\n heads q=2 kv=1\n dtype f16\n mask custom",
     {"mask": "additive", "shape": (200, 300)}),
    ("d256 causal 130x200", "head_dim 256\n heads q=3 kv=1\n dtype bf16\n mask causal(bottom_right)",
     {"shape": (130, 200)}),
    ("d256 custom 100x150", "head_dim 256\n heads q=2 kv=2\n dtype f16\n mask custom", {"mask": True, "shape": (100, 150)}),
    # (softcap's one-pass recompute; 4 steps per head, two heads per block: the dQ box kept across steps)
    ("d256 softcap 200x130", "head_dim 256\n heads q=2 kv=1\n dtype f16\n softcap 20", {"shape": (200, 130)}),
    # (Q and dO by the tensor copy engine: rows past a packed sequence's end zeroed in shared memory)
    ("d256 packed", "head_dim 256\n heads q=2 kv=1\n dtype f16\n mask causal", {"cu": [0, 70, 70, 200]}),
    ("mma d128 causal gqa3", "head_dim 128\n heads q=3 kv=1\n dtype f16\n mask causal",
     {"profile": "cuda-sm80", "shape": (150, 200)}),
    ("mma d64 window softcap", "head_dim 64\n heads q=2 kv=2\n dtype bf16\n mask window(left=20, right=3)\n softcap 10.0",
     {"profile": "cuda-sm80", "kv_lens": [37, 70]}),
    # a `grad` table read at a clamped k - q (the fast family's register sums of uniform steps,
    # the band's shuffles and red.shared adds into the step's run, the flushes' atomics)
    ("d128 grad table 200x300", "head_dim 128\n heads q=3 kv=1\n dtype f16\n input table[h, 201] f32 grad\n"
                                " score s + table[h, clamp(k - q, -100, 100) + 100]", {"table": 201, "shape": (200, 300)}),
]


def main() -> int:
    import torch
    ok = True
    picked = set(sys.argv[1:])  # case names (all without)
    for name, body, opt in CASES:
        if picked and name not in picked:
            continue
        spec = attngen.parse(f"attention s {{\n {body}\n}}\n")[0]
        kernel = attngen.compile(spec, target="cuda", profile=opt.get("profile"))
        rng = np.random.default_rng(0)
        hq, hkv = spec.heads_q, spec.heads_kv
        dt = {"f16": torch.float16, "bf16": torch.bfloat16}[spec.dtype]
        if "cu" in opt:
            n = opt["cu"][-1]
            shapes = ((n, hq, spec.head_dim_qk), (n, hkv, spec.head_dim_qk), (n, hkv, spec.head_dim_v))
        else:
            lq, lk = opt.get("shape", (53, 70))
            shapes = ((2, lq, hq, spec.head_dim_qk), (2, lk, hkv, spec.head_dim_qk), (2, lk, hkv, spec.head_dim_v))
        q, k, v = (rng.standard_normal(s).astype(np.float32) for s in shapes)
        kw = {}
        if "kv_lens" in opt:
            kw["kv_lens"] = np.array(opt["kv_lens"], np.int32)
            for b, n in enumerate(opt["kv_lens"]):
                k[b, n:], v[b, n:] = np.inf, np.nan
        if "cu" in opt:
            kw["cu_seqlens_q"] = np.array(opt["cu"], np.int32)
        if opt.get("mask") == "additive":  # a float mask: added to the scores, -inf hides
            shape = (2, 1) + shapes[0][1:2] + shapes[1][1:2]
            bias = np.where(rng.random(shape) < 0.5, -np.inf, rng.standard_normal(shape))
            kw["mask"] = torch.from_numpy(bias).to(torch.float32).cuda()
        elif opt.get("mask"):
            kw["mask"] = torch.from_numpy(rng.random((2, 1) + shapes[0][1:2] + shapes[1][1:2]) < 0.5).cuda()
        if "table" in opt:  # a `grad` input: (query heads, entries)
            kw["table"] = (rng.standard_normal((hq, opt["table"])) * 0.5).astype(np.float32)
        tq, tk, tv = (torch.from_numpy(x).cuda().to(dt) for x in (q, k, v))
        dout = torch.randn((*shapes[0][:-1], spec.head_dim_v), device="cuda", dtype=dt)
        call = {n: (torch.from_numpy(x).cuda() if n == "table" else x) for n, x in kw.items()}
        out, lse = kernel(tq, tk, tv, return_lse=True, **call)
        grads = kernel.backward(tq, tk, tv, out, lse, dout, **call)
        torch.cuda.synchronize()
        ref_kw = {n: (x.cpu().numpy() if hasattr(x, "cpu") else x) for n, x in kw.items()}
        if "cu_seqlens_q" in ref_kw:
            ref_kw["cu_seqlens_q"] = ref_kw["cu_seqlens_q"]
        want = attngen.reference_backward(spec, tq, tk, tv, dout, **ref_kw)
        errs = [relative_error(g.float().cpu().numpy(), w) for g, w in zip(grads[:3], want[:3])]
        if len(want) > 3:  # the `grad` inputs' gradients
            errs += [relative_error(grads[3][n].float().cpu().numpy(), w) for n, w in want[3].items()]
        good = all(e <= 2 * tolerance(spec) for e in errs)
        ok &= good
        family = backward_family(kernel.plan)
        print(f"{name:22s} {family:5s} dq {errs[0]:.1e} dk {errs[1]:.1e} dv {errs[2]:.1e} {'ok' if good else 'FAIL'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
