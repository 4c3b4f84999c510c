"""BlockMask on the WGSL target: the tile lists are built on the GPU by a generated shader.

    bm = attngen.block_mask(mask, kernel)    # kernel: a WgslKernel of a `mask custom` spec

The mask (numpy bool, True = attend, or float, additive) is put in its canonical form on the
host (blockmask.build_arrays' data: uint8 or float32, (Bm, Hm, Lq, Lk)) and uploaded into one
storage buffer of u32 words, [counts | tiles | data] (bool bytes 4 per word); the two entry
points of templates/wgsl/block_mask.wgsl.j2 then classify every (q tile, kv tile) pair and
compact each q tile's list of live kv tiles in place. counts and tiles are read back once
(for the BlockMask's numpy fields, its statistics and the completeness check); the attention
kernels bind the same buffer as `mask`.
"""

from __future__ import annotations

import threading

import numpy as np

from ...errors import LaunchError
from ...runtime.blockmask import BlockMask, mask_kind, mask_shape4
from .devices import WgslTensor, create_module, wgpu
from .emit import BLOCK_MASK_WORKGROUP, block_mask_source

UNSET = 0xFFFFFFFF

_PIPELINES: dict = {}
_LOCK = threading.Lock()


def _pipelines(kernel):
    """(layout, classify, compact) for the kernel's tiles, compiled once per process."""
    plan = kernel.plan
    key = (plan.tile_q, plan.tile_kv, id(kernel.state.device))
    with _LOCK:
        hit = _PIPELINES.get(key)
    if hit is not None:
        return hit
    dev = kernel.state.device
    module = create_module(dev, "attngen_block_mask", block_mask_source(plan))
    layout = dev.create_bind_group_layout(entries=[
        {"binding": 0, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": wgpu.BufferBindingType.uniform}},
        {"binding": 1, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": wgpu.BufferBindingType.storage}},
    ])
    pl = dev.create_pipeline_layout(bind_group_layouts=[layout])
    made = (layout,) + tuple(dev.create_compute_pipeline(layout=pl, compute={"module": module, "entry_point": name})
                             for name in ("block_mask_classify", "block_mask_compact"))
    with _LOCK:
        _PIPELINES[key] = made
    return made


def _host_mask(mask) -> np.ndarray:
    if isinstance(mask, WgslTensor):
        return mask.numpy()
    mod = type(mask).__module__.split(".")[0]
    if mod in ("torch", "cupy"):
        raise LaunchError(f"mask is a {mod} array; the WGSL target takes numpy masks")
    return np.asarray(mask)


def _words(shape: tuple, kind: str, tq: int, tk: int) -> tuple[int, int, int]:
    """u32 words of the BlockMask buffer of a mask of `shape` (Bm, Hm, Lq, Lk) and `kind`: (counts,
    tiles, data); bool masks take a byte per element, additive ones a word."""
    bm_b, bm_h, lq, lk = shape
    slices, nq, nk = bm_b * bm_h, -(-lq // tq), -(-lk // tk)
    elements = slices * lq * lk
    return slices * nq, slices * nq * nk, -(-elements // 4) if kind == "bool" else elements


def check_size(kernel, shape: tuple, kind: str) -> None:
    """A LaunchError when the BlockMask of a mask of `shape` and `kind` would not fit the device:
    its buffer within the storage binding limit, its dispatches within the workgroups per
    dimension. From the shape alone, before anything is allocated (build_block_mask, and attngen
    run's check of a --shape through check_sizes)."""
    plan = kernel.plan
    tq, tk = plan.tile_q, plan.tile_kv
    nbytes = 4 * sum(_words(shape, kind, tq, tk))
    limit = kernel.binding_limit()
    if nbytes > limit:
        raise LaunchError(f"mask: its BlockMask buffer would be {nbytes} bytes, above the {limit}-byte "
                          "storage binding limit of this device/profile")
    bm_b, bm_h, lq, lk = shape
    nq, nk = -(-lq // tq), -(-lk // tk)
    dims = kernel.limit("workgroups_per_dimension")
    for what, n in (("q tiles", nq), ("mask batch x heads", bm_b * bm_h),
                    ("kv tiles / 64", -(-nk // BLOCK_MASK_WORKGROUP))):
        if n > dims:
            raise LaunchError(f"mask: {what} = {n} exceeds the {dims} workgroups per dimension of this device")


def build_block_mask(kernel, mask) -> BlockMask:
    """The BlockMask of `mask` for `kernel` (a WgslKernel), built on its device."""
    if isinstance(mask, BlockMask):
        return mask
    m = _host_mask(mask)
    kind = mask_kind(m.dtype)
    shape = mask_shape4(m.shape)
    check_size(kernel, shape, kind)  # before the host copies below and any GPU buffer
    plan = kernel.plan
    tq, tk = plan.tile_q, plan.tile_kv
    if kind == "bool":
        canon = np.ascontiguousarray(m.reshape(shape).astype(np.uint8))
        data = canon.reshape(-1)
        data = np.concatenate([data, np.zeros(-len(data) % 4, np.uint8)]).view(np.uint32)
    else:
        canon = f = np.ascontiguousarray(m.reshape(shape).astype(np.float32))
        if np.isnan(f).any():
            raise LaunchError("mask has NaN entries; additive masks use -inf for masked pairs")
        if (f == np.inf).any():
            raise LaunchError("mask has +inf entries; additive masks use -inf for masked pairs, finite "
                              "values otherwise")
        data = f.reshape(-1).view(np.uint32)
    bm_b, bm_h, lq, lk = shape
    slices = bm_b * bm_h
    nq, nk = -(-lq // tq), -(-lk // tk)
    n_counts, n_tiles = slices * nq, slices * nq * nk
    offsets = {"counts": 0, "tiles": n_counts, "data": n_counts + n_tiles}
    words = np.concatenate([np.full(n_counts + n_tiles, UNSET, np.uint32), data])

    st = kernel.state
    dev = st.device
    layout, classify, compact = _pipelines(kernel)
    buf = dev.create_buffer_with_data(data=words.tobytes(), usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
    prm = np.array([slices, lq, lk, nq, nk, 1 if kind == "additive" else 0, offsets["counts"], offsets["tiles"],
                    offsets["data"], 0, 0, 0], np.uint32)
    ubuf = dev.create_buffer_with_data(data=prm.tobytes(), usage=wgpu.BufferUsage.UNIFORM)
    group = dev.create_bind_group(layout=layout, entries=[
        {"binding": 0, "resource": {"buffer": ubuf, "offset": 0, "size": ubuf.size}},
        {"binding": 1, "resource": {"buffer": buf, "offset": 0, "size": buf.size}}])
    enc = dev.create_command_encoder()
    for pipe, grid in ((classify, (-(-nk // BLOCK_MASK_WORKGROUP), nq, slices)),
                       (compact, (-(-nq // BLOCK_MASK_WORKGROUP), slices, 1))):
        cp = enc.begin_compute_pass()
        cp.set_pipeline(pipe)
        cp.set_bind_group(0, group)
        cp.dispatch_workgroups(*grid)
        cp.end()
    dev.queue.submit([enc.finish()])
    head = np.frombuffer(dev.queue.read_buffer(buf, size=4 * (n_counts + n_tiles)), dtype=np.uint32)
    counts_u = head[:n_counts]
    if (counts_u == UNSET).any():
        raise LaunchError(f"mask: the block-mask shader was cut short on {st.info.get('device') or 'this adapter'} "
                          "(a software adapter's loop budget); use smaller masks on this adapter")
    counts = counts_u.astype(np.int32).reshape(bm_b, bm_h, nq)
    tiles = head[n_counts:].view(np.int32).reshape(bm_b, bm_h, nq, nk).copy()
    live = int(counts.sum())
    partial = int(((tiles >= 0) & (tiles % 2 == 1)).sum())
    return BlockMask("wgsl", kind, shape, tq, tk, dev, counts=counts, tiles=tiles,
                     data=canon, buffer=buf, offsets=offsets, live_tiles=live, partial_tiles=partial)
