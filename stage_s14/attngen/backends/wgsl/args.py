"""Run-time arguments of the WGSL kernels: the Params uniform and the packed integer buffer.

`params_words()` fills struct Params (lower.py lists its fields) from a checked
Launch (attngen/runtime/launch.py), and `meta_words()` packs the integer inputs into the u32 words of
the seq_meta binding at the offsets it also records in Params: cu_seqlens_q, cu_seqlens_k,
kv_lens, block_table, each right after the previous one (the manifest's "seq_meta" layout);
`input_words()` packs the expression inputs (issue 42) into the words of the `inputs` binding.
Pure numpy: no wgpu here.
"""

from __future__ import annotations

import numpy as np

from ...limits import UINT32_MAX
from ...plan.kernel_plan import KernelPlan
from ...runtime.blockmask import BlockMask
from ...runtime.launch import Launch

LAYOUT_CODE = {"padded": 0, "packed": 1, "paged": 2}


def meta_words(launch: Launch) -> tuple[np.ndarray, dict]:
    """(u32 words, word offsets by Params field) of the integer inputs."""
    parts, offsets, at = [], {}, 0
    table = launch.block_table
    if table is not None:
        # entries past a sequence's pages are never read (may be anything): keep the words valid
        table = np.clip(table, 0, UINT32_MAX)
    for field, arr in (("meta_cu_q", launch.cu_seqlens_q), ("meta_cu_k", launch.cu_seqlens_k),
                       ("meta_kv_lens", launch.kv_lens), ("meta_table", table)):
        offsets[field] = at
        if arr is not None:
            flat = np.asarray(arr, dtype=np.int64).reshape(-1).astype(np.uint32)
            parts.append(flat)
            at += len(flat)
    words = np.concatenate(parts) if parts else np.zeros(1, np.uint32)
    if len(words) == 0:
        words = np.zeros(1, np.uint32)
    return words.astype(np.uint32), offsets


def input_words(spec, arrays: dict) -> tuple[np.ndarray, dict]:
    """(u32 words, {Params field input_NAME: word offset}) of the `inputs` binding: word 0 is the
    out-of-bounds flag (0), then each input (checked: attngen.runtime.inputs.check_call_inputs) in
    declaration order, row-major, stored as attngen/backends/wgsl/expr.py reads it (STORAGE): f32
    and i32 as their bits, f16 widened to f32 (exact), u8 and bool as bytes, 4 per word,
    little-endian (the last word of an input padded with zeros)."""
    parts, offsets, at = [np.zeros(1, np.uint32)], {}, 1
    for inp in spec.inputs:
        a = np.ascontiguousarray(arrays[inp.name]).reshape(-1)
        if inp.dtype in ("f32", "f16", "i32"):
            raw = a.astype("<i4" if inp.dtype == "i32" else "<f4").tobytes()
        else:  # u8, bool: one byte per element
            raw = a.astype(np.uint8).tobytes()
            raw += b"\0" * (-len(raw) % 4)
        words = np.frombuffer(raw, dtype="<u4").astype(np.uint32)
        offsets[f"input_{inp.name}"] = at
        parts.append(words)
        at += len(words)
    return np.concatenate(parts), offsets


def params_words(plan: KernelPlan, launch: Launch, *, write_lse: bool, offsets: dict,
                 bm: BlockMask | None) -> np.ndarray:
    """struct Params as u32 words, in the order of the plan's uniform fields."""
    values = {
        "batch": launch.batch,
        "len_q": launch.len_q,
        "len_k": launch.len_k,
        "heads_q": launch.heads_q,
        "heads_kv": launch.heads_kv,
        "group": launch.group,
        "write_lse": 1 if write_lse else 0,
        "kv_layout": LAYOUT_CODE[launch.layout],
        "has_kv_lens": 1 if launch.kv_lens is not None else 0,
        "cap": launch.page if launch.layout == "paged" else launch.capacity,
        "total_q": launch.total_q,
        "len_new": launch.len_new,
        "table_width": launch.block_table.shape[1] if launch.block_table is not None else 0,
        "new_v": launch.batch * launch.len_new * launch.heads_kv * plan.d_qk,
        "splits": launch.splits,
        **offsets,
    }
    if bm is not None:
        bm_b, bm_h, bm_q, bm_k = bm.shape
        values.update(
            mask_additive=1 if bm.kind == "additive" else 0,
            mask_batch=bm_b, mask_heads=bm_h, mask_len_q=bm_q, mask_len_k=bm_k,
            mask_qtiles=bm.n_qtiles, mask_kvtiles=bm.n_kvtiles,
            mask_counts=bm.offsets["counts"], mask_tiles=bm.offsets["tiles"], mask_data=bm.offsets["data"],
        )
    fields = plan.details.uniform_fields
    words = [values.get(name, 0) if not name.startswith("_pad") else 0 for name, _, _ in fields]
    missing = [name for name, _, _ in fields if not name.startswith("_pad") and name not in values]
    assert not missing, f"Params fields without a value: {missing}"
    return np.array(words, dtype=np.uint32)


def workspace_bytes(plan: KernelPlan, launch: Launch) -> dict:
    """Bytes of the split schedules' workspaces (Workspace.nbytes), by binding name."""
    sizes = launch.sizes(plan)
    return {w.name: w.nbytes(sizes) for w in plan.workspaces}
