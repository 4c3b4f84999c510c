"""Masks over inputs on the CUDA target (issue 42): a generated kernel writes the mask, and the
BlockMask is made from it as from a mask tensor (args.build_block_mask).

    kernel = attngen.compile(spec, target="cuda")   # spec: `mask k <= q && doc[b, q] == doc[b, k]`
    out = kernel(q, k, v, doc=doc)                  # the BlockMask built (or reused), then the kernel
    bm = kernel.block_mask(q, k, doc=doc)           # the same BlockMask, to pass as mask= later
    dq, dk, dv = kernel.backward(q, k, v, out, lse, dout, doc=doc)  # the same BlockMask, reused

The builder (`builder_source`, one source per spec: it does not depend on the tiles) holds the
mask expression as `mask_expr(in, b, h, hkv, q, k, Lq, Lk)`, rendered by expr.py with each
input read replaced by a call of its loader, `in_NAME(in, site, i0, ...)`: every index tested
against its axis (a read out of bounds gives 0 and writes its site, 1.. in walk order, into
in.flag); one thread per element of the (Bm, Hm, Lq, Lk) mask writes 1 where the key is within
its sequence (kv_lens) and the expression holds. The mask reads only integer and boolean inputs
(i32 as int, u8 and bool as bytes). The attention kernel is the spec with `mask custom`
(attngen/plan/mask_inputs.py); `MaskInputsKernel` puts the two together, with the cache of the
last BlockMask (mask_inputs.signature: the inputs' bytes are read on the host for the digest).
The bits path of index-only mask expressions (expr_bits.py) runs the same builder and cache on
an expression that reads no input.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ...errors import LaunchError
from ...lang.expr import Load, Var, format_expr, walk
from ...limits import MAX_GRID_X
from ...plan import mask_inputs
from ...runtime.blockmask import BlockMask
from ...runtime.kernel import Kernel
from . import expr as cuda_expr

ENTRY = "attngen_mask_fill"
THREADS = 256
_C_INPUT = {"i32": "int", "u8": "unsigned char", "bool": "unsigned char"}
_EXTENT = {"b": "in.batch", "h": "in.heads_q", "hkv": "in.heads_kv", "q": "in.len_q", "k": "in.cap"}
_FN = "__host__ __device__ __forceinline__"
# the attention kernel's options besides mask and kv_lens (CudaKernel.__call__); any other keyword is an input
_OPTIONS = ("cu_seqlens_q", "cu_seqlens_k", "block_table", "k_new", "v_new", "return_lse", "out", "max_seqlen_q",
            "max_seqlen_k", "check")


def sites(spec) -> list:
    """Every input read (Load) of the mask expression, in walk order: site n (from 1) is the n-th."""
    return [n for n in walk(spec.mask.expr) if isinstance(n, Load)]


def _with_calls(e, site_of: dict):
    """`e` with each Load replaced by a name that renders as its loader's call (indices first)."""
    if isinstance(e, Load):
        args = ", ".join(cuda_expr.render(_with_calls(i, site_of)) for i in e.indices)
        return Var(f"in_{e.input}(in, {site_of[id(e)]}, {args})", e.type)
    fields = {}
    for name in ("x", "a", "b"):
        if hasattr(e, name):
            fields[name] = _with_calls(getattr(e, name), site_of)
    if hasattr(e, "args"):
        fields["args"] = tuple(_with_calls(x, site_of) for x in e.args)
    return replace(e, **fields) if fields else e


def _loader(inp) -> str:
    n = len(inp.axes)
    ext = [_EXTENT[a] if isinstance(a, str) else str(a) for a in inp.axes]
    bounds = " || ".join(f"i{d} < 0 || i{d} >= {x}" for d, x in enumerate(ext))
    flat = "(long long)i0"
    for d in range(1, n):
        flat = f"({flat}) * {ext[d]} + i{d}"
    read = f"in.{inp.name}[{flat}]"
    value = {"i32": read, "u8": f"(int){read}", "bool": f"{read} != 0"}[inp.dtype]
    t = "bool" if inp.dtype == "bool" else "int"
    return (f"// input {inp.name}[{', '.join(map(str, inp.axes))}] {inp.dtype}, row-major; an index out of its axis "
            "reads 0 (false) and flags the build\n"
            f"{_FN} {t} in_{inp.name}(const MaskInputs& in, int site, {', '.join(f'int i{d}' for d in range(n))}) {{\n"
            f"    if ({bounds}) {{\n"
            "        *in.flag = site;\n"
            f"        return {'false' if t == 'bool' else '0'};\n"
            "    }\n"
            f"    return {value};\n"
            "}\n")


def builder_source(spec) -> str:
    """The builder kernel of `spec` (a mask expression over inputs): CUDA C++, no headers."""
    read = mask_inputs.mask_inputs(spec)
    e = spec.mask.expr
    site_of = {id(load): n for n, load in enumerate(sites(spec), 1)}
    fields = "".join(f"    const {_C_INPUT[i.dtype]}* {i.name};  // input {i.name} ({i.dtype})\n" for i in read)
    params = "".join(f", const {_C_INPUT[i.dtype]}* {i.name}" for i in read)
    names = "".join(f", {i.name}" for i in read)
    helpers = "".join(h + "\n" for h in cuda_expr.helpers_of(e)) + "".join(_loader(i) + "\n" for i in read)
    why = ("built on the GPU from its inputs (issue 42).", "The expression reads inputs, so its tiles cannot be "
           "classified before the call: this kernel") if read else (
        "evaluated once per call signature (issue 42).", "It reads indices only. On the bits path (mask_expr=bits, "
        "or auto where most of its live\n// tiles are partial: attngen/plan/expr_bits.py) this kernel")
    return f"""\
// =================================================================================================
// attngen: the mask of kernel '{spec.name}', {why[0]}
//     mask {format_expr(e)}
// {why[1]}
// evaluates it on every (row, key) of each (mask batch, mask head) slice into a byte mask
// (Bm, Hm, Lq, Lk), from which the runtime makes the BlockMask (tile lists and bit words) that
// the attention kernel (the same spec with `mask custom`) reads. One thread per element.
// =================================================================================================

// The call's extents (the loaders bound their indices by them) and the inputs the mask reads.
struct MaskInputs {{
    int batch, heads_q, heads_kv, len_q, cap;
    int* flag;  // a read out of an input's bounds writes its site here (0: none)
{fields}}};

{helpers}// mask {format_expr(e)}
{_FN} bool mask_expr(const MaskInputs& in, int b, int h, int hkv, int q, int k, int Lq, int Lk) {{
    return {cuda_expr.render(_with_calls(e, site_of))};
}}

// Element e of the mask (slice, row, key): its key within the sequence (kv_lens: each sequence's
// keys, cap for all where the call has no kv_lens) and the expression true.
{_FN} bool mask_element(const MaskInputs& in, long long e, int mask_heads, const int* kv_lens) {{
    const long long per_slice = (long long)in.len_q * in.cap;
    const int slice = (int)(e / per_slice);
    const int row = (int)((e % per_slice) / in.cap);
    const int key = (int)(e % in.cap);
    const int b = slice / mask_heads;
    const int h = slice % mask_heads;
    const int lk = kv_lens[b];
    if (key >= lk) {{
        return false;  // past the sequence's keys: the expression is not evaluated there
    }}
    return mask_expr(in, b, h, h / (in.heads_q / in.heads_kv), row, key, in.len_q, lk);
}}

extern "C" __global__ void {ENTRY}(unsigned char* __restrict__ mask, long long elements, int mask_heads,
        const int* kv_lens, int* flag, int batch, int heads_q, int heads_kv, int len_q, int cap{params}) {{
    const MaskInputs in{{batch, heads_q, heads_kv, len_q, cap, flag{names}}};
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < elements;
         e += (long long)gridDim.x * blockDim.x) {{
        mask[e] = mask_element(in, e, mask_heads, kv_lens) ? 1 : 0;
    }}
}}
"""


# ---- the run time (CuPy) -------------------------------------------------------------------------

class MaskInputsKernel(Kernel):
    """A spec whose mask reads inputs, compiled for CUDA: the builder, then `attention` (the
    spec with `mask custom`, a CudaKernel) on the BlockMask, which is kept for the next call
    while the signature is the same (`mask_builds` counts the builds). Expression inputs are
    numpy arrays of their declared dtype (attngen.runtime.inputs; the cache digests their bytes),
    or all CuPy arrays / CUDA PyTorch tensors (checked as the forward's device inputs; the cache
    keys them by address, shape, dtype and PyTorch's version counter: nothing is copied); kv_lens
    a host array."""

    target = "cuda"

    def __init__(self, spec, attention):
        super().__init__(attention.emitted)
        self.spec = spec  # what is computed; self.plan is the attention kernel's (mask custom)
        self.attention = attention
        self.mask_builds = 0
        self._last = None  # (signature, BlockMask) of the last build
        self._modules: dict = {}  # device -> the builder's loaded entry point

    def __call__(self, q, k, v, *, mask=None, kv_lens=None, **options):
        """out (and lse) as the attention kernel's call (docs/variants.md); `mask`: None (built or
        reused) or a BlockMask of block_mask(); the expression inputs by name among `options`."""
        inputs = {n: x for n, x in options.items() if n not in _OPTIONS}
        options = {n: x for n, x in options.items() if n in _OPTIONS}
        v_shape = tuple(v.shape)
        launch, arrays = self._launch(q, k, v_shape, kv_lens, inputs, options)
        return self.attention(q, k, v, mask=self._mask(launch, arrays, q, mask), kv_lens=kv_lens, **options)

    def _mask(self, launch, arrays: dict, q, mask) -> BlockMask:
        """mask= (a BlockMask of block_mask()), or the call's BlockMask, built or reused."""
        if mask is None:
            return self._cached(launch, arrays, q)
        if not isinstance(mask, BlockMask):
            raise LaunchError(f"kernel '{self.spec.name}' has a mask expression: mask= takes only the BlockMask "
                              "of kernel.block_mask(q, k, **inputs), not a mask tensor")
        return mask

    def block_mask(self, q, k, kv_lens=None, **inputs) -> BlockMask:
        """The BlockMask of the mask expression for a call with q's and k's shapes, kv_lens and
        the inputs (the kernel's last one where the signature is the same)."""
        launch, arrays = self._launch(q, k, tuple(k.shape[:-1]) + (self.plan.d_v,), kv_lens, inputs, {})
        return self._cached(launch, arrays, q)

    def backward(self, q, k, v, out, lse, dout, *, mask=None, kv_lens=None, **options):
        """(dq, dk, dv) as the attention kernel's backward (docs/backward.md), on the call's BlockMask:
        mask=, or the one of the inputs (the forward's, reused while the signature is the same; the
        builder runs again where it changed). The expression inputs by name, as the call took them."""
        inputs = {n: x for n, x in options.items() if n not in _OPTIONS}
        options = {n: x for n, x in options.items() if n in _OPTIONS}
        launch, arrays = self._launch(q, k, tuple(v.shape), kv_lens, inputs, options)
        return self.attention.backward(q, k, v, out, lse, dout, mask=self._mask(launch, arrays, q, mask),
                                       kv_lens=kv_lens, **options)

    def _launch(self, q, k, v_shape, kv_lens, inputs: dict, options: dict):
        from ...runtime.inputs import check_call_inputs
        from ...runtime.launch import OnDevice, resolve
        from .kernel import _as_tensor
        tq = _as_tensor("q", q)
        shapes = {"q": tuple(q.shape), "k": tuple(k.shape), "v": v_shape}
        shapes.update({n: tuple(options[n].shape) for n in ("k_new", "v_new") if options.get(n) is not None})
        launch = resolve(self.plan, shapes, {n: tq.dtype for n in shapes}, kv_lens=kv_lens, cores=None,
                         has_mask=True, **{n: options.get(n) for n in ("cu_seqlens_q", "cu_seqlens_k", "block_table",
                                                                         "max_seqlen_q", "max_seqlen_k")})
        if isinstance(launch.kv_lens, OnDevice):
            raise LaunchError(f"kernel '{self.spec.name}' (cuda): kv_lens is on the GPU, but the mask over inputs "
                              "is built from each sequence's keys on the host (its cache): pass kv_lens as a numpy "
                              "array")
        who = f"kernel '{self.spec.name}' (cuda)"
        if inputs and all(_on_gpu(x) for x in inputs.values()):  # no copy: cached by address and version
            from .args import device_inputs
            ptrs, keep, _ = device_inputs(self.spec, inputs, launch, _device_of(q), who)  # (checks every input)
            return launch, {n: _DeviceInput(x, ptrs[f"input_{n}"], keep) for n, x in inputs.items()}
        arrays = check_call_inputs(self.spec, {n: _on_host(x) for n, x in inputs.items()}, launch, who)
        return launch, arrays

    def _cached(self, launch, arrays: dict, q) -> BlockMask:
        sig = mask_inputs.signature(launch, arrays, self.spec,
                                    identity=(lambda a: a.identity()) if any(
                                        isinstance(a, _DeviceInput) for a in arrays.values()) else None)
        if self._last is not None and self._last[0] == sig:
            return self._last[1]
        bm = self._build(launch, arrays, _device_of(q))
        self._last = (sig, bm, arrays)  # (the arrays: a device input's memory stays its own while cached)
        self.mask_builds += 1
        return bm

    def _function(self, device: int):
        fn = self._modules.get(device)
        if fn is None:
            from ...resources import generator_version
            from ...runtime.cache import cache_key, cached
            from . import nvrtc
            from .args import _cupy
            cupy = _cupy()
            source = builder_source(self.spec)
            arch = self.plan.details.arch
            key = cache_key(builder=source, arch=arch, generator=generator_version(), **nvrtc.key_extra())
            cubin, _ = cached(key, ".cubin", lambda: nvrtc.compile_cubin(source, arch)[0])
            with cupy.cuda.Device(device):
                module = cupy.cuda.function.Module()
                module.load(cubin)
                fn = self._modules[device] = (module, module.get_function(ENTRY))
        return fn[1]

    def _build(self, launch, arrays: dict, device: int) -> BlockMask:
        """Run the builder on `device` and make the BlockMask (args.build_block_mask; synchronises)."""
        from .args import _cupy, build_block_mask
        cupy = _cupy()
        bm_b, bm_h = mask_inputs.slices(self.spec, launch.batch, launch.heads_q, launch.kv_lens is not None)
        shape = (bm_b, bm_h, launch.len_q, launch.len_k)
        elements = int(np.prod(shape))
        with cupy.cuda.Device(device):
            mask = cupy.empty(shape, cupy.uint8)
            flag = cupy.zeros(1, cupy.int32)
            lens = cupy.asarray(np.asarray(launch.seq_lens_k(), np.int64).astype(np.int32))
            dev_inputs = [np.uint64(arrays[i.name].ptr) if isinstance(arrays[i.name], _DeviceInput) else
                          cupy.asarray(arrays[i.name].view(np.uint8) if i.dtype == "bool" else arrays[i.name])
                          for i in mask_inputs.mask_inputs(self.spec)]
            blocks = max(1, min(-(-elements // THREADS), MAX_GRID_X))  # a grid-stride loop does the rest
            self._function(device)((blocks,), (THREADS,), (
                mask, np.int64(elements), np.int32(bm_h), lens, flag, np.int32(launch.batch),
                np.int32(launch.heads_q), np.int32(launch.heads_kv), np.int32(launch.len_q), np.int32(launch.len_k),
                *dev_inputs))
            site = int(flag.get()[0])
            if site:
                load = sites(self.spec)[site - 1]
                raise LaunchError(f"kernel '{self.spec.name}' (cuda): the mask expression read input '{load.input}' "
                                  f"out of its bounds in {format_expr(load)} (at a row and key of the sequence; "
                                  "attngen.reference names the index)")
            return build_block_mask(mask.view(cupy.bool_), self.plan.tile_q, self.plan.tile_kv, device)


class _DeviceInput:
    """A mask input given on the GPU (a CuPy array or a CUDA PyTorch tensor): its contiguous
    address (device_inputs' checks passed) and what identifies its values for the cache: the
    object, its address, shape, dtype and, for PyTorch, the tensor's version counter (bumped by
    every in-place change). The cache holds the object, so its memory is not reused by another
    array while its BlockMask is kept. CuPy arrays have no version: one changed in place keeps its
    BlockMask (docs/variants.md)."""

    def __init__(self, array, ptr: int, keep: list):
        self.array, self.ptr, self.keep = array, ptr, keep

    def identity(self) -> tuple:
        a = self.array
        return (id(a), self.ptr, tuple(a.shape), str(a.dtype), getattr(a, "_version", None))


def _on_gpu(x) -> bool:
    mod = type(x).__module__.split(".")[0]
    return mod == "cupy" or (mod == "torch" and getattr(x, "is_cuda", False))


def _on_host(x):
    """A mask input as a numpy array: CuPy arrays and CUDA PyTorch tensors are copied to the host
    (a synchronisation), for the checks and the cache's digest of their values; anything else as
    given (check_call_inputs names what it is not)."""
    mod = type(x).__module__.split(".")[0]
    if mod == "cupy":
        return x.get()
    if mod == "torch" and getattr(x, "is_cuda", False):
        return x.detach().cpu().numpy()
    return x


def _device_of(q) -> int:
    """The GPU of q (a CuPy array or a CUDA PyTorch tensor)."""
    mod = type(q).__module__.split(".")[0]
    if mod == "torch":
        return q.device.index
    return q.device.id
