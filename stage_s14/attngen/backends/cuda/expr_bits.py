"""Index-only mask expressions evaluated once into bits on the CUDA target (issue 42).

    kernel = attngen.compile(spec, target="cuda")  # spec: `mask abs(q // 64 - k // 64) <= 7 && ...`
    out = kernel(q, k, v)                          # inline, or the BlockMask built (or reused) and mask custom

A spec whose mask is an index-only expression compiles to its own kernel (*inline*: partial
tiles evaluate the expression per element) and, unless `target cuda { mask_expr=inline }`, to a
`MaskBitsKernel` around it that may run a call on the *bits* path instead: the block-mask
builder of masks over inputs (expr_blockmask.py; here it reads no input) evaluates the
expression once per call signature (the extents and kv_lens: nothing else changes the mask)
into a BlockMask, and the spec with `mask custom` (compiled at the first such call) runs on it,
its partial tiles testing staged bits. Which path a call takes (`path`):

- inline where the bits path cannot serve the call: the spec with `mask custom` does not plan
  with the spec's options (producer=on with tile kv above 128: `unplanned_reason`), packed
  sequences (cu_seqlens), k_new /
  v_new, kv_lens on the GPU (the builder reads each sequence's keys on the host), a mask of more
  than attngen.plan.expr_bits.MAX_ELEMENTS elements, a call captured into a CUDA graph before
  its signature's mask is built (a build reads the host); paged caches never get this kernel;
- else `mask_expr=bits`: bits; `auto`: attngen.plan.expr_bits.prefers_bits at the call's
  lengths and the inline kernel's tiles (most live tiles partial, at least MIN_PAIRS pairs).

The decision depends on the call's shapes and options only (and on a capture, before the first
build), so a backward takes the path its forward took (on bits: the custom-mask backward with the
same BlockMask, the last one built, which is kept). Both paths compute the same function: a
forward captured inline and a backward on bits agree too.
"""

from __future__ import annotations

import dataclasses

from ...plan import expr_bits, mask_inputs
from ...runtime.kernel import Kernel

# options with which the bits path cannot serve a call (the inline kernel takes them)
_INLINE_ONLY = ("cu_seqlens_q", "cu_seqlens_k", "block_table", "k_new", "v_new", "mask")
# decisions kept for padded calls (by shapes and dtype); more distinct shapes start the table again
_PADDED_KEPT = 256


def bits_spec(spec):
    """The bits path's attention kernel: the spec with `mask custom` and the score's inputs
    (mask_inputs.custom_spec), without cuda's mask_expr, which applies to expressions only."""
    custom = mask_inputs.custom_spec(spec)
    targets = {name: {k: v for k, v in opts if (name, k) != ("cuda", "mask_expr")} for name, opts in custom.targets}
    return dataclasses.replace(custom, targets=targets)


class MaskBitsKernel(Kernel):
    """An index-only mask expression on the CUDA target: `inline` (the spec's CudaKernel, whose
    plan, source and manifest this kernel shows) and the bits path (module docstring). `last_path`
    is the path of the last call, forward or backward ("inline" or "bits"), `last_reason` why;
    `mask_builds` counts the builds. Attributes not defined here are the inline kernel's."""

    target = "cuda"

    def __init__(self, inline, compile_bits):
        super().__init__(inline.emitted)
        self.inline = inline
        self.mode = self.spec.options("cuda").get("mask_expr") or "auto"
        self._compile_bits = compile_bits  # () -> the `mask custom` CudaKernel
        self._builder = None  # expr_blockmask.MaskInputsKernel on it: the builder and its BlockMask cache
        self._padded: dict = {}  # (q, k, v shapes, dtype) -> _choose's answer, for calls without kv_lens
        self.last_path, self.last_reason = None, ""
        self._unplanned = ""  # why the `mask custom` kernel does not plan with the spec's options ("": it does)

    def __getattr__(self, name):
        if name == "inline":  # not yet set (in __init__): no recursion
            raise AttributeError(name)
        return getattr(self.inline, name)

    @property
    def mask_builds(self) -> int:
        return self._builder.mask_builds if self._builder is not None else 0

    @property
    def builder(self):
        """The builder with the spec's `mask custom` CudaKernel (`.attention`) and the cache of the
        last BlockMask (expr_blockmask.MaskInputsKernel), compiled when first asked for."""
        if self._builder is None:
            self._builder = self._new_builder()
        return self._builder

    def _new_builder(self):
        from .expr_blockmask import MaskInputsKernel
        return MaskInputsKernel(self.spec, self._compile_bits())

    @property
    def bits(self):
        """The spec with `mask custom` (a CudaKernel)."""
        return self.builder.attention

    def __call__(self, q, k, v, *, mask=None, kv_lens=None, **options):
        """out (and lse) as CudaKernel's call (docs/variants.md), on the call's path (`mask`: the
        inline kernel's, which refuses it: the mask is the expression)."""
        bm = self._bits_mask(q, k, v.shape, mask, kv_lens, options)
        if bm is None:
            return self.inline(q, k, v, mask=mask, kv_lens=kv_lens, **options)
        return self.bits(q, k, v, mask=bm, kv_lens=kv_lens, **options)

    def backward(self, q, k, v, out, lse, dout, *, mask=None, kv_lens=None, **options):
        """(dq, dk, dv) on the path the forward of the same call took (docs/backward.md)."""
        bm = self._bits_mask(q, k, v.shape, mask, kv_lens, options)
        if bm is None:
            return self.inline.backward(q, k, v, out, lse, dout, mask=mask, kv_lens=kv_lens, **options)
        return self.bits.backward(q, k, v, out, lse, dout, mask=bm, kv_lens=kv_lens, **options)

    def prepared(self, q, k, v, *, mask=None, kv_lens=None, **options):
        """CudaKernel.prepared on the call's path (the BlockMask built first where it is bits)."""
        bm = self._bits_mask(q, k, v.shape, mask, kv_lens, options)
        if bm is None:
            return self.inline.prepared(q, k, v, mask=mask, kv_lens=kv_lens, **options)
        return self.bits.prepared(q, k, v, mask=bm, kv_lens=kv_lens, **options)

    def bits_mask(self, q, k, v, *, kv_lens=None):
        """The BlockMask of a padded call with these arguments (built, or the last one reused),
        whatever mask_expr and the rule choose for it: `kernel.bits(q, k, v, mask=kernel.bits_mask(q,
        k, v))` runs the bits path, to time or test it beside `kernel.inline`'s (kv_lens: a host
        array)."""
        from ...runtime.launch import resolve
        from .kernel import _as_tensor
        shapes = {"q": tuple(q.shape), "k": tuple(k.shape), "v": tuple(v.shape)}
        dtype = _as_tensor("q", q).dtype
        launch = resolve(self.plan, shapes, {n: dtype for n in shapes}, kv_lens=kv_lens, cores=None)
        return self.builder._cached(launch, {}, q)

    def compute_units(self) -> int:
        """The current GPU's multiprocessors, as the inline kernel's."""
        return self.inline.compute_units()

    def block_mask(self, mask):
        """As the inline CudaKernel's (attngen.block_mask)."""
        return self.inline.block_mask(mask)

    def torch_operator(self, name: str | None = None):
        """This kernel, both paths, as a PyTorch operator (attngen.torch.operator; docs/torch.md)."""
        from .kernel import kernel_key
        from .torch_op import TorchOperator, operator_name
        return TorchOperator(self, name or operator_name(self, kernel_key(self.plan)))

    def path(self, q, k, v, *, mask=None, kv_lens=None, **options) -> str:
        """"inline" or "bits": the path a call with these arguments takes (no mask is built)."""
        return self._choose(q, k, tuple(v.shape), mask, kv_lens, options)[0]

    def _choose(self, q, k, v_shape: tuple, mask, kv_lens, options: dict):
        """(path, why, launch): the call's path, in words, and its resolved launch (None: not needed)."""
        given = [n for n in _INLINE_ONLY if (mask if n == "mask" else options.get(n)) is not None]
        if given:
            return "inline", f"{given[0]}= given: the bits path takes padded batches without it", None
        from .kernel import _as_tensor
        tq = _as_tensor("q", q)
        shapes = {"q": tuple(q.shape), "k": tuple(k.shape), "v": v_shape}
        if kv_lens is not None:
            return self._decide(shapes, tq.dtype, kv_lens)
        key = (shapes["q"], shapes["k"], v_shape, tq.dtype)
        if key not in self._padded:
            if len(self._padded) >= _PADDED_KEPT:
                self._padded.clear()
            self._padded[key] = self._decide(shapes, tq.dtype, None)
        return self._padded[key]

    def _decide(self, shapes: dict, dtype: str, kv_lens):
        """_choose's answer for a call of these shapes, q's dtype and kv_lens (None, a host array or
        a device one), without the options that make it inline; resolve's errors are the call's."""
        from ...runtime.launch import resolve
        if kv_lens is not None and _on_gpu(kv_lens):
            return "inline", "kv_lens on the GPU: the builder reads each sequence's keys on the host", None
        launch = resolve(self.plan, shapes, {n: dtype for n in shapes}, kv_lens=kv_lens, cores=None)
        if launch.empty or launch.len_k == 0:
            return "inline", "no rows or no keys: nothing to build", None
        slices = mask_inputs.slices(self.spec, launch.batch, launch.heads_q, launch.kv_lens is not None)
        if not expr_bits.fits(slices, launch.len_q, launch.len_k):
            return "inline", (f"the mask would have {expr_bits.elements(slices, launch.len_q, launch.len_k)} "
                              f"elements, above {expr_bits.MAX_ELEMENTS}"), None
        if self.mode == "auto" and not expr_bits.prefers_bits(self.spec.mask.expr, launch.len_q, launch.len_k,
                                                              self.plan.tile_q, self.plan.tile_kv):
            return "inline", "mask_expr=auto: fewer partial than full live tiles, or a short call", None
        return "bits", f"mask_expr={self.mode}", launch

    def _bits_mask(self, q, k, v_shape, mask, kv_lens, options: dict):
        """The call's BlockMask on the bits path (built or reused), or None on the inline path; a
        call captured into a CUDA graph whose mask is not built yet runs inline (a build reads
        the host: the next call outside the capture builds it)."""
        self.last_path, self.last_reason, launch = self._choose(q, k, tuple(v_shape), mask, kv_lens, options)
        if launch is None:
            return None
        if self._builder is None and not self._unplanned:
            from ...errors import SpecError
            try:  # compiled here, where a spec error is a reason to stay inline
                self._builder = self._new_builder()
            except SpecError as e:
                self._unplanned = unplanned_reason(e)
        if self._unplanned:
            self.last_path, self.last_reason = "inline", self._unplanned
            return None
        last = self._builder._last if self._builder is not None else None
        if (last is None or last[0] != mask_inputs.signature(launch, {}, self.spec)) and _captured(q):
            self.last_path, self.last_reason = "inline", "a CUDA graph capture, and the mask is not built yet"
            return None
        return self.builder._cached(launch, {}, q)


def unplanned_reason(error) -> str:
    """Why the bits path is not taken where the spec with `mask custom` does not plan with the
    spec's options (e.g. producer=on with tile kv above 128): the SpecError's first message."""
    first = str(error).splitlines()[0]
    return f"the spec with mask custom does not plan with these options ({first.split(': error: ', 1)[-1]})"


def _on_gpu(x) -> bool:
    """Whether an integer input is a device array (which the kernels read where it is)."""
    mod = type(x).__module__.split(".")[0]
    return mod == "cupy" or (mod == "torch" and getattr(x, "is_cuda", False)) or (
        mod != "torch" and hasattr(x, "__cuda_array_interface__"))


def _captured(q) -> bool:
    """Whether q's framework's current stream on q's GPU is being captured into a CUDA graph."""
    from .expr_blockmask import _device_of
    from .kernel import _as_tensor, _stream_getter
    from .launch import capturing
    return capturing(_stream_getter(_as_tensor("q", q).kind, _device_of(q))())
