"""Suite `expressions` (issue 42, "Speed"): score and mask expressions, forward and backward.

Rows: ALiBi causal, a relative-bias table (the clamped distance k - q, 2047 entries per head, a
learnable `grad` input), prefix-LM, document ids (8 documents per sequence), the 2D neighbourhood
of radius 7 over a 64 x 64 image (L 4k) and a 128 x 128 one (L 16k), and tanh soft-capping 30
(causal) written as a score expression; L 4k and 16k (`--quick`: three rows at L 4k), d128, 16
heads, f16, B L = 16384. Each row's peers, on the same inputs:

- `flex`: FlexAttention (torch.compile) with the same score_mod / mask_mod and the block mask
  create_block_mask derives from the mask_mod (per sequence where the mask reads an input);
- `sdpa_attn_mask`: SDPA (memory-efficient or cuDNN) given the bias, with -inf where masked, as a
  float attn_mask; the forward only, where the mask fits in memory, and not for soft-capping
  (not a bias);
- `attngen_named`: attngen's own kernel for the same function without an expression: `mask
  causal` beside ALiBi (no bias), `softcap 30` beside the tanh expression, `mask custom` with the
  same visible pairs as a BlockMask for prefix-LM, document ids and the neighbourhoods;
- `attngen_plain`: attngen's `mask none` kernel of the same shape (dense), for "the expression
  costs nothing": compare its TFLOP/s with the expression's on live pairs.

TFLOP/s count the live pairs only (4 B H L^2 D times the visible fraction; the backward 2.5x
that), as the issue's numbers do; `attngen_plain` counts its dense pairs. attngen's rows whose
target refuses the spec (the CUDA target compiles no expression yet, and no backward takes one)
are recorded with the checker's message ({"error": ..., "refused": true}) and the peers still
run. Where attngen runs, its output (or its gradients) is checked against FlexAttention's
(relative L2, the worst of dq, dk, dv).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import torch
import torch._functorch.config

import attngen

# FlexAttention's backward is timed by calling backward(retain_graph=True) again and again, which
# a compiled graph's donated buffers refuse ("requires create_graph=False and retain_graph=False")
torch._functorch.config.donated_buffer = False

L_VALUES = (4096, 16384)
HEADS, HEAD_DIM, TOKENS = 16, 128, 16384
RADIUS = 7  # the neighbourhood's, in rows and columns
IMAGE_WIDTH = {4096: 64, 16384: 128}  # a square image of L tokens
SOFTCAP = 30
QUICK = {"alibi causal L4096", "document ids L4096", "2d neighbourhood 64x64 L4096"}
# SDPA's float mask is materialised: only where it takes at most this share of the free memory
SDPA_MEMORY_SHARE = 0.4


@dataclass(frozen=True)
class Case:
    """One row: the spec's lines, its inputs, FlexAttention's mods over them, and attngen's
    equivalent without an expression (`named`: a spec body; `custom`: it takes the mask as a
    BlockMask). `score_mod(inputs, L)` / `mask_mod(inputs, L)` return FlexAttention's functions
    (None: no score change / every key); `bias`: the score change is an additive bias (SDPA can
    take it)."""

    name: str
    body: Callable[[int], str]
    inputs: Callable[[int, int, int, torch.Generator, str], dict]
    score_mod: Callable[[dict, int], Callable | None]
    mask_mod: Callable[[dict, int], Callable | None]
    named: str
    custom: bool = False
    bias: bool = True
    per_batch: bool = False  # the mask reads an input indexed by b


def _slopes(batch, seqlen, heads, gen, device):
    i = torch.arange(1, heads + 1, device=device, dtype=torch.float64)
    return {"slopes": (2.0 ** (-8.0 * i / heads)).float()}  # ALiBi's 2^(-8 i / n)


def _table(batch, seqlen, heads, gen, device):
    return {"table": torch.randn((heads, 2047), device=device, generator=gen) * 0.5}


def _prefix(batch, seqlen, heads, gen, device):
    return {"prefix": torch.randint(seqlen // 8, seqlen // 2, (batch,), device=device, generator=gen,
                                    dtype=torch.int32)}


def _documents(batch, seqlen, heads, gen, device):
    """doc[b, t]: the id of the document holding token t, 8 documents of random lengths a row."""
    rows = []
    for _ in range(batch):
        cuts = torch.randperm(seqlen - 1, device=device, generator=gen)[:7].sort().values + 1
        lengths = torch.diff(torch.cat([cuts.new_zeros(1), cuts, cuts.new_full((1,), seqlen)]))
        rows.append(torch.repeat_interleave(torch.arange(8, device=device), lengths))
    return {"doc": torch.stack(rows).to(torch.int32)}


def _none(batch, seqlen, heads, gen, device):
    return {}


def _causal(inp, seqlen):
    return lambda b, h, qi, kj: kj <= qi


def _neighbourhood(inp, seqlen):
    w = IMAGE_WIDTH[seqlen]
    return lambda b, h, qi, kj: ((qi // w - kj // w).abs() <= RADIUS) & ((qi % w - kj % w).abs() <= RADIUS)


def _no_mod(inp, seqlen):
    return None


CASES = [
    Case("alibi causal", lambda L: "input slopes[h] f32\n score s - slopes[h] * abs(q - k)\n mask causal", _slopes,
         lambda inp, L: (lambda s, b, h, qi, kj: s - inp["slopes"][h] * (qi - kj).abs()), _causal, "mask causal"),
    Case("relative bias table", lambda L: "input table[h, 2047] f32 grad\n"
         " score s + table[h, clamp(k - q, -1023, 1023) + 1023]", _table,
         lambda inp, L: (lambda s, b, h, qi, kj: s + inp["table"][h, (kj - qi).clamp(-1023, 1023) + 1023]),
         _no_mod, "mask none"),
    Case("prefix-lm", lambda L: "input prefix[b] i32\n mask k <= q || k < prefix[b]", _prefix, _no_mod,
         lambda inp, L: (lambda b, h, qi, kj: (kj <= qi) | (kj < inp["prefix"][b])), "mask custom", custom=True,
         per_batch=True),
    Case("document ids", lambda L: "input doc[b, q] i32\n mask k <= q && doc[b, q] == doc[b, k]", _documents,
         _no_mod, lambda inp, L: (lambda b, h, qi, kj: (kj <= qi) & (inp["doc"][b, qi] == inp["doc"][b, kj])),
         "mask custom", custom=True, per_batch=True),
    Case("2d neighbourhood", lambda L: f"mask abs(q // {IMAGE_WIDTH[L]} - k // {IMAGE_WIDTH[L]}) <= {RADIUS} && "
         f"abs(q % {IMAGE_WIDTH[L]} - k % {IMAGE_WIDTH[L]}) <= {RADIUS}", _none, _no_mod,
         _neighbourhood, "mask custom", custom=True),
    Case("tanh softcap 30 causal", lambda L: f"score {SOFTCAP} * tanh(s / {SOFTCAP})\n mask causal", _none,
         lambda inp, L: (lambda s, b, h, qi, kj: SOFTCAP * torch.tanh(s / SOFTCAP)), _causal,
         f"mask causal\n softcap {SOFTCAP}", bias=False),
]


def case_rows(quick: bool = False) -> list:
    """[(label, case, L)] in the suite's order (the 2D neighbourhood's label names its image);
    ATTNGEN_EXPR_ROWS (labels, comma-separated) picks rows instead of `quick`'s."""
    picked = {x.strip() for x in os.environ.get("ATTNGEN_EXPR_ROWS", "").split(",") if x.strip()}
    out = []
    for seqlen in L_VALUES:
        for case in CASES:
            w = IMAGE_WIDTH[seqlen]
            label = f"{case.name} {w}x{w} L{seqlen}" if case.name == "2d neighbourhood" else f"{case.name} L{seqlen}"
            if (label in picked) if picked else (not quick or label in QUICK):
                out.append((label, case, seqlen))
    return out


def spec_of(case: Case, seqlen: int, body: str | None = None) -> attngen.AttentionSpec:
    name = "expr_" + "".join(c if c.isalnum() else "_" for c in case.name) + f"_{seqlen}"
    return attngen.parse(f"attention {name} {{\n head_dim {HEAD_DIM}\n heads q={HEADS} kv={HEADS}\n dtype f16\n"
                         f" {body if body is not None else case.body(seqlen)}\n}}\n")[0]


def compile_or_refusal(spec, target: str = "cuda"):
    """(kernel, None), or (None, the checker's message) where the target refuses the spec."""
    try:
        return attngen.compile(spec, target=target), None
    except attngen.SpecError as e:
        return None, _message(e)


def _message(e) -> str:
    """The first line of an error (a checker's: file:line:col: error: ...)."""
    return (str(e).splitlines() or [type(e).__name__])[0][:300]


def dense_visible(mask_mod, batch: int, seqlen: int, device) -> torch.Tensor | None:
    """(batch or 1, L, L) bool: mask_mod on every (query, key) pair; None for no mask."""
    if mask_mod is None:
        return None
    i = torch.arange(seqlen, device=device)
    b = torch.arange(batch, device=device)[:, None, None]
    return mask_mod(b, torch.zeros_like(b), i[None, :, None], i[None, None, :])


def dense_bias(case: Case, inp: dict, batch: int, seqlen: int, heads: int, dtype, device) -> torch.Tensor:
    """SDPA's float attn_mask (batch or 1, heads or 1, L, L): the score change as a bias, -inf
    where masked; built head by head."""
    sm, mm = case.score_mod(inp, seqlen), case.mask_mod(inp, seqlen)
    bb = batch if case.per_batch else 1
    hb = heads if sm is not None else 1
    out = torch.zeros((bb, hb, seqlen, seqlen), device=device, dtype=dtype)
    i = torch.arange(seqlen, device=device)
    b = torch.arange(bb, device=device)[:, None, None]
    zero = torch.zeros((), device=device, dtype=torch.float32)
    for h in range(hb):
        hh = torch.full_like(b, h)
        bias = sm(zero, b, hh, i[None, :, None], i[None, None, :]) if sm is not None else zero
        if mm is not None:
            bias = torch.where(mm(b, hh, i[None, :, None], i[None, None, :]), bias, float("-inf"))
        out[:, h] = bias
    return out


def section(rows, quick: bool = False):
    """Run the suite's rows (forward, then backward, per case) and append them to `rows`."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    from variants import bench_ms, rel_err  # the suite's timer and error (Triton)
    import torch._dynamo
    for name in ("recompile_limit", "cache_size_limit"):  # every mod is a compilation; stay compiled
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 512)
    flex = torch.compile(flex_attention)
    plain = {}  # seqlen -> (fwd ms, bwd ms) of attngen's mask none kernel
    for label, case, seqlen in case_rows(quick):
        batch = TOKENS // seqlen
        g = torch.Generator(device="cuda").manual_seed(0)
        shape = (batch, seqlen, HEADS, HEAD_DIM)
        q, k, v, dout = (torch.randn(shape, device="cuda", dtype=torch.float16, generator=g) for _ in range(4))
        inp = case.inputs(batch, seqlen, HEADS, g, "cuda")
        qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
        dt = dout.transpose(1, 2)
        visible = dense_visible(case.mask_mod(inp, seqlen), batch, seqlen, "cuda")
        live = 1.0 if visible is None else float(visible.float().mean())
        fwd_flops = 4.0 * batch * HEADS * seqlen * seqlen * HEAD_DIM * live
        spec = spec_of(case, seqlen)
        kernel, refused = compile_or_refusal(spec)
        res = {p: {"attngen": None, "peers": {}, "rel_err": None} for p in ("forward", "backward")}
        out, grads = None, None
        if kernel is None:
            for p in res:
                res[p]["attngen"] = {"error": refused, "refused": True}
        else:
            out, grads = _attngen(kernel, (q, k, v, dout), inp, res, bench_ms)
        # FlexAttention: the same mods over the same inputs; the table's gradient too (learnable),
        # else (a torch without gradients of captured tensors) without it, and the row says so
        for learn in ((True, False) if "table" in inp else (False,)):
            table = {n: t.detach().requires_grad_(learn and n == "table") for n, t in inp.items()}
            sm, mm = case.score_mod(table, seqlen), case.mask_mod(table, seqlen)
            try:
                bm = (create_block_mask(mm, batch if case.per_batch else None, None, seqlen, seqlen, device="cuda")
                      if mm is not None else None)
                fo = flex(qt, kt, vt, score_mod=sm, block_mask=bm)
                if out is not None:
                    res["forward"]["rel_err"] = rel_err(out, fo.transpose(1, 2))
                res["forward"]["peers"]["flex"] = bench_ms(lambda: flex(qt, kt, vt, score_mod=sm, block_mask=bm))
                wrt = (qt, kt, vt, *(t for t in table.values() if t.requires_grad))
                ref = torch.autograd.grad(fo, wrt, dt, retain_graph=True)
                ms = bench_ms(lambda: torch.autograd.grad(fo, wrt, dt, retain_graph=True))
                res["backward"]["peers"]["flex"] = {"ms": ms, "table_grad": learn} if "table" in inp else ms
                if grads is not None:  # dq, dk, dv
                    res["backward"]["rel_err"] = max(rel_err(a, b.transpose(1, 2)) for a, b in zip(grads[:3], ref[:3]))
                break
            except Exception as e:  # a peer that cannot run the case is absent
                print(f"expressions {label}: flex{' (table grad)' if learn else ''}: {type(e).__name__}: "
                      f"{_message(e)}", flush=True)
                res["backward"]["peers"].pop("flex", None)
        # SDPA with the bias as a float attn_mask (forward)
        if case.bias:
            bb, hb = (batch if case.per_batch else 1), (HEADS if case.score_mod(inp, seqlen) is not None else 1)
            need = bb * hb * seqlen * seqlen * 2
            if need <= SDPA_MEMORY_SHARE * torch.cuda.mem_get_info()[0]:
                try:
                    bias = dense_bias(case, {n: t.detach() for n, t in inp.items()}, batch, seqlen, HEADS,
                                      torch.float16, "cuda")
                    with torch.no_grad(), sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]):
                        res["forward"]["peers"]["sdpa_attn_mask"] = bench_ms(
                            lambda: F.scaled_dot_product_attention(qt, kt, vt, attn_mask=bias))
                    del bias
                except (RuntimeError, torch.cuda.OutOfMemoryError) as e:
                    print(f"expressions {label}: SDPA attn_mask: {_message(e)}", flush=True)
            else:
                print(f"expressions {label}: SDPA attn_mask: {need / 2**30:.1f} GiB of mask does not fit", flush=True)
        # attngen without the expression: the named equivalent, and the plain kernel
        try:
            named = attngen.compile(spec_of(case, seqlen, case.named), target="cuda")
            call = {"mask": attngen.block_mask(visible[:, None], named)} if case.custom else {}
            no, nl = named(q, k, v, return_lse=True, **call)
            for p, fn in (("forward", lambda: named(q, k, v, **call)),
                          ("backward", lambda: named.backward(q, k, v, no, nl, dout, **call))):
                res[p]["peers"]["attngen_named"] = {"ms": bench_ms(fn), "spec": case.named.replace("\n ", " | ")}
            if seqlen not in plain:
                pk = attngen.compile(spec_of(case, seqlen, "mask none"), target="cuda")
                po, pl = pk(q, k, v, return_lse=True)
                plain[seqlen] = (bench_ms(lambda: pk(q, k, v)), bench_ms(lambda: pk.backward(q, k, v, po, pl, dout)))
        except Exception as e:  # report; the row keeps what ran
            print(f"expressions {label}: attngen named / plain: {type(e).__name__}: {_message(e)}", flush=True)
        dense = 4.0 * batch * HEADS * seqlen * seqlen * HEAD_DIM
        for i, p in enumerate(("forward", "backward")):
            scale = 1.0 if p == "forward" else 2.5
            r = res[p]
            row = {"suite": "expressions", "case": f"{label} {p}", "target": "cuda", "pass": p,
                   "spec": " | ".join(line.strip() for line in case.body(seqlen).splitlines()),
                   "plan": kernel.plan.summary() if kernel is not None else None, "live_fraction": live,
                   "rel_err": r["rel_err"], "rel_err_against": "flex",
                   "attngen": _entry(r["attngen"], fwd_flops * scale),
                   "peers": {n: _entry(ms, fwd_flops * scale) for n, ms in r["peers"].items()}}
            if seqlen in plain:
                row["peers"]["attngen_plain"] = dict(_entry(plain[seqlen][i], dense * scale), spec="mask none",
                                                     flops="dense")
            rows.append(row)
            _print(row)


def _attngen(kernel, tensors, inp, res, bench_ms):
    """Time attngen's forward and backward of a spec it compiled, into res[pass]["attngen"] (a
    refusal or a failure recorded as such); (out, gradients or None)."""
    q, k, v, dout = tensors
    try:
        out, lse = kernel(q, k, v, return_lse=True, **inp)
        res["forward"]["attngen"] = bench_ms(lambda: kernel(q, k, v, **inp))
    except Exception as e:
        for p in res:
            res[p]["attngen"] = {"error": f"{type(e).__name__}: {_message(e)}"}
        return None, None
    try:
        grads = kernel.backward(q, k, v, out, lse, dout, **inp)
        res["backward"]["attngen"] = bench_ms(lambda: kernel.backward(q, k, v, out, lse, dout, **inp))
        return out, grads
    except attngen.SpecError as e:
        res["backward"]["attngen"] = {"error": _message(e), "refused": True}
    except Exception as e:
        res["backward"]["attngen"] = {"error": f"{type(e).__name__}: {_message(e)}"}
    return out, None


def _entry(ms, flops) -> dict:
    """{ms, tflops} of a time, or of {ms, ...} (flex's backward with table_grad, attngen_named with
    its spec) with tflops added; a refusal or failure ({error: ...}) as it is."""
    if isinstance(ms, dict):
        return ms if "ms" not in ms else {**ms, "tflops": flops / (ms["ms"] * 1e-3) / 1e12}
    return {"ms": ms, "tflops": flops / (ms * 1e-3) / 1e12}


PEER_COLUMNS = ("flex", "sdpa_attn_mask", "attngen_named", "attngen_plain")


def _print(r):
    a = r["attngen"]
    peers = "  ".join(f"{n} {r['peers'][n]['tflops']:6.1f}" for n in PEER_COLUMNS if n in r["peers"])
    print(f"expressions {r['case']:44s} attngen " + (f"{a['tflops']:6.1f}" if "tflops" in a else "refused" if
                                                      a.get("refused") else "failed")
          + f"  {peers}  (live {r['live_fraction']:.3f})", flush=True)


def markdown(rows) -> str:
    if not rows:
        return ""
    out = ["", "## expressions (suite expressions)", "",
           "TFLOP/s on live pairs (4 B H L^2 D x the visible fraction; backward 2.5x); attngen plain: `mask none`, "
           "dense pairs. named: attngen without the expression (mask causal, softcap, mask custom). d128, 16 heads, "
           "f16, B L = 16384.", "",
           "| case | live | attngen | flex | SDPA attn_mask | attngen named | attngen plain | attngen / flex | "
           "rel. err vs flex |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        a = r["attngen"].get("tflops")

        def t(key):
            return r["peers"].get(key, {}).get("tflops")
        f = (lambda x: f"{x:.1f}" if x else "n/a")
        first = f(a) if a else ("refused" if r["attngen"].get("refused") else "failed")
        ratio = f"{a / t('flex'):.2f}x" if a and t("flex") else "-"
        err = "n/a" if r["rel_err"] is None else format(r["rel_err"], ".1e")
        out.append(f"| {r['case']} | {r['live_fraction']:.3f} | {first} | {f(t('flex'))} | {f(t('sdpa_attn_mask'))} | "
                   f"{f(t('attngen_named'))} | {f(t('attngen_plain'))} | {ratio} | {err} |")
    refusals = sorted({r["attngen"]["error"] for r in rows if r["attngen"].get("refused")})
    if refusals:
        out += ["", "Refused by the checker:", ""] + [f"- {m}" for m in refusals]
    return "\n".join(out) + "\n"
