"""Probe (issue 41): an A / B of edits of the fast CUDA backward's generated source, in one process.

    python3 benchmarks/probes/probe_backward_edits.py EDITS.py ROW... [--rounds N]

EDITS.py (any path) defines `VARIANTS = {name: [(old, new), ...]}`: each variant replaces, in the
rendered source of a row's backward (attngen.backends.cuda.backward.render_backward), each `old`
text (which must occur) by `new`, once. A ROW is `d<D>-L<L>-<full|causal>[-bf16]`, the dense suite's
shape (B L = 16384, H D = 2048). For each row every variant is compiled (NVRTC, the kernel's arch)
and swapped in for the unedited kernel (backward_launch._cubin), its gradients checked against the
unedited kernel's (relative L2 error of dq, dk, dv: dQ's f32 reductions may land in another order,
so expect ~1e-5 there and 0 elsewhere), then every row is timed, each variant back to back with the
unedited kernel ("as is"), in N rounds (default 3) whose order alternates, so that a drift of the
GPU's clocks does not favour one side. A variant whose edits do not all apply to a row's source is
reported and left out of that row. TFLOP/s = 2.5x the forward's FLOPs (halved for causal).

Why in one process: benchmarks/ab.sh runs the two sides minutes apart, and a row moved by 3-4%
between them with no change that measured on it here (benchmarks/NOTES.md, eighteenth session).
"""

from __future__ import annotations

import argparse
import runpy

import torch

import attngen
from attngen.backends.cuda import backward as bw
from attngen.backends.cuda import backward_launch as bl
from attngen.backends.cuda import nvrtc
from common import median_ms, randn, rel_err


def edited(source: str, edits) -> str | None:
    for old, new in edits:
        if old not in source:
            return None
        source = source.replace(old, new, 1)
    return source


def setup(row: str, variants: dict):
    parts = row.split("-")
    d, length, mask = int(parts[0][1:]), int(parts[1][1:]), parts[2]
    dtype = "bf16" if parts[-1] == "bf16" else "f16"
    heads, batch = 2048 // d, 16384 // length
    spec = attngen.parse(f"attention e_{mask} {{\n head_dim {d}\n heads q={heads} kv={heads}\n dtype {dtype}\n"
                         f" mask {'none' if mask == 'full' else mask}\n}}\n")[0]
    kern = attngen.compile(spec, target="cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    tdt = torch.float16 if dtype == "f16" else torch.bfloat16
    q, k, v, dout = (randn((batch, length, heads, d), tdt, gen) for _ in range(4))
    out, lse = kern(q, k, v, return_lse=True)
    flops = 2.5 * 4.0 * batch * heads * length * length * d * (0.5 if mask == "causal" else 1.0)
    source = bw.render_backward(kern.plan)
    cubins = {"as is": None}
    for name, edits in variants.items():
        text = edited(source, edits)
        if text is None:
            print(f"{row}: {name}: an edit's text is not in this source (left out)", flush=True)
            continue
        cubins[name] = nvrtc.compile_cubin(text, kern.plan.details.arch)[0]
    return kern, (q, k, v, out, lse, dout), flops, cubins


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("edits")
    ap.add_argument("rows", nargs="+")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    variants = runpy.run_path(args.edits)["VARIANTS"]
    original = bl._cubin

    def use(kern, cubin):
        bl._cubin = original if cubin is None else (lambda plan, c=cubin: c)
        kern.__dict__.pop("_backward_functions", None)

    cases = [(row, *setup(row, variants)) for row in args.rows]
    for row, kern, call, _, cubins in cases:
        use(kern, None)
        ref = [x.float() for x in kern.backward(*call)]
        for name, cubin in cubins.items():
            if cubin is not None:
                use(kern, cubin)
                errs = " ".join(f"{g} {rel_err(x, r):.1e}" for g, x, r in zip(("dq", "dk", "dv"), kern.backward(*call), ref))
                print(f"{row}: {name}: rel. err against as is: {errs}", flush=True)
    totals = {}
    for rnd in range(args.rounds):
        for row, kern, call, flops, cubins in cases:
            names = list(cubins) if rnd % 2 == 0 else list(cubins)[::-1]
            line = f"round {rnd} {row:22s}"
            for name in names:
                use(kern, cubins[name])
                tflops = flops / median_ms(lambda: kern.backward(*call)) / 1e9
                totals.setdefault((row, name), []).append(tflops)
                line += f"  {name} {tflops:6.1f}"
            print(line, flush=True)
        use(kern, None)
    print("mean TFLOP/s over the rounds:")
    for row, _, _, _, cubins in cases:
        base = sum(totals[(row, "as is")]) / args.rounds
        print(f"  {row:22s} " + "  ".join(
            f"{n} {sum(totals[(row, n)]) / args.rounds:6.1f} ({sum(totals[(row, n)]) / args.rounds / base - 1:+.1%})"
            for n in cubins), flush=True)


if __name__ == "__main__":
    main()
