"""The CUDA kernels' arguments for one call: values by parameter name, in the plan's order.

kernel.py checks the tensors and resolves the call (attngen.runtime.launch.resolve); this
module turns the result into the argument tuples of the main entry point and of the further
ones (plan.entries: two_pass's P V pass, the split combine), sizes the split workspaces from
the plan's formulas, and builds block masks on the GPU. Every name here is a parameter name of
lower.py, so what is launched is what the manifest describes.
"""

from __future__ import annotations

import numpy as np

from ...errors import LaunchError
from ...limits import MAX_GRID_X, MAX_GRID_YZ
from ...plan.formulas import evaluate_all
from ...runtime.blockmask import BlockMask, build_arrays, mask_kind
from ...runtime.launch import Launch

def _cupy():
    import cupy  # the CUDA runtime checked it is installed
    return cupy


# The array dtype (torch's and CuPy's names) of each input dtype: exactly it, no conversion.
_INPUT_DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "i32": "int32", "u8": "uint8", "bool": "bool"}


def device_inputs(spec, given: dict, launch: Launch, device: int, who: str) -> tuple[dict, list, bool]:
    """({input_NAME: address}, copies to keep until the launch, whether the call's recipe may be
    kept) of a call's expression inputs (issue 42): CuPy arrays or PyTorch CUDA tensors on q's
    GPU, of exactly the declared dtype and shape (attngen.runtime.inputs.declared_for_call);
    a layout other than row-major contiguous is copied. Every problem a LaunchError naming the input."""
    from ...runtime.inputs import declared_for_call
    arrays = declared_for_call(spec, given, launch, who)
    ptrs, keep, cacheable = {}, [], True
    for inp in spec.inputs:
        name, x, want = inp.name, arrays[inp.name], _INPUT_DTYPES[inp.dtype]
        mod = type(x).__module__.split(".")[0]
        if mod == "torch":
            if not x.is_cuda:
                raise LaunchError(f"{who}: input '{name}' is a PyTorch tensor on {x.device}; the cuda target needs "
                                  "CUDA tensors (move it with .cuda())")
            dtype, where = str(x.dtype).replace("torch.", ""), x.device.index
        elif mod == "cupy" and hasattr(x, "device"):
            dtype, where = x.dtype.name, x.device.id
        elif isinstance(x, np.ndarray):
            raise LaunchError(f"{who}: input '{name}' is a numpy array in host memory; the cuda target reads inputs "
                              f"on the GPU: pass cupy.asarray({name}) or torch.as_tensor({name}, device='cuda')")
        else:
            raise LaunchError(f"{who}: input '{name}' is a {type(x).__name__}; the cuda target takes CuPy arrays "
                              "or PyTorch CUDA tensors")
        if dtype != want:
            raise LaunchError(f"{who}: input '{name}' is {dtype}; it is declared {inp.dtype}: pass an array of dtype "
                              f"{want} (no conversion is made), e.g. {name}.to(torch.{want}) or "
                              f"{name}.astype(cupy.{want})" if want != "bfloat16" else
                              f"{who}: input '{name}' is {dtype}; it is declared bf16: pass a torch.bfloat16 tensor "
                              f"(no conversion is made), e.g. {name}.to(torch.bfloat16)")
        if where != device:
            raise LaunchError(f"{who}: input '{name}' is on GPU {where}, but q is on GPU {device}")
        if not (x.is_contiguous() if mod == "torch" else x.flags.c_contiguous):
            x = x.contiguous() if mod == "torch" else _cupy().ascontiguousarray(x)
            keep.append(x)
            cacheable = False
        ptrs[f"input_{name}"] = x.data_ptr() if mod == "torch" else x.data.ptr
    return ptrs, keep, cacheable


def input_values(spec, launch: Launch, site0: int) -> dict:
    """The kernel's scalars of expression inputs (lower.py: _inputs): the axes' extents, expr_site0."""
    if not spec.inputs:
        return {}
    return {"ext_b": launch.batch, "ext_h": launch.heads_q, "ext_hkv": launch.heads_kv, "ext_q": launch.len_q,
            "ext_k": launch.capacity, "expr_site0": site0}


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


def workspace_bytes(plan, launch: Launch) -> dict:
    """The split schedules' workspaces (plan.workspaces but the persistent ones) as {name: bytes}
    for this call (Workspace.nbytes); a key axis of Lk = 0 still gets one column (the scores'
    row stride)."""
    sizes = {**launch.sizes(plan), "Lk": max(launch.len_k, 1)}
    return {w.name: w.nbytes(sizes) for w in plan.workspaces if not w.persistent}


def persistent_words(plan, launch: Launch) -> dict:
    """The persistent workspaces (the fused combine's tile counters) as {name: 32-bit words} for
    this call; the runtime keeps them zeroed per stream (ZeroedBuffers, backends/cuda/launch.py)."""
    sizes = launch.sizes(plan)
    return {w.name: max(1, w.nbytes(sizes) // 4) for w in plan.workspaces if w.persistent}


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
    launcher packs the parameters' values: attngen/backends/cuda/launch.py). `mask_kind`: the
    BlockMask's (bool | additive) of a custom mask; the producer kernel of a custom mask stages
    boolean masks only, and an additive one takes its _varlen entry (docs/cuda-variants.md)."""
    sizes = launch.sizes(plan)
    out = []
    alt = varlen_launch(launch) or (mask_kind == "additive" and plan.config.producer)
    first = plan.details.varlen if plan.details.varlen is not None and alt else None
    main = (plan.entry, plan.params, plan.grid, plan.threads, plan.smem_bytes) if first is None else (
        first.entry, first.params, first.grid, first.threads, first.smem_bytes)
    entries = [(e.entry, e.params, e.grid, e.threads, e.smem_bytes) for e in plan.entries]
    first = sum(e.before for e in plan.entries)  # (FP8's preparation of V runs before the attention)
    for name, params, grid, threads, smem in entries[:first] + [main] + entries[first:]:
        g = evaluate_all(grid, **sizes)
        if 0 in g:  # a grid of no blocks does nothing (FP8's _prepare_v without keys); CUDA refuses it
            continue
        if g[1] > MAX_GRID_YZ or g[2] > MAX_GRID_YZ:
            raise LaunchError(f"{name}'s grid {g} exceeds {MAX_GRID_YZ} blocks along y or z")
        if g[0] > MAX_GRID_X:
            raise LaunchError(f"{name}'s grid {g} exceeds 2^31 - 1 blocks along x")
        out.append((name, params, g, threads, smem))
    return out


_NUMPY_NAMES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}  # (_as_tensor's names, back to numpy's)


def kv_scales(plan, named: dict, given: dict, launch: Launch, device: int, as_tensor, stream) -> tuple[dict, list, bool]:
    """({k_scale, v_scale: the device arrays the kernels read}, copies to keep until the launch,
    whether the call's recipe may be kept) of a quantized cache's scales (docs/language.md,
    "Quantized KV caches"; runtime/kvquant.py). CUDA float32 arrays are read in place, their shape
    and dtype checked here and their values by the kernels (a scale that is not finite and >= 0 is
    reported like a bad integer input: docs/cuda-calls.md); numpy arrays are checked whole here and
    uploaded on `stream` (a context: the launches' stream). i8 scales are copied by the kernels a
    row at a time, so their rows must be aligned to it (else a contiguous copy is read; an append,
    which writes them, refuses that). A scale given to a kernel without kv_dtype, or missing, is a
    LaunchError naming it."""
    from ...runtime.kvquant import check_scale_shape, check_scales
    from .kvquant import scale_copy_bytes
    spec, kv = plan.spec, plan.spec.kv_dtype
    out, keep, cacheable = {}, [], True
    if kv is None:
        for name, x in given.items():
            check_scales(name, spec.name, None, None, x, launch.batch)  # (refuses a scale that is given)
        return out, keep, cacheable
    writes = kv == "i8" and launch.len_new > 0  # the append writes the new rows' scales
    for name, stored, dim in (("k_scale", "k", plan.d_qk), ("v_scale", "v", plan.d_v)):
        x = given.get(name)
        if x is None or isinstance(x, np.ndarray):
            if writes and x is not None:
                raise LaunchError(f"{name} is a numpy array, but this call appends to kernel '{spec.name}''s i8 cache, "
                                  f"which writes {name} at the new rows: pass it as a CUDA array (CuPy or PyTorch)")
            checked = check_scales(name, spec.name, kv, named[stored], x, launch.batch)  # (x None: refused)
            with _cupy().cuda.Device(device), stream:
                x = _cupy().asarray(checked)
            keep.append(x)
            cacheable = False
        t = as_tensor(name, x)
        if t.device != device:
            raise LaunchError(f"{name} is on GPU {t.device}, but q is on GPU {device}")
        check_scale_shape(name, kv, tuple(named[stored].shape), tuple(t.shape), _NUMPY_NAMES.get(t.dtype, t.dtype),
                          launch.batch)
        if kv == "i8":
            row = scale_copy_bytes(dim)  # bytes of one cp.async of a row's scales
            if (t.ptr % 16 or (t.shape[-1] > 1 and t.strides[-1] != 1)
                    or any(n > 1 and s * 4 % row for s, n in zip(t.strides[:3], t.shape[:3]))):
                if writes:
                    raise LaunchError(f"{name} is written by this call's append (i8), so the kernel takes it in place: "
                                      f"it needs a 16-byte aligned pointer, a contiguous last axis and strides that are "
                                      f"multiples of {row // 4} floats")
                x = t.obj.contiguous() if t.kind == "torch" else _cupy().ascontiguousarray(t.obj)
                keep.append(x)
                cacheable = False
                t = as_tensor(name, x)
        out[name] = t
    return out, keep, cacheable


def scale_strides(kv_scales: dict) -> dict:
    """The kernels' stride parameters of a quantized cache's scales (lower.py: kv_scale_params), in
    floats: FP8's (B, Hkv) as (batch, 0, head), i8's by the cache's first three axes."""
    out = {}
    for name, prefix in (("k_scale", "ks"), ("v_scale", "vs")):
        t = kv_scales.get(name)
        if t is None:
            continue
        st = (t.strides[0], 0, t.strides[1]) if len(t.shape) == 2 else t.strides[:3]
        out.update({f"{prefix}_s{axis}": s for axis, s in zip("blh", st)})
    return out
