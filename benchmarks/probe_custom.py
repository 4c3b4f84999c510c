"""Custom masks on the Hopper family: variants of the `mask custom` kernel side by side (issue 11).

    python3 benchmarks/probe_custom.py [--variants NAME=SPEC_LINES,...] [--no-flex]

The masks section's two cases (L 16384, d128, 16 heads, B 1, f16: a sliding window of 1024 keys
and 8 causal documents of uneven lengths, each as a `mask custom` BlockMask) for each variant
of the custom kernel (extra spec lines, `;` for a new line), beside the analytic window kernel
and FlexAttention in the same process. Each output is checked against SDPA's memory-efficient
kernel with the dense mask (relative error printed). Medians of triton do_bench, ms.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import attngen  # noqa: E402

L, H, D, WINDOW = 16384, 16, 128, 1024
DOC_LENGTHS = [1024, 3072, 512, 2560, 2048, 4096, 1536, 1536]
DEFAULT_VARIANTS = ("default=;plain=target cuda { producer=off };"
                    "nopersist=target cuda { persistent=off };kv64=tile q=128 kv=64")


def _ms(fn) -> float:
    return do_bench(fn, warmup=10, rep=50, return_mode="median")


# Variants whose name contains keys here get their generated source rewritten (timing only:
# `computed` evaluates the window in registers instead of reading the mask, right only for the
# window case; `nomask` applies no mask inside partial tiles, a wrong kernel).
REWRITES = {
    "computed": [("cmask.apply(x, i, j)", f"((j <= i && j > i - {WINDOW}) ? x : neg_inf())")],
    "nomask": [("cmask.apply(x, i, j)", "x")],
    # the producer kernel's staged mask words: not copied (the consumers read stale words: a wrong
    # kernel), or copied but not read (the window computed instead: right for the window only)
    "nocopy": [("if (partial && cmask.bits != nullptr) cmask.copy_words(", "if (false) cmask.copy_words(")],
    "unread": [("if (!((mrow[mf][e / 2][n / 4] >> ((n % 4) * 8 + e % 2)) & 1u)) x = neg_inf();",
                "{ const int i = qi[mf][e / 2], j = j0 + n * 8 + 2 * t + e % 2; "
                f"if (!(j <= i && j > i - {WINDOW} && i < seq.len_q)) x = neg_inf(); }}")],
    "noahead": [("const int entry = entry_next;", "const int entry = cmask.tiles[tile_first + it];")],
    "nobits": [("if (!((mrow[mf][e / 2][n / 4] >> ((n % 4) * 8 + e % 2)) & 1u)) x = neg_inf();", "")],
}


def _compile(name: str, body: str):
    from attngen.backends.cuda import nvrtc
    text = f"attention {name} {{\n head_dim {D}\n heads q={H} kv={H}\n dtype f16\n {body}\n}}"
    rewrite = [pair for key, r in REWRITES.items() if key in name[len("custom_"):] for pair in r]
    compile_cubin = nvrtc.compile_cubin
    if rewrite:
        def patched(source, *a, **k):
            for old, new in rewrite:
                assert old in source, old
                source = source.replace(old, new)
            return compile_cubin(source, *a, **k)
        nvrtc.compile_cubin = patched
    try:
        return attngen.compile(attngen.parse(text)[0], target="cuda")
    finally:
        nvrtc.compile_cubin = compile_cubin


def _rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default=DEFAULT_VARIANTS,
                    help="';'-separated NAME=EXTRA (EXTRA: spec lines, '|' for a new line)")
    ap.add_argument("--no-flex", action="store_true")
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn((1, L, H, D), device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    i = torch.arange(L, device="cuda")
    doc = torch.repeat_interleave(torch.arange(len(DOC_LENGTHS), device="cuda"), torch.tensor(DOC_LENGTHS, device="cuda"))
    masks = {"window 1024": (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - WINDOW),
             "document-causal": (doc[:, None] == doc[None, :]) & (i[None, :] <= i[:, None])}
    mods = {"window 1024": lambda b, h, qi, kj: (kj <= qi) & (kj > qi - WINDOW),
            "document-causal": lambda b, h, qi, kj: (doc[qi] == doc[kj]) & (kj <= qi)}
    variants = []
    for item in args.variants.split(";"):
        name, _, extra = item.partition("=")
        variants.append((name, _compile(f"custom_{name}", "mask custom\n " + extra.replace("|", "\n "))))
    for name, kern in variants:
        c = kern.plan.config
        print(f"{name:10s} tile q{c.tile_q} kv{c.tile_kv} {c.stages} stages producer={c.producer} "
              f"persistent={c.persistent}", flush=True)
    window = _compile("window", f"mask window(left={WINDOW - 1})")
    flex = None
    if not args.no_flex:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        flex = torch.compile(flex_attention)
    for case, dense in masks.items():
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
            ref = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=dense).transpose(1, 2)
        line = [f"{case:16s}"]
        for name, kern in variants:
            bm = attngen.block_mask(dense, kern)
            out = kern(q, k, v, mask=bm)
            line.append(f"{name} {_ms(lambda: kern(q, k, v, mask=bm)):.3f} ({_rel(out, ref):.1e})")
        if case == "window 1024":
            out = window(q, k, v)
            line.append(f"analytic {_ms(lambda: window(q, k, v)):.3f} ({_rel(out, ref):.1e})")
        if flex is not None:
            fbm = create_block_mask(mods[case], None, None, L, L, device="cuda")
            flex(qt, kt, vt, block_mask=fbm)
            line.append(f"flex {_ms(lambda: flex(qt, kt, vt, block_mask=fbm)):.3f}")
        print("  ".join(line), flush=True)


if __name__ == "__main__":
    main()
