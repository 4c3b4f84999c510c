"""FP8 prefill's P in e4m3, emulated in numpy (no GPU): which offset and rescale slack keep the
error against the float64 reference smallest (docs/language.md, "FP8 prefill", records the table).

The kernel (templates/cuda/math_wgmma_fp8.j2) quantizes P = exp2(t - m + offset) to e4m3 in
registers for P V, and sums the unquantized P in f32 for l; a common factor 2^offset cancels in
acc / l (lse subtracts it). e4m3 is normal from 2^-6 down (subnormal to 2^-9, 0 below 2^-10), so
with offset 0 the small probabilities of a row lose most of their bits; offset 8 (FlashAttention-3's
Max_offset) moves them up by 256, and P <= 2^(offset + slack) must stay <= 448 (the lazy rescale's
slack: m is kept until a tile's max passes it by `slack`). Each case runs the kernel's order:
tiles of 128 keys, the online softmax in f32, P quantized by round-to-nearest-even with
saturation, acc in f64 (the tensor cores' f32 sums of e4m3 x e4m3 products are exact to f32), and
also l summed from the quantized P (`l from q(P)`) for comparison. Inputs: q, k, v drawn, then
quantized to e4m3 per tensor (amax / 448) and dequantized: the reference sees the same values.

    python3 benchmarks/probes/emulate_fp8_p.py [--rows 256] [--keys 4096] [--seed 0]

Prints, per input kind, the relative L2 error of each case (and of f16 P for scale).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from attngen.runtime.kvquant import decode_fp8, encode_fp8  # noqa: E402

TILE = 128
LOG2E = 1.4426950408889634


def e4m3(x):
    """x rounded to e4m3 (nearest even, saturating), as float64."""
    return decode_fp8(encode_fp8(x, "e4m3"), "e4m3")


def quantized(x, fmt="e4m3"):
    """x quantized per tensor (amax / largest) and dequantized."""
    largest = 448.0 if fmt == "e4m3" else 57344.0
    s = np.abs(x).max() / largest
    return decode_fp8(encode_fp8(x / s, fmt), fmt) * s


def reference(q, k, v, scale):
    s = (q @ k.T) * scale
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p @ v) / p.sum(axis=1, keepdims=True)


def emulate(q, k, v, scale, offset, slack, p_round, l_quantized=False):
    """The kernel's loop: tiles of TILE keys, m_i / l_i in f32, P rounded by p_round."""
    rows = q.shape[0]
    m = np.full(rows, -np.inf, np.float32)
    l = np.zeros(rows, np.float32)
    acc = np.zeros((rows, v.shape[1]), np.float64)
    for j0 in range(0, k.shape[0], TILE):
        s = (q @ k[j0:j0 + TILE].T).astype(np.float32)
        t = s * np.float32(scale * LOG2E)
        m_new = np.maximum(m, t.max(axis=1))
        grows = m_new - m > slack
        m_keep = np.where(grows, m_new, m)
        alpha = np.where(grows, np.exp2(m - m_keep), np.float32(1)).astype(np.float32)
        p = np.exp2(t - (m_keep - offset)[:, None]).astype(np.float32)
        pq = p_round(p)
        if np.any(pq > 448):
            raise AssertionError(f"P up to {pq.max()}: offset {offset} + slack {slack} overflows e4m3")
        l = l * alpha + (pq if l_quantized else p).sum(axis=1, dtype=np.float32)
        acc = acc * alpha[:, None] + pq @ v[j0:j0 + TILE]
        m = m_keep
    return acc / l[:, None]


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--keys", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    scale = 1 / np.sqrt(a.dim)
    kinds = {
        "randn q k v": (1.0, 0.0),
        "randn, v mean 1": (1.0, 1.0),
        "peaked scores (q x 4)": (4.0, 0.0),
        "peaked, v mean 1": (4.0, 1.0),
    }
    cases = [("offset 0, slack 0", 0, 0), ("offset 8, slack 0", 8, 0), ("offset 0, slack 8", 0, 8),
             ("offset 4, slack 4", 4, 4)]
    print(f"rows {a.rows}, keys {a.keys}, d {a.dim}, tiles of {TILE} keys; relative L2 error vs float64")
    head = f"{'inputs':<24}" + "".join(f"{c[0]:>20}" for c in cases) + f"{'off 8, l from q(P)':>20}{'f16 P':>12}"
    print(head)
    for name, (qs, vmean) in kinds.items():
        q = quantized(rng.standard_normal((a.rows, a.dim)) * qs)
        k = quantized(rng.standard_normal((a.keys, a.dim)))
        v = quantized(rng.standard_normal((a.keys, a.dim)) + vmean)
        ref = reference(q, k, v, scale)
        errs = [rel(emulate(q, k, v, scale, off, sl, e4m3), ref) for _, off, sl in cases]
        lq = rel(emulate(q, k, v, scale, 8, 0, e4m3, l_quantized=True), ref)
        f16 = rel(emulate(q, k, v, scale, 0, 0, lambda p: p.astype(np.float16).astype(np.float64)), ref)
        print(f"{name:<24}" + "".join(f"{e:>20.2e}" for e in errs) + f"{lq:>20.2e}{f16:>12.2e}")


if __name__ == "__main__":
    main()
