"""Time attngen CUDA kernels over tile configurations, with ptxas's spill report for each (the
tuning data behind the profiles' [[defaults]]: the default plans must not spill).

    python3 benchmarks/tools/sweep_tiles.py [--only prefill,decode]
    python3 benchmarks/tools/sweep_tiles.py --only prefill --d 256 --cases causal:1024,causal:4096 \
        --configs "default;q=128 kv=64 | stages=2 producer=on"     (chosen configurations and cases)

Prefill: fp16, B L = 16384, H D = 2048 as run_gpu.py, CUDA events (median); each configuration is
checked against SDPA flash before it is timed. Decode: B8, 32 query heads over 8 KV heads, d128,
Lk 4096 and 32768 (launches alone, kernel.prepared), split_kv(auto) and two_pass; MLA decode
(qk 576 / v 512, 128 heads over 1, bf16, paged 64, Lk 4096). Spills: registers and spill-store
bytes of every entry point for sm_90 from NVRTC's ptxas report.
"""

import argparse
import os
import re
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import attngen  # noqa: E402
from attngen.backends.cuda import nvrtc  # noqa: E402

# Tile configurations per head dim. On the H100 a spec with whole warpgroups (warps a multiple of
# 4 with 16 rows each, or no warps given) takes the Hopper family (wgmma); `warps=4` with 32 rows
# per warp keeps mma.sync: both families side by side in one run; `producer=on/off` the Hopper
# family with and without its producer warpgroup (warp specialisation).
PREFILL = {
    64: ["q=128 kv=64 | warps=4", "q=64 kv=128 | producer=off", "q=64 kv=128 | producer=on", "q=128 kv=128",
         "q=128 kv=64"],
    128: ["q=128 kv=128 | producer=off", "q=128 kv=128", "q=128 kv=128 | stages=2", "q=128 kv=176 | stages=2",
          "q=64 kv=64", "q=64 kv=64 | producer=on", "q=128 kv=96 | producer=on"],
    256: ["q=128 kv=64 | stages=2 producer=off", "q=128 kv=64 | stages=2", "q=128 kv=80 | stages=2",
          "q=128 kv=64 | stages=3"],
}
DECODE = ["tile kv=64", "tile kv=32", "tile kv=32\n target cuda { stages=3 }", "tile kv=16\n target cuda { stages=4 }"]


def spills(kernel) -> str:
    nv = nvrtc._cuda_bindings()
    arch = kernel.plan.details.arch
    _, log = nvrtc._compile_cuda_bindings(nv, kernel.source, ["--std=c++17", f"--gpu-architecture={arch}",
                                                             "--ptxas-options=-v"], "sweep.cu")
    parts = re.split(r"Compiling entry function '(\w+)'", log)
    out = []
    for i in range(1, len(parts), 2):
        regs = re.search(r"Used (\d+) registers", parts[i + 1]).group(1)
        spill = re.search(r"(\d+) bytes spill stores", parts[i + 1]).group(1)
        out.append(f"{regs}r/{spill}s")
    return " ".join(out)


def compile_text(text):
    try:
        return attngen.compile(attngen.parse(text)[0], target="cuda"), None
    except attngen.SpecError as e:
        return None, e.diagnostics[0].message[:80]


def prefill(table=None, cases=(("none", 4096), ("causal", 4096), ("causal", 1024))):
    """`table`: head dim -> configurations ("tile | target cuda options"; "default": the
    profile's plan), PREFILL unless given; `cases`: (mask, L) pairs."""
    print(f"{'d':>4} {'mask':7} {'L':6} {'tile':36} {'family':6} {'TFLOP/s':>8} {'err':>8}  regs/spill bytes")
    for d, configs in (table or PREFILL).items():
        for mask, L in cases:
            B, H = 16384 // L, 2048 // d
            q, k, v = (torch.randn(B, L, H, d, device="cuda", dtype=torch.float16) for _ in range(3))
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                ref = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)),
                                                     is_causal=mask == "causal").transpose(1, 2)
            flops = 4.0 * B * H * L * L * d * (0.5 if mask == "causal" else 1.0)
            for cfg in configs:
                tile, _, opts = (x.strip() for x in cfg.partition("|"))
                text = f"attention s {{\n head_dim {d}\n dtype f16\n mask {mask}\n"
                text += f" tile {tile}\n" if tile != "default" else ""
                text += f" target cuda {{ {opts} }}\n}}\n" if opts else "}\n"
                kernel, why = compile_text(text)
                if kernel is None:
                    print(f"{d:>4} {mask:7} L{L:<5} {cfg:36} refused: {why}")
                    continue
                out = kernel(q, k, v)
                err = float((out.float() - ref.float()).norm() / ref.float().norm())
                ms = do_bench(lambda: kernel(q, k, v), warmup=25, rep=100, return_mode="median")
                family = kernel.plan.config.math
                print(f"{d:>4} {mask:7} L{L:<5} {cfg:36} {family:6} {flops / ms / 1e9:8.1f} {err:8.1e}  {spills(kernel)}",
                      flush=True)


def decode():
    B, HQ, HKV, D = 8, 32, 8, 128
    print(f"{'decode':28} {'config':40} {'ms':>7} {'TB/s':>6}  sm_90 regs/spill bytes (per entry)")
    for lk in (4096, 32768):
        q = torch.randn((B, 1, HQ, D), device="cuda", dtype=torch.float16)
        k, v = (torch.randn((B, lk, HKV, D), device="cuda", dtype=torch.float16) for _ in range(2))
        nbytes = 2 * k.numel() * k.element_size()
        for sched in ("split_kv(auto)", "two_pass"):
            for cfg in DECODE:
                text = (f"attention d {{\n head_dim {D}\n dtype f16\n heads q={HQ} kv={HKV}\n schedule {sched}\n"
                        f" {cfg}\n}}\n")
                kernel, why = compile_text(text)
                label = cfg.replace("\n", ";")
                if kernel is None:
                    print(f"Lk {lk} {sched:22} {label:40} refused: {why}")
                    continue
                launch = kernel.prepared(q, k, v)
                ms = do_bench(launch, warmup=25, rep=100, return_mode="median")
                print(f"Lk {lk} {sched:22} {label:40} {ms:7.3f} {nbytes / ms / 1e9:6.2f}  {spills(kernel)}", flush=True)
    # MLA decode (DeepSeek-V3 shape): 128 query heads over one latent KV head, paged
    HQ, LK, PAGE = 128, 4096, 64
    q = torch.randn((B, 1, HQ, 576), device="cuda", dtype=torch.bfloat16)
    pages = B * LK // PAGE
    kc = torch.randn((pages, PAGE, 1, 576), device="cuda", dtype=torch.bfloat16)
    vc = kc[..., :512]
    table = torch.arange(pages, device="cuda", dtype=torch.int32).reshape(B, -1)
    lens = torch.full((B,), LK, device="cuda", dtype=torch.int32)
    nbytes = kc.numel() * kc.element_size()
    for cfg in ("tile d=64", "tile kv=32 d=64", "tile d=32"):
        text = (f"attention m {{\n head_dim qk=576 v=512\n heads q={HQ} kv=1\n dtype bf16\n mask causal(bottom_right)\n"
                f" {cfg}\n schedule split_kv(auto)\n kv_cache paged(page={PAGE})\n}}\n")
        kernel, why = compile_text(text)
        if kernel is None:
            print(f"MLA {cfg:40} refused: {why}")
            continue
        launch = kernel.prepared(q, kc, vc.contiguous(), kv_lens=lens, block_table=table)
        ms = do_bench(launch, warmup=25, rep=100, return_mode="median")
        print(f"MLA Lk {LK} {'split_kv(auto)':18} {cfg:40} {ms:7.3f} {nbytes / ms / 1e9:6.2f}  {spills(kernel)}",
              flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="prefill,decode")
    ap.add_argument("--d", type=int, help="prefill: this head dim with --configs instead of the built-in table")
    ap.add_argument("--configs", help='prefill: ";"-separated "tile | options" (or "default")')
    ap.add_argument("--cases", default="none:4096,causal:4096,causal:1024", help="prefill: mask:L pairs")
    args = ap.parse_args()
    only = set(args.only.split(","))
    if "prefill" in only:
        table = {args.d: [c.strip() for c in args.configs.split(";")]} if args.d and args.configs else None
        cases = [(c.split(":")[0], int(c.split(":")[1])) for c in args.cases.split(",")]
        prefill(table, cases)
    if "decode" in only:
        decode()


if __name__ == "__main__":
    main()
