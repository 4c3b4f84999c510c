"""One call of a WGSL kernel: check (attngen.runtime.launch.resolve), upload, dispatch, read back.

Every entry point of the kernel (the attention, then for split schedules two_pass's P V pass
and the combine) is dispatched in order in one command encoder, each with a bind group of
exactly its bindings (lower.py). The kernel object (kernel.py) is handed in; only its public
attributes are used. Results are numpy arrays, or WgslTensor when q, k
and v are all WgslTensor. Appending (k_new / v_new) updates the cache on the GPU; numpy caches
are read back and written into the caller's arrays in place.

On Mesa's llvmpipe (a loop budget per invocation, see devices.py) `out` and `lse` are filled
with sentinel NaNs before the launch and checked afterwards (_check_written: a row whose lse
kept its marker was cut short; a marker left in out is checked again, since a NaN in V can carry
its bits); the split schedules' lse_part / stats workspaces carry lse's marker bits so that a
cut-short workgroup leaves its rows of `out` and `lse` unwritten.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np

from ...errors import LaunchError
from ...plan.formulas import evaluate_all
from ...plan.schedule import max_splits
from ...runtime.blockmask import BlockMask, check_against, mask_keys, mask_kind, mask_shape4
from ...runtime.launch import resolve
from ...runtime.inputs import check_call_inputs
from ...runtime.kvquant import check_scales
from . import expr_grads
from .config import backward_config
from .args import input_words, meta_words, params_words, workspace_bytes
from .blockmask import check_size
from .devices import (
    DTYPE_BYTES, LSE_SENTINEL, NP_DTYPES, RECHECK_SENTINEL, WgslTensor, as_input, dtype_name, padded, sentinel_bytes,
    wgpu,
)


def _upload(dev, data: np.ndarray | bytes, usage):
    raw = data if isinstance(data, bytes) else np.ascontiguousarray(data).tobytes()
    raw += b"\0" * (padded(len(raw)) - len(raw))
    return dev.create_buffer_with_data(data=raw, usage=usage | wgpu.BufferUsage.STORAGE)


def _upload_shared(dev, bufs: dict, plan, L, bm, named: dict, limit: int, new_words=None) -> dict:
    """The buffers the forward and the backward both bind: the sequences' integer words
    (seq_meta), the BlockMask's words (mask) and the expression inputs' words (inputs), into
    `bufs`; returns the words' offsets (params_words reads them). `new_words`: k_new then v_new as
    u32 words, after the integers (meta_new: the decode kernel's append to a quantized cache)."""
    words, offsets = meta_words(L)
    if plan.spec.kv_dtype is not None:
        offsets["meta_new"] = len(words)
        if new_words is not None:
            words = np.concatenate([words, new_words])
    if words.nbytes > limit:
        raise LaunchError(f"the integer inputs are {words.nbytes} bytes, above the {limit}-byte limit")
    bufs["seq_meta"] = _upload(dev, words, 0)
    if bm is not None:
        bufs["mask"] = bm.buffer
    if plan.spec.inputs:
        words, in_offsets = input_words(plan.spec, named)
        if words.nbytes > limit:
            raise LaunchError(f"the expression inputs are {words.nbytes} bytes, above the {limit}-byte storage "
                              "binding limit of this device/profile")
        bufs["inputs"] = _upload(dev, words, wgpu.BufferUsage.COPY_SRC)
        offsets = {**offsets, **in_offsets}
    return offsets


def _check_dispatch(kernel, L) -> None:
    """Every entry point's dispatch within the device's workgroups per dimension, and the splits
    within the kernel's bound."""
    plan = kernel.plan
    sizes = L.sizes(plan)
    dims = kernel.limit("workgroups_per_dimension")
    for role, _, _, _, grid in kernel.pipelines:
        for axis, n, what in zip("xyz", evaluate_all(grid, **sizes), grid):
            if n > dims:
                raise LaunchError(f"dispatch {axis} of {role} = {what} = {n} exceeds the {dims} workgroups per "
                                  "dimension this device allows")
    if L.splits > max_splits(plan.spec):
        raise LaunchError(f"{L.splits} KV splits exceed the kernel's bound")


def _check_outputs(kernel, L, limit: int) -> tuple[int, int, dict]:
    """(out bytes, lse bytes, {workspace: bytes}) of a launch, each within the binding limit."""
    plan = kernel.plan
    out_bytes = int(np.prod(L.out_shape_for(plan.d_v))) * DTYPE_BYTES[plan.dtype]
    lse_bytes = int(np.prod(L.lse_shape)) * 4
    work = workspace_bytes(plan, L)
    for name, n in [("out", out_bytes), ("lse", lse_bytes)] + list(work.items()):
        if n > limit:
            raise LaunchError(f"{name} would be {n} bytes, above the {limit}-byte storage binding limit "
                              "of this device/profile" + (" (fewer splits or shorter sequences)" if name in work else ""))
    return out_bytes, lse_bytes, work


def check_sizes(kernel, L, inputs: dict, mask=None) -> None:
    """What `call` checks of a launch's sizes, from shapes alone (attngen run checks each --shape
    with it before drawing any input): a custom mask's BlockMask ((shape, kind), blockmask.check_size),
    the dispatch, each input's bytes ({name: bytes}), then the outputs' and workspaces' against
    the storage binding limit."""
    limit = kernel.binding_limit()
    if mask is not None:
        check_size(kernel, *mask)
    _check_dispatch(kernel, L)
    for name, n in inputs.items():
        if n > limit:
            raise LaunchError(f"{name} would be {n} bytes, above the {limit}-byte storage binding limit "
                              "of this device/profile")
    _check_outputs(kernel, L, limit)


def _checked_block_mask(kernel, mask, L, dev) -> BlockMask:
    """The BlockMask of a call's mask= (a BlockMask, or a mask the kernel builds one of), checked
    against the call's shapes: a raw mask's shape first, before any GPU work."""
    plan = kernel.plan
    if not isinstance(mask, BlockMask):
        if not hasattr(mask, "shape") or not hasattr(mask, "dtype"):
            mask = np.asarray(mask)
        mask_kind(mask.dtype)
        check_against(BlockMask("wgsl", "bool", mask_shape4(mask.shape), plan.tile_q, plan.tile_kv, dev), L.batch,
                      L.heads_q, L.len_q, L.mask_lk, plan.tile_q, plan.tile_kv, "wgsl")
        mask = kernel.block_mask(mask)
    check_against(mask, L.batch, L.heads_q, L.len_q, L.mask_lk, plan.tile_q, plan.tile_kv, "wgsl")
    if mask.device is not dev:
        raise LaunchError("mask= is a BlockMask built on another wgpu device")
    return mask


def _input_flag(kernel, buf) -> None:
    """Raise where the kernel flagged a read out of an input's bounds (word 0 of `inputs`: the
    read's site, attngen/backends/wgsl/expr.py)."""
    from .expr import sites
    site = int(np.frombuffer(kernel.state.device.queue.read_buffer(buf, size=4), dtype=np.uint32)[0])
    if site:
        found = sites(kernel.plan.spec)
        what, load = found[site - 1] if site <= len(found) else ("", None)
        from ...lang.expr import format_expr
        raise LaunchError(f"kernel '{kernel.plan.spec.name}' (wgsl): the {what} expression read input "
                          f"'{load.input}' out of its bounds in {format_expr(load)} (at a pair where its result is "
                          "used; the kernel read 0 there and its output is not to be used: attngen.reference "
                          "names the index)")


def call(kernel, q, k, v, *, mask=None, kv_lens=None, cu_seqlens_q=None, cu_seqlens_k=None, block_table=None,
         k_new=None, v_new=None, return_lse=False, out=None, max_seqlen_q=None, max_seqlen_k=None, inputs=None):
    """One call (kernel.py's __call__); `inputs`: the expression inputs passed by keyword."""
    plan = kernel.plan
    given = dict(inputs or {})
    scales = given.pop("k_scale", None), given.pop("v_scale", None)  # kv_dtype's (runtime/kvquant.py)
    st = kernel.state
    dev = st.device
    inputs = {"q": as_input("q", q), "k": as_input("k", k), "v": as_input("v", v)}
    if k_new is not None:
        inputs["k_new"] = as_input("k_new", k_new)
    if v_new is not None:
        inputs["v_new"] = as_input("v_new", v_new)
    shapes = {n: tuple(x.shape) for n, x in inputs.items()}
    dtypes = {n: dtype_name(x) for n, x in inputs.items()}
    L = resolve(plan, shapes, dtypes, kv_lens=kv_lens, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                block_table=block_table, has_mask=mask is not None, max_seqlen_q=max_seqlen_q,
                max_seqlen_k=max_seqlen_k, cores=kernel.compute_units(),
                mask_keys=None if mask is None else mask_keys(mask))
    bm = None if mask is None else _checked_block_mask(kernel, mask, L, dev)
    table = L.block_table if isinstance(L.block_table, np.ndarray) else None
    given_scales = scales  # (an i8 append writes the new rows' scales back into them)
    scales = [check_scales(name, plan.spec.name, plan.spec.kv_dtype, inputs[name[0]], x, L.batch, table, L.kv_lens)
              for name, x in zip(("k_scale", "v_scale"), scales)]
    named = None
    if plan.spec.inputs or given:
        named = check_call_inputs(plan.spec, given, L, f"kernel '{plan.spec.name}' (wgsl)")

    out_shape, lse_shape = L.out_shape_for(plan.d_v), L.lse_shape
    np_dtype = NP_DTYPES[plan.dtype]
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    on_gpu = all(isinstance(x, WgslTensor) for x in (q, k, v))
    if out is not None:
        if on_gpu and not isinstance(out, WgslTensor):
            raise LaunchError(f"q, k and v are WgslTensors, so the result stays on the GPU: out must be a WgslTensor "
                              f"too (or None), not {type(out).__name__}; read a WgslTensor back with .numpy()")
        kernel.check_out(out, out_shape, plan.dtype)
    if L.empty:
        if on_gpu:
            o = out if out is not None else WgslTensor.from_numpy(np.zeros(out_shape, np_dtype))
            return (o, WgslTensor.from_numpy(np.zeros(lse_shape, np.float32))) if return_lse else o
        o = out if out is not None else np.zeros(out_shape, np_dtype)
        if out is not None:
            o[...] = 0
        return (o, np.zeros(lse_shape, np.float32)) if return_lse else o

    limit = kernel.binding_limit()
    _check_dispatch(kernel, L)
    sizes = L.sizes(plan)

    usage_rw = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC
    appending = L.len_new > 0
    decode_kv = plan.spec.kv_dtype is not None and "kv_scale" not in {p.name for p in plan.params}  # the decode kernel's
    if appending:  # every argument is checked before anything is written: never half an append
        for name, x in (("k", k), ("v", v)):
            if isinstance(x, np.ndarray) and not x.flags.writeable:
                raise LaunchError(f"{name} is read-only, but k_new/v_new are appended to it in place")
        if plan.spec.kv_dtype == "i8":
            for name, x in zip(("k_scale", "v_scale"), given_scales):
                if isinstance(x, np.ndarray) and not x.flags.writeable:
                    raise LaunchError(f"{name} is read-only, but an append to an i8 cache writes the new rows' scales")
                if not decode_kv and isinstance(x, WgslTensor) and not x.buffer.usage & wgpu.BufferUsage.COPY_DST:
                    raise LaunchError(f"{name}'s buffer was not created with COPY_DST usage, but an append to an i8 "
                                      "cache writes the new rows' scales back into it (WgslTensor.from_numpy makes "
                                      "buffers that allow it)")
    if st.loop_budget is not None and plan.spec.schedule.is_split:
        # the combine loops over the splits for each output column, three times besides, and
        # over the columns (a loop's own passes count against the budget too)
        need = L.splits * (plan.d_v + 4) + plan.d_v + 4
        if need >= st.loop_budget:
            most = max(1, (st.loop_budget - plan.d_v - 5) // (plan.d_v + 4))
            raise LaunchError(
                f"kernel '{plan.spec.name}' with {L.splits} KV splits: the combine loops over the splits for "
                f"each of the {plan.d_v} output columns ({need} iterations), above the {st.loop_budget}-iteration "
                f"loop budget of the software adapter {st.info.get('device') or 'llvmpipe'} (Mesa's llvmpipe); "
                f"use at most {most} splits (split_kv(N) with N <= {most}, or split_kv(auto)), or a hardware adapter")
    bufs = {"q": kernel.buffer("q", q, limit)}
    for name, x in (("k", k), ("v", v)):
        if appending and not isinstance(x, WgslTensor):  # read back after the append
            data = np.ascontiguousarray(x)
            if data.nbytes > limit:
                raise LaunchError(f"{name} is {data.nbytes} bytes, above the {limit}-byte storage binding limit")
            bufs[name] = _upload(dev, data, usage_rw)
        else:
            bufs[name] = kernel.buffer(name, x, limit)
    if appending:
        kn, vn = inputs["k_new"], inputs["v_new"]
        host = [x.numpy() if isinstance(x, WgslTensor) else np.ascontiguousarray(x) for x in (kn, vn)]
        if plan.spec.kv_dtype == "i8":  # (runtime/kvquant.py: quantize_rows refuses them too)
            for name, h in zip(("k_new", "v_new"), host):
                if not np.isfinite(h.astype(np.float32)).all():
                    raise LaunchError(f"{name} holds inf or NaN, which kernel '{plan.spec.name}''s kv_dtype i8 cache "
                                      "cannot store (int8 values times a finite scale)")
        both = np.concatenate([h.reshape(-1) for h in host]).astype(np_dtype)
        if both.nbytes > limit:
            raise LaunchError(f"k_new and v_new are {both.nbytes} bytes together, above the {limit}-byte limit")
        bufs["kv_new"] = _upload(dev, both, 0)
    else:
        bufs["kv_new"] = _upload(dev, np.zeros(1, np.uint32), 0)
    new_words = None
    if appending and decode_kv:  # the decode kernel reads them from seq_meta (lower.py: its bindings)
        raw = both.tobytes()
        new_words = np.frombuffer(raw + b"\0" * (-len(raw) % 4), dtype="<u4").astype(np.uint32)
    offsets = _upload_shared(dev, bufs, plan, L, bm, named, limit, new_words)
    writes_scales = appending and plan.spec.kv_dtype == "i8"
    if plan.spec.kv_dtype is not None:
        offsets = {**offsets, **_scale_buffers(kernel, bufs, scales, limit, writes=writes_scales)}

    out_bytes, lse_bytes, work = _check_outputs(kernel, L, limit)
    fills = {w.name: w.fill for w in plan.workspaces}
    guard = st.loop_budget is not None
    if guard:
        bufs["out"] = dev.create_buffer_with_data(data=sentinel_bytes(plan.dtype, out_bytes), usage=usage_rw)
    elif isinstance(out, WgslTensor):
        bufs["out"] = out.buffer
    else:
        bufs["out"] = dev.create_buffer(size=padded(out_bytes), usage=usage_rw)
    if guard:  # every row's lse is written and checked, wanted or not (_check_written)
        bufs["lse"] = dev.create_buffer_with_data(
            data=np.full(padded(lse_bytes) // 4, LSE_SENTINEL, np.uint32).tobytes(), usage=usage_rw)
    else:
        bufs["lse"] = dev.create_buffer(size=padded(lse_bytes if return_lse else 4), usage=usage_rw)
    for name, n in work.items():
        if fills[name] is not None:  # the workspaces the combine checks for unwritten rows
            bufs[name] = dev.create_buffer_with_data(data=np.full(padded(n) // 4, fills[name], np.uint32).tobytes(),
                                                     usage=wgpu.BufferUsage.STORAGE)
        else:
            bufs[name] = dev.create_buffer(size=padded(n), usage=wgpu.BufferUsage.STORAGE)
    prm = params_words(plan, L, write_lse=return_lse or guard, offsets=offsets, bm=bm)
    bufs["params"] = dev.create_buffer_with_data(data=prm.tobytes(), usage=wgpu.BufferUsage.UNIFORM)
    dispatch(kernel, bufs, sizes, appending)

    count = out_bytes // DTYPE_BYTES[plan.dtype]
    data = None
    if guard or not (on_gpu or isinstance(out, WgslTensor)):
        data = dev.queue.read_buffer(bufs["out"], size=padded(out_bytes))
    if guard:
        _check_written(kernel, bufs, sizes, data, count, lse_bytes // 4, L.len_k)
    if plan.spec.inputs:
        _input_flag(kernel, bufs["inputs"])
    if appending:  # numpy caches: the appended rows, read back into the caller's arrays
        for name, x in (("k", k), ("v", v)):
            if not isinstance(x, WgslTensor):
                raw = dev.queue.read_buffer(bufs[name], size=padded(x.nbytes))
                new = np.frombuffer(raw, dtype=x.dtype, count=x.size).reshape(x.shape)
                np.copyto(x, new)
        if writes_scales and not decode_kv:  # the new rows' scales, into the caller's k_scale and v_scale
            _write_back_scales(kernel, bufs["kv_scale"], given_scales)
        elif writes_scales:  # the decode kernel wrote them in place: host arrays read back
            for name, x in zip(("k_scale", "v_scale"), given_scales):
                if isinstance(x, np.ndarray) and x.size:
                    raw = dev.queue.read_buffer(bufs[name], size=padded(4 * x.size))
                    np.copyto(x, np.frombuffer(raw, dtype=np.float32, count=x.size).reshape(x.shape))
    if isinstance(out, WgslTensor):
        if guard:  # the checked result is in our buffer: move it into the caller's
            if out.buffer.usage & wgpu.BufferUsage.COPY_DST:
                enc = dev.create_command_encoder()
                enc.copy_buffer_to_buffer(bufs["out"], 0, out.buffer, 0, padded(out_bytes))
                dev.queue.submit([enc.finish()])
            else:  # no COPY_DST: run again straight into it (deterministic; an append rewrites the same rows)
                dispatch(kernel, {**bufs, "out": out.buffer}, sizes, appending)
        result = out
    elif on_gpu:
        result = WgslTensor(bufs["out"], out_shape, plan.dtype)
    else:
        o = np.frombuffer(data, dtype=np_dtype, count=count).reshape(out_shape)
        if out is not None:
            np.copyto(out, o)
            result = out
        else:
            result = o.copy()
    if not return_lse:
        return result
    if on_gpu:
        return result, WgslTensor(bufs["lse"], lse_shape, "f32")
    raw = dev.queue.read_buffer(bufs["lse"], size=padded(lse_bytes))
    return result, np.frombuffer(raw, dtype=np.float32, count=lse_bytes // 4).reshape(lse_shape).copy()


def _scale_buffers(kernel, bufs: dict, scales: list, limit: int, writes: bool = False) -> dict:
    """The buffers of a quantized cache's scales into `bufs` (each a numpy array or a resident f32
    WgslTensor, checked: runtime/kvquant.check_scales); returns the Params offset they need. The
    decode kernel binds k_scale and v_scale as they are (lower.py). The register-tiled kernels bind
    one buffer, kv_scale: k_scale, then v_scale from word scale_v (webgpu-core's 8 storage buffers
    leave no room for two); host scales are uploaded into it, resident ones copied on the GPU by
    each call (a copy of the scales: FP8 two numbers per sequence and KV head, i8 1/8 of the cache's
    bytes). `writes`: an i8 append writes its new rows' scales (_write_back_scales takes them back)."""
    names = {p.name for p in kernel.plan.params}
    sizes = [int(np.prod(x.shape)) for x in scales]
    if "kv_scale" not in names:  # the decode kernel: one binding each, nothing copied (scale_v unread)
        for name, x in zip(("k_scale", "v_scale"), scales):
            if writes and not isinstance(x, WgslTensor):  # the append writes the new rows' scales: read back
                data = np.ascontiguousarray(x, np.float32)
                if data.nbytes > limit:
                    raise LaunchError(f"{name} is {data.nbytes} bytes, above the {limit}-byte storage binding limit")
                bufs[name] = _upload(kernel.state.device, data, wgpu.BufferUsage.COPY_SRC)
            else:
                bufs[name] = kernel.buffer(name, x, limit)
            bufs[name + "_w"] = bufs[name]  # the appending twin's read_write view (i8: lower.append_params)
        return {"scale_v": sizes[0]}
    dev = kernel.state.device
    nbytes = 4 * sum(sizes)
    if nbytes > limit:
        raise LaunchError(f"k_scale and v_scale are {nbytes} bytes together, above the {limit}-byte limit")
    usage = wgpu.BufferUsage.COPY_SRC if writes else 0
    if not any(isinstance(x, WgslTensor) for x in scales):
        bufs["kv_scale"] = _upload(dev, np.concatenate([x.reshape(-1) for x in scales]), usage)
        return {"scale_v": sizes[0]}
    buf = dev.create_buffer(size=padded(nbytes), usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | usage)
    enc = dev.create_command_encoder()
    for at, x, name in zip((0, 4 * sizes[0]), scales, ("k_scale", "v_scale")):
        if not isinstance(x, WgslTensor):
            dev.queue.write_buffer(buf, at, np.ascontiguousarray(x, np.float32).tobytes())
        elif x.nbytes:
            kernel.buffer(name, x, limit)  # (its size and usage checked)
            if not x.buffer.usage & wgpu.BufferUsage.COPY_SRC:
                raise LaunchError(f"{name}'s buffer was not created with COPY_SRC usage (this kernel copies the "
                                  "scales into one binding; WgslTensor.from_numpy makes buffers that allow it)")
            enc.copy_buffer_to_buffer(x.buffer, 0, buf, at, x.nbytes)
    dev.queue.submit([enc.finish()])
    bufs["kv_scale"] = buf
    return {"scale_v": sizes[0]}


def _write_back_scales(kernel, buf, given: list) -> None:
    """After an i8 append: the scales in `buf` (kv_scale: k_scale, then v_scale), which the append
    wrote at its new rows, back into the caller's arrays (numpy: copied in place; resident
    WgslTensors: a copy on the GPU)."""
    dev = kernel.state.device
    sizes = [int(np.prod(x.shape)) for x in given]
    if all(isinstance(x, np.ndarray) for x in given):
        raw = np.frombuffer(dev.queue.read_buffer(buf, size=padded(4 * sum(sizes))), dtype=np.float32)
    enc = dev.create_command_encoder()
    for x, at, n in zip(given, (0, sizes[0]), sizes):
        if isinstance(x, WgslTensor):
            if n:
                enc.copy_buffer_to_buffer(buf, 4 * at, x.buffer, 0, 4 * n)
        else:
            if not all(isinstance(y, np.ndarray) for y in given):
                raw = np.frombuffer(dev.queue.read_buffer(buf, size=padded(4 * sum(sizes))), dtype=np.float32)
            np.copyto(x, raw[at:at + n].reshape(x.shape))
    dev.queue.submit([enc.finish()])


def _check_written(kernel, bufs: dict, sizes: dict, data: bytes, count: int, rows: int, len_k: int) -> None:
    """On a loop-budget adapter: raise the budget error unless every row of out and lse was
    written (`data`: out as read back, `count` elements; `rows`: lse's elements).

    lse decides first: a written row's lse is finite, -inf or the kernel's own NaN, never
    LSE_SENTINEL's bits (devices.py), so a row whose lse kept them was cut short. out's marker
    alone cannot decide: a NaN in V with its bits reaches out through P V (NaN in, NaN out,
    which is correct). So elements of rows with a written lse that still hold out's marker
    (normally none) are checked by a second dispatch into a buffer filled with another marker
    (RECHECK_SENTINEL): an element the kernel writes is the same in both (the kernels are
    deterministic; an append rewrites the same rows), one it never writes holds each run's
    marker. That covers a V block (its own workgroup) cut short where the lse writer was not.
    """
    dev = kernel.state.device
    lse = np.frombuffer(dev.queue.read_buffer(bufs["lse"], size=padded(rows * 4)), dtype=np.uint32, count=rows)
    cut = int(np.count_nonzero(lse == LSE_SENTINEL))
    if cut:
        raise kernel.budget_error(len_k, f"{cut} of {rows} rows were not written")
    bits_type, sentinel = kernel.sentinel()
    suspects = np.flatnonzero(np.frombuffer(data, dtype=bits_type, count=count) == sentinel)
    if not suspects.size:
        return
    again = dev.create_buffer_with_data(data=sentinel_bytes(kernel.plan.dtype, bufs["out"].size, RECHECK_SENTINEL),
                                        usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
    timed, _TIMER.times = getattr(_TIMER, "times", None), None  # a check, not a call: gpu_timer never sees it
    try:
        dispatch(kernel, {**bufs, "out": again}, sizes)
    finally:
        _TIMER.times = timed
    second = np.frombuffer(dev.queue.read_buffer(again, size=bufs["out"].size), dtype=bits_type, count=count)
    unwritten = int(np.count_nonzero(second[suspects] == kernel.sentinel(recheck=True)[1]))
    if unwritten:
        raise kernel.budget_error(len_k, f"{unwritten} of {count} output elements were not written")


_TIMER = threading.local()


TIMED_SUBMISSION_MS = 25.0  # repeats_for: a timed submission keeps the GPU busy about this long


def repeats_for(ms: float, target_ms: float = TIMED_SUBMISSION_MS, most: int = 64) -> int:
    """Back-to-back repeats of a call of `ms` GPU milliseconds that fill one timed submission."""
    return max(1, min(most, int(target_ms // max(ms, 1e-3))))


def timed_repeats(kernel, call) -> int:
    """gpu_timer's `repeat` for `call` (one call of `kernel`, made once here and timed): how many
    back-to-back repeats of its dispatches fill one timed submission (1 without timestamp queries)."""
    with gpu_timer(kernel) as times:
        if times is None:
            return 1
        call()
        return repeats_for(sum(times))


@contextlib.contextmanager
def gpu_timer(kernel, repeat: int = 1):
    """Collect the GPU time (ms) of every dispatch made inside the block, from timestamp queries
    written at the start of the first compute pass and the end of the last one: the kernels'
    time on the GPU, without uploads, read-back or Python. With `repeat` > 1 each call encodes its
    passes `repeat` times back to back in its one submission and records the mean time of one:
    short kernels (a few ms) are then timed with the GPU busy throughout, not between the host's
    waits (their single-submission times read up to 2x high in some runs, benchmarks/NOTES.md).
    Yields the list of times, or None when the device has no timestamp-query feature (then time
    on the wall)."""
    if "timestamp-query" not in kernel.state.features:
        yield None
        return
    times = []
    _TIMER.times, _TIMER.repeat = times, max(1, int(repeat))
    try:
        yield times
    finally:
        _TIMER.times, _TIMER.repeat = None, 1


def dispatch(kernel, bufs: dict, sizes: dict, appending: bool = False) -> None:
    """Every entry point in order, one compute pass each, in one submission (`appending`: the
    decode kernel's appending twin in place of its main entry point, where it has one)."""
    dev = kernel.state.device
    twin = [p for p in kernel.pipelines if p[0] == "attention_append"]
    pipelines = [p for p in kernel.pipelines if p[0] != "attention_append"]
    if appending and twin:
        pipelines[0] = twin[0]
    enc = dev.create_command_encoder()
    times = getattr(_TIMER, "times", None)
    repeat = getattr(_TIMER, "repeat", 1) if times is not None else 1  # gpu_timer(repeat=): timing only
    queries = dev.create_query_set(type=wgpu.QueryType.timestamp, count=2) if times is not None else None
    groups = [dev.create_bind_group(layout=bgl, entries=[
        {"binding": p.binding, "resource": {"buffer": bufs[p.name], "offset": 0, "size": bufs[p.name].size}}
        for p in params]) for _, _, bgl, params, _ in pipelines]
    last = repeat * len(pipelines) - 1
    for i in range(last + 1):
        _, pipeline, _, _, grid = pipelines[i % len(pipelines)]
        writes = None
        if queries is not None and i in (0, last):  # a pass between writes no timestamp
            writes = {"query_set": queries}
            if i == 0:
                writes["beginning_of_pass_write_index"] = 0
            if i == last:
                writes["end_of_pass_write_index"] = 1
        cp = enc.begin_compute_pass(timestamp_writes=writes)
        cp.set_pipeline(pipeline)
        cp.set_bind_group(0, groups[i % len(pipelines)])
        cp.dispatch_workgroups(*evaluate_all(grid, **sizes))
        cp.end()
    if queries is not None:
        stamps = dev.create_buffer(size=16, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
        enc.resolve_query_set(queries, 0, 2, stamps, 0)
    dev.queue.submit([enc.finish()])
    if queries is not None:
        t0, t1 = np.frombuffer(dev.queue.read_buffer(stamps), dtype=np.uint64)
        times.append(float(t1 - t0) / 1e6 / repeat)  # WebGPU timestamps are nanoseconds


# ---- the backward (issue 41; Kernel.backward, templates/wgsl/backward.wgsl.j2) ------------------

def _check_like(name: str, x, shape: tuple, dtype: str, why: str) -> None:
    got_shape, got_dtype = tuple(x.shape), dtype_name(x)
    if got_shape != tuple(shape) or got_dtype != dtype:
        raise LaunchError(f"{name} has shape {got_shape} and dtype {got_dtype}, but this call's {name} must be "
                          f"{tuple(shape)} {dtype} ({why})")


def backward_call(kernel, q, k, v, out, lse, dout, *, mask=None, kv_lens=None, cu_seqlens_q=None, cu_seqlens_k=None,
                  max_seqlen_q=None, max_seqlen_k=None, inputs=None):
    """(dq, dk, dv) of the kernel's attention: the three entry points of its backward module
    (kernel.backward_pipelines) in one submission; a spec with `grad` inputs adds a fourth value,
    {name: f32 gradient of the input's shape} (issue 42: step 2 writes them into rows; WgslTensor
    where q, k, v are). Inputs are checked as the forward's call checks them (the expression
    inputs, `inputs`, too), and out, lse, dout against the shapes that call gives; a read out of an
    input's bounds is raised as the forward's (_input_flag)."""
    given = inputs or {}
    plan = kernel.plan
    passes = kernel.backward_pipelines()  # refuses specs without a backward
    st = kernel.state
    dev = st.device
    inputs = {n: as_input(n, x) for n, x in (("q", q), ("k", k), ("v", v), ("out", out), ("lse", lse),
                                              ("dout", dout))}
    L = resolve(plan, {n: tuple(inputs[n].shape) for n in "qkv"}, {n: dtype_name(inputs[n]) for n in "qkv"},
                kv_lens=kv_lens, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, has_mask=mask is not None,
                max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, cores=kernel.compute_units(),
                mask_keys=None if mask is None else mask_keys(mask))
    out_shape = L.out_shape_for(plan.d_v)
    _check_like("out", inputs["out"], out_shape, plan.dtype, "the forward's output")
    _check_like("dout", inputs["dout"], out_shape, plan.dtype, "the gradient of out: out's shape and dtype")
    _check_like("lse", inputs["lse"], L.lse_shape, "f32", "the forward's lse, from return_lse=True")
    named = check_call_inputs(plan.spec, given, L, f"kernel '{plan.spec.name}' (wgsl) backward") if (
        plan.spec.inputs or given) else {}
    bm = None if mask is None else _checked_block_mask(kernel, mask, L, dev)

    np_dtype = NP_DTYPES[plan.dtype]
    on_gpu = all(isinstance(inputs[n], WgslTensor) for n in "qkv")
    shapes = {n: tuple(inputs[n].shape) for n in "qkv"}
    grad_at = expr_grads.layout(plan.spec, named, 2 * L.heads_q * L.total_q + 1)  # {name: (word, shape)}
    if L.empty:
        zeros = [np.zeros(shapes[n], np_dtype) for n in "qkv"]
        done = tuple(WgslTensor.from_numpy(z) for z in zeros) if on_gpu else tuple(zeros)
        if grad_at:
            grads = {n: np.zeros(shape, np.float32) for n, (_, shape) in grad_at.items()}
            return (*done, {n: WgslTensor.from_numpy(g) for n, g in grads.items()} if on_gpu else grads)
        return done

    limit = kernel.binding_limit()
    sizes = {**L.sizes(plan), "Tq": L.total_q}
    dims = kernel.limit("workgroups_per_dimension")
    for role, _, _, _, grid in passes:
        for axis, n, what in zip("xyz", evaluate_all(grid, **sizes), grid):
            if n > dims:
                raise LaunchError(f"dispatch {axis} of the backward's {role} = {what} = {n} exceeds the {dims} "
                                  "workgroups per dimension this device allows")
    elem = DTYPE_BYTES[plan.dtype]
    n_q, n_k, n_v = (int(np.prod(shapes[n])) for n in "qkv")
    flag_word = 2 * L.heads_q * L.total_q  # then the `grad` inputs' gradients (expr_grads.layout)
    rows_words = flag_word + 1 + sum(int(np.prod(shape)) for _, shape in grad_at.values())
    rows_name = "the rows workspace"
    if grad_at:  # then step 2's partial sums of the `grad` inputs many pairs read (expr_grads.py)
        cfg = backward_config(plan)
        slices = -(-L.len_k // cfg.block_kv) * L.heads_kv * L.batch  # the dkdv grid's workgroups
        part = expr_grads.partial_words(plan.spec, named, slices, cfg.block_kv, L.group)
        rows_words += part
        if part:
            rows_name = (f"the wgsl backward's rows workspace, with {4 * part} bytes of partial sums of the `grad` "
                         f"inputs (one slice per dK/dV workgroup, {slices} of them),")
    for name, n in (("dq", n_q * elem), ("dk and dv", (n_k + n_v) * elem), (rows_name, 4 * rows_words)):
        if n > limit:
            raise LaunchError(f"{name} would be {n} bytes, above the {limit}-byte storage binding limit of this "
                              "device/profile")
    bufs = {n: kernel.buffer(n, inputs[n], limit) for n in ("q", "k", "v", "out", "lse", "dout")}
    offsets = _upload_shared(dev, bufs, plan, L, bm, named, limit)
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC
    bufs["rows"] = dev.create_buffer(size=padded(4 * rows_words), usage=usage)  # zeroed, as WebGPU buffers are
    bufs["dq"] = dev.create_buffer(size=max(16, padded(n_q * elem)), usage=usage)
    bufs["dkv"] = dev.create_buffer(size=max(16, padded((n_k + n_v) * elem)), usage=usage)
    prm = params_words(plan, L, write_lse=False, offsets=offsets, bm=bm)
    bufs["params"] = dev.create_buffer_with_data(data=prm.tobytes(), usage=wgpu.BufferUsage.UNIFORM)

    enc = dev.create_command_encoder()
    for _, pipeline, bgl, params, grid in passes:
        group = dev.create_bind_group(layout=bgl, entries=[
            {"binding": p.binding, "resource": {"buffer": bufs[p.name], "offset": 0, "size": bufs[p.name].size}}
            for p in params])
        cp = enc.begin_compute_pass()
        cp.set_pipeline(pipeline)
        cp.set_bind_group(0, group)
        cp.dispatch_workgroups(*evaluate_all(grid, **sizes))
        cp.end()
    dev.queue.submit([enc.finish()])
    if st.loop_budget is not None:  # a step whose loops the driver cut short set the last word of rows
        flag = np.frombuffer(dev.queue.read_buffer(bufs["rows"], buffer_offset=4 * flag_word, size=4),
                             dtype=np.float32)
        if flag[0] != 0:
            raise kernel.budget_error(L.len_k, "a backward step's loops were cut short")
    if plan.spec.inputs:
        _input_flag(kernel, bufs["inputs"])
    grads = _grads_of(dev, bufs["rows"], grad_at, on_gpu)
    if on_gpu:
        dk_buf = dev.create_buffer(size=max(16, padded(n_k * elem)), usage=usage | wgpu.BufferUsage.COPY_DST)
        dv_buf = dev.create_buffer(size=max(16, padded(n_v * elem)), usage=usage | wgpu.BufferUsage.COPY_DST)
        enc = dev.create_command_encoder()
        # copies are in multiples of 4 bytes: n_k * elem is one (head dims are multiples of 8)
        enc.copy_buffer_to_buffer(bufs["dkv"], 0, dk_buf, 0, n_k * elem)
        enc.copy_buffer_to_buffer(bufs["dkv"], n_k * elem, dv_buf, 0, n_v * elem)
        dev.queue.submit([enc.finish()])
        return (WgslTensor(bufs["dq"], shapes["q"], plan.dtype), WgslTensor(dk_buf, shapes["k"], plan.dtype),
                WgslTensor(dv_buf, shapes["v"], plan.dtype), *grads)
    raw_q = dev.queue.read_buffer(bufs["dq"], size=padded(n_q * elem))
    raw_kv = dev.queue.read_buffer(bufs["dkv"], size=padded((n_k + n_v) * elem))
    dq = np.frombuffer(raw_q, dtype=np_dtype, count=n_q).reshape(shapes["q"]).copy()
    both = np.frombuffer(raw_kv, dtype=np_dtype, count=n_k + n_v)
    return (dq, both[:n_k].reshape(shapes["k"]).copy(), both[n_k:].reshape(shapes["v"]).copy(), *grads)


def _grads_of(dev, rows, grad_at: dict, on_gpu: bool) -> tuple:
    """((the `grad` inputs' gradients {name: f32 array of its shape},) from the workspace rows, or
    () for a spec without: numpy arrays, or WgslTensor copies (on_gpu: nothing read back)."""
    if not grad_at:
        return ()
    out = {}
    for name, (word, shape) in grad_at.items():
        n = int(np.prod(shape))
        if on_gpu:
            buf = dev.create_buffer(size=max(16, padded(4 * n)), usage=wgpu.BufferUsage.STORAGE
                                    | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST)
            if n:
                enc = dev.create_command_encoder()
                enc.copy_buffer_to_buffer(rows, 4 * word, buf, 0, 4 * n)
                dev.queue.submit([enc.finish()])
            out[name] = WgslTensor(buf, shape, "f32")
        else:
            raw = dev.queue.read_buffer(rows, buffer_offset=4 * word, size=4 * n) if n else b""
            out[name] = np.frombuffer(raw, dtype=np.float32, count=n).reshape(shape).copy()
    return (out,)
