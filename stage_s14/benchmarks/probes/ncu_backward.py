"""Hardware counters of attngen's fast CUDA backward (issue 41) beside SDPA flash's backward on the
same inputs: where a short row (d128 causal L1024) or a `mask custom` step loses time. Run under
Nsight Compute on the GPU machine:

    ncu --clock-control none --profile-from-start off --section SpeedOfLight \
        --section WarpStateStats --section SchedulerStats --section LaunchStats \
        python3 benchmarks/probes/ncu_backward.py [--d 128] [--l 1024] [--mask causal] [--flash]

--mask: none, causal, window (the named window 1024, causal side), window-custom (the same window
as a BlockMask), doc-custom (the masks section's document-causal mask). The dense suite's shape
(B L = 16384, H D = 2048). Each backward is warmed up outside the profiled range, then run once
inside it (torch.cuda.profiler.start / stop): attngen's three kernels (preprocess, dkdv, dq), then
SDPA flash's with --flash (dense masks only). Without ncu it prints each one's median time.
ATTNGEN_NVRTC_LINEINFO=1 compiles with -lineinfo, for ncu's source page (attngen/backends/cuda/nvrtc.py).
"""

from __future__ import annotations

import argparse

import torch
from torch.nn.attention import SDPBackend

import attngen
from common import median_ms, profiled_once, randn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--l", type=int, default=1024)
    ap.add_argument("--mask", default="causal", choices=["none", "causal", "window", "window-custom", "doc-custom"])
    ap.add_argument("--dtype", default="f16", choices=["f16", "bf16"])
    ap.add_argument("--flash", action="store_true", help="also SDPA flash's backward (none / causal)")
    args = ap.parse_args()
    d, length = args.d, args.l
    heads, batch = 2048 // d, 16384 // length
    dt = torch.float16 if args.dtype == "f16" else torch.bfloat16
    q, k, v, dout = (randn((batch, length, heads, d), dt) for _ in range(4))
    mask_line = {"window-custom": "custom", "doc-custom": "custom", "window": "window(left=1023, right=0)"}.get(
        args.mask, args.mask)
    text = (f"attention bwd_{args.mask.replace('-', '_')} {{\n head_dim {d}\n heads q={heads} kv={heads}\n"
            f" dtype {args.dtype}\n mask {mask_line}\n}}")
    kern = attngen.compile(attngen.parse(text)[0], target="cuda")
    kw = {}
    if args.mask.endswith("-custom"):
        import sys
        sys.path.insert(0, "benchmarks/suite")
        from variants import mask_cases
        masks, _ = mask_cases(length)
        kw["mask"] = attngen.block_mask(masks["window 1024" if args.mask == "window-custom" else "document-causal"],
                                        kern)
    out, lse = kern(q, k, v, return_lse=True, **kw)
    runs = [("attngen backward", lambda: kern.backward(q, k, v, out, lse, dout, **kw))]
    if args.flash and args.mask in ("none", "causal"):
        qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
        with torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            o = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=args.mask == "causal")
        g = dout.transpose(1, 2)
        runs.append(("sdpa flash backward",
                     lambda: torch.autograd.grad(o, (qt, kt, vt), g, retain_graph=True)))
    for name, fn in runs:
        print(f"{name}: {median_ms(fn):.3f} ms", flush=True)
    profiled_once(runs)


if __name__ == "__main__":
    main()
