"""Block masks: a custom mask classified per (q tile, kv tile), with per-q-tile live lists.

    bm = attngen.block_mask(mask, kernel)   # on the kernel's device; reuse it across calls
    out = kernel(q, k, v, mask=bm)

A mask is boolean (True = attend) or additive (float added to the score; -inf = masked),
of shape (Lq, Lk), (Hm, Lq, Lk) or (Bm, Hm, Lq, Lk). Every (q tile, kv tile) pair of every
(mask batch, mask head) is *empty* (every element masked: the kernel never visits it),
*full* (nothing to apply: the kernel does not read the mask there) or *partial*. Per q tile
the live kv tiles are listed in ascending order as `kv_tile * 2 + partial`, after `counts`
of them: the same information as FlexAttention's BlockMask (kv_num_blocks / kv_indices and
the full-block lists). docs/variants.md has the contract.

`build_arrays` is written once against the array namespace it is given: a device array
library builds a target's block masks on its GPU (the CUDA backend passes CuPy), numpy gives
the oracle the tests compare the device builders with (a target may build its own in a
shader instead: attngen/backends/wgsl/blockmask.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import LaunchError


@dataclass
class BlockMask:
    """A custom mask ready for a kernel: its canonical data and the tile lists.

    Arrays live on the target's device: device arrays (counts, tiles, data), or one GPU buffer
    (`buffer`) holding counts, tiles and data at the word offsets in `offsets`.
    """

    target: str
    kind: str  # bool | additive
    shape: tuple  # (Bm, Hm, Lq, Lk) of the mask
    tile_q: int
    tile_kv: int
    device: object  # the target's device (an id or a device object)
    counts: object = None  # (Bm, Hm, n_qtiles) int32
    tiles: object = None  # (Bm, Hm, n_qtiles, n_kvtiles) int32: kv_tile * 2 + partial
    data: object = None  # (Bm, Hm, Lq, Lk) uint8 (bool) or float32 (additive)
    buffer: object = None  # or: everything in one storage buffer of u32 words
    offsets: dict = field(default_factory=dict)  # its word offsets of counts, tiles, data
    live_tiles: int = 0  # sum of counts
    partial_tiles: int = 0
    # what a backend derives from the mask once and keeps with it (the CUDA backward's key-block
    # lists), keyed by the backend's own name
    derived: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def n_qtiles(self) -> int:
        return -(-self.shape[2] // self.tile_q)

    @property
    def n_kvtiles(self) -> int:
        return -(-self.shape[3] // self.tile_kv)

    @property
    def density(self) -> float:
        """Fraction of tile pairs that are visited (live)."""
        total = self.shape[0] * self.shape[1] * self.n_qtiles * self.n_kvtiles
        return self.live_tiles / total if total else 0.0

    def __repr__(self) -> str:
        return (f"<attngen BlockMask {self.kind} {self.shape} for {self.target}, tiles {self.tile_q}x"
                f"{self.tile_kv}: {self.live_tiles} live tile pairs ({self.partial_tiles} partial), "
                f"density {self.density:.3f}>")


def mask_kind(dtype) -> str:
    """'bool' or 'additive' for a mask dtype (numpy / device array / PyTorch dtype or its name)."""
    name = str(dtype).replace("torch.", "")
    if name == "bool":
        return "bool"
    if name in ("float16", "float32", "float64", "bfloat16", "half", "float"):
        return "additive"
    raise LaunchError(f"mask must be boolean (True = attend) or floating point (additive), not {name}")


def mask_shape4(shape) -> tuple:
    """The mask's shape as (Bm, Hm, Lq, Lk); a LaunchError for anything else."""
    shape = tuple(int(n) for n in shape)
    if not 2 <= len(shape) <= 4:
        raise LaunchError(f"mask must have shape (Lq, Lk), (H, Lq, Lk) or (B, H, Lq, Lk), got {shape}")
    shape = (1,) * (4 - len(shape)) + shape
    if shape[2] == 0 or shape[3] == 0:
        raise LaunchError(f"mask has an empty query or key axis: {shape}")
    return shape


def mask_keys(mask) -> int | None:
    """The key axis of a mask= argument (a BlockMask or a mask tensor), None when it has none
    (the shape checks say what is wrong)."""
    shape = getattr(mask, "shape", None)
    if shape is None:
        try:
            shape = np.shape(mask)
        except ValueError:  # ragged nested lists: mask_shape4 / np.asarray say so
            return None
    return int(shape[-1]) if len(shape) >= 2 else None


def check_against(bm: BlockMask, batch: int, heads_q: int, len_q: int, len_k: int,
                  tile_q: int, tile_kv: int, target: str) -> None:
    """A LaunchError unless `bm` fits this call: target, tiles, broadcastable shape."""
    if not isinstance(bm, BlockMask):
        raise LaunchError(f"mask= must be a BlockMask or a mask tensor, not {type(bm).__name__}")
    if bm.target != target:
        raise LaunchError(f"mask= is a BlockMask built for the {bm.target} target; this kernel is {target}")
    if (bm.tile_q, bm.tile_kv) != (tile_q, tile_kv):
        raise LaunchError(f"mask= is a BlockMask for tiles {bm.tile_q}x{bm.tile_kv}, but this kernel uses "
                          f"{tile_q}x{tile_kv}: build it with attngen.block_mask(mask, kernel)")
    check_mask_shape(bm.shape, batch, heads_q, len_q, len_k)


def check_mask_shape(shape4: tuple, batch: int, heads_q: int, len_q: int, len_k: int) -> None:
    """A LaunchError unless a mask of shape (Bm, Hm, Lq, Lk) fits a call of these sizes."""
    bm_b, bm_h, bm_q, bm_k = shape4
    if bm_b not in (1, batch):
        raise LaunchError(f"mask has batch dimension {bm_b}, but the batch is {batch} (must be 1 or {batch})")
    if bm_h not in (1, heads_q):
        raise LaunchError(f"mask has head dimension {bm_h}, but q has {heads_q} heads (must be 1 or {heads_q})")
    if (bm_q, bm_k) != (len_q, len_k):
        raise LaunchError(f"mask covers {bm_q} query rows x {bm_k} keys, but this call has Lq={len_q}, "
                          f"Lk={len_k}")


def build_arrays(xp, mask, tile_q: int, tile_kv: int):
    """(kind, data, counts, tiles, live, partial) for a mask array of namespace `xp`.

    data is the mask as (Bm, Hm, Lq, Lk) uint8 or float32, contiguous; counts and tiles as
    documented above; live / partial are Python ints. Padding rows and keys (past Lq, Lk in
    the last tiles) never make a tile live or partial; the kernels bound keys by each
    sequence's Lk themselves (a tile reaching past it is treated as partial).
    """
    kind = mask_kind(mask.dtype)
    shape = mask_shape4(mask.shape)
    m = mask.reshape(shape)
    if kind == "bool":
        data = xp.ascontiguousarray(m.astype(xp.uint8))
        live_el = data != 0
        plain_el = live_el
    else:
        data = xp.ascontiguousarray(m.astype(xp.float32))
        if bool(xp.isnan(data).any()):
            raise LaunchError("mask has NaN entries; additive masks use -inf for masked pairs")
        if bool((data == xp.inf).any()):
            raise LaunchError("mask has +inf entries; additive masks use -inf for masked pairs, finite "
                              "values otherwise")
        live_el = data > -xp.inf
        plain_el = data == 0
    bm, hm, lq, lk = shape
    nq, nk = -(-lq // tile_q), -(-lk // tile_kv)
    pad = ((0, 0), (0, 0), (0, nq * tile_q - lq), (0, nk * tile_kv - lk))

    def tiles_of(el, reduce, fill):
        el = xp.pad(el, pad, constant_values=fill) if (pad[2][1] or pad[3][1]) else el
        el = el.reshape(bm, hm, nq, tile_q, nk, tile_kv)
        return reduce(reduce(el, axis=5), axis=3)

    any_live = tiles_of(live_el, xp.any, False)
    all_plain = tiles_of(plain_el, xp.all, True)
    live = any_live
    partial = any_live & ~all_plain
    counts = live.sum(axis=-1).astype(xp.int32)
    # Compact each row's live tiles to the front, in ascending order: a stable sort on "dead".
    order = xp.argsort((~live).astype(xp.int8), axis=-1, kind="stable")
    code = xp.arange(nk, dtype=xp.int32)[None, None, None, :] * 2 + partial.astype(xp.int32)
    tiles = xp.take_along_axis(code, order, axis=-1)
    tiles = xp.where(xp.arange(nk)[None, None, None, :] < counts[..., None], tiles, -1).astype(xp.int32)
    return (kind, data, xp.ascontiguousarray(counts), xp.ascontiguousarray(tiles),
            int(counts.sum()), int(partial.sum()))


def reference_block_mask(mask, tile_q: int, tile_kv: int) -> BlockMask:
    """The numpy oracle of a block mask (host arrays), as the device builders must produce."""
    m = np.asarray(mask)
    kind, data, counts, tiles, live, partial = build_arrays(np, m, tile_q, tile_kv)
    return BlockMask("numpy", kind, tuple(data.shape), tile_q, tile_kv, None, counts, tiles, data,
                     live_tiles=live, partial_tiles=partial)


def block_mask(mask, kernel) -> BlockMask:
    """Classify `mask` for `kernel`'s tiles on its device (see the module docstring)."""
    builder = getattr(kernel, "block_mask", None)
    if builder is None:
        raise LaunchError(f"block_mask needs a compiled attngen kernel (attngen.compile), not "
                          f"{type(kernel).__name__}")
    if not kernel.spec.mask.is_custom:
        raise LaunchError(f"kernel '{kernel.spec.name}' has mask {kernel.spec.mask.kind}, not custom: it takes "
                          "no mask tensor")
    return builder(mask)
