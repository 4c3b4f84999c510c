"""Custom masks on the Hopper family: variants of the `mask custom` kernel side by side (issue 11).

    python3 benchmarks/probes/probe_custom.py [--variants NAME=SPEC_LINES,...] [--no-flex] [--dim 128]

The masks section's two cases (L 16384, d128, 16 heads, B 1, f16: a sliding window of 1024 keys
and 8 causal documents of uneven lengths, each as a `mask custom` BlockMask) for each variant
of the custom kernel (extra spec lines, `;` for a new line; --dim another head dim, with
2048 / dim heads), beside the analytic window kernel
and FlexAttention in the same process. Each output is checked against SDPA's memory-efficient
kernel with the dense mask (relative error printed). Medians of triton do_bench, ms.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch.nn.attention import SDPBackend

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import attngen  # noqa: E402
from common import median_ms, randn, rel_err, sdpa  # noqa: E402  (and benchmarks/suite/ on sys.path)
from common import compile_with  # noqa: E402
from variants import MASK_WINDOW, mask_cases  # noqa: E402  (benchmarks/suite/variants.py: the masks section)

L, H, D, WINDOW = 16384, 16, 128, MASK_WINDOW
DEFAULT_VARIANTS = ("default=;plain=target cuda { producer=off };"
                    "nopersist=target cuda { persistent=off };kv64=tile q=128 kv=64")


# Variants whose name contains keys here get the producer entry's generated source rewritten
# (timing probes, not kernels to keep): `nocopy` leaves a partial tile's mask words uncopied (the
# consumers read stale words: wrong), `unread` computes the window in registers instead of
# testing the words' bits (right for the window case only), `nobits` applies no mask inside
# partial tiles (wrong), `noahead` reads each tile's list entry when it is used instead of one
# iteration ahead.
BIT_TEST = "if (!((bits[n / 4] >> ((n % 4) * 8 + e % 2)) & 1u)) x = neg_inf();"
REWRITES = {
    "nocopy": [("if (words) cmask.copy_words(", "if (false) cmask.copy_words(")],
    "unread": [(BIT_TEST, "{ const int i = qi[mf][e / 2], j = j0 + n * 8 + 2 * t + e % 2; "
                          f"if (!(j <= i && j > i - {WINDOW} && i < seq.len_q)) x = neg_inf(); }}")],
    "nobits": [(BIT_TEST, "")],
    "noahead": [("const int entry = entry_next;", "const int entry = cmask.tiles[tile_first + it];")],
}


def _compile(name: str, body: str, d: int = D, h: int = H):
    text = f"attention {name}_d{d} {{\n head_dim {d}\n heads q={h} kv={h}\n dtype f16\n {body}\n}}"
    pairs = [pair for key, r in REWRITES.items() if key in name[len("custom_"):] for pair in r]
    return compile_with(attngen.parse(text)[0], pairs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default=DEFAULT_VARIANTS,
                    help="';'-separated NAME=EXTRA (EXTRA: spec lines, '|' for a new line)")
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--dim", type=int, default=D, help="head dim (heads: 2048 / dim)")
    args = ap.parse_args()
    d, h = args.dim, 2048 // args.dim
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (randn((1, L, h, d), generator=g) for _ in range(3))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    masks, mods = mask_cases(L)
    variants = []
    for item in args.variants.split(";"):
        name, _, extra = item.partition("=")
        variants.append((name, _compile(f"custom_{name}", "mask custom\n " + extra.replace("|", "\n "), d, h)))
    for name, kern in variants:
        c = kern.plan.config
        print(f"{name:10s} tile q{c.tile_q} kv{c.tile_kv} {c.stages} stages producer={c.producer} "
              f"persistent={c.persistent}", flush=True)
    window = _compile("window", f"mask window(left={WINDOW - 1})", d, h)
    flex = None
    if not args.no_flex:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        flex = torch.compile(flex_attention)
    for case, dense in masks.items():
        ref = sdpa(qt, kt, vt, SDPBackend.EFFICIENT_ATTENTION, attn_mask=dense).transpose(1, 2)
        line = [f"{case:16s}"]
        for name, kern in variants:
            bm = attngen.block_mask(dense, kern)
            out = kern(q, k, v, mask=bm)
            line.append(f"{name} {median_ms(lambda: kern(q, k, v, mask=bm), 10, 50):.3f} ({rel_err(out, ref):.1e})")
        if case == "window 1024":
            out = window(q, k, v)
            line.append(f"analytic {median_ms(lambda: window(q, k, v), 10, 50):.3f} ({rel_err(out, ref):.1e})")
        if flex is not None:
            fbm = create_block_mask(mods[case], None, None, L, L, device="cuda")
            flex(qt, kt, vt, block_mask=fbm)
            line.append(f"flex {median_ms(lambda: flex(qt, kt, vt, block_mask=fbm), 10, 50):.3f}")
        print("  ".join(line), flush=True)


if __name__ == "__main__":
    main()
