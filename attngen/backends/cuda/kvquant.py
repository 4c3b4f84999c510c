"""Quantized K/V caches on the CUDA target (`kv_dtype e4m3 | e5m2 | i8`, issue 44): how the kernels
lay out and read the stored bytes (docs/cuda-variants.md, "Quantized KV caches").

The mma.sync family (f16 / bf16 specs) stages the bytes of K and V in shared memory with cp.async,
half the bytes of an f16 tile, and decodes them in registers straight into the tensor cores'
fragments (templates/cuda/math_mma_kvq.j2); f32 specs decode them on CUDA cores
(templates/cuda/math_fma.j2). The Hopper wgmma family does not read them (choices.wgmma_refusal).

The fragments ask for bytes that are not adjacent in a row, so both products read the head dim in
an order of their own, which the tensor cores cannot tell from the natural one:

- Q K^T sums over the head dim, so any order of its columns that Q and K share gives the same
  scores. The columns are taken in groups of 64, 32 or 16 (`k_groups`: 4, 2 or 1 k16 steps); in a
  group of J steps, lane 4 g + t reads 4 J adjacent bytes of key row g (one 16-, 8- or 4-byte load)
  and uses bytes 4 j .. 4 j + 3 as its B fragment of step j (the mma's columns 2t, 2t + 1, 2t + 8,
  2t + 9); its A fragment of Q is read from the same 4 columns of Q's rows. i8 takes groups of 32
  columns, the blocks of its scales, so that a step's products share one scale per key.
- P V sums over keys, whose order is the scores' own; instead its output columns are taken in an
  order of their own: in a group of T 8-column tiles (`v_groups`: 16, 8, 4 or 2), column g of tile
  n is column g T + n of the group, so that lane 4 g + t reads T adjacent bytes of each of its four
  key rows (keys 2t, 2t + 1, 2t + 8, 2t + 9 of the k16 step) and pairs them byte by byte into its B
  fragments. The epilogue writes acc to the columns it stands for.

Rows of the byte tiles are padded so that those loads hit 32 different banks (`row_bytes`); where
both head dims are multiples of 128 (choices.swizzles_kv), the rows are whole 128-byte lines instead,
unpadded, with 16-byte chunk c of row r stored at chunk c ^ chunk_key(r) (`chunk_key`): one pattern
that keeps both products' loads on different banks (tests/backends/cuda/test_kvquant_banks.py models
every phase of them), at a third less shared memory than the padded rows at d128.
Scales: FP8's per (sequence, KV head) multiply the f32 scores (k_scale) and the normalised output
(v_scale) once; i8's per 32 values are staged with their rows (sKs, sVs) and multiply each 32-column
block's partial scores per key (K) and each value as it is decoded (V, in f32, one rounding to the
tile's type).
"""

from __future__ import annotations

I8_BLOCK = 32  # values per i8 scale (runtime/kvquant.py)
K_GROUPS = (64, 32, 16)  # head-dim columns of a group of Q K^T's k16 steps, largest first
V_GROUPS = (16, 8, 4, 2)  # 8-column output tiles of a group of P V's columns, largest first
# Row residues mod 128 bytes that keep a warp's loads on 32 different banks: K by its first group's
# load (16, 8 or 4 bytes a lane, rows g .. of one 8-key tile), V for every group (keys 2t .. of a step)
_K_RESIDUE = {4: 64, 2: 32, 1: 16}
_V_RESIDUE = 16

C_TYPES = {"e4m3": "unsigned char", "e5m2": "unsigned char", "i8": "signed char"}
WHAT = {"e4m3": "FP8 e4m3 (OCP fn) bytes", "e5m2": "FP8 e5m2 bytes", "i8": "int8 values"}


def k_groups(kv_dtype: str, d_qk_pad: int) -> tuple:
    """(first column, k16 steps) of each group of Q K^T's head dim (a multiple of 16), in order."""
    sizes = (I8_BLOCK,) if kv_dtype == "i8" else K_GROUPS
    out, col = [], 0
    for size in sizes:
        while d_qk_pad - col >= size:
            out.append((col, size // 16))
            col += size
    assert col == d_qk_pad, (kv_dtype, d_qk_pad)
    return tuple(out)


def v_groups(d_v_pad: int) -> tuple:
    """(first column, 8-column tiles T) of each group of P V's output columns, in order."""
    out, col = [], 0
    for tiles in V_GROUPS:
        while d_v_pad - col >= 8 * tiles:
            out.append((col, tiles))
            col += 8 * tiles
    assert col == d_v_pad, d_v_pad
    return tuple(out)


def _padded(n: int, residue: int) -> int:
    """The least row length >= n bytes that is residue mod 128 (a multiple of 16)."""
    return n + (residue - n) % 128


def chunk_key(row: int) -> int:
    """The XOR of the 16-byte chunks of byte-tile row `row` in 128-byte rows (templates/cuda/copy.j2,
    kv_chunk_key, computes the same): bits 1 and 2 of the chunk index, from bits 0-2 of the row. Q K^T's
    16-byte loads (a phase: rows 2i, 2i + 1) need rows 2i and 2i + 1 in opposite halves of the line (bit 2
    flips with bit 0 of the row), its 8-byte loads (rows 4i .. 4i + 3) and P V's (rows 2t, keys apart by 2)
    the four rows' chunk pairs apart (bits 1-2 one-to-one on bits 0-1 and on bits 1-2 of the row)."""
    return (((row ^ (row >> 2)) & 1) << 2) | (row & 2)


def row_bytes(kv_dtype: str, d_qk_pad: int, d_v_pad: int) -> tuple[int, int]:
    """Bytes per row of the K and V byte tiles in shared memory (mma.sync: see the module docstring;
    CUDA cores read whole rows in order, so their rows are padded by 16 bytes like every tile)."""
    first = k_groups(kv_dtype, d_qk_pad)[0][1]
    return _padded(d_qk_pad, _K_RESIDUE[first]), _padded(d_v_pad, _V_RESIDUE)


def layout_entries(spec, math: str, stages: int, tile_kv: int, d_qk_pad: int, d_v_pad: int, skew: int,
                   swizzled: bool = False) -> list:
    """Shared-memory buffers of the K and V byte tiles (and i8's scales), per pipeline stage;
    `swizzled`: rows of whole 128-byte lines with permuted chunks (chunk_key)."""
    kv = spec.kv_dtype
    note = "; 128-byte rows, chunks permuted" if swizzled else ""
    if swizzled:
        k_row, v_row = d_qk_pad, d_v_pad
    elif math == "mma":
        k_row, v_row = row_bytes(kv, d_qk_pad, d_v_pad)
    else:  # CUDA cores: 4 bytes a read, whole rows in order (16 bytes of skew, as the f32 tiles)
        k_row, v_row = d_qk_pad + skew, d_v_pad + skew
    what = WHAT[kv]
    out = [("sK", kv, stages, tile_kv, k_row, f"K tiles as stored ({what}), one per pipeline stage{note}"),
           ("sV", kv, stages, tile_kv, v_row, f"V tiles as stored ({what}), one per pipeline stage{note}")]
    if kv == "i8":
        out += [("sKs", "f32", stages, tile_kv, spec.head_dim_qk // I8_BLOCK, "K's scales, one per 32 values"),
                ("sVs", "f32", stages, tile_kv, spec.head_dim_v // I8_BLOCK, "V's scales, one per 32 values")]
    return out


def refuse_chunks(spec, max_columns: int) -> None:
    """A Problem where `spec` would stream its head dims through shared memory in chunks (tile d, or
    head dims above `max_columns`): a quantized cache's tiles are read with whole rows in it."""
    if spec.tile.d is None and max(spec.head_dim_qk, spec.head_dim_v) <= max_columns:
        return
    from ...plan.kernel_plan import Problem
    why = (f"tile d={spec.tile.d}" if spec.tile.d is not None else
           f"head dims above {max_columns}, which stream through shared memory in chunks")
    raise Problem(f"kv_dtype {spec.kv_dtype} with {why}: a quantized cache's tiles are read with the whole head dim "
                  "in shared memory on target cuda", key="kv_dtype",
                  hint="leave tile d out; head dims up to 256 with kv_dtype" if spec.tile.d is not None
                  else f"keep K and V in the spec's dtype (no kv_dtype) for head dims above {max_columns}")


def scale_copy_bytes(head_dim: int) -> int:
    """The cp.async size of an i8 scale row (head_dim / 32 floats): the largest of 16, 8, 4 bytes that
    divides it (the rows of a scale tensor start at multiples of it)."""
    row = head_dim // I8_BLOCK * 4
    return next(n for n in (16, 8, 4) if row % n == 0)


def template_context(plan, c) -> dict:
    """What the templates of configuration `c` need of the quantized cache ({} without kv_dtype)."""
    kv = plan.spec.kv_dtype
    if kv is None:
        return {"kv_dtype": None}
    ctx = {"kv_dtype": kv, "kv_c_type": C_TYPES[kv], "kv_what": WHAT[kv],
           "kv_scale_copy_k": scale_copy_bytes(plan.spec.head_dim_qk),
           "kv_scale_copy_v": scale_copy_bytes(plan.spec.head_dim_v)}
    if c.math == "mma":
        ctx.update(k_groups=k_groups(kv, c.d_qk_pad), v_groups=v_groups(c.d_v_pad))
    return ctx


def describe(plan) -> str:
    """`attngen check`'s line on how the kernels read the quantized cache."""
    kv, c = plan.spec.kv_dtype, plan.config
    scales = ("k_scale and v_scale per (sequence, KV head) multiply the f32 scores and the output" if kv != "i8"
              else "k_scale and v_scale per 32 values are staged with their rows (sKs, sVs): K's multiply the "
                   "partial scores of each 32-column block, V's each value as it is decoded (f32, rounded once)")
    how = ("decoded in registers into the mma.sync fragments (head-dim columns in groups of "
           + ", ".join(str(16 * j) for j in sorted({j for _, j in k_groups(kv, c.d_qk_pad)}, reverse=True))
           + " for Q K^T; output columns in groups for P V)" if c.math == "mma" else "decoded to f32 on CUDA cores")
    return (f"kv_dtype {kv}: K and V staged in shared memory as stored, one byte per value (cp.async), {how}; "
            f"{scales}; an append quantizes k_new / v_new as it writes them (docs/language.md)")
