"""KernelPlan -> CUDA C++ source (for NVRTC) and its manifest."""

from __future__ import annotations

from ..ir import KernelPlan
from .common import Emitted, comment_block, constants, header_lines, layout_lines, manifest, mask_doc, render, transform_doc

# Per storage dtype: the types template and the PTX type name of the tensor-core inputs.
_TYPES = {
    "f16": ("cuda/types_f16.j2", "f16"),
    "bf16": ("cuda/types_bf16.j2", "bf16"),
    "f32": ("cuda/types_f32.j2", None),
}


def emit_cuda(plan: KernelPlan) -> Emitted:
    c = plan.config
    types_template, mma_type = _TYPES[plan.dtype]
    offsets = {b.name: b.offset for b in c.buffers}
    strides = {b.name[1:].lower(): b.cols for b in c.buffers}
    if c.math == "mma":
        pad_doc = "padded to a multiple of 16 (the k of m16n8k16); padding is zero"
    else:
        pad_doc = "no padding on CUDA cores"
    layout = layout_lines(plan, "Shared memory")
    if c.chunked:
        layout.append(c.chunk_summary[0].upper() + c.chunk_summary[1:] + ".")
    source = render(
        "cuda/kernel.cu.j2",
        header=comment_block(header_lines(plan, layout)),
        c=c,
        entry=plan.entry,
        elem_bytes=4 if plan.dtype == "f32" else 2,
        pad=16 if c.math == "mma" else 8,
        pad_doc=pad_doc,
        strides=strides,
        offsets=offsets,
        types_template=types_template,
        math_template=f"cuda/math_{c.math}.j2",
        mma_type=mma_type,
        acc_qk=plan.acc_qk,
        acc_pv=plan.acc_pv,
        any_f16_acc="f16" in (plan.acc_qk, plan.acc_pv),
        mask=plan.mask,
        mask_doc=mask_doc(plan),
        transform_doc=transform_doc(plan),
        **constants(plan),
    )
    extra = {
        "language": "CUDA C++17 (NVRTC), no headers",
        "arch": plan.arch,
        "compile_options": ["--std=c++17", f"--gpu-architecture={plan.arch}"],
        "block": [c.threads, 1, 1],
        "dynamic_shared_memory_bytes": c.smem_bytes,
        "shared_memory_note": "above 48 KiB a launcher must raise the kernel's "
                              "cudaFuncAttributeMaxDynamicSharedMemorySize first",
        "alignment": "q, k, v, out base pointers 16-byte aligned; strides multiples of "
                     f"{16 // (4 if plan.dtype == 'f32' else 2)} elements",
        "features": [],
    }
    if c.chunked:
        # tile d and the split of the output columns over blocks (already in the grid formula).
        extra["tile"] = {"q": c.tile_q, "kv": c.tile_kv, "d": c.chunk}
        extra["output_column_blocks"] = {
            "blocks": c.v_blocks, "columns_per_block": c.d_v_block,
            "grid_y": f"head * {c.v_blocks} + block; block b writes out[..., b * {c.d_v_block} : "
                      f"(b + 1) * {c.d_v_block}] (clipped to Dv); block 0 writes lse"}
    return Emitted(source, manifest(plan, extra), plan)
