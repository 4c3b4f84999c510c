"""`attngen run`: random inputs on this machine's device, the kernel against the reference,
and the time it took.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from .errors import LaunchError
from .reference import reference, relative_error, to_numpy, tolerance

_NP = {"f16": np.float16, "f32": np.float32}


def visible_pairs(spec, len_q: int, len_k: int) -> int:
    """How many (query, key) pairs the mask lets through (the work that counts as FLOPs).

    Each row sees one interval of keys, so this is a sum over rows, in chunks (no Lq x Lk array).
    """
    m = spec.mask
    if m.kind in ("none", "custom"):
        return len_q * len_k
    off = len_k - len_q
    total = 0
    for r0 in range(0, len_q, 1 << 20):
        i = np.arange(r0, min(len_q, r0 + (1 << 20)), dtype=np.int64)
        if m.kind == "causal":
            lo, hi = np.zeros_like(i), i + (off if m.bottom_right else 0)
        else:
            lo, hi = i + off - m.left, i + off + m.right
        lo, hi = np.maximum(lo, 0), np.minimum(hi, len_k - 1)
        total += int(np.maximum(hi - lo + 1, 0).sum())
    return total


# Inputs are drawn on the host in float32 first; refuse shapes that would not fit there.
MAX_HOST_INPUT_BYTES = 32 << 30


def _inputs(spec, target, shape, seed):
    rng = np.random.default_rng(seed)
    b, lq, lk, hq, hkv = shape["B"], shape["Lq"], shape["Lk"], shape["Hq"], shape["Hkv"]
    need = 4 * b * (lq * hq * spec.head_dim_qk + lk * hkv * (spec.head_dim_qk + spec.head_dim_v))
    if need > MAX_HOST_INPUT_BYTES:
        raise LaunchError(f"random inputs for B={b} Lq={lq} Lk={lk} Hq={hq} Hkv={hkv} would take "
                          f"{need / 2**30:.1f} GiB of host memory (attngen run draws them on the host; "
                          f"at most {MAX_HOST_INPUT_BYTES >> 30} GiB)")
    host = (
        rng.standard_normal((b, lq, hq, spec.head_dim_qk), dtype=np.float32),
        rng.standard_normal((b, lk, hkv, spec.head_dim_qk), dtype=np.float32),
        rng.standard_normal((b, lk, hkv, spec.head_dim_v), dtype=np.float32),
    )
    k, v, opts = runtime_inputs(spec, *host, rng)
    host = (host[0], k, v)
    if target == "wgsl":
        return host, tuple(a.astype(_NP[spec.dtype]) for a in host), opts
    if "mask" in opts:
        import cupy
        opts = {**opts, "mask": cupy.asarray(opts["mask"])}
    if spec.dtype == "bf16":
        try:
            import torch
        except ImportError:
            raise LaunchError("bf16 inputs on the cuda target are made with PyTorch, which is not "
                              "installed") from None
        return host, tuple(torch.from_numpy(a).cuda().to(torch.bfloat16) for a in host), opts
    import cupy
    return host, tuple(cupy.asarray(a.astype(_NP[spec.dtype])) for a in host), opts


def runtime_inputs(spec, q, k, v, rng):
    """(k, v, options) for specs that need run-time inputs, on the host: a custom mask (three
    documents with random holes, so tiles are empty, full and partial) or a paged cache (the
    contiguous k, v scattered over shuffled pages, with block_table and kv_lens). The same
    options serve the kernel and attngen.reference; other specs get k, v and no options."""
    opts = {}
    b, lq = q.shape[:2]
    lk = k.shape[1]
    if spec.mask.kind == "custom":
        docs = 3
        same = (np.arange(lq)[:, None] * docs // lq) == (np.arange(lk)[None, :] * docs // lk)
        opts["mask"] = same & (rng.random((b, 1, lq, lk)) < 0.9)
    if spec.kv_cache.kind == "paged":
        page = spec.kv_cache.page
        per = -(-lk // page)
        table = rng.permutation(b * per + 1)[: b * per].reshape(b, per).astype(np.int32)
        kc = rng.standard_normal((b * per + 1, page) + k.shape[2:]).astype(np.float32)
        vc = rng.standard_normal((b * per + 1, page) + v.shape[2:]).astype(np.float32)
        pos = np.arange(lk)
        for bi in range(b):
            kc[table[bi, pos // page], pos % page] = k[bi]
            vc[table[bi, pos // page], pos % page] = v[bi]
        k, v = kc, vc
        opts.update(kv_lens=np.full(b, lk, np.int32), block_table=table)
    return k, v, opts


def _time_cuda(kernel, args, opts, repeat) -> float:
    import cupy
    kernel(*args, **opts)  # warm-up (module load)
    times = []
    for _ in range(repeat):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        kernel(*args, **opts)
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop))
    return statistics.median(times)


def _time_wall(kernel, args, opts, repeat) -> float:
    kernel(*args, **opts)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        kernel(*args, **opts)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _compile(spec, target, profile):
    from .api import compile as compile_kernel
    try:
        return compile_kernel(spec, target=target, profile=profile)
    except (ImportError, RuntimeError, OSError) as e:
        what = "CUDA GPU (with CuPy)" if target == "cuda" else "wgpu adapter"
        raise LaunchError(f"no usable {what} on this machine: {type(e).__name__}: {e}") from None


def run_shapes(spec, target, profile, shapes, *, repeat=10, seed=0, use_reference=True, echo=print) -> bool:
    """Run every shape; print one line each; True when all are within tolerance."""
    kernel = _compile(spec, target, profile)
    bound = tolerance(spec)
    timing = "GPU time (events)" if target == "cuda" else "wall time, uploads and read-back included"
    echo(f"{spec.name} on {target} ({kernel.plan.profile}): {kernel.plan.summary()}")
    echo(f"{'B':>4} {'Lq':>7} {'Lk':>7} {'Hq':>4} {'Hkv':>4}  {'rel. error':>10}  {'ms':>9}  {'TFLOP/s':>8}  result")
    all_ok = True
    for i, shape in enumerate(shapes):
        host, args, opts = _inputs(spec, target, shape, seed + i)
        timer = _time_cuda if target == "cuda" else _time_wall
        ms = timer(kernel, args, opts, repeat)
        flops = 2.0 * shape["B"] * shape["Hq"] * visible_pairs(spec, shape["Lq"], shape["Lk"]) * \
            (spec.head_dim_qk + spec.head_dim_v)
        tflops = flops / (ms * 1e-3) / 1e12 if ms > 0 else float("nan")
        if use_reference:
            out = to_numpy(kernel(*args, **opts))
            ref_opts = {n: to_numpy(x) for n, x in opts.items()}
            err = relative_error(out, reference(spec, *host, **ref_opts))
            ok = err <= bound
            verdict = "ok" if ok else f"FAIL (tolerance {bound:g})"
            err_text = f"{err:10.2e}"
        else:
            ok, verdict, err_text = True, "not checked", f"{'-':>10}"
        all_ok &= ok
        echo(f"{shape['B']:>4} {shape['Lq']:>7} {shape['Lk']:>7} {shape['Hq']:>4} {shape['Hkv']:>4}  "
             f"{err_text}  {ms:9.3f}  {tflops:8.2f}  {verdict}")
    echo(f"times: median of {repeat} runs after a warm-up; {timing}; tolerance {bound:g} "
         "(relative L2 vs float64)")
    return all_ok
