"""Masks over inputs on the WGSL target (issue 42): a generated builder writes the BlockMask.

    out = kernel(q, k, v, doc=doc)              # builds the BlockMask, or reuses the last one
    bm = kernel.block_mask(q, k, doc=doc)       # the same BlockMask, to pass as mask= later
    dq, dk, dv = kernel.backward(q, k, v, out, lse, dout, doc=doc)  # the same BlockMask, reused

A spec whose mask expression reads an input (attngen/plan/mask_inputs.py) runs in two parts:
the builder (templates/wgsl/expr_block_mask.wgsl.j2: the expression on every (row, key) of each
slice it depends on, written as bytes into a BlockMask buffer, then blockmask.py's two entry
points make the tile lists) and the attention kernel of the same spec with `mask custom`
(`companion`), which skips the empty tiles and reads the bytes in the partial ones. The kernel
keeps the BlockMask of its last call and reuses it while the call's signature is the same
(mask_inputs.signature: the extents, each sequence's keys and the bytes of the inputs the mask
reads; a digest of them is computed on the host at every call).
"""

from __future__ import annotations

import threading

import numpy as np

from ...errors import LaunchError, SpecError
from ...lang.expr import format_expr
from ...plan import mask_inputs
from ...runtime.blockmask import BlockMask
from ...runtime.inputs import check_call_inputs
from ...runtime.launch import resolve
from .blockmask import UNSET, check_size
from .devices import create_module, dtype_name, wgpu
from .emit import BLOCK_MASK_WORKGROUP, expr_block_mask_source

_PIPELINES: dict = {}
_LOCK = threading.Lock()


def companion(kernel):
    """The attention kernel of `kernel`'s spec with `mask custom` (compiled once per kernel), or
    None where the profile refuses it: a custom mask and the score's inputs binding take one
    storage buffer more than `kernel` (9 where most profiles allow 8); `kernel` then tests the
    expression per element itself (launch.call)."""
    made = kernel._companion
    if made is None:
        try:
            made = kernel.backend.compile(mask_inputs.custom_spec(kernel.spec), kernel.profile)
        except SpecError:
            made = False
        kernel._companion = made
    return made or None


def _pipelines(kernel, tile_q: int, tile_kv: int):
    key = (kernel.plan.spec_text, tile_q, tile_kv, id(kernel.state.device))
    with _LOCK:
        hit = _PIPELINES.get(key)
    if hit is not None:
        return hit
    dev = kernel.state.device
    source = expr_block_mask_source(kernel.spec, tile_q, tile_kv)
    module = create_module(dev, "attngen_expr_block_mask", source)
    kinds = (wgpu.BufferBindingType.uniform, wgpu.BufferBindingType.storage) * 2
    layout = dev.create_bind_group_layout(entries=[
        {"binding": n, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": t}} for n, t in enumerate(kinds)])
    pl = dev.create_pipeline_layout(bind_group_layouts=[layout])
    made = (layout,) + tuple(dev.create_compute_pipeline(layout=pl, compute={"module": module, "entry_point": name})
                             for name in ("block_mask_fill", "block_mask_classify", "block_mask_compact"))
    with _LOCK:
        _PIPELINES[key] = made
    return made


def _launch(kernel, q, k, v_shape: tuple, kv_lens, named_inputs: dict, **layout):
    """(checked Launch, {name: numpy array}) of a call's shapes, kv_lens, layout options (packed
    sequences and paged caches are refused with inputs: check_call_inputs) and inputs."""
    shapes = {"q": tuple(q.shape), "k": tuple(k.shape), "v": v_shape}
    for name in ("k_new", "v_new"):
        if layout.get(name) is not None:
            shapes[name] = tuple(layout[name].shape)
    dtypes = {n: dtype_name(q) for n in shapes}
    L = resolve(kernel.plan, shapes, dtypes, kv_lens=kv_lens, cores=None,
                **{n: layout.get(n) for n in ("cu_seqlens_q", "cu_seqlens_k", "block_table", "max_seqlen_q",
                                              "max_seqlen_k")})
    arrays = check_call_inputs(kernel.spec, named_inputs, L, f"kernel '{kernel.spec.name}' (wgsl)")
    return L, arrays


def _words(arrays: dict, read: list, lens) -> tuple[np.ndarray, dict]:
    """The inputs binding: the flag, each input the mask reads (expr.py's storage), kv_lens."""
    from types import SimpleNamespace

    from .args import input_words
    words, offsets = input_words(SimpleNamespace(inputs=read), arrays)  # (it packs the `inputs` it is given)
    offsets["kv_lens"] = len(words)
    if lens is not None:
        words = np.concatenate([words, np.asarray(lens, np.int64).astype(np.uint32)])
    return words, offsets


def build(kernel, L, arrays: dict) -> BlockMask:
    """The BlockMask of `kernel`'s mask expression for the checked Launch `L` and its inputs."""
    att = companion(kernel)
    spec, tq, tk = kernel.spec, att.plan.tile_q, att.plan.tile_kv
    lens = L.seq_lens_k() if L.kv_lens is not None else None
    bm_b, bm_h = mask_inputs.slices(spec, L.batch, L.heads_q, lens is not None)
    shape = (bm_b, bm_h, L.len_q, L.len_k)
    check_size(att, shape, "bool")
    slices, nq, nk = bm_b * bm_h, -(-L.len_q // tq), -(-L.len_k // tk)
    elements = slices * L.len_q * L.len_k
    n_words = -(-elements // 4)
    n_counts, n_tiles = slices * nq, slices * nq * nk
    offsets = {"counts": 0, "tiles": n_counts, "data": n_counts + n_tiles}
    read = mask_inputs.mask_inputs(spec)
    in_words, in_offsets = _words(arrays, read, lens)
    limit = kernel.binding_limit()
    if in_words.nbytes > limit:
        raise LaunchError(f"the mask's inputs are {in_words.nbytes} bytes, above the {limit}-byte storage binding "
                          "limit of this device/profile")
    groups = -(-n_words // BLOCK_MASK_WORKGROUP)
    dims = kernel.limit("workgroups_per_dimension")
    grid = (min(groups, dims), -(-groups // dims), 1)
    if grid[1] > dims:
        raise LaunchError(f"mask: {elements} elements are more than the builder's dispatch covers on this device")

    dev = kernel.state.device
    layout, fill, classify, compact = _pipelines(kernel, tq, tk)
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC
    words = np.concatenate([np.full(n_counts + n_tiles, UNSET, np.uint32), np.zeros(n_words, np.uint32)])
    buf = dev.create_buffer_with_data(data=words.tobytes(), usage=usage)
    ibuf = dev.create_buffer_with_data(data=in_words.tobytes(), usage=usage)
    bm_prm = np.array([slices, L.len_q, L.len_k, nq, nk, 0, offsets["counts"], offsets["tiles"], offsets["data"],
                       0, 0, 0], np.uint32)
    prm = [L.batch, L.heads_q, L.heads_kv, L.len_q, L.len_k, bm_b, bm_h, elements, int(lens is not None),
           in_offsets["kv_lens"]] + [in_offsets[f"input_{i.name}"] for i in read]
    prm = np.array(prm + [0] * (-len(prm) % 4), np.uint32)
    ubufs = [dev.create_buffer_with_data(data=p.tobytes(), usage=wgpu.BufferUsage.UNIFORM) for p in (bm_prm, prm)]
    group = dev.create_bind_group(layout=layout, entries=[
        {"binding": n, "resource": {"buffer": b, "offset": 0, "size": b.size}}
        for n, b in enumerate((ubufs[0], buf, ubufs[1], ibuf))])
    enc = dev.create_command_encoder()
    for pipe, g in ((fill, grid), (classify, (-(-nk // BLOCK_MASK_WORKGROUP), nq, slices)),
                    (compact, (-(-nq // BLOCK_MASK_WORKGROUP), slices, 1))):
        cp = enc.begin_compute_pass()
        cp.set_pipeline(pipe)
        cp.set_bind_group(0, group)
        cp.dispatch_workgroups(*g)
        cp.end()
    dev.queue.submit([enc.finish()])
    _flag(kernel, ibuf)
    raw = np.frombuffer(dev.queue.read_buffer(buf), dtype=np.uint32)
    counts_u = raw[:n_counts]
    if (counts_u == UNSET).any():
        where = kernel.state.info.get("device") or "this adapter"
        raise LaunchError(f"mask: the block-mask shader was cut short on {where} (a software adapter's loop "
                          "budget); use smaller masks on this adapter")
    counts = counts_u.astype(np.int32).reshape(bm_b, bm_h, nq)
    tiles = raw[n_counts:n_counts + n_tiles].view(np.int32).reshape(bm_b, bm_h, nq, nk).copy()
    data = raw[offsets["data"]:].view(np.uint8)[:elements].reshape(shape).copy()
    return BlockMask("wgsl", "bool", shape, tq, tk, dev, counts=counts, tiles=tiles, data=data, buffer=buf,
                     offsets=offsets, live_tiles=int(counts.sum()),
                     partial_tiles=int(((tiles >= 0) & (tiles % 2 == 1)).sum()))


def _flag(kernel, buf) -> None:
    """Raise where the builder flagged a read out of an input's bounds (as launch._input_flag)."""
    from .expr import sites
    site = int(np.frombuffer(kernel.state.device.queue.read_buffer(buf, size=4), dtype=np.uint32)[0])
    if site:
        load = sites(kernel.spec)[site - 1][1]
        raise LaunchError(f"kernel '{kernel.spec.name}' (wgsl): the mask expression read input '{load.input}' out of "
                          f"its bounds in {format_expr(load)} (at a row and key of the sequence; attngen.reference "
                          "names the index)")


def block_mask(kernel, q, k, kv_lens=None, **inputs) -> BlockMask:
    """The BlockMask of the mask expression for a call with q's and k's shapes, kv_lens and the
    inputs (built, or the kernel's last one where the signature is the same)."""
    L, arrays = _launch(kernel, q, k, tuple(k.shape[:-1]) + (kernel.plan.d_v,), kv_lens, inputs)
    return cached(kernel, L, arrays)


def cached(kernel, L, arrays: dict) -> BlockMask:
    """The kernel's last BlockMask if its signature is this call's, else a new one (kept)."""
    sig = mask_inputs.signature(L, arrays, kernel.spec)
    last = kernel._last_mask
    if last is not None and last[0] == sig:
        return last[1]
    bm = build(kernel, L, arrays)
    kernel._last_mask = (sig, bm)
    kernel.mask_builds += 1
    return bm


def _mask(kernel, L, arrays: dict, mask) -> BlockMask:
    """The BlockMask of a call: mask= (a BlockMask of block_mask()), or built / reused."""
    if mask is None:
        return cached(kernel, L, arrays)
    if isinstance(mask, BlockMask):
        return mask
    raise LaunchError(f"kernel '{kernel.spec.name}' has a mask expression: mask= takes only the BlockMask of "
                      "kernel.block_mask(q, k, **inputs), not a mask tensor")


def call(kernel, q, k, v, *, mask=None, kv_lens=None, inputs=None, **options):
    """A call of a mask-over-inputs kernel: the BlockMask (mask=, or built / reused), then the
    companion attention kernel with it and the inputs the score reads."""
    L, arrays = _launch(kernel, q, k, tuple(v.shape), kv_lens, inputs or {}, **options)
    bm = _mask(kernel, L, arrays, mask)
    att = companion(kernel)
    keep = {i.name: arrays[i.name] for i in att.spec.inputs}
    return att(q, k, v, mask=bm, kv_lens=kv_lens, **options, **keep)


def backward(kernel, q, k, v, out, lse, dout, *, mask=None, kv_lens=None, inputs=None, **options):
    """The backward of a mask-over-inputs kernel (docs/backward.md): the call's BlockMask (mask=,
    or the forward's, reused while the signature is the same), then the backward of the companion
    `mask custom` kernel with it and the inputs the score reads."""
    L, arrays = _launch(kernel, q, k, tuple(v.shape), kv_lens, inputs or {}, **options)
    bm = _mask(kernel, L, arrays, mask)
    att = companion(kernel)
    keep = {i.name: arrays[i.name] for i in att.spec.inputs}
    return att.backward(q, k, v, out, lse, dout, mask=bm, kv_lens=kv_lens, **options, **keep)
