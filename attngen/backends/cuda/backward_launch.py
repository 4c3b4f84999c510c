"""The CUDA backward's launches (issue 41; backward.py renders and describes the kernels, this
module runs them): the cubin (compiled by NVRTC or found in the disk cache), its functions per
device, the argument struct (backward.ARG_FIELDS in ctypes), the fast family's view of a BlockMask
(per key block, the query steps that see it), the expression inputs and `grad` buffers, and
run_backward: `kernel.backward(q, k, v, out, lse, dout, **options)` checked and launched on the
caller's stream."""

from __future__ import annotations

import ctypes
import hashlib
import math

import numpy as np

from ...errors import LaunchError
from ...plan.kernel_plan import KernelPlan
from . import backward_mma, expr_grads
from .backward import (ARG_FIELDS, PRE_ROWS, THREADS, WGMMA_ROWS, backward_config, backward_problems, block_keys,
                       entry_names, family, fast_smem_bytes, partials, render_backward, split_additive, wgmma_rows,
                       wide)


def _ctype(c: str):
    return ctypes.c_uint64 if c.endswith("*") else ctypes.c_longlong if c == "long long" else ctypes.c_int32


class _Args(ctypes.Structure):
    _fields_ = [(name, _ctype(c)) for c, name, _ in ARG_FIELDS]


def _cubin(plan: KernelPlan) -> bytes:
    from ...resources import generator_version
    from ...runtime.cache import cache_key, cached
    from . import nvrtc
    key = cache_key(generator=generator_version(), target="cuda", kind="backward", arch=plan.details.arch,
                    plan=hashlib.sha256(repr(plan).encode()).hexdigest(), **nvrtc.key_extra())
    return cached(key, ".cubin", lambda: nvrtc.compile_cubin(render_backward(plan), plan.details.arch)[0])[0]


def _dkdv_smem(plan: KernelPlan) -> int:
    """The dK/dV step's dynamic shared memory (the fma family's dQ step takes as much)."""
    fam = family(plan)
    if fam == "mma":
        return backward_mma.template_args(plan)["smem_bytes"]
    return fast_smem_bytes(plan) if fam == "wgmma" else backward_config(plan).smem_bytes


def _functions(kernel, device: int) -> dict:
    """{step: loaded function} of `kernel`'s backward on `device`, compiled (or found in the disk
    cache) on first use."""
    cache = kernel.__dict__.setdefault("_backward_functions", {})
    if device not in cache:
        from .devices import cupy_module
        cupy = cupy_module()
        cubin = _cubin(kernel.plan)
        smem = _dkdv_smem(kernel.plan)
        fma = family(kernel.plan) == "fma"
        with cupy.cuda.Device(device):
            module = cupy.cuda.function.Module()
            module.load(cubin)
            fns = {}
            steps = dict(zip(("preprocess", "dkdv", "dq"), entry_names(kernel.plan)))
            if not fma and kernel.plan.spec.mask.is_custom and split_additive(kernel.plan):
                # (an additive mask's dK/dV step: an entry of its own)
                steps["dkdv_add"] = steps["dkdv"] + "_add"
            for step, name in steps.items():
                fn = module.get_function(name)
                if step.startswith("dkdv") or (step == "dq" and fma):
                    cupy.cuda.driver.funcSetAttribute(
                        fn.ptr, cupy.cuda.driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)
                fns[step] = fn
            if partials(kernel.plan):  # the 4th entry: the `grad` inputs' partial sums added up
                fns["grads"] = module.get_function(f"{kernel.plan.entry}_bwd_grads")
        cache[device] = (module, fns)
    return cache[device][1]



def _key_block_lists(bm, cupy, keys: int):
    """The fast family's view of a BlockMask: per (mask batch, mask head, key block of `keys`
    keys), the steps of WGMMA_ROWS query rows that see any of its keys, ascending, as step * 2 +
    partial (the step tests the mask per element), and their counts: the BlockMask's own
    construction (build_arrays) on the transposed mask, with the key blocks as its rows. (The
    BlockMask's tiles are the forward's, which need not divide the key blocks.) Returns (counts,
    lists, batch stride, head stride, list row length), strides in key blocks."""
    from ...runtime.blockmask import build_arrays
    nb, nh, _, lk = bm.shape
    if bm.kind == "bool":  # 32 keys per word, key j at bit j % 32 of word j // 32 (little-endian bytes)
        octets = bm.data.view(cupy.uint8)
        bits = (octets[..., None] >> cupy.arange(8, dtype=cupy.uint8)) & 1
        mask = bits.reshape(*octets.shape[:-1], -1)[..., :lk].astype(bool)
    else:
        mask = bm.data
    _, _, counts, lists, _, _ = build_arrays(cupy, mask.transpose(0, 1, 3, 2), keys, WGMMA_ROWS)
    nkb, steps = lists.shape[2], lists.shape[3]
    return counts, lists, (nh * nkb if nb > 1 else 0), (nkb if nh > 1 else 0), steps


def _map_view(t, packed: bool) -> tuple:
    """(shape, strides) of `t` as a tensor map's (B, L, H, D) view (packed sequences: one batch)."""
    return ((1, *t.shape), (0, *t.strides)) if packed else (tuple(t.shape), tuple(t.strides))


def _strides3(t, packed: bool) -> tuple:
    return (0, t.strides[0], t.strides[1]) if packed else tuple(t.strides[:3])


def _expr_inputs(spec, ptrs: dict, launch, errors: int, site0: int):
    """The kernels' ExprInputs (expr.inputs_source: each input's address, the extents of the index
    axes, the errors word and site0) as a ctypes struct, laid out as C lays out the struct."""
    from .args import input_values
    from .lower import EXTENTS
    fields = [(i.name, ctypes.c_uint64) for i in spec.inputs] + [(f"ext_{x}", ctypes.c_int32) for x in EXTENTS]
    struct = type("ExprInputs", (ctypes.Structure,), {"_fields_": fields + [("errors", ctypes.c_uint64),
                                                                            ("site0", ctypes.c_int32)]})()
    values = input_values(spec, launch, site0)
    for i in spec.inputs:
        setattr(struct, i.name, ptrs[f"input_{i.name}"])
    for x in EXTENTS:
        setattr(struct, f"ext_{x}", values[f"ext_{x}"])
    struct.errors, struct.site0 = errors, values["expr_site0"]
    return struct


def _zeroed_f32(kind: str, device: int, shape: tuple):
    """A zeroed f32 array of `shape` on `device` in the caller's framework, on its current stream
    (the kernels' stream): a `grad` input's gradient, added into by the dK/dV step."""
    if kind == "torch":
        import torch
        return torch.zeros(shape, dtype=torch.float32, device=torch.device("cuda", device))
    from .devices import cupy_module
    cupy = cupy_module()
    with cupy.cuda.Device(device):
        return cupy.zeros(shape, dtype=cupy.float32)


def run_backward(kernel, q, k, v, out, lse, dout, *, mask=None, kv_lens=None, cu_seqlens_q=None, cu_seqlens_k=None,
                 max_seqlen_q=None, max_seqlen_k=None, inputs=None):
    """(dq, dk, dv) of `kernel`'s attention (Kernel.backward's contract), in q's framework, on
    the caller's current stream. `inputs`: the expression inputs by name, checked as the forward's
    (args.device_inputs); a read out of an input's bounds is reported as the forward's. With `grad`
    inputs (the fast family) a fourth value, {name: f32 gradient of the input's shape}."""
    from ...runtime.blockmask import BlockMask, check_against, mask_keys
    from ...runtime.inputs import call_extents, input_shape
    from ...runtime.launch import resolve
    from . import args as cuda_args
    from .devices import cupy_module
    from .kernel import _allocator, _as_tensor, _contiguous, _launch_stream, _row_major, _stream_getter
    from .launch import error_flags, pending, raise_pending
    from .tensor_maps import TensorMapEncoder, tma_layout_problem
    plan = kernel.plan
    found = backward_problems(plan)
    if found:
        raise LaunchError(f"kernel '{plan.spec.name}' has no backward on the cuda target: "
                          + "; ".join(p.message for p in found))
    if pending():
        raise_pending()
    named = {name: _as_tensor(name, x) for name, x in (("q", q), ("k", k), ("v", v))}
    devices = {t.device for t in named.values()}
    if len(devices) > 1:
        raise LaunchError("q, k and v are on different GPUs: " + ", ".join(f"{n} on {t.device}" for n, t in named.items()))
    dev = named["q"].device
    # integer inputs are read on the host (a device array is copied there) and checked by the forward's rules
    launch = resolve(plan, {n: t.shape for n, t in named.items()}, {n: t.dtype for n, t in named.items()},
                     kv_lens=kv_lens, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                     has_mask=mask is not None, cores=1, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                     mask_keys=None if mask is None else mask_keys(mask))
    packed = launch.layout == "packed"
    out_shape, lse_shape = launch.out_shape_for(plan.d_v), launch.lse_shape
    for name, x, shape, dtype in (("out", out, out_shape, plan.dtype), ("dout", dout, out_shape, plan.dtype),
                                  ("lse", lse, lse_shape, "f32")):
        t = _as_tensor(name, x)
        if tuple(t.shape) != tuple(shape) or t.dtype != dtype:
            raise LaunchError(f"{name} must have shape {tuple(shape)} and dtype {dtype} (the forward call's "
                              f"{'output' if name != 'lse' else 'lse'}{' gradient' if name == 'dout' else ''}), "
                              f"got {tuple(t.shape)} {t.dtype}")
        if t.device != dev:
            raise LaunchError(f"{name} is on GPU {t.device}, q on GPU {dev}")
        named[name] = t
    q_maps = family(plan) == "wgmma"  # the fast family reads Q and dO through tensor maps (tensor_maps.py)
    for name in list(named):  # the kernels read rows with a contiguous last dimension
        t = named[name]
        if t.shape[-1] > 1 and t.strides[-1] != 1:
            named[name] = _contiguous(name, t)
        elif q_maps and name in ("q", "dout") and (t.ptr % 16 or tma_layout_problem(
                _map_view(t, packed)[0], _map_view(t, packed)[1], plan.dtype) is not None):
            named[name] = _contiguous(name, t)  # the maps' strides: multiples of 16 bytes, an aligned address
    bm = None
    if mask is not None:
        bm = mask if isinstance(mask, BlockMask) else cuda_args.build_block_mask(mask, plan.tile_q, plan.tile_kv, dev)
        check_against(bm, launch.batch, launch.heads_q, launch.len_q, launch.mask_lk, plan.tile_q, plan.tile_kv,
                      "cuda")
    expr_keep = []
    if plan.spec.inputs or inputs:
        ptrs, expr_keep, _ = cuda_args.device_inputs(plan.spec, inputs or {}, launch, dev,
                                                     f"kernel '{plan.spec.name}' (cuda) backward")
    fam = family(plan)
    fast, accum = fam == "wgmma", fam != "fma"  # (accum: dQ's f32 accumulator, added into by atomics)
    tq, kind = named["q"], named["q"].kind
    alloc = {name: _allocator(kind, dev, named[src].shape, plan.dtype, tq.dtype)
             for name, src in (("dq", "q"), ("dk", "k"), ("dv", "v"))}
    grads = {name: f(q) for name, f in alloc.items()}
    input_grads = {i.name: _zeroed_f32(kind, dev, input_shape(i, call_extents(launch)))
                   for i in plan.spec.inputs if i.grad}
    part_words = {} if not partials(plan) else expr_grads.partial_words(
        plan.spec, {n: tuple(t.shape) for n, t in input_grads.items()},
        math.ceil(named["k"].shape[1] / backward_config(plan).tile) * launch.heads_kv * launch.batch,
        backward_config(plan).tile, launch.group)  # (inputs: padded batches only)
    expr_grads.check_partials(plan.spec.name, part_words)
    part_bufs = {n: _zeroed_f32(kind, dev, (w,)) for n, w in part_words.items()}
    delta = _allocator(kind, dev, lse_shape, "f32", tq.dtype)(q)
    dq_accum = _allocator(kind, dev, named["q"].shape, "f32", tq.dtype)(q) if accum else None
    keep = [named, grads, delta, dq_accum, bm, expr_keep, input_grads, part_bufs]
    a = _Args()
    for name in ("q", "k", "v", "out", "dout", "lse"):
        setattr(a, name, named[name].ptr)
    for name, g in grads.items():
        setattr(a, name, _as_tensor(name, g).ptr)
    a.delta = _as_tensor("delta", delta).ptr
    a.dq_accum = _as_tensor("dq_accum", dq_accum).ptr if accum else 0
    for prefix, name in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "out"), ("do", "dout")):
        for axis, st in zip("blh", _strides3(named[name], packed)):
            setattr(a, f"{prefix}_s{axis}", st)
    for name, src in (("dq", "q"), ("dk", "k"), ("dv", "v")):
        strides = _row_major(named[src].shape)
        for axis, st in zip("blh", (0, *strides[:2]) if packed else strides[:3]):
            setattr(a, f"{name}_s{axis}", st)
    lse_t = named["lse"]
    a.lse_sb, a.lse_sh, a.lse_sl = (0, *lse_t.strides) if packed else lse_t.strides
    d_strides = _row_major(lse_shape)
    a.delta_sb, a.delta_sh = (0, d_strides[0]) if packed else d_strides[:2]
    a.len_q, a.len_k, a.group = launch.len_q, launch.len_k, launch.group
    a.rows_q = launch.total_q if packed else launch.len_q
    a.rows_k = 0 if packed else named["k"].shape[1]
    cupy = cupy_module()
    with cupy.cuda.Device(dev), _launch_stream(kind, dev):
        ints = {}
        if packed:
            ints["cu_seqlens_q"] = launch.cu_seqlens_q
            ints["cu_seqlens_k"] = launch.cu_seqlens_k if launch.cu_seqlens_k is not None else launch.cu_seqlens_q
        elif launch.kv_lens is not None:
            ints["kv_lens"] = launch.kv_lens
        for name, host in ints.items():
            arr = cupy.asarray(np.ascontiguousarray(host, dtype=np.int32))
            keep.append(arr)
            setattr(a, name, arr.data.ptr)
        if bm is not None:
            values = cuda_args.mask_values(bm, dev)
            for name in ("mask_bits", "mask_add", "mask_counts", "mask_tiles"):
                setattr(a, name, 0 if values[name] is None else values[name].data.ptr)
            for name in ("mask_sb", "mask_sh", "mask_sl", "list_sb", "list_sh", "n_kvtiles"):
                setattr(a, name, int(values[name]))
            if fast:
                derived = f"cuda_backward_blocks_{block_keys(plan)}"  # built once per BlockMask and block size
                if derived not in bm.derived:
                    bm.derived[derived] = _key_block_lists(bm, cupy, block_keys(plan))
                block_counts, lists, a.blist_sb, a.blist_sh, a.n_steps = bm.derived[derived]
                keep += [block_counts, lists]
                a.block_counts, a.block_lists = block_counts.data.ptr, lists.data.ptr
        fns = _functions(kernel, dev)
        stream = _stream_getter(kind, dev)()
        nb = 1 if packed else launch.batch
        rows_grid = (math.ceil(a.rows_q / PRE_ROWS), launch.heads_q, nb)
        key_rows = launch.len_k if packed else a.rows_k
        if fast:
            grids = (("preprocess", rows_grid, 0),
                     ("dkdv", (math.ceil(key_rows / block_keys(plan)), launch.heads_kv, launch.batch),
                      fast_smem_bytes(plan)),
                     ("dq", rows_grid, 0))
        elif fam == "mma":
            grids = (("preprocess", rows_grid, 0),
                     ("dkdv", (math.ceil(key_rows / backward_mma.KEYS), launch.heads_kv, launch.batch),
                      _dkdv_smem(plan)),
                     ("dq", rows_grid, 0))
        else:
            cfg = backward_config(plan)
            grids = (("preprocess", rows_grid, 0),
                     ("dkdv", (math.ceil(key_rows / cfg.tile), launch.heads_kv, launch.batch), cfg.smem_bytes),
                     ("dq", (math.ceil(launch.len_q / cfg.tile), launch.heads_q, launch.batch), cfg.smem_bytes))
            if part_bufs:  # then the partial sums added up, threads striding over the gradients' entries
                grids += (("grads", (expr_grads.SUM_BLOCKS, 1, 1), 0),)
        params = (ctypes.c_void_p * 1)(ctypes.addressof(a))
        # the score's inputs: the last parameter of the dK/dV and dQ steps (the fast family's dQ step
        # only converts)
        expr_in = _expr_inputs(plan.spec, ptrs, launch, error_flags(cupy, dev).ptr,
                               getattr(kernel, "_site0", 0)) if plan.spec.inputs else None
        keep.append(expr_in)  # (its memory is the launches' parameter until they are queued)
        ein = () if expr_in is None else (ctypes.addressof(expr_in),)
        if input_grads:  # (the dK/dV step alone adds into them, in both families)
            g = type("ExprGrads", (ctypes.Structure,), {"_fields_": [
                (n, ctypes.c_uint64) for n in expr_grads.fields(plan.spec, atomic=fast)]})()
            for n, t in {**input_grads, **part_bufs}.items():
                setattr(g, n, _as_tensor(n, t).ptr)
            keep.append(g)
        params_dq = params if accum else (ctypes.c_void_p * (1 + len(ein)))(ctypes.addressof(a), *ein)
        params_dkdv = params_dq
        if input_grads and not fast:  # the deterministic family: ExprGrads after the inputs, dK/dV only
            params_dkdv = (ctypes.c_void_p * (2 + len(ein)))(ctypes.addressof(a), *ein, ctypes.addressof(g))
        if fast:  # dkdv adds dQ into its accumulator through a tensor map (tensor_maps.py)
            dq_map = TensorMapEncoder("dq_accum", (1, *named["q"].shape) if packed else tuple(named["q"].shape),
                                      (0, *_row_major(named["q"].shape)) if packed else _row_major(named["q"].shape),
                                      "f32", WGMMA_ROWS, box_cols=32)
            keep.append(dq_map)
            maps = [dq_map.encode(a.dq_accum)]
            for name in ("q", "dout"):  # Q_i and dO_i: boxes of 64 columns x a step's rows
                enc = TensorMapEncoder(name, *_map_view(named[name], packed), plan.dtype,
                                       WGMMA_ROWS if wide(plan) else wgmma_rows(plan))
                keep.append(enc)
                maps.append(enc.encode(named[name].ptr))
            extra = ein + ((ctypes.addressof(g),) if input_grads else ())
            params_dkdv = (ctypes.c_void_p * (1 + len(maps) + len(extra)))(ctypes.addressof(a), *maps, *extra)
        additive = split_additive(plan) and bm is not None and bm.kind == "additive"
        for step, grid, smem in grids:
            if min(grid) <= 0:
                continue
            chosen = {"dkdv": params_dkdv, "grads": params_dkdv, "dq": params_dq}.get(step, params)
            fn = fns["dkdv_add" if step == "dkdv" and additive else step]
            cupy.cuda.driver.launchKernel(fn.ptr, *grid, THREADS, 1, 1, smem, stream,
                                          ctypes.addressof(chosen), 0)
    del keep  # (the launches are queued; torch's and CuPy's allocators order later reuse on the stream)
    if input_grads:
        return grads["dq"], grads["dk"], grads["dv"], input_grads
    return grads["dq"], grads["dk"], grads["dv"]
