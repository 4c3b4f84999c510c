"""Time attngen CUDA kernels over tile configurations (for the profiles' [[defaults]]).

    python3 benchmarks/sweep_tiles.py

Same method as run_gpu.py (fp16, B L = 16384, H D = 2048, CUDA events, median); each
configuration is checked against SDPA flash before it is timed.
"""

import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import attngen  # noqa: E402

CONFIGS = {
    64: ["q=128 kv=64 | ", "q=128 kv=32 | warps=4", "q=128 kv=64 | warps=4", "q=64 kv=64 | ",
         "q=128 kv=64 | stages=3", "q=128 kv=128 | "],
    128: ["q=128 kv=64 | ", "q=128 kv=32 | warps=4", "q=128 kv=64 | warps=4", "q=64 kv=64 | ",
          "q=128 kv=64 | stages=3", "q=128 kv=32 | ", "q=64 kv=32 | "],
    256: ["q=64 kv=32 | ", "q=128 kv=32 | ", "q=64 kv=64 | ", "q=128 kv=16 | ", "q=64 kv=32 | stages=3",
          "q=128 kv=32 | warps=4"],
}


def main():
    print(f"{'d':>4} {'mask':7} {'tile':28} {'TFLOP/s':>8} {'err':>8}")
    for d, configs in CONFIGS.items():
        for mask in ("none", "causal"):
            L, B, H = 4096, 4, 2048 // d
            q, k, v = (torch.randn(B, L, H, d, device="cuda", dtype=torch.float16) for _ in range(3))
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                ref = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)),
                                                     is_causal=mask == "causal").transpose(1, 2)
            flops = 4.0 * B * H * L * L * d * (0.5 if mask == "causal" else 1.0)
            for cfg in configs:
                tile, opts = (x.strip() for x in cfg.split("|"))
                text = f"attention s {{\n head_dim {d}\n dtype f16\n mask {mask}\n tile {tile}\n"
                text += f" target cuda {{ {opts} }}\n}}\n" if opts else "}\n"
                try:
                    kernel = attngen.compile(attngen.parse(text)[0], target="cuda")
                except attngen.SpecError as e:
                    print(f"{d:>4} {mask:7} {cfg:28} refused: {e.diagnostics[0].message[:80]}")
                    continue
                out = kernel(q, k, v)
                err = float((out.float() - ref.float()).norm() / ref.float().norm())
                ms = do_bench(lambda: kernel(q, k, v), warmup=25, rep=100, return_mode="median")
                print(f"{d:>4} {mask:7} {cfg:28} {flops / ms / 1e9:8.1f} {err:8.1e}", flush=True)


if __name__ == "__main__":
    main()
