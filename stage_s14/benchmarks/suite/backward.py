"""Suites `backward` and `training` (issue 41).

backward: the dense grid of the forward's suite (f16 / bf16 x d64/128/256 x L 1k/4k/16k x full /
causal, B L = 16384, H D = 2048): attngen's kernel.backward beside the backward of SDPA's flash,
cuDNN and memory-efficient kernels and FlexAttention's (torch.compile), each timed alone (the
peers: `out.backward(dout, retain_graph=True)` on a kept graph; attngen: kernel.backward on the
forward's out and lse), medians of CUDA events (do_bench). TFLOP/s = 2.5 x the forward's count
(4 B H L^2 D, halved for causal), as FlashAttention reports the backward. attngen's gradients are
checked against SDPA flash's (relative L2 of each of dq, dk, dv; the worst is reported). Head dims 64 and
128 also time the same spec built with profile cuda-sm80 (column "attngen sm80": the mma.sync
family an A100 runs, here on this GPU), its error against SDPA flash's as sm80_rel_err.

wgsl_backward: attngen's WGSL backward (kernel.backward on resident WgslTensors) on the machine's
Vulkan adapter, f16 and f32, d64 / d128, L 1k / 4k, full / causal, B L = 16384, H D = 2048 (as
the dense grid; issue 41's goal is 5 TFLOP/s): wall time of each call to completion (the backward
submits its three passes at once; a 4-byte read-back of dq waits for them), medians; the
gradients checked against SDPA flash's on the GPU (f16) or its math kernel (f32).

training: step time (forward + backward + AdamW) of the tiny-but-not-toy models of
tests/hf/test_training.py's copy task at GPU widths, attn_implementation attngen vs sdpa vs
flex_attention, and the loss curves of a few hundred steps of attngen and SDPA from one seed
(the largest per-step relative difference and the final losses).
"""

from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attngen
from attngen.backends.cuda.backward import family as backward_family
from variants import bench_ms, mask_cases, rel_err

SLOW_FLOPS = 2e11  # the deterministic family (a few TFLOP/s) is timed only below this count

BACKENDS = [("SDPA flash", SDPBackend.FLASH_ATTENTION), ("SDPA cuDNN", SDPBackend.CUDNN_ATTENTION),
            ("SDPA mem-eff", SDPBackend.EFFICIENT_ATTENTION)]
PEERS = {"SDPA flash": "sdpa_flash", "SDPA cuDNN": "sdpa_cudnn", "SDPA mem-eff": "sdpa_mem_efficient",
         "flex": "flex", "attngen sm80": "attngen_sm80"}  # (attngen sm80: the mma.sync family, profile cuda-sm80)
TORCH_DTYPE = {"f16": torch.float16, "bf16": torch.bfloat16}
CASES = [(f"{dt} d{d} L{L} {'causal' if m == 'causal' else 'full'}", dt, d, L, m)
         for dt in ("f16", "bf16") for d in (64, 128, 256) for L in (1024, 4096, 16384) for m in ("none", "causal")]
QUICK = {"f16 d128 L4096 full", "f16 d128 L4096 causal", "bf16 d64 L1024 causal", "f16 d64 L4096 full",
         "bf16 d256 L4096 causal", "f16 d256 L16384 full"}


def _flex():
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return None, None
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    return torch.compile(flex_attention, dynamic=False), create_block_mask


def backward_section(rows, quick: bool = False):
    """The dense grid (QUICK's rows with `quick`; ATTNGEN_BACKWARD_ROWS, labels comma-separated,
    picks rows instead, "none" for only the masks rows), then the masks rows."""
    flex, create_block_mask = _flex()
    picked = {x.strip() for x in os.environ.get("ATTNGEN_BACKWARD_ROWS", "").split(",") if x.strip()}
    for label, dtype, d, seqlen, mask in CASES:
        if (label not in picked) if picked else (quick and label not in QUICK):
            continue
        batch, heads = 16384 // seqlen, 2048 // d
        spec = attngen.parse(f"attention bwd_d{d}_{mask}_{dtype} {{\n head_dim {d}\n dtype {dtype}\n"
                             f" mask {mask}\n}}\n")[0]
        kernel = attngen.compile(spec, target="cuda")
        g = torch.Generator(device="cuda").manual_seed(0)
        shape = (batch, seqlen, heads, d)
        q, k, v, dout = (torch.randn(shape, device="cuda", dtype=TORCH_DTYPE[dtype], generator=g) for _ in range(4))
        causal = mask == "causal"
        flops = 2.5 * 4.0 * batch * heads * seqlen * seqlen * d * (0.5 if causal else 1.0)
        row = {"suite": "backward", "case": label, "target": "cuda", "plan": kernel.plan.summary(),
               "family": backward_family(kernel.plan)}
        grads = None
        if row["family"] == "fma" and flops > SLOW_FLOPS:
            row["attngen_error"] = ("the deterministic CUDA-core family (the fast ones take head dims 64, 128 and 256 "
                                    "on sm_90a, 32 to 128 on mma.sync): not timed at this size")
        else:
            try:
                out, lse = kernel(q, k, v, return_lse=True)
                grads = kernel.backward(q, k, v, out, lse, dout)
                row["attngen_ms"] = bench_ms(lambda: kernel.backward(q, k, v, out, lse, dout))
            except Exception as e:
                row["attngen_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
        sm80_grads = None
        if d in (64, 128):  # the sm_80 tensor-core family (mma.sync), as an A100 runs it, on this GPU
            try:
                sm80 = attngen.compile(spec, target="cuda", profile="cuda-sm80")
                out8, lse8 = sm80(q, k, v, return_lse=True)
                sm80_grads = sm80.backward(q, k, v, out8, lse8, dout)
                row["attngen sm80_ms"] = bench_ms(lambda: sm80.backward(q, k, v, out8, lse8, dout))
                row["sm80_family"] = backward_family(sm80.plan)
            except Exception as e:
                row["sm80_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
        qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
        dt = dout.transpose(1, 2)
        for name, backend in BACKENDS:
            try:
                with sdpa_kernel([backend]):
                    o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                    if name == "SDPA flash" and grads is not None:
                        ref = torch.autograd.grad(o, (qt, kt, vt), dt, retain_graph=True)
                        row["rel_err_vs_flash"] = max(rel_err(a, b.transpose(1, 2)) for a, b in zip(grads, ref))
                    if name == "SDPA flash" and sm80_grads is not None:
                        ref = torch.autograd.grad(o, (qt, kt, vt), dt, retain_graph=True)
                        row["sm80_rel_err"] = max(rel_err(a, b.transpose(1, 2)) for a, b in zip(sm80_grads, ref))
                    row[f"{name}_ms"] = bench_ms(lambda: torch.autograd.grad(o, (qt, kt, vt), dt, retain_graph=True))
            except RuntimeError:
                pass  # a peer that cannot run the case is absent
        if flex is not None:
            try:
                bm = create_block_mask(lambda b, h, qi, kj: qi >= kj, None, None, seqlen, seqlen,
                                       device="cuda") if causal else None
                o = flex(qt, kt, vt, block_mask=bm)
                row["flex_ms"] = bench_ms(lambda: torch.autograd.grad(o, (qt, kt, vt), dt, retain_graph=True))
            except Exception:
                pass
        r = _finish(row, flops)
        rows.append(r)
        peers = "  ".join(f"{key} {r['peers'][key]['tflops']:6.1f}" for key in PEERS.values() if key in r["peers"])
        err = r["rel_err"]
        print(f"backward {label:22s} attngen {r['attngen'].get('tflops') or 0:6.1f}  {peers}  err "
              f"{'n/a' if err is None else format(err, '.1e')}" + (f"  ({row['attngen_error']})" if
                                                                  "attngen_error" in row else "")
              + (f"  (sm80 {r.get('sm80_family')} err {r['sm80_rel_err']:.1e})" if "sm80_rel_err" in r else "")
              + (f"  (sm80: {r['sm80_error']})" if "sm80_error" in r else ""), flush=True)
    backward_masks_section(rows)


def backward_masks_section(rows):
    """The masks rows: L 16384, 16 heads, d128, f16, B 1; window 1024 (attngen's `mask window`, and the
    same window as a `mask custom` BlockMask) and document-causal (mask custom), against
    FlexAttention's backward with the same block mask. TFLOP/s over the live scores only."""
    L, H, D = 16384, 16, 128
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (torch.randn((1, L, H, D), device="cuda", dtype=torch.float16, generator=g) for _ in range(4))
    qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
    dt = dout.transpose(1, 2)
    masks, mask_mods = mask_cases(L)
    flex, create_block_mask = _flex()
    custom = attngen.compile(attngen.parse(f"attention bwd_custom {{\n head_dim {D}\n dtype f16\n mask custom\n}}\n")[0],
                             target="cuda")
    window = attngen.compile(attngen.parse(f"attention bwd_window {{\n head_dim {D}\n dtype f16\n"
                                           f" mask window(left=1023)\n}}\n")[0], target="cuda")
    cases = [("window 1024 (mask window)", window, "window 1024", None),
             ("window 1024 (mask custom)", custom, "window 1024", "custom"),
             ("document-causal (mask custom)", custom, "document-causal", "custom")]
    for label, kernel, name, kind in cases:
        dense = masks[name]
        live = float(dense.float().mean())
        flops = 2.5 * 4.0 * H * L * L * D * live
        call = {"mask": attngen.block_mask(dense, kernel)} if kind else {}
        row = {"suite": "backward", "case": f"masks: {label} L{L} d{D}", "target": "cuda",
               "plan": kernel.plan.summary(), "family": backward_family(kernel.plan), "live_fraction": live}
        out, lse = kernel(q, k, v, return_lse=True, **call)
        grads = kernel.backward(q, k, v, out, lse, dout, **call)
        row["attngen_ms"] = bench_ms(lambda: kernel.backward(q, k, v, out, lse, dout, **call))
        if flex is not None:
            try:
                fbm = create_block_mask(mask_mods[name], None, None, L, L, device="cuda")
                o = flex(qt, kt, vt, block_mask=fbm)
                ref = torch.autograd.grad(o, (qt, kt, vt), dt, retain_graph=True)
                row["rel_err_vs_flash"] = max(rel_err(a, b.transpose(1, 2)) for a, b in zip(grads, ref))
                row["flex_ms"] = bench_ms(lambda: torch.autograd.grad(o, (qt, kt, vt), dt, retain_graph=True))
            except Exception as e:
                print(f"flex {name}: {type(e).__name__}: {str(e).splitlines()[0][:120]}", flush=True)
        r = _finish(row, flops)
        r["family"], r["live_fraction"], r["rel_err_against"] = row["family"], live, "flex"
        rows.append(r)
        flex_t = r["peers"].get("flex", {}).get("tflops")
        print(f"backward {r['case']:44s} attngen {r['attngen'].get('tflops') or 0:6.1f}  flex "
              f"{flex_t or float('nan'):6.1f}  (live {live:.3f}; err vs flex {r['rel_err'] or float('nan'):.1e})",
              flush=True)


WGSL_CASES = [(dt, d, L, m) for dt in ("f16", "f32") for d in (64, 128) for L in (1024, 4096)
              for m in ("none", "causal")]
WGSL_QUICK = {("f16", 128, 1024, "causal"), ("f32", 64, 1024, "none")}


def wgsl_backward_section(rows, quick: bool = False, runs: int = 3):
    import statistics
    import time

    import numpy as np

    from attngen.backends import wgsl
    for dtype, d, seqlen, mask in WGSL_CASES:
        if quick and (dtype, d, seqlen, mask) not in WGSL_QUICK:
            continue
        batch, heads = 16384 // seqlen, 2048 // d
        label = f"wgsl {dtype} d{d} L{seqlen} {'causal' if mask == 'causal' else 'full'}"
        spec = attngen.parse(f"attention wbwd_d{d}_{mask}_{dtype} {{\n head_dim {d}\n dtype {dtype}\n"
                             f" mask {mask}\n}}\n")[0]
        row = {"suite": "backward", "case": label, "target": "wgsl", "plan": None}
        causal = mask == "causal"
        flops = 2.5 * 4.0 * batch * heads * seqlen * seqlen * d * (0.5 if causal else 1.0)
        try:
            kernel = attngen.compile(spec, target="wgsl")
            row["plan"] = kernel.plan.summary()
            tdt = torch.float16 if dtype == "f16" else torch.float32
            g = torch.Generator(device="cuda").manual_seed(0)
            shape = (batch, seqlen, heads, d)
            q, k, v, dout = (torch.randn(shape, device="cuda", dtype=tdt, generator=g) for _ in range(4))
            host = [x.cpu().numpy() for x in (q, k, v, dout)]
            dev = [wgsl.WgslTensor.from_numpy(x) for x in host]
            out, lse = kernel(*dev[:3], return_lse=True)

            def call():
                grads = kernel.backward(*dev[:3], out, lse, dev[3])
                wgsl.device().queue.read_buffer(grads[0].buffer, 0, 4)  # waits for the passes
                return grads
            grads = call()
            times = []
            for _ in range(runs):
                t0 = time.perf_counter()
                call()
                times.append((time.perf_counter() - t0) * 1e3)
            row["attngen_ms"] = statistics.median(times)
            qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION if dtype == "f16" else SDPBackend.MATH]):
                o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                ref = torch.autograd.grad(o, (qt, kt, vt), dout.transpose(1, 2))
            row["rel_err_vs_flash"] = max(
                rel_err(torch.from_numpy(np.asarray(a.numpy(), np.float32)).cuda(), b.transpose(1, 2).float())
                for a, b in zip(grads, ref))
        except Exception as e:
            row["attngen_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
        r = _finish(row, flops)
        rows.append(r)
        print(f"backward {label:26s} attngen {r['attngen'].get('tflops') or 0:6.2f} TFLOP/s  err "
              f"{'n/a' if r['rel_err'] is None else format(r['rel_err'], '.1e')}"
              + (f"  ({row['attngen_error']})" if "attngen_error" in row else ""), flush=True)


def _finish(row, flops):
    def entry(ms):
        return {"ms": ms, "tflops": flops / (ms * 1e-3) / 1e12}
    out = {"suite": row["suite"], "case": row["case"], "target": row["target"], "plan": row["plan"],
           "family": row.get("family"),
           "rel_err": row.get("rel_err_vs_flash"),
           "attngen": entry(row["attngen_ms"]) if "attngen_ms" in row else {"error": row.get("attngen_error")},
           "peers": {PEERS[n]: entry(row[f"{n}_ms"]) for n in PEERS if row.get(f"{n}_ms")}}
    out.update({key: row[key] for key in ("sm80_family", "sm80_rel_err", "sm80_error") if key in row})
    return out


def training_section(rows, steps: int | None = None):
    """Step times and loss curves of tests/hf/test_training.py's models at GPU widths
    (steps: $ATTNGEN_TRAIN_STEPS, default 300)."""
    steps = steps or int(os.environ.get("ATTNGEN_TRAIN_STEPS", "300"))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for where in (os.path.join(root, "tests"), os.path.join(root, "tests", "hf")):  # conftest, tiny, test_training
        if where not in sys.path:
            sys.path.insert(0, where)
    import test_training as tt  # noqa: E402  (tests/hf: the copy task, the training loop)
    from tiny import tiny_config  # noqa: E402
    import attngen.transformers as at
    at.register()
    widths = {"hidden_size": 512, "intermediate_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 2,
              "num_hidden_layers": 4, "vocab_size": 512, "attention_dropout": 0.0}
    for family, extra in (("llama", {}), ("gemma2", {"head_dim": 128, "query_pre_attn_scalar": 128,
                                                     "sliding_window": 64})):
        config = tiny_config(family, **widths, **extra)
        curves, times = {}, {}
        for impl in ("attngen", "sdpa", "flex_attention"):
            try:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                start.record()
                curves[impl] = tt.train(config, impl, steps, torch.device("cuda"), batch=8, half=128, lr=1e-3)
                end.record()
                torch.cuda.synchronize()
                times[impl] = start.elapsed_time(end) / steps
            except Exception as e:
                print(f"training {family} {impl}: {type(e).__name__}: {str(e).splitlines()[0][:120]}", flush=True)
        ref = "sdpa" if family == "llama" else "flex_attention"  # SDPA drops Gemma-2's soft-cap
        worst = (max(abs(a - b) / abs(b) for a, b in zip(curves["attngen"], curves[ref]))
                 if "attngen" in curves and ref in curves else None)
        row = {"suite": "training", "case": f"{family} copy task, 4 layers, {steps} steps, B=8 L=256, f32",
               "target": "cuda", "attngen": {"ms": times.get("attngen")},
               "peers": {("sdpa" if i == "sdpa" else "flex"): {"ms": times[i]} for i in ("sdpa", "flex_attention")
                         if i in times},
               "loss_vs": ref, "max_step_rel_diff": worst,
               "final_loss": {i: c[-1] for i, c in curves.items()}, "first_loss": {i: c[0] for i, c in curves.items()}}
        rows.append(row)
        print(f"training {row['case']}: ms/step " + ", ".join(f"{i} {t:.2f}" for i, t in times.items())
              + f"; loss {row['first_loss']} -> {row['final_loss']}; worst step diff vs {ref}: {worst}", flush=True)


def markdown(rows) -> str:
    bw = [r for r in rows if r["suite"] == "backward"]
    tr = [r for r in rows if r["suite"] == "training"]
    out = []
    if bw:
        out += ["", "## backward (suite backward)", "",
                "TFLOP/s = 2.5 x 4 B H L^2 D (halved for causal; masks rows: times the live fraction); each backward "
                "timed alone; rel. err: the worst of dq, dk, dv against SDPA flash's (masks rows: FlexAttention's).", "",
                "attngen sm80: the same spec built with profile cuda-sm80 (its mma.sync backward family), on this GPU.",
                "",
                "| case | attngen | attngen sm80 | SDPA flash | SDPA cuDNN | SDPA mem-eff | flex | attngen / flash | "
                "attngen / flex | rel. err |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in bw:
            a = r["attngen"].get("tflops")

            def t(key):
                return r["peers"].get(key, {}).get("tflops")
            f = (lambda x: f"{x:.1f}" if x else "n/a")
            ratio = (lambda p: f"{a / t(p):.2f}x" if a and t(p) else "-")
            out.append(f"| {r['case']} | {f(a) if a else r['attngen'].get('error', 'n/a')} | {f(t('attngen_sm80'))} | "
                       f"{f(t('sdpa_flash'))} | "
                       f"{f(t('sdpa_cudnn'))} | {f(t('sdpa_mem_efficient'))} | {f(t('flex'))} | {ratio('sdpa_flash')} "
                       f"| {ratio('flex')} | {r['rel_err'] if r['rel_err'] is None else format(r['rel_err'], '.1e')} |")
    if tr:
        out += ["", "## training (suite training)", "",
                "| case | attngen ms/step | sdpa ms/step | flex ms/step | loss first -> final (attngen) | "
                "largest per-step rel. diff (vs) |", "|---|---|---|---|---|---|"]
        for r in tr:
            f = (lambda x: f"{x:.2f}" if x else "n/a")
            w = r["max_step_rel_diff"]
            out.append(f"| {r['case']} | {f(r['attngen']['ms'])} | {f(r['peers'].get('sdpa', {}).get('ms'))} | "
                       f"{f(r['peers'].get('flex', {}).get('ms'))} | {r['first_loss'].get('attngen', 0):.3f} -> "
                       f"{r['final_loss'].get('attngen', 0):.3f} | {'n/a' if w is None else format(w, '.1e')} "
                       f"({r['loss_vs']}) |")
    return "\n".join(out) + "\n"
