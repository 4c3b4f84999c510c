"""`attngen run`: random inputs on this machine's device, the kernel against the reference,
and the time it took. The target's backend, handed in, puts the inputs on its device and times
the calls; nothing here knows a target.
"""

from __future__ import annotations

import numpy as np

from ..errors import LaunchError
from ..plan.masks import visible_pairs
from ..reference import reference, relative_error, to_numpy, tolerance


# Inputs are drawn on the host in float32 first; refuse shapes that would not fit there.
MAX_HOST_INPUT_BYTES = 32 << 30


def _label(shape) -> str:
    return f"B={shape['B']} Lq={shape['Lq']} Lk={shape['Lk']} Hq={shape['Hq']} Hkv={shape['Hkv']}"


def _pages(spec, lk: int) -> int:
    """Pages of one sequence of a paged cache (runtime_inputs: the cache has B of them + 1)."""
    return -(-lk // spec.kv_cache.page)


def call_shapes(spec, shape) -> dict:
    """{name: shape} of the tensors `attngen run` hands the kernel for one --shape: q, k, v (a
    paged cache's pages for k and v, as runtime_inputs makes them)."""
    b, lq, lk, hq, hkv = shape["B"], shape["Lq"], shape["Lk"], shape["Hq"], shape["Hkv"]
    dqk, dv = spec.head_dim_qk, spec.head_dim_v
    rows = (b * _pages(spec, lk) + 1, spec.kv_cache.page) if spec.kv_cache.is_paged else (b, lk)
    return {"q": (b, lq, hq, dqk), "k": rows + (hkv, dqk), "v": rows + (hkv, dv)}


def _host_bytes(spec, shape) -> int:
    """Host bytes draw_inputs takes: float32 q, k, v; a paged cache's float32 pages; a custom
    mask's float64 draws and its booleans."""
    b, lq, lk, hq, hkv = shape["B"], shape["Lq"], shape["Lk"], shape["Hq"], shape["Hkv"]
    dqk, dv = spec.head_dim_qk, spec.head_dim_v
    need = 4 * b * (lq * hq * dqk + lk * hkv * (dqk + dv))
    if spec.kv_cache.is_paged:
        need += 4 * (b * _pages(spec, lk) + 1) * spec.kv_cache.page * hkv * (dqk + dv)
    if spec.mask.is_custom:
        need += 9 * b * lq * lk
    return need


def _check_host(spec, shape) -> None:
    need = _host_bytes(spec, shape)
    if need > MAX_HOST_INPUT_BYTES:
        raise LaunchError(f"random inputs for {_label(shape)} would take {need / 2**30:.1f} GiB of host memory "
                          f"(attngen run draws them on the host; at most {MAX_HOST_INPUT_BYTES >> 30} GiB)")


def check_shape(kernel, backend, shape) -> None:
    """A LaunchError, before anything is allocated, when the inputs of `shape` would not fit: on
    the host (MAX_HOST_INPUT_BYTES), or in a call of the kernel, by the rules the call itself
    applies (attngen.runtime.launch.resolve: lengths, batch and heads against attngen.limits;
    then the target's grids and buffer sizes, backend.check_sizes). A KV-split schedule's
    workspaces are counted with the splits the call would use: split_kv(N)'s N, and for
    split_kv(auto) and two_pass those of the kernel's device (Kernel.compute_units)."""
    from ..lang.spec import DTYPE_BYTES
    from ..runtime.launch import on_device, resolve
    spec = kernel.spec
    _check_host(spec, shape)
    ints = {}
    if spec.kv_cache.is_paged:  # described, not made: their contents are not what is checked here
        b = shape["B"]
        ints = dict(kv_lens=on_device("kv_lens", (b,), "int32", 1),
                    block_table=on_device("block_table", (b, _pages(spec, shape["Lk"])), "int32", 2))
    tensors = call_shapes(spec, shape)
    units = getattr(kernel, "compute_units", lambda: None)()  # a plan without a device (tests): 1
    dtypes = dict.fromkeys(tensors, kernel.plan.dtype)
    if spec.kv_dtype is not None:  # a quantized cache's bytes (issue 44): counted as they are, one each
        from ..runtime.launch import KV_STORED
        dtypes.update(k=KV_STORED[spec.kv_dtype], v=KV_STORED[spec.kv_dtype])
    launch = resolve(kernel.plan, tensors, dtypes, has_mask=spec.mask.is_custom,
                     cores=units if units is not None else 1, **ints)
    size = {n: 1 if n in ("k", "v") and spec.kv_dtype is not None else DTYPE_BYTES[kernel.plan.dtype] for n in tensors}
    nbytes = {n: int(np.prod(dims, dtype=object)) * size[n] for n, dims in tensors.items()}
    mask = ((shape["B"], 1, shape["Lq"], shape["Lk"]), "bool") if spec.mask.is_custom else None  # runtime_inputs'
    backend.check_sizes(kernel, launch, nbytes, mask=mask)


def draw_inputs(spec, backend, shape, seed):
    rng = np.random.default_rng(seed)
    _check_host(spec, shape)
    b, lq, lk, hq, hkv = shape["B"], shape["Lq"], shape["Lk"], shape["Hq"], shape["Hkv"]
    host = (
        rng.standard_normal((b, lq, hq, spec.head_dim_qk), dtype=np.float32),
        rng.standard_normal((b, lk, hkv, spec.head_dim_qk), dtype=np.float32),
        rng.standard_normal((b, lk, hkv, spec.head_dim_v), dtype=np.float32),
    )
    k, v, opts = runtime_inputs(spec, *host, rng)
    q = host[0]
    if spec.is_fp8:  # FP8 prefill (issue 44): q's bytes and descale too (k's and v's: runtime_inputs)
        from ..runtime.fp8 import quantize_fp8
        q, opts["q_descale"] = quantize_fp8(q, spec.dtype, heads_kv=hkv)
    host = (q, k, v)
    args, opts = backend.device_inputs(spec, host, opts)
    return host, args, opts


# A custom mask's documents (blocks on the diagonal) and the chance that a pair inside one is kept.
MASK_DOCUMENTS, MASK_KEEP = 3, 0.9


def runtime_inputs(spec, q, k, v, rng):
    """(k, v, options) for specs that need run-time inputs, on the host: a custom mask (three
    documents with random holes, so tiles are empty, full and partial), a paged cache (the
    contiguous k, v scattered over shuffled pages, with block_table and kv_lens) or expression
    inputs (_random_input). The same
    options serve the kernel and attngen.reference; other specs get k, v and no options.
    made_up says the same in words."""
    opts = {}
    b, lq = q.shape[:2]
    lk = k.shape[1]
    extents = {"b": b, "h": q.shape[2], "hkv": k.shape[2], "q": lq, "k": lk}
    for inp in spec.inputs:  # expression inputs (issue 42): random values of their dtype and shape
        opts[inp.name] = _random_input(inp, extents, rng)
    if spec.is_fp8:  # FP8 prefill (issue 44): the bytes and their descales (attngen.quantize_fp8)
        from ..runtime.fp8 import quantize_fp8
        (k, k_descale), (v, v_descale) = quantize_fp8(k, spec.dtype), quantize_fp8(v, spec.dtype)
        opts.update(k_descale=k_descale, v_descale=v_descale)
    if spec.kv_dtype is not None:  # issue 44: the stored bytes and their scales (attngen.quantize_kv)
        from ..runtime.kvquant import quantize_kv
        (k, k_scale), (v, v_scale) = quantize_kv(k, spec.kv_dtype), quantize_kv(v, spec.kv_dtype)
        opts.update(k_scale=k_scale, v_scale=v_scale)
    if spec.mask.is_custom:
        docs = MASK_DOCUMENTS
        same = (np.arange(lq)[:, None] * docs // lq) == (np.arange(lk)[None, :] * docs // lk)
        opts["mask"] = same & (rng.random((b, 1, lq, lk)) < MASK_KEEP)
    if spec.kv_cache.is_paged:
        page = spec.kv_cache.page
        per = -(-lk // page)
        table = rng.permutation(b * per + 1)[: b * per].reshape(b, per).astype(np.int32)
        kc = rng.standard_normal((b * per + 1, page) + k.shape[2:]).astype(k.dtype)
        vc = rng.standard_normal((b * per + 1, page) + v.shape[2:]).astype(v.dtype)
        pos = np.arange(lk)
        for bi in range(b):
            kc[table[bi, pos // page], pos % page] = k[bi]
            vc[table[bi, pos // page], pos % page] = v[bi]
        k, v = kc, vc
        if spec.kv_dtype == "i8":  # its scales travel with their rows (the spare page's: 1)
            for name in ("k_scale", "v_scale"):
                paged = np.ones((b * per + 1, page) + opts[name].shape[2:], np.float32)
                for bi in range(b):
                    paged[table[bi, pos // page], pos % page] = opts[name][bi]
                opts[name] = paged
        opts.update(kv_lens=np.full(b, lk, np.int32), block_table=table)
    return k, v, opts


def _random_input(inp, extents: dict, rng):
    """An expression input of its declared shape and dtype (attngen.runtime.inputs.NUMPY_DTYPES;
    bf16 as float32): reals standard normal / 2, integers uniform in 0 .. max(Lq, Lk), booleans
    true with probability 1/2."""
    from ..runtime.inputs import NUMPY_DTYPES, input_shape
    shape = input_shape(inp, extents)
    if inp.dtype in ("f32", "f16", "bf16"):
        return (rng.standard_normal(shape) / 2).astype(NUMPY_DTYPES.get(inp.dtype, np.float32))
    if inp.dtype == "bool":
        return rng.random(shape) < 0.5
    top = min(max(extents["q"], extents["k"]), 255 if inp.dtype == "u8" else 2**31 - 2)
    return rng.integers(0, top + 1, size=shape).astype(NUMPY_DTYPES[inp.dtype])


def made_up(spec, shape, seed: int) -> list[str]:
    """What draw_inputs makes up for one shape, a line per input, in words (attngen run prints
    them): q, k, v, and where the spec needs them the custom mask, the paged cache's block
    table and kv_lens, and the expression inputs."""
    b, lq, lk = shape["B"], shape["Lq"], shape["Lk"]
    entries = f"{b} batch entr{'y' if b == 1 else 'ies'}"
    lines = [f"q, k, v: standard normal (seed {seed}), stored as {spec.dtype}; {entries}, each one sequence of {lq} "
             f"queries and {lk} keys (no cu_seqlens" + ("" if spec.kv_cache.is_paged else ", no kv_lens") + ")"]
    if spec.is_fp8:
        lines.append(f"q, k, v: then quantized to {spec.dtype} by attngen.quantize_fp8, with q_descale, k_descale and "
                     "v_descale per sequence and KV head (docs/language.md, \"FP8 prefill\")")
    if spec.kv_dtype is not None:
        lines.append(f"k, v: then quantized to kv_dtype {spec.kv_dtype} by attngen.quantize_kv, with k_scale and "
                     "v_scale (docs/language.md, \"Quantized KV caches\")")
    if spec.mask.is_custom:
        docs = MASK_DOCUMENTS
        same = sum(len(range(-(-d * lq // docs), -(-(d + 1) * lq // docs)))
                   * len(range(-(-d * lk // docs), -(-(d + 1) * lk // docs))) for d in range(docs))
        lines.append(f"mask: random boolean (B, 1, Lq, Lk), one per batch entry for every head: {docs} documents "
                     f"on the diagonal (query i and key j in one when i*{docs}//Lq == j*{docs}//Lk), each pair in "
                     f"a document kept with probability {MASK_KEEP:g}, pairs across documents masked: about "
                     f"{100 * MASK_KEEP * same / (lq * lk):.0f}% of the pairs kept")
    if spec.kv_cache.is_paged:
        page, per = spec.kv_cache.page, _pages(spec, lk)
        lines.append(f"block_table: {per} page(s) of {page} keys per sequence, drawn at random without repeats "
                     f"from a cache of {b * per + 1} pages (one unused, random values), so pages are shuffled; "
                     f"kv_lens = {lk} for every sequence")
    for inp in spec.inputs:
        what = {"bool": "random booleans", "i32": "random integers 0 .. max(Lq, Lk)",
                "u8": "random integers 0 .. min(max(Lq, Lk), 255)"}.get(inp.dtype, "standard normal / 2")
        lines.append(f"input {inp.name}[{', '.join(map(str, inp.axes))}] {inp.dtype}: {what}")
    return lines


def _made_up_lines(spec, shapes, seed: int) -> list[str]:
    """made_up's lines for every shape: once where every shape has the same, else per shape."""
    each = [made_up(spec, s, seed + i) for i, s in enumerate(shapes)]
    if len(shapes) == 1:
        return [f"made up: {ln}" for ln in each[0]]
    out = []
    for n in range(len(each[0])):
        if len({lines[n] for lines in each}) == 1:
            out.append(f"made up: {each[0][n]}")
        else:
            out += [f"made up for shape {i + 1}: {lines[n]}" for i, lines in enumerate(each)]
    return out


def _ms(x: float) -> str:
    """Milliseconds with four significant digits (0.01234, 1.480, 123.4; 1234 and above whole)."""
    if x != x or x >= 1000:
        return f"{x:.0f}"
    return f"{x:#.4g}".rstrip(".")


def _tflops(x: float) -> str:
    """TFLOP/s with three significant digits, so that a tiny run does not show 0.00."""
    return "nan" if x != x else f"{x:#.3g}".rstrip(".")


def run_shapes(kernel, backend, shapes, *, repeat=10, seed=0, use_reference=True, echo=print,
               progress=None, notes=()) -> bool:
    """Run a compiled kernel on every shape; print one line each with `echo`; True when all
    are within tolerance. `backend` is the kernel's target's (attngen.backends). `progress`,
    when given, is called with a line before each step (drawing inputs, timing, the float64
    reference), which can take long on big shapes. `notes`: lines printed after the first (the
    profile and why), before what the inputs are made of."""
    spec = kernel.spec
    bound = tolerance(spec)
    say = progress or (lambda line: None)
    echo(f"{spec.name} on {backend.name} ({kernel.plan.profile}): {kernel.plan.summary()}")
    for line in list(notes) + _made_up_lines(spec, shapes, seed):
        echo(line)
    echo(f"{'B':>4} {'Lq':>7} {'Lk':>7} {'Hq':>4} {'Hkv':>4}  {'rel. error':>10}  {'ms':>9}  {'TFLOP/s':>8}  result")
    for shape in shapes:  # every shape before the first is drawn: a bad one fails at once
        check_shape(kernel, backend, shape)
    all_ok = True
    for i, shape in enumerate(shapes):
        where = f"shape {i + 1}/{len(shapes)}"
        say(f"{where} (B={shape['B']} Lq={shape['Lq']} Lk={shape['Lk']} Hq={shape['Hq']} Hkv={shape['Hkv']}): "
            "drawing inputs")
        host, args, opts = draw_inputs(spec, backend, shape, seed + i)
        say(f"{where}: timing {repeat} run{'s' if repeat != 1 else ''} after a warm-up")
        ms = backend.time_call(kernel, args, opts, repeat)
        flops = 2.0 * shape["B"] * shape["Hq"] * visible_pairs(spec.mask, shape["Lq"], shape["Lk"]) * \
            (spec.head_dim_qk + spec.head_dim_v)
        tflops = flops / (ms * 1e-3) / 1e12 if ms > 0 else float("nan")
        if use_reference:
            say(f"{where}: comparing with the float64 reference")
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
             f"{err_text}  {_ms(ms):>9}  {_tflops(tflops):>8}  {verdict}")
    echo(f"times: median of {repeat} runs after a warm-up; {backend.timing}; tolerance {bound:g} "
         "(relative L2 vs float64)")
    return all_ok
