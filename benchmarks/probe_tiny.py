"""Tiny prefill (B1 H32 L128 d128 f16, issue 12's host row): plan variants' launch and call times beside SDPA
(triton do_bench medians, after an L2 flush each)."""
import torch, torch.nn.functional as F, attngen
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench
B, H, L, D = 1, 32, 128, 128
q, k, v = (torch.randn((B, L, H, D), device="cuda", dtype=torch.float16) for _ in range(3))
qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
def t(fn): return do_bench(fn, warmup=50, rep=200, return_mode="median") * 1e3
for name, extra in [("default", ""), ("persistent=off", "target cuda { persistent=off }"), ("producer=off", "target cuda { producer=off }"),
                    ("tile q=64", "tile q=64 kv=128"), ("sm80 profile", None)]:
    text = f"attention tiny {{\n head_dim {D}\n heads q={H} kv={H}\n dtype f16\n {extra or ''}\n}}"
    kern = attngen.compile(attngen.parse(text)[0], target="cuda", profile="cuda-sm80" if extra is None else None)
    f = kern.prepared(q, k, v)
    print(f"{name:16s} launches {t(f):6.2f} us  call {t(lambda: kern(q, k, v)):6.2f} us  [{kern.plan.summary()[:90]}]", flush=True)
for key, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
    with sdpa_kernel(be):
        print(f"SDPA {key:11s} call {t(lambda: F.scaled_dot_product_attention(qt, kt, vt)):6.2f} us", flush=True)
