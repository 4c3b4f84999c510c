"""Suite `fp8` (issue 44, "Speed"): FP8 prefill against attngen's own f16 kernel and cuDNN's FP8 SDPA.

Cases: head dims 64 / 128 / 256 x L 4k / 16k x full / causal, B L = 16384, H D = 2048 (MHA), e4m3
inputs with the output in bf16 (docs/language.md, "FP8 prefill"). Per case, on the same GPU in one
process, medians of CUDA events after warm-up (triton's do_bench, as the rest of the suite):

- `attngen`: the FP8 kernel's whole call as a prepared launch: the _prepare_v entry (V^T, its bad
  keys, the descales' check) then the attention; `prepare_v_ms` is the first launch alone and
  `attention_ms` the second alone (what a V^T kept between calls would leave);
- `attngen_f16`: attngen's f16 kernel of the same spec on f16 inputs (the >= 1.5x target);
- peer `cudnn_fp8`: cuDNN's FP8 SDPA (`nvidia-cudnn-frontend`'s pygraph, `sdpa_fp8`, per-tensor
  descales of 1, e4m3 in and out: Hopper's cuDNN writes O in FP8), where `cudnn` imports;
  absent otherwise (the row says why).

TFLOP/s = 4 B H L^2 D, halved for causal. `rel_err` is the FP8 output's relative L2 error against
the f16 kernel's on the same (dequantized, rounded to f16) values: P's e4m3 rounding, about 1e-2.

    python3 benchmarks/suite/fp8_prefill.py [--dims 64,128,256] [--lengths 4096,16384] [--masks none,causal]
"""

from __future__ import annotations

import argparse
import math

import torch

import attngen
from variants import bench_ms, rel_err

TOKENS, WIDTH = 16384, 2048  # B L and H D


def _spec(dtype: str, d: int, mask: str):
    name = f"fp8_suite_{dtype.split()[0]}_d{d}_{mask}"
    return attngen.parse(f"attention {name} {{\n head_dim {d}\n dtype {dtype}\n mask {mask}\n}}\n")[0]


def parts(kernel, q, k, v, descales: dict):
    """(whole call, _prepare_v alone, attention alone, the output) of an FP8 kernel as prepared
    launches: CudaKernel.prepared's recipe, its launches taken one by one (a timing probe's view)."""
    import cupy
    ints = {"kv_lens": None, "cu_seqlens_q": None, "cu_seqlens_k": None, "block_table": None}
    result, recipe, ptrs, held = kernel._call(q, k, v, None, None, False, None, None, False, ints, None, None,
                                              dict(descales))
    driver, stream = cupy.cuda.driver, recipe.stream()
    prepare, main = recipe.launches

    def run(*launches):
        def go():
            for p in launches:
                p.launch(driver, ptrs, stream)
            _keep = (q, k, v, held, descales)  # noqa: F841 - the buffers the launches use
        return go
    return run(prepare, main), run(prepare), run(main), result


def cudnn_fp8(q8, k8, v8, d: int, causal: bool):
    """cuDNN's FP8 SDPA on (B, L, H, D) e4m3 tensors (descales 1): a function that runs it, or the
    reason it cannot run here."""
    try:
        import cudnn
    except ImportError as e:
        return f"no cudnn frontend ({e}): pip install nvidia-cudnn-frontend"
    b, length, h, _ = q8.shape
    try:
        handle = cudnn.create_handle()
        cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
        e4m3, f32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
        graph = cudnn.pygraph(io_data_type=e4m3, intermediate_data_type=f32, compute_data_type=f32, handle=handle)
        dims, strides = (b, h, length, d), (length * h * d, d, h * d, 1)  # (B, H, L, D) views of (B, L, H, D)
        tq, tk, tv = (graph.tensor(name=n, dim=dims, stride=strides, data_type=e4m3) for n in ("q", "k", "v"))
        one = dict(dim=(1, 1, 1, 1), stride=(1, 1, 1, 1), data_type=f32)
        scalars = [graph.tensor(name=n, **one) for n in ("descale_q", "descale_k", "descale_v", "descale_s",
                                                            "scale_s", "scale_o")]
        o, _, amax_s, amax_o = graph.sdpa_fp8(q=tq, k=tk, v=tv, descale_q=scalars[0], descale_k=scalars[1],
                                              descale_v=scalars[2], descale_s=scalars[3], scale_s=scalars[4],
                                              scale_o=scalars[5], is_inference=True, attn_scale=1.0 / math.sqrt(d),
                                              use_causal_mask=causal, name="sdpa_fp8")
        out = torch.empty_like(q8)
        o.set_output(True).set_dim(dims).set_stride(strides).set_data_type(e4m3)
        amax = [torch.empty((1, 1, 1, 1), dtype=torch.float32, device="cuda") for _ in range(2)]
        for t in (amax_s, amax_o):
            t.set_output(True).set_dim((1, 1, 1, 1)).set_stride((1, 1, 1, 1)).set_data_type(f32)
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        graph.check_support()
        graph.build_plans()
        ones = [torch.ones((1, 1, 1, 1), dtype=torch.float32, device="cuda") for _ in scalars]
        pack = {tq: q8, tk: k8, tv: v8, o: out, amax_s: amax[0], amax_o: amax[1], **dict(zip(scalars, ones))}
        workspace = torch.empty(graph.get_workspace_size(), dtype=torch.uint8, device="cuda")
        graph.execute(pack, workspace, handle=handle)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - any refusal of the library is the row's note
        return f"cuDNN FP8 SDPA: {type(e).__name__}: {str(e)[:200]}"
    return lambda: graph.execute(pack, workspace, handle=handle)


def measure(d: int, length: int, mask: str, profile=None) -> dict:
    """One case's row (module docstring); `profile`: the FP8 kernel's (None: this GPU's, as attngen.compile
    takes it; a probe's A/B passes one with tile-table overrides)."""
    b, h = TOKENS // length, WIDTH // d
    causal = mask == "causal"
    flops = 4.0 * b * h * length * length * d * (0.5 if causal else 1.0)
    case = f"e4m3 d{d} L{length} {'causal' if causal else 'full'}"
    g = torch.Generator(device="cuda").manual_seed(d + length)
    x = [torch.randn((b, length, h, d), device="cuda", generator=g) for _ in range(3)]
    q8, k8, v8 = (t.to(torch.float8_e4m3fn) for t in x)
    ones = torch.ones((b, h), dtype=torch.float32, device="cuda")
    descales = {"q_descale": ones, "k_descale": ones, "v_descale": ones}
    fp8 = attngen.compile(_spec("e4m3 out=bf16", d, mask), target="cuda", profile=profile)
    f16 = attngen.compile(_spec("f16", d, mask), target="cuda")
    whole, prepare, main, out = parts(fp8, q8, k8, v8, descales)
    whole()
    q16, k16, v16 = (t.to(torch.float16) for t in (q8, k8, v8))  # the same values
    ref = f16(q16, k16, v16)
    row = {"case": case, "plan": fp8.plan.summary(), "flops": flops, "rel_err": rel_err(out, ref)}
    row["attngen_ms"] = bench_ms(whole)
    row["prepare_v_ms"] = bench_ms(prepare)
    row["attention_ms"] = bench_ms(main)
    row["attngen_f16_ms"] = bench_ms(lambda: f16(q16, k16, v16))
    peer = cudnn_fp8(q8, k8, v8, d, causal)
    if callable(peer):
        row["cudnn_fp8_ms"] = bench_ms(peer)
    else:
        row["cudnn_fp8_note"] = peer
    for key in ("attngen", "attention", "attngen_f16", "cudnn_fp8"):
        if row.get(f"{key}_ms"):
            row[f"{key}_tflops"] = flops / row[f"{key}_ms"] / 1e9
    return row


def section(rows, dims=(64, 128, 256), lengths=(4096, 16384), masks=("none", "causal"), profile=None):
    """run_gpu.py's `fp8` section: every case into `rows`, each printed as it comes (`profile`: measure's)."""
    for d in dims:
        for length in lengths:
            for mask in masks:
                try:
                    row = measure(d, length, mask, profile)
                except Exception as e:  # noqa: BLE001 - report, keep the other cases
                    row = {"case": f"e4m3 d{d} L{length} {'causal' if mask == 'causal' else 'full'}",
                           "error": f"{type(e).__name__}: {str(e)[:300]}"}
                rows.append(row)
                print(line(row), flush=True)
                torch.cuda.empty_cache()


def _t(row, key) -> str:
    v = row.get(f"{key}_tflops")
    return "n/a" if v is None else f"{v:.0f}"


def line(row) -> str:
    if "error" in row:
        return f"{row['case']}: failed: {row['error']}"
    cud, f16 = row.get("cudnn_fp8_tflops"), row.get("attngen_f16_tflops")
    return (f"{row['case']:<24} attngen FP8 {_t(row, 'attngen'):>5} TFLOP/s ({row['attngen_ms']:.3f} ms: prepare_v "
            f"{row['prepare_v_ms']:.3f} + attention {row['attention_ms']:.3f}, {_t(row, 'attention')} alone)  f16 "
            f"{_t(row, 'attngen_f16')} ({row['attngen_tflops'] / f16:.2f}x)  cuDNN FP8 {_t(row, 'cudnn_fp8')}"
            + (f" ({row['attngen_tflops'] / cud:.2f}x)" if cud else f" [{row.get('cudnn_fp8_note', '')}]")
            + f"  rel. err vs f16 {row['rel_err']:.1e}")


def latest_rows(rows) -> list:
    """benchmarks/results/latest.json's rows: {suite "fp8", case, attngen {ms, tflops}, peers
    {cudnn_fp8}}, with the f16 kernel and the two launches beside them."""
    out = []
    for r in rows:
        if "error" in r:
            out.append({"suite": "fp8", "case": r["case"], "target": "cuda", "error": r["error"]})
            continue
        peers = {"cudnn_fp8": {"ms": r["cudnn_fp8_ms"], "tflops": r["cudnn_fp8_tflops"]}} if r.get("cudnn_fp8_ms") else {}
        out.append({"suite": "fp8", "case": r["case"], "target": "cuda", "plan": r["plan"], "rel_err": r["rel_err"],
                    "attngen": {"ms": r["attngen_ms"], "tflops": r["attngen_tflops"]}, "peers": peers,
                    "attngen_f16": {"ms": r["attngen_f16_ms"], "tflops": r["attngen_f16_tflops"]},
                    "prepare_v_ms": r["prepare_v_ms"], "attention_ms": r["attention_ms"],
                    **({"cudnn_fp8_note": r["cudnn_fp8_note"]} if r.get("cudnn_fp8_note") else {})})
    return out


def markdown(rows) -> str:
    lines = ["", "FP8 prefill (e4m3 in, bf16 out; B L = 16384, H D = 2048; TFLOP/s = 4 B H L^2 D, halved for causal):",
             "", "| case | attngen FP8 | prepare_v ms | attention alone | attngen f16 | FP8 / f16 | cuDNN FP8 | "
                 "attngen / cuDNN | rel. err vs f16 |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['case']} | failed: {r['error'][:80]} | | | | | | | |")
            continue
        cud = r.get("cudnn_fp8_tflops")
        vs_cudnn = f"{r['attngen_tflops'] / cud:.2f}x" if cud else "n/a"
        lines.append(f"| {r['case']} | {_t(r, 'attngen')} | {r['prepare_v_ms']:.3f} | {_t(r, 'attention')} | "
                     f"{_t(r, 'attngen_f16')} | {r['attngen_tflops'] / r['attngen_f16_tflops']:.2f}x | "
                     f"{_t(r, 'cudnn_fp8')} | {vs_cudnn} | {r['rel_err']:.1e} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--lengths", default="4096,16384")
    ap.add_argument("--masks", default="none,causal")
    a = ap.parse_args()
    rows = []
    section(rows, tuple(int(x) for x in a.dims.split(",")), tuple(int(x) for x in a.lengths.split(",")),
            tuple(a.masks.split(",")))
    print(markdown(rows))


if __name__ == "__main__":
    main()
