"""The CUDA kernels' arguments for one call: values by parameter name, in the plan's order.

runtime.py checks the tensors and resolves the call (attngen.runtime.launch.resolve); this
module turns the result into the argument tuples of the main entry point and of the further
ones (plan.entries: two_pass's P V pass, the split combine), sizes the split workspaces from
the plan's formulas, and builds block masks on the GPU. Every name here is a parameter name of
lower.py, so what is launched is what the manifest describes.
"""

from __future__ import annotations

import numpy as np

from ...errors import LaunchError
from ...plan.formulas import evaluate_all
from ...runtime.blockmask import BlockMask, build_arrays, mask_kind
from ...runtime.launch import MAX_GRID_YZ, Launch

def _cupy():
    import cupy  # the CUDA runtime checked it is installed
    return cupy


def strides3(t, packed: bool) -> tuple:
    """(batch, sequence, head) strides in elements; packed (T, H, D) tensors have batch stride 0."""
    if packed:
        return (0, t.strides[0], t.strides[1])
    return tuple(t.strides[:3])


def build_block_mask(mask, tile_q: int, tile_kv: int, device: int) -> BlockMask:
    """A BlockMask on `device` from a CuPy / PyTorch (through DLPack) / numpy mask."""
    cupy = _cupy()
    mod = type(mask).__module__.split(".")[0]
    kind = mask_kind(mask.dtype)
    with cupy.cuda.Device(device):
        if mod == "torch":
            if mask.is_cuda and mask.device.index != device:
                raise LaunchError(f"mask is on GPU {mask.device.index}, but the kernel runs on GPU {device}")
            t = mask.detach()
            # DLPack has no bool everywhere, nor bfloat16 in CuPy: go through uint8 / float32.
            t = t.to(dtype=__import__("torch").uint8) if kind == "bool" else t.float()
            if not t.is_cuda:
                t = t.cuda(device)
            m = cupy.from_dlpack(t.contiguous())
            m = m.astype(bool) if kind == "bool" else m
        elif mod == "cupy":
            if mask.device.id != device:
                raise LaunchError(f"mask is on GPU {mask.device.id}, but the kernel runs on GPU {device}")
            m = mask
        else:
            m = cupy.asarray(np.asarray(mask))
        kind, data, counts, tiles, live, partial = build_arrays(cupy, m, tile_q, tile_kv)
        shape = tuple(data.shape)
        if kind == "bool":
            data = mask_words(cupy, data)
    return BlockMask("cuda", kind, shape, tile_q, tile_kv, device, counts, tiles, data,
                     live_tiles=live, partial_tiles=partial)


def mask_words(xp, data):
    """A boolean mask (Bm, Hm, Lq, Lk) of 0 / 1 bytes as the CUDA kernels read it: 32 keys per
    32-bit word (key j: bit j % 32 of word j / 32), each row padded with zero bits to
    Wm = 4 * ceil(Lk / 128) + 4 words, so that a tile of up to 128 keys lies in the row's
    16-byte-aligned 256-key window that starts at its 128-key chunk (the producer copies that
    window; docs/cuda-variants.md)."""
    lk = data.shape[-1]
    words = 4 * (-(-lk // 128)) + 4
    padded = xp.zeros(data.shape[:-1] + (words * 32,), dtype=xp.uint8)
    padded[..., :lk] = data != 0
    packed = xp.packbits(padded.reshape(-1), bitorder="little")  # rows of whole words: 4 bytes each
    return xp.ascontiguousarray(packed.view(xp.uint32).reshape(data.shape[:-1] + (words,)))


def mask_values(bm: BlockMask, device: int) -> dict:
    if bm.device != device:
        raise LaunchError(f"mask= is a BlockMask built on GPU {bm.device}; this call runs on GPU {device}")
    bm_b, bm_h, lq, lk = bm.shape
    nq, nk = bm.n_qtiles, bm.n_kvtiles
    row = int(bm.data.shape[-1])  # Wm words (boolean) or Lk floats (additive)
    return {
        "mask_bits": bm.data if bm.kind == "bool" else None,
        "mask_add": bm.data if bm.kind == "additive" else None,
        "mask_counts": bm.counts,
        "mask_tiles": bm.tiles,
        "mask_sb": bm_h * lq * row if bm_b > 1 else 0,
        "mask_sh": lq * row if bm_h > 1 else 0,
        "mask_sl": row,
        "list_sb": bm_h * nq if bm_b > 1 else 0,
        "list_sh": nq if bm_h > 1 else 0,
        "n_kvtiles": nk,
    }


def workspace_shapes(plan, launch: Launch) -> dict:
    """The split schedules' workspaces (plan.workspaces) as (shape, dtype) for this call; a key
    axis of Lk = 0 still gets one column (the scores' row stride)."""
    sizes = {**launch.sizes(plan), "Lk": max(launch.len_k, 1)}
    return {w.name: evaluate_all(w.shape, **sizes) for w in plan.workspaces if not w.persistent}


def persistent_words(plan, launch: Launch) -> dict:
    """The persistent workspaces (the fused combine's tile counters) as {name: 32-bit words} for
    this call; the runtime keeps them zeroed per stream (backends/cuda/runtime.py)."""
    sizes = launch.sizes(plan)
    return {w.name: max(1, int(np.prod(evaluate_all(w.shape, **sizes), dtype=np.int64)))
            for w in plan.workspaces if w.persistent}


def entry_points(plan) -> list:
    """Every entry point of the source as (name, params, grid, threads, shared bytes): the main
    one, its stand-in for launches with per-sequence lengths, the ones launched after it."""
    main = [(plan.entry, plan.params, plan.grid, plan.threads, plan.smem_bytes)]
    v = plan.details.varlen
    alt = [(v.entry, v.params, v.grid, v.threads, v.smem_bytes)] if v is not None else []
    return main + alt + [(e.entry, e.params, e.grid, e.threads, e.smem_bytes) for e in plan.entries]


def varlen_launch(launch: Launch) -> bool:
    """A launch with per-sequence lengths (the entry point CudaDetails.varlen serves)."""
    return launch.layout == "packed" or launch.kv_lens is not None or launch.len_new > 0


def launches(plan, launch: Launch, mask_kind: str | None = None) -> list:
    """[(entry point name, its parameters, grid, block, shared bytes)] in launch order (the
    launcher packs the parameters' values: attngen/backends/cuda/launcher.py). `mask_kind`: the
    BlockMask's (bool | additive) of a custom mask; the producer kernel of a custom mask stages
    boolean masks only, and an additive one takes its _varlen entry (docs/cuda-variants.md)."""
    sizes = launch.sizes(plan)
    out = []
    alt = varlen_launch(launch) or (mask_kind == "additive" and plan.config.producer)
    first = plan.details.varlen if plan.details.varlen is not None and alt else None
    main = (plan.entry, plan.params, plan.grid, plan.threads, plan.smem_bytes) if first is None else (
        first.entry, first.params, first.grid, first.threads, first.smem_bytes)
    for name, params, grid, threads, smem in [main] + [
            (e.entry, e.params, e.grid, e.threads, e.smem_bytes) for e in plan.entries]:
        g = evaluate_all(grid, **sizes)
        if g[1] > MAX_GRID_YZ or g[2] > MAX_GRID_YZ:
            raise LaunchError(f"{name}'s grid {g} exceeds {MAX_GRID_YZ} blocks along y or z")
        if g[0] >= 2**31:
            raise LaunchError(f"{name}'s grid {g} exceeds 2^31 - 1 blocks along x")
        out.append((name, params, g, threads, smem))
    return out
