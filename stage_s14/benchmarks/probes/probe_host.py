"""Where the host time of one plain attngen call goes (issue 12: a plain call <= SDPA's), piece
by piece, on the host.py prefill case (B1 H32 Lq=Lk=128 d128 f16, torch tensors).

    python3 benchmarks/probes/probe_host.py [--rounds 7]

Each piece is timed as host.py times a call: 100 calls issued without waiting (the GPU drained
between batches), microseconds per call, the median of `rounds` rounds in which every piece is
timed once in turn (so host drift hits all alike). The pieces are the steps of
CudaKernel._call / _run for a call whose signature is cached; SDPA (flash) is in the same rounds.
"""

from __future__ import annotations

import argparse
import ctypes

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attngen
from attngen.backends.cuda import kernel as rt
from attngen.backends.cuda.launch import pending
from common import randn  # (and benchmarks/suite/ on sys.path)
from host import host_ms  # noqa: E402  (benchmarks/suite/host.py: 100 calls without waiting, median of 4 runs)


def host_us(fn) -> float:
    return host_ms(fn) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    spec = attngen.parse("attention host_prefill {\n head_dim 128\n heads q=32 kv=32\n dtype f16\n}")[0]
    kern = attngen.compile(spec, target="cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (randn((1, 128, 32, 128), generator=g) for _ in range(3))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    kern(q, k, v)
    arrays = (q, k, v, None, None, None, None, None, None)
    opts = (False, None, None)
    key, _ = rt._signature(arrays, None, None, opts)
    ints = {"kv_lens": None, "cu_seqlens_q": None, "cu_seqlens_k": None, "block_table": None}
    # a real call's addresses (out, persistent buffers included), kept alive for the raw launches
    result, recipe, ptrs, held = kern._call(q, k, v, None, None, False, None, None, False, ints, None, None)
    assert kern._recipes[key] is recipe
    stream = recipe.stream()
    (p,) = recipe.launches
    cupy = rt._cupy()
    driver = cupy.cuda.driver
    libcuda = ctypes.CDLL("libcuda.so.1")
    launch_c = libcuda.cuLaunchKernel
    launch_c.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    launch_c.restype = ctypes.c_int
    p.launch(driver, ptrs, stream)
    gx, gy, gz = p.grid
    prepared = kern.prepared(q, k, v)
    out = torch.empty_like(q)
    shape, dev = tuple(q.shape), torch.device("cuda", 0)

    def sdpa():
        return F.scaled_dot_product_attention(qt, kt, vt)

    pieces = {
        "whole call kern(q, k, v)": lambda: kern(q, k, v),
        "call with out=": lambda: kern(q, k, v, out=out),
        "prepared() launch": prepared,
        "SDPA flash": sdpa,
        "pending()": pending,
        "_signature": lambda: rt._signature(arrays, None, None, opts),
        "recipe lookup": lambda: kern._recipes.get(key),
        "alloc_out(q)": lambda: recipe.alloc_out(q),
        "torch.empty(shape, dtype, device)": lambda: torch.empty(shape, dtype=torch.float16, device=dev),
        "q.new_empty(shape)": lambda: q.new_empty(shape),
        "torch.empty_like(q)": lambda: torch.empty_like(q),
        "stream()": recipe.stream,
        "Packed.launch": lambda: p.launch(driver, ptrs, stream),
        "cupy driver.launchKernel": lambda: driver.launchKernel(p.fn_ptr, gx, gy, gz, p.threads, 1, 1, p.smem,
                                                                 stream, p.params_ptr, 0),
        "ctypes cuLaunchKernel": lambda: launch_c(p.fn_ptr, gx, gy, gz, p.threads, 1, 1, p.smem, stream,
                                                  p.params_ptr, None),
        "_qkv_signature": lambda: rt._qkv_signature(q, k, v),
    }
    times = {name: [] for name in pieces}
    for _ in range(args.rounds):
        for name, fn in pieces.items():
            if name == "SDPA flash":
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    times[name].append(host_us(fn))
            else:
                times[name].append(host_us(fn))
    del result, held
    for name, ts in times.items():
        print(f"{name:28s} {np.median(ts):7.2f} us   (rounds: {' '.join(f'{t:.1f}' for t in ts)})")


if __name__ == "__main__":
    main()
