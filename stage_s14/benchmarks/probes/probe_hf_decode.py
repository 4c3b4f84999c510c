"""Where a transformers decode step's attention time goes (suite hf, issue 40): host time per call
of attngen.transformers' attention function vs the kernel called directly, on (B, H, L, D)
transposed views and on contiguous (B, L, H, D) tensors, and the GPU time of each."""

from __future__ import annotations

import time

import torch

import attngen.transformers as at
from attngen.transformers import attention as A


class Module:  # what transformers' attention layers look like to the function
    is_causal = True

    class config:  # noqa: N801
        model_type = "llama"
        name_or_path = ""


def host_us(fn, n=200):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return host


def gpu_ms(fn, n=50):
    for _ in range(5):
        fn()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    s.record()
    for _ in range(n):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / n


def main():
    at.register()
    B, Hq, Hkv, L, D = 8, 32, 8, 4096, 128
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, Hq, 1, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, Hkv, L, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, Hkv, L, D, device="cuda", dtype=torch.bfloat16, generator=g)
    m = Module()
    f = lambda: A.attention_forward(m, q, k, v, None, scaling=D ** -0.5)  # noqa: E731
    f()
    kernel = next(iter(A._KERNELS.values()))
    print("kernel:", kernel.spec.name, kernel.plan.summary())
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    kc, vc, qc = kt.contiguous(), vt.contiguous(), qt.contiguous()
    sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
    for name, fn in (("attention_forward (views)", f), ("kernel(views)", lambda: kernel(qt, kt, vt)),
                     ("kernel(contiguous)", lambda: kernel(qc, kc, vc)), ("sdpa", sdpa)):
        print(f"{name:28s} host {host_us(fn):8.1f} us/call   gpu {gpu_ms(fn) * 1e3:8.1f} us/call", flush=True)
    print("recipes kept:", len(kernel._recipes))


if __name__ == "__main__":
    main()
