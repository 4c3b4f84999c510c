"""Quantized KV caches on the WGSL target (issue 44): the decode row of the issue (B8, 32 query heads
/ 8 KV heads, d128, one query row per sequence) with an i8 and an e4m3 cache beside the f16 cache,
contiguous and paged (page 16), on the live adapter (the H100's Vulkan: issue 44's must is the i8
cache at >= 1.5x its own f16 cache's tokens per second).

    python3 benchmarks/probes/probe_wgsl_kvq.py [--lengths 4096,32768] [--kv f16,i8,e4m3]
                                                [--layouts contiguous,paged] [--schedule 'split_kv(auto)']

Each kernel is timed as `attngen tune` times WGSL (GPU time from timestamp queries around the
dispatches, so the per-call upload of a host cache is not counted; median of 5 after warm-up; an
adapter without timestamp queries, as lavapipe, gets wall time with the uploads: a smoke run only);
tokens per second = B / time; the ratio is against the f16 cache of the same layout and length.
At the first length each output is checked against the float64 reference fed the same stored
values (relative error). A row whose buffers pass the adapter's binding limit prints its
LaunchError. It changes nothing in attngen.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import attngen
from attngen.backends import wgsl
from attngen.backends.wgsl.launch import gpu_timer, timed_repeats
from attngen.reference import reference, relative_error

B, HQ, HKV, D, PAGE = 8, 32, 8, 128, 16


def spec_for(kv: str, layout: str, schedule: str):
    lines = [f"head_dim {D}", f"heads q={HQ} kv={HKV}", "dtype f16", f"schedule {schedule}"]
    if layout == "paged":
        lines.append(f"kv_cache paged(page={PAGE})")
    if kv != "f16":
        lines.append(f"kv_dtype {kv}")
    return attngen.parse(f"attention kvq_{kv}_{layout} {{\n" + "\n".join(lines) + "\n}\n")[0]


def inputs(kv: str, layout: str, lk: int, rng):
    """(q, k, v, call options): a cache of lk keys per sequence, paged in order when paged."""
    q = rng.standard_normal((B, 1, HQ, D)).astype(np.float16)
    opts = {"kv_lens": np.full(B, lk, np.int32)}
    caches = []
    for _ in "kv":
        x = rng.standard_normal((B, lk, HKV, D)).astype(np.float32)
        if kv == "f16":
            stored, scale = x.astype(np.float16), None
        else:
            stored, scale = attngen.quantize_kv(x, kv)
        if layout == "paged":  # sequence b's pages are b * lk / PAGE ... in order
            stored = stored.reshape(B * lk // PAGE, PAGE, HKV, D)
            if scale is not None and kv == "i8":
                scale = scale.reshape(B * lk // PAGE, PAGE, HKV, D // 32)
        caches.append((stored, scale))
    if layout == "paged":
        opts["block_table"] = np.arange(B * lk // PAGE, dtype=np.int32).reshape(B, lk // PAGE)
    (k, ks), (v, vs) = caches
    if kv != "f16":
        opts.update(k_scale=ks, v_scale=vs)
    return q, k, v, opts


def gpu_ms(kernel, q, k, v, opts, repeat=5) -> float:
    def call():
        kernel(q, k, v, **opts)
    call()
    with gpu_timer(kernel, repeat=timed_repeats(kernel, call)) as times:
        if times is None:  # (a software adapter: wall time, uploads included; a smoke run, not a result)
            per_call = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                call()
                per_call.append((time.perf_counter() - t0) * 1e3)
            return statistics.median(per_call)
        per_call = []
        for _ in range(repeat):
            times.clear()
            call()
            per_call.append(sum(times))
    return statistics.median(per_call)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="4096,32768")
    ap.add_argument("--kv", default="f16,i8,e4m3")
    ap.add_argument("--layouts", default="contiguous,paged")
    ap.add_argument("--schedule", default="split_kv(auto)")
    args = ap.parse_args()
    print(wgsl.devices.device_state().description())
    lengths = [int(x) for x in args.lengths.split(",")]
    print(f"{'layout':<11} {'Lk':>6} {'kv':<5} {'ms':>8} {'tok/s':>10} {'vs f16':>7} {'rel err':>9}")
    for layout in args.layouts.split(","):
        for lk in lengths:
            base = None
            for kv in args.kv.split(","):
                spec = spec_for(kv, layout, args.schedule)
                rng = np.random.default_rng(lk)
                q, k, v, opts = inputs(kv, layout, lk, rng)
                try:
                    kernel = attngen.compile(spec, target="wgsl")
                    ms = gpu_ms(kernel, q, k, v, opts)
                except (attngen.LaunchError, attngen.SpecError) as e:
                    print(f"{layout:<11} {lk:>6} {kv:<5} {str(e).splitlines()[0][:100]}")
                    continue
                err = ""
                if lk == lengths[0]:
                    err = f"{relative_error(kernel(q, k, v, **opts), reference(spec, q, k, v, **opts)):.2e}"
                tps = B / (ms / 1e3)
                base = tps if kv == "f16" else base
                ratio = f"{tps / base:.2f}x" if base else "-"
                print(f"{layout:<11} {lk:>6} {kv:<5} {ms:>8.3f} {tps:>10.0f} {ratio:>7} {err:>9}", flush=True)


if __name__ == "__main__":
    main()
