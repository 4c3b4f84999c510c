"""Quantized KV caches on the WGSL target (issue 44), old kernel against the decode kernel: the decode
row of the issue (B8, 32 query heads / 8 KV heads, d128, one query row per sequence, split_kv(auto))
with f16, i8, e4m3 and e5m2 caches, contiguous and paged (page 16, pages in order), Lk 4096 and
32768, on the live adapter (the H100's / H200's Vulkan: issue 44's must is the i8 cache at >= 1.5x
its own f16 cache's tokens per second).

    python3 benchmarks/probes/probe_wgsl_kvq.py [--lengths 4096,32768] [--kv f16,i8,e4m3,e5m2]
        [--layouts contiguous,paged] [--kernels old,decode] [--schedule 'split_kv(auto)'] [--no-host] [--no-sweep]
        [--budget 85]

Kernels: `old` is the register-tiled split_kv kernel (target wgsl { decode=off }), `decode` the decode
kernel (decode=on; docs/wgsl-variants.md "The decode kernel"). Every cache is resident (WgslTensor:
uploaded once per length and kv dtype, the paged layout a view of the same bytes; q too, and the
output stays on the GPU), so a timed call uploads only its uniforms and integer inputs. Time: GPU
time from timestamp queries around the dispatches (gpu_timer, short calls repeated back to back in
one submission; median of 5 after a warm-up); tokens per second = B / time; GB/s = the cache's bytes
(K and V, and the i8 scales) / time; "vs f16" = tokens per second over the same kernel's f16 cache
at the same layout and length. At the first length every output is checked against the float64
reference fed the same stored values (relative error, "rel err"). Kernels are compiled on first use
(the row's note says how long it took); no row starts after --budget seconds (85).

Then (unless --no-host) the old kernel with host numpy caches, f16 and i8 contiguous, beside its
resident time: whether the per-call upload of a host cache shows in the GPU time (it should not:
the uploads are not in the timed passes). Then (unless --no-sweep, and only while the run is under
--budget seconds) the decode kernel's variants at the last length, contiguous f16 and i8: keys per team
and step (tile table decode_keys), invocations per workgroup (decode_workgroup), split_kv(16), and for i8
unpack4xI8 instead of the integer decode (decode_i8_unpack); or --variants' list. Random
stored bytes stand in for real caches (f16 in +-[0.5, 2), i8 any byte, FP8 without NaN or inf codes):
the cost of a kernel does not depend on the values. It changes nothing in attngen.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import numpy as np

import attngen
from attngen.backends import wgsl
from attngen.backends.wgsl import WgslTensor
from attngen.backends.wgsl.launch import gpu_timer, timed_repeats
from attngen.reference import reference, relative_error

B, HQ, HKV, D, PAGE = 8, 32, 8, 128, 16
START = time.perf_counter()


def spec_for(kv: str, layout: str, schedule: str, kernel: str):
    lines = [f"head_dim {D}", f"heads q={HQ} kv={HKV}", "dtype f16", f"schedule {schedule}",
             f"target wgsl {{ decode={'on' if kernel == 'decode' else 'off'} }}"]
    if layout == "paged":
        lines.append(f"kv_cache paged(page={PAGE})")
    if kv != "f16":
        lines.append(f"kv_dtype {kv}")
    return attngen.parse(f"attention kvq_{kv}_{layout}_{kernel} {{\n" + "\n".join(lines) + "\n}\n")[0]


def stored(kv: str, lk: int, rng) -> tuple:
    """(k, v, scales) on the host: random stored values of a (B, lk, Hkv, D) cache, made fast."""
    n = B * lk * HKV * D
    shape = (B, lk, HKV, D)
    out = []
    for _ in "kv":
        if kv == "f16":  # sign, exponent 14 or 15 (0.5 .. 2), any mantissa
            bits = np.frombuffer(rng.bytes(2 * n), np.uint16)
            out.append(((bits & 0x87FF) | 0x3800).view(np.float16).reshape(shape))
        elif kv == "i8":
            out.append(np.frombuffer(rng.bytes(n), np.int8).reshape(shape))
        else:  # FP8 bytes with the exponent's top bit clear: no NaN, no inf
            out.append((np.frombuffer(rng.bytes(n), np.uint8) & 0xBF).reshape(shape))
    if kv == "f16":
        return out[0], out[1], {}
    if kv == "i8":
        sc = [rng.uniform(0.005, 0.02, (B, lk, HKV, D // 32)).astype(np.float32) for _ in "kv"]
    else:
        sc = [rng.uniform(0.2, 0.5, (B, HKV)).astype(np.float32) for _ in "kv"]
    return out[0], out[1], {"k_scale": sc[0], "v_scale": sc[1]}


def cache_bytes(kv: str, lk: int) -> int:
    """Bytes a call reads of the cache: K and V (and the i8 scales)."""
    values = 2 * B * lk * HKV * D
    return values * (2 if kv == "f16" else 1) + (values // 32 * 4 if kv == "i8" else 0)


def layout_args(layout: str, lk: int, k: WgslTensor, v: WgslTensor, scales: dict, kv: str):
    """(k, v, options) of a layout: paged = the same buffers viewed as pages in order."""
    opts = {"kv_lens": np.full(B, lk, np.int32)}
    if layout == "paged":
        pages = B * lk // PAGE
        k, v = (WgslTensor(x.buffer, (pages, PAGE, HKV, D), x.dtype) for x in (k, v))
        if kv == "i8":
            scales = {n: WgslTensor(s.buffer, (pages, PAGE, HKV, D // 32), "f32") for n, s in scales.items()}
        opts["block_table"] = np.arange(pages, dtype=np.int32).reshape(B, lk // PAGE)
    return k, v, {**opts, **scales}


def gpu_ms(kernel, q, k, v, opts, repeat=5) -> float:
    def call():
        kernel(q, k, v, **opts)
    call()
    with gpu_timer(kernel, repeat=timed_repeats(kernel, call)) as times:
        per_call = []
        for _ in range(repeat):
            if times is None:  # no timestamp queries (a software adapter): wall time, a smoke run only
                t0 = time.perf_counter()
                call()
                per_call.append((time.perf_counter() - t0) * 1e3)
            else:
                times.clear()
                call()
                per_call.append(sum(times))
    return statistics.median(per_call)


def row(kernel_name, layout, lk, kv, ms, base, err="", note=""):
    tps = B / (ms / 1e3)
    gbs = cache_bytes(kv, lk) / (ms / 1e3) / 1e9
    ratio = f"{tps / base:.2f}x" if base else "-"
    print(f"{kernel_name:<7} {layout:<11} {lk:>6} {kv:<5} {ms:>8.3f} {tps:>9.0f} {gbs:>8.1f} {ratio:>7} {err:>9}  {note}",
          flush=True)
    return tps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="4096,32768")
    ap.add_argument("--kv", default="f16,i8,e4m3,e5m2")
    ap.add_argument("--layouts", default="contiguous,paged")
    ap.add_argument("--kernels", default="old,decode")
    ap.add_argument("--schedule", default="split_kv(auto)")
    ap.add_argument("--no-host", action="store_true", help="leave out the old kernel with host caches")
    ap.add_argument("--no-sweep", action="store_true", help="leave out the decode kernel's variants")
    ap.add_argument("--variants", default="",
                    help="the sweep's variants instead of the built-in list: 'KV: NAME=VALUE ...; ...', e.g. "
                         "'i8: decode_i8_unpack=true decode_keys=8; f16: decode_workgroup=256' (tile-table overrides)")
    ap.add_argument("--budget", type=float, default=85.0, help="seconds after which no further row starts")
    args = ap.parse_args()
    print(wgsl.devices.device_state().description())
    lengths = [int(x) for x in args.lengths.split(",")]
    kvs, layouts, kernels = args.kv.split(","), args.layouts.split(","), args.kernels.split(",")
    compiled = {}

    def kernel_of(kv, layout, name):
        """The kernel, compiled on first use (its compile time in the row's note)."""
        if (kv, layout, name) not in compiled:
            t0 = time.perf_counter()
            kernel = attngen.compile(spec_for(kv, layout, args.schedule, name), target="wgsl")
            compiled[kv, layout, name] = kernel, f"compiled in {time.perf_counter() - t0:.1f} s"
            return compiled[kv, layout, name]
        return compiled[kv, layout, name][0], ""

    for name in kernels:
        print(f"  {name}: {kernel_of(kvs[0], layouts[0], name)[0].plan.summary()}")
    print(f"{'kernel':<7} {'layout':<11} {'Lk':>6} {'kv':<5} {'ms':>8} {'tok/s':>9} {'GB/s':>8} {'vs f16':>7} {'rel err':>9}")
    rng = np.random.default_rng(44)
    q_host = rng.standard_normal((B, 1, HQ, D)).astype(np.float16)
    q = WgslTensor.from_numpy(q_host)
    host_ms = {}
    sweep = not args.no_sweep and "decode" in kernels
    kept = {}  # the last length's contiguous f16 and i8 caches, for the sweep
    for lk in lengths:
        base = {}
        for kv in kvs:
            k_host, v_host, sc_host = stored(kv, lk, rng)
            k, v = WgslTensor.from_numpy(k_host), WgslTensor.from_numpy(v_host)
            scales = {n: WgslTensor.from_numpy(x) for n, x in sc_host.items()}
            ref = None
            if lk == lengths[0]:
                ref = reference(spec_for(kv, "contiguous", args.schedule, "old"), q_host, k_host, v_host,
                                kv_lens=np.full(B, lk, np.int32), **sc_host)
            for layout in layouts:
                kk, vv, opts = layout_args(layout, lk, k, v, scales, kv)
                for name in kernels:
                    if time.perf_counter() - START > args.budget:
                        print(f"(stopped at {args.budget:.0f} s: --budget)")
                        return
                    kernel, note = kernel_of(kv, layout, name)
                    try:
                        ms = gpu_ms(kernel, q, kk, vv, opts)
                    except attngen.LaunchError as e:
                        print(f"{name:<7} {layout:<11} {lk:>6} {kv:<5} {str(e).splitlines()[0][:100]}")
                        continue
                    err = "" if ref is None else f"{relative_error(kernel(q, kk, vv, **opts).numpy(), ref):.2e}"
                    tps = row(name, layout, lk, kv, ms, base.get((layout, name)), err, note)
                    if kv == "f16":
                        base[layout, name] = tps
                    if layout == "contiguous" and name == "old":
                        host_ms[kv, lk] = ms
            if not args.no_host and "old" in kernels and "contiguous" in layouts and kv in ("f16", "i8"):
                kernel = kernel_of(kv, "contiguous", "old")[0]
                opts = {"kv_lens": np.full(B, lk, np.int32), **sc_host}
                ms = gpu_ms(kernel, q_host, k_host, v_host, opts)
                row("old", "host", lk, kv, ms, None, note=f"host numpy caches, uploaded by each call "
                    f"(resident: {host_ms.get((kv, lk), float('nan')):.3f} ms)")
            if sweep and lk == lengths[-1] and kv in ("f16", "i8"):
                kept[kv] = (k, v, scales)
            del k, v, scales, k_host, v_host
            gc.collect()
    if not sweep:
        return
    lk = lengths[-1]
    variants = [({"decode_keys": 2}, args.schedule), ({"decode_keys": 8}, args.schedule),
                ({"decode_workgroup": 256}, args.schedule), ({"decode_workgroup": 64}, args.schedule),
                ({}, "split_kv(16)"), ({"decode_keys": 8}, "split_kv(16)")]
    print(f"decode kernel variants at Lk {lk}, contiguous (tile-table overrides of the live profile):")
    live = wgsl.adapter_profile()
    given = [part.split(":", 1) for part in args.variants.split(";") if part.strip()]
    for kv, (k, v, scales) in kept.items():
        opts = {"kv_lens": np.full(B, lk, np.int32), **scales}
        mine = variants + ([({"decode_i8_unpack": True}, args.schedule)] if kv == "i8" else [])
        if given:
            value = (lambda x: x == "true" if x in ("true", "false") else int(x))  # bool fields take true / false
            mine = [({n: value(x) for n, x in (w.split("=") for w in rest.split())}, args.schedule)
                    for name, rest in given if name.strip() == kv]
        for overrides, schedule in mine:
            if time.perf_counter() - START > args.budget:
                print(f"  (the rest left out: the run is past {args.budget:.0f} s)")
                return
            kernel = attngen.compile(spec_for(kv, "contiguous", schedule, "decode"), target="wgsl",
                                     profile=live.with_overrides(**overrides) if overrides else None)
            ms = gpu_ms(kernel, q, k, v, opts)
            label = ", ".join(f"{n}={x}" for n, x in overrides.items()) or "defaults"
            row("decode", "contiguous", lk, kv, ms, None, note=f"{label}, {schedule}: {kernel.plan.summary()}")
    print(f"done in {time.perf_counter() - START:.1f} s")


if __name__ == "__main__":
    main()
