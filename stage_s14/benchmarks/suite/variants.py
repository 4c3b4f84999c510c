"""Issue 3's benchmark sections for run_gpu.py: masks, decode schedules, large head dims.

Each section builds the attngen kernels, checks them against a PyTorch peer on the same
inputs (relative L2 error), and times attngen and the peers side by side in this process
(triton do_bench: median of CUDA events after warm-up). Rows are dicts; markdown() renders
them. Cases follow issue 3 and benchmarks/ANCHORS.md:

- masks: L=16384, d128, 16 heads, B=1, f16. Sliding window of 1024 keys (structured
  `mask window(left=1023)`, and the same window as a `mask custom` block mask) and a
  document-causal mask (8 documents of uneven lengths) against the same attngen kernel with
  no mask and against FlexAttention with the same block mask.
- decode: B=8, 32 query heads over 8 KV heads, d128, Lq=1, Lk 4096 and 32768: attngen
  fused, split_kv(auto), split_kv(4 / 16 / 64) and two_pass against SDPA flash / cuDNN /
  mem-efficient (enable_gqa), as effective K+V bytes per second (the bytes of K and V divided
  by the time; copy ceiling 2.97 TB/s).
- head dims 320, 512, 1024: B=1, 48 heads, L=4096, f16, no mask, against SDPA's
  memory-efficient kernel (the only PyTorch backend that runs them).
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import attngen

COPY_CEILING_TBS = 2.97


def bench_ms(fn) -> float:
    """The suite's timer (run_gpu.py's too): CUDA events by triton's do_bench, 25 ms of warm-up,
    the median over 100 ms of calls."""
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def rel_err(a, b) -> float:
    """Relative L2 error of a against b, in f32 (run_gpu.py's too)."""
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm())


def spec(name, body):
    return attngen.parse(f"attention {name} {{\n{body}\n}}\n")[0]


def _sdpa(backend, q, k, v, **kw):
    with sdpa_kernel([backend]):
        return F.scaled_dot_product_attention(q, k, v, **kw)


def _try(fn):
    try:
        return fn(), None
    except Exception as e:  # a peer that cannot run the case: reported, not fatal
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"


# ---- masks -------------------------------------------------------------------------------------

DOC_LENGTHS = [1024, 3072, 512, 2560, 2048, 4096, 1536, 1536]  # 8 documents, 16384 tokens
MASK_WINDOW = 1024


def mask_cases(L: int = 16384):
    """The masks section's two custom masks over L tokens: {name: dense bool mask on the GPU}
    and {name: FlexAttention mask_mod} (also benchmarks/probes/probe_custom.py)."""
    i = torch.arange(L, device="cuda")
    doc = torch.repeat_interleave(torch.arange(len(DOC_LENGTHS), device="cuda"),
                                  torch.tensor(DOC_LENGTHS, device="cuda"))
    window = MASK_WINDOW
    masks = {
        "window 1024": (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - window),
        "document-causal": (doc[:, None] == doc[None, :]) & (i[None, :] <= i[:, None]),
    }
    mask_mods = {
        "window 1024": lambda b, h, qi, kj: (kj <= qi) & (kj > qi - window),
        "document-causal": lambda b, h, qi, kj: (doc[qi] == doc[kj]) & (kj <= qi),
    }
    return masks, mask_mods


def mask_section(rows):
    L, H, D = 16384, 16, 128
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn((1, L, H, D), device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    window = MASK_WINDOW
    masks, mask_mods = mask_cases(L)
    dense_k = attngen.compile(spec("dense", f"head_dim {D}\n dtype f16\n mask none"), target="cuda")
    dense_ms = bench_ms(lambda: dense_k(q, k, v))
    full_flops = 4.0 * H * L * L * D
    rows.append({"section": "masks", "case": "no mask (same kernel family)", "attngen_ms": dense_ms,
                 "live_fraction": 1.0, "attngen_tflops_live": full_flops / dense_ms / 1e9})
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        flex = torch.compile(flex_attention)
    except Exception as e:
        flex, create_block_mask = None, None
        print(f"FlexAttention unavailable: {e}")
    custom = attngen.compile(spec("custom", f"head_dim {D}\n dtype f16\n mask custom"), target="cuda")
    structured = attngen.compile(spec("window", f"head_dim {D}\n dtype f16\n mask window(left={window - 1})"),
                                 target="cuda")
    for name, dense_mask in masks.items():
        live = float(dense_mask.float().mean())
        attngen.block_mask(dense_mask, custom)  # warm-up: CuPy compiles its reductions once
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        bm = attngen.block_mask(dense_mask, custom)
        torch.cuda.synchronize()
        build_ms = (time.perf_counter() - t0) * 1e3
        out = custom(q, k, v, mask=bm)
        ref = _sdpa(SDPBackend.EFFICIENT_ATTENTION, qt, kt, vt, attn_mask=dense_mask).transpose(1, 2)
        row = {"section": "masks", "case": f"{name} (mask custom)", "live_fraction": live,
               "tile_density": bm.density, "block_mask_build_ms": build_ms, "rel_err": rel_err(out, ref),
               "attngen_ms": bench_ms(lambda: custom(q, k, v, mask=bm))}
        if flex is not None:
            fbm = create_block_mask(mask_mods[name], None, None, L, L, device="cuda")
            fo, err = _try(lambda: flex(qt, kt, vt, block_mask=fbm))
            if fo is not None:
                row["flex_ms"] = bench_ms(lambda: flex(qt, kt, vt, block_mask=fbm))
                row["flex_rel_err_vs_attngen"] = rel_err(fo.transpose(1, 2), out)
            else:
                row["flex_error"] = err
        rows.append(row)
        if name == "window 1024":
            out_s = structured(q, k, v)
            rows.append({"section": "masks", "case": "window 1024 (mask window, analytic bounds)",
                         "live_fraction": live, "rel_err": rel_err(out_s, ref),
                         "attngen_ms": bench_ms(lambda: structured(q, k, v)),
                         "flex_ms": row.get("flex_ms")})
    for r in rows:
        if r.get("section") == "masks":
            r["vs_dense"] = r["attngen_ms"] / dense_ms
            r["attngen_tflops_live"] = full_flops * r["live_fraction"] / r["attngen_ms"] / 1e9
            print(f"{r['case']:44s} {r['attngen_ms']:7.3f} ms ({r['vs_dense']:.3f} of dense)  "
                  f"flex {r.get('flex_ms') or float('nan'):7.3f} ms", flush=True)


# ---- decode ------------------------------------------------------------------------------------

def decode_section(rows):
    B, HQ, HKV, D = 8, 32, 8, 128
    schedules = ("fused", "split_kv(auto)", "split_kv(4)", "split_kv(16)", "split_kv(64)", "two_pass")
    kernels = {s: attngen.compile(spec(f"decode_{s.replace('(', '_').replace(')', '')}",
                                       f"head_dim {D}\n dtype f16\n heads q={HQ} kv={HKV}\n schedule {s}"),
                                  target="cuda") for s in schedules}
    for lk in (4096, 32768):
        g = torch.Generator(device="cuda").manual_seed(1)
        q = torch.randn((B, 1, HQ, D), device="cuda", dtype=torch.float16, generator=g)
        k, v = (torch.randn((B, lk, HKV, D), device="cuda", dtype=torch.float16, generator=g) for _ in range(2))
        nbytes = 2 * k.numel() * k.element_size()
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        # SDPA's fused kernels may refuse enable_gqa: then they run on K/V expanded to 32 heads
        # (the bytes counted stay those of the 8 KV heads, so their TB/s is what a user gets)
        ke, ve = (x.repeat_interleave(HQ // HKV, dim=1) for x in (kt, vt))
        ref = _sdpa(SDPBackend.EFFICIENT_ATTENTION, qt, ke, ve).transpose(1, 2)
        for sched, kern in kernels.items():
            row = {"section": "decode", "case": f"Lk {lk} attngen {sched}", "bytes": nbytes}
            launch, err = _try(lambda: kern.prepared(q, k, v))
            if launch is None:
                row["error"] = err
            else:
                row["rel_err"] = rel_err(launch(), ref)
                row["ms"] = bench_ms(launch)  # the kernels' launches alone (GPU time)
                row["call_ms"] = bench_ms(lambda: kern(q, k, v))  # a full call: checks, workspaces
            rows.append(row)
        for name, backend in (("SDPA flash", SDPBackend.FLASH_ATTENTION), ("SDPA cuDNN", SDPBackend.CUDNN_ATTENTION),
                              ("SDPA mem-eff", SDPBackend.EFFICIENT_ATTENTION)):
            for label, args, kw in (("enable_gqa", (qt, kt, vt), {"enable_gqa": True}),
                                    ("K/V expanded", (qt, ke, ve), {})):
                out, err = _try(lambda: _sdpa(backend, *args, **kw))
                if out is not None:
                    break
            row = {"section": "decode", "case": f"Lk {lk} {name} ({label})", "bytes": nbytes}
            if err:
                row["error"] = err
            else:
                row["rel_err"] = rel_err(out.transpose(1, 2), ref)
                row["ms"] = row["call_ms"] = bench_ms(lambda: _sdpa(backend, *args, **kw))
            rows.append(row)
    for r in rows:
        if r.get("section") == "decode" and "ms" in r:
            r["tbs"] = r["bytes"] / (r["ms"] * 1e-3) / 1e12
            r["call_tbs"] = r["bytes"] / (r["call_ms"] * 1e-3) / 1e12
            print(f"{r['case']:36s} {r['ms']:7.3f} ms {r['tbs']:5.2f} TB/s (call {r['call_tbs']:5.2f})", flush=True)


# ---- head dims -----------------------------------------------------------------------------------

def head_dim_section(rows):
    B, H, L = 1, 48, 4096
    for d in (320, 512, 1024):
        g = torch.Generator(device="cuda").manual_seed(2)
        q, k, v = (torch.randn((B, L, H, d), device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        flops = 4.0 * B * H * L * L * d
        row = {"section": "head_dims", "case": f"d{d} L{L} B{B} H{H}", "flops": flops}
        kern, err = _try(lambda: attngen.compile(spec(f"d{d}", f"head_dim {d}\n dtype f16"), target="cuda"))
        ref, ref_err = _try(lambda: _sdpa(SDPBackend.EFFICIENT_ATTENTION, qt, kt, vt).transpose(1, 2))
        if kern is None:
            row["error"] = err
        else:
            row["plan"] = kern.plan.summary()
            out = kern(q, k, v)
            if ref is not None:
                row["rel_err"] = rel_err(out, ref)
            row["attngen_ms"] = bench_ms(lambda: kern(q, k, v))
        if ref is not None:
            row["mem_eff_ms"] = bench_ms(lambda: _sdpa(SDPBackend.EFFICIENT_ATTENTION, qt, kt, vt))
        else:
            row["mem_eff_error"] = ref_err
        for key in ("attngen", "mem_eff"):
            if f"{key}_ms" in row:
                row[f"{key}_tflops"] = flops / (row[f"{key}_ms"] * 1e-3) / 1e12
        rows.append(row)
        print(f"{row['case']:24s} attngen {row.get('attngen_tflops', 0):6.1f}  mem-eff "
              f"{row.get('mem_eff_tflops', 0):6.1f} TFLOP/s", flush=True)


def run_all(rows, only=None):
    for name, fn in (("masks", mask_section), ("decode", decode_section), ("head_dims", head_dim_section)):
        if only and name not in only:
            continue
        try:
            fn(rows)
        except Exception as e:  # one failing section must not lose the others' numbers
            import traceback
            traceback.print_exc()
            rows.append({"section": name, "case": "section failed", "error": f"{type(e).__name__}: {e}"[:300]})


def _f(x, fmt="{:.3f}"):
    return "n/a" if x is None else fmt.format(x)


def markdown(rows) -> str:
    lines = ["", "### Issue 3 variants", ""]
    masks = [r for r in rows if r["section"] == "masks"]
    if masks:
        lines += ["Masks: B=1, L=16384, 16 heads, d128, f16. `vs dense` = time / the no-mask kernel's time "
                  "(live tiles decide the work); FlexAttention with the same block mask (torch.compile).", "",
                  "| case | live pairs | attngen ms | vs dense | TFLOP/s on live pairs | FlexAttention ms | "
                  "rel. err | block-mask build ms |", "|---|---|---|---|---|---|---|---|"]
        for r in masks:
            lines.append(f"| {r['case']} | {_f(r.get('live_fraction'))} | {_f(r.get('attngen_ms'))} | "
                         f"{_f(r.get('vs_dense'))} | {_f(r.get('attngen_tflops_live'), '{:.0f}')} | "
                         f"{_f(r.get('flex_ms')) if 'flex_error' not in r else r['flex_error']} | "
                         f"{_f(r.get('rel_err'), '{:.1e}')} | {_f(r.get('block_mask_build_ms'), '{:.1f}')} |")
    dec = [r for r in rows if r["section"] == "decode"]
    if dec:
        lines += ["", f"Decode: B=8, Lq=1, 32 query heads over 8 KV heads, d128, f16. Effective K+V bytes per "
                  f"second (copy ceiling {COPY_CEILING_TBS} TB/s). attngen: `launches` times the kernels' "
                  "launches alone (kernel.prepared), `call` a whole kernel(...) call with its Python checks "
                  "and workspace allocation; SDPA is timed as a call, with enable_gqa=True where its kernel takes it, "
                  "else on K/V expanded to 32 heads (bytes still counted for 8).", "",
                  "| case | launches ms | launches TB/s | call ms | call TB/s | rel. err vs SDPA mem-eff |",
                  "|---|---|---|---|---|---|"]
        for r in dec:
            lines.append(f"| {r['case']} | {_f(r.get('ms'))} | {_f(r.get('tbs'), '{:.2f}')} | "
                         f"{_f(r.get('call_ms'))} | {_f(r.get('call_tbs'), '{:.2f}')} | "
                         f"{_f(r.get('rel_err'), '{:.1e}') if 'error' not in r else r['error']} |")
    hd = [r for r in rows if r["section"] == "head_dims"]
    if hd:
        lines += ["", "Large head dims: B=1, 48 heads, L=4096, f16, no mask; TFLOP/s = 4 B H L^2 D.", "",
                  "| case | attngen TFLOP/s | SDPA mem-eff TFLOP/s | rel. err | attngen plan |", "|---|---|---|---|---|"]
        for r in hd:
            lines.append(f"| {r['case']} | {_f(r.get('attngen_tflops'), '{:.0f}')} | "
                         f"{_f(r.get('mem_eff_tflops'), '{:.0f}')} | "
                         f"{_f(r.get('rel_err'), '{:.1e}') if 'error' not in r else r['error']} | "
                         f"{r.get('plan', '')} |")
    failed = [r for r in rows if r.get("case") == "section failed"]
    for r in failed:
        lines.append(f"\nSection {r['section']} failed: {r['error']}")
    return "\n".join(lines) + "\n"


_PEER_KEYS = {"SDPA flash": "sdpa_flash", "SDPA cuDNN": "sdpa_cudnn", "SDPA mem-eff": "sdpa_mem_efficient"}


def latest_rows(rows) -> list:
    """These sections' rows in benchmarks/results/latest.json's form (suites masks, decode,
    head_dims; a peer that did not run a case is absent)."""
    out = []
    for r in rows:
        if r.get("section") == "masks" and "attngen_ms" in r:
            peers = {"flex": {"ms": r["flex_ms"]}} if r.get("flex_ms") else {}
            out.append({"suite": "masks", "case": f"L16384 d128 H16 {r['case']}", "target": "cuda",
                        "plan": r.get("plan", ""), "rel_err": r.get("rel_err"),
                        "attngen": {"ms": r["attngen_ms"], "tflops": r.get("attngen_tflops_live")}, "peers": peers})
    decode = [r for r in rows if r.get("section") == "decode" and "ms" in r]
    for r in decode:
        if " attngen " not in r["case"]:
            continue
        lk = r["case"].split()[1]
        peers = {}
        for p in decode:
            for name, key in _PEER_KEYS.items():
                if p["case"].startswith(f"Lk {lk} {name} "):
                    peers[key] = {"ms": p["ms"], "tbs": p["tbs"]}
        out.append({"suite": "decode", "case": f"B8 32q/8kv d128 {r['case']}", "target": "cuda",
                    "plan": r.get("plan", ""), "rel_err": r.get("rel_err"),
                    "attngen": {"ms": r["ms"], "tbs": r["tbs"], "call_ms": r.get("call_ms")}, "peers": peers})
    for r in rows:
        if r.get("section") == "head_dims" and "attngen_ms" in r:
            peers = ({"sdpa_mem_efficient": {"ms": r["mem_eff_ms"], "tflops": r.get("mem_eff_tflops")}}
                     if r.get("mem_eff_ms") else {})
            out.append({"suite": "head_dims", "case": r["case"], "target": "cuda", "plan": r.get("plan", ""),
                        "rel_err": r.get("rel_err"),
                        "attngen": {"ms": r["attngen_ms"], "tflops": r.get("attngen_tflops")}, "peers": peers})
    return out
