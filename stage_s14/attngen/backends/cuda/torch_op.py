"""A compiled CUDA kernel as a PyTorch operator (attngen.torch.operator; docs/torch.md).

The kernel is registered with torch.library.custom_op as `attngen::<name>` (one operator per
compiled plan) with a fake implementation that gives the outputs' shapes, so torch.compile
traces a call without a graph break and a CUDA graph captures its launches. The real
implementation is the kernel's own call: outputs and workspaces come from torch's caching
allocator, the launches go to torch's current stream, nothing is copied to the host. Calls that
append (k_new / v_new) use a second operator that declares k and v mutated.
"""

from __future__ import annotations

import re
import threading
import typing

from ...errors import LaunchError

_OPS: dict = {}  # operator name -> TorchOperator
_LOCK = threading.Lock()


def _torch():
    try:
        import torch
    except ImportError:
        raise LaunchError("attngen.torch needs PyTorch (pip install torch)") from None
    if not hasattr(torch, "library") or not hasattr(torch.library, "custom_op"):
        raise LaunchError(f"attngen.torch needs PyTorch 2.4 or newer (torch.library.custom_op); this is "
                          f"{torch.__version__}")
    return torch


def _compiling() -> bool:
    """Whether torch.compile is tracing this call (then the registered operator goes in the graph)."""
    import torch
    return torch.compiler.is_compiling()


class TorchOperator:
    """Call it like the kernel (q, k, v and the integer options as CUDA tensors); `op` /
    `append_op` are the registered operators (torch.ops.attngen.<name>). Under torch.compile a
    call is the operator; run eagerly it is the kernel's own call (the same function and
    buffers, without the dispatcher's per-call cost)."""

    def __init__(self, kernel, name: str):
        self.kernel, self.name = kernel, name
        if kernel.spec.mask.is_custom:
            raise LaunchError(f"attngen.torch: kernel '{kernel.spec.name}' has `mask custom`, whose BlockMask is "
                              "not a tensor an operator can take; call the kernel itself (docs/torch.md)")
        if kernel.spec.kv_dtype is not None:
            raise LaunchError(f"attngen.torch: kernel '{kernel.spec.name}' reads a quantized cache (kv_dtype "
                              f"{kernel.spec.kv_dtype}), whose k_scale / v_scale the operator does not take yet "
                              "(issue 44); call the kernel itself: kernel(q, k, v, k_scale=..., v_scale=..., ...)")
        if kernel.spec.inputs:
            raise LaunchError(f"attngen.torch: kernel '{kernel.spec.name}' reads expression inputs "
                              f"({', '.join(i.name for i in kernel.spec.inputs)}), which the operator does not take "
                              "yet (issue 42); call the kernel itself: kernel(q, k, v, name=tensor, ...)")
        torch = _torch()
        self.op = _register(torch, kernel, name, append=False)
        self._append_op = None

    @property
    def append_op(self):
        if self._append_op is None:
            self._append_op = _register(_torch(), self.kernel, self.name + "_append", append=True)
        return self._append_op

    def __call__(self, q, k, v, *, kv_lens=None, cu_seqlens_q=None, cu_seqlens_k=None, block_table=None,
                 k_new=None, v_new=None, max_seqlen_q=None, max_seqlen_k=None, return_lse=False):
        import torch
        grad = torch.is_grad_enabled() and any(getattr(x, "requires_grad", False) for x in (q, k, v))
        if grad and k_new is None and v_new is None:
            # autograd: the registered operator (its backward is kernel.backward), with the lse it needs
            ms_q = -1 if max_seqlen_q is None else max_seqlen_q
            ms_k = -1 if max_seqlen_k is None else max_seqlen_k
            out, lse = self.op(q, k, v, kv_lens, cu_seqlens_q, cu_seqlens_k, block_table, ms_q, ms_k, True)
            return (out, lse) if return_lse else out
        if not _compiling():  # eager (a CUDA graph capture too): the kernel's call, without the dispatcher's cost
            return self.kernel(q, k, v, kv_lens=kv_lens, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                               block_table=block_table, k_new=k_new, v_new=v_new, max_seqlen_q=max_seqlen_q,
                               max_seqlen_k=max_seqlen_k, return_lse=return_lse)
        ms_q = -1 if max_seqlen_q is None else max_seqlen_q
        ms_k = -1 if max_seqlen_k is None else max_seqlen_k
        if k_new is not None or v_new is not None:
            out, lse = self.append_op(q, k, v, kv_lens, cu_seqlens_q, cu_seqlens_k, block_table, ms_q, ms_k,
                                      bool(return_lse), k_new, v_new)
        else:
            out, lse = self.op(q, k, v, kv_lens, cu_seqlens_q, cu_seqlens_k, block_table, ms_q, ms_k,
                               bool(return_lse))
        return (out, lse) if return_lse else out

    def __repr__(self) -> str:
        return f"<attngen.torch operator attngen::{self.name} of {self.kernel!r}>"


def _shapes(kernel, q, return_lse: bool):
    """The outputs' shapes of a call with queries q (padded (B, Lq, Hq, D) or packed (T, Hq, D))."""
    d_v = kernel.plan.d_v
    if q.dim() == 3:
        t, h = q.shape[0], q.shape[1]
        return (t, h, d_v), ((h, t) if return_lse else (0,))
    b, lq, h = q.shape[0], q.shape[1], q.shape[2]
    return (b, lq, h, d_v), ((b, h, lq) if return_lse else (0,))


def _register(torch, kernel, name: str, append: bool):
    """torch.library.custom_op `attngen::<name>`: (out, lse) of the kernel's call (lse has shape
    (0,) unless return_lse); the append variant takes k_new, v_new and mutates k and v."""
    with _LOCK:
        if name in _OPS:
            return _OPS[name]

        def run(q, k, v, kv_lens, cu_seqlens_q, cu_seqlens_k, block_table, max_seqlen_q, max_seqlen_k,
                return_lse, k_new=None, v_new=None):
            res = kernel(q, k, v, kv_lens=kv_lens, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                         block_table=block_table, k_new=k_new, v_new=v_new, return_lse=return_lse,
                         max_seqlen_q=None if max_seqlen_q < 0 else max_seqlen_q,
                         max_seqlen_k=None if max_seqlen_k < 0 else max_seqlen_k)
            return res if return_lse else (res, q.new_empty((0,), dtype=torch.float32))

        def fake(q, return_lse):
            out_shape, lse_shape = _shapes(kernel, q, return_lse)
            return q.new_empty(out_shape), q.new_empty(lse_shape, dtype=torch.float32)

        # the operator's schema comes from these annotations (strings under `from __future__ import
        # annotations`: resolved below with the names they use; Tensor, Optional, Tuple are not
        # imported at module level, where torch may be missing)
        if append:
            def impl(q: Tensor, k: Tensor, v: Tensor, kv_lens: Optional[Tensor],
                     cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
                     block_table: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int, return_lse: bool,
                     k_new: Tensor, v_new: Tensor) -> Tuple[Tensor, Tensor]:
                return run(q, k, v, kv_lens, cu_seqlens_q, cu_seqlens_k, block_table, max_seqlen_q, max_seqlen_k,
                           return_lse, k_new, v_new)

            def impl_fake(q, k, v, kv_lens, cu_seqlens_q, cu_seqlens_k, block_table, max_seqlen_q, max_seqlen_k,
                          return_lse, k_new, v_new):
                return fake(q, return_lse)
            mutates = ("k", "v")
        else:
            def impl(q: Tensor, k: Tensor, v: Tensor, kv_lens: Optional[Tensor],
                     cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
                     block_table: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
                     return_lse: bool) -> Tuple[Tensor, Tensor]:
                return run(q, k, v, kv_lens, cu_seqlens_q, cu_seqlens_k, block_table, max_seqlen_q, max_seqlen_k,
                           return_lse)

            def impl_fake(q, k, v, kv_lens, cu_seqlens_q, cu_seqlens_k, block_table, max_seqlen_q, max_seqlen_k,
                          return_lse):
                return fake(q, return_lse)
            mutates = ()
        names = {"Tensor": torch.Tensor, "Optional": typing.Optional, "Tuple": typing.Tuple,
                 "int": int, "bool": bool}
        impl.__annotations__ = {n: eval(t, names) for n, t in impl.__annotations__.items()}  # noqa: S307
        op = torch.library.custom_op(f"attngen::{name}", mutates_args=mutates, device_types="cuda")(impl)
        op.register_fake(impl_fake)
        if not append:
            _differentiable(torch, kernel, name, op)
        _OPS[name] = op
        return op


def _differentiable(torch, kernel, name: str, op) -> None:
    """register_autograd of the operator: dq, dk, dv through `attngen::<name>_backward`
    (kernel.backward, docs/backward.md); lse and the integer inputs get no gradient. A call
    that asks for gradients computes lse (TorchOperator.__call__ passes return_lse=True)."""
    def impl(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dout: Tensor, kv_lens: Optional[Tensor],
             cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor], max_seqlen_q: int,
             max_seqlen_k: int) -> Tuple[Tensor, Tensor, Tensor]:
        if lse.numel() == 0:
            raise LaunchError(f"attngen.torch: the backward of {name} needs the forward's lse (call with "
                              "return_lse=True, or through TorchOperator, which asks for it under autograd)")
        grads = kernel.backward(q, k, v, out, lse, dout, kv_lens=kv_lens, cu_seqlens_q=cu_seqlens_q,
                                cu_seqlens_k=cu_seqlens_k, max_seqlen_q=None if max_seqlen_q < 0 else max_seqlen_q,
                                max_seqlen_k=None if max_seqlen_k < 0 else max_seqlen_k)
        return tuple(g.contiguous() for g in grads)

    def impl_fake(q, k, v, *rest):
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    names = {"Tensor": torch.Tensor, "Optional": typing.Optional, "Tuple": typing.Tuple, "int": int}
    impl.__annotations__ = {n: eval(t, names) for n, t in impl.__annotations__.items()}  # noqa: S307
    backward = torch.library.custom_op(f"attngen::{name}_backward", mutates_args=(), device_types="cuda")(impl)
    backward.register_fake(impl_fake)

    def setup(ctx, inputs, output):
        q, k, v, kv_lens, cu_q, cu_k, block_table, ms_q, ms_k, _ = inputs
        if block_table is not None:
            raise LaunchError("attngen.torch: a paged cache (block_table) has no backward")
        ctx.save_for_backward(q, k, v, output[0], output[1], kv_lens, cu_q, cu_k)
        ctx.ms = (ms_q, ms_k)
        ctx.mark_non_differentiable(output[1])

    def grad(ctx, dout, _dlse):
        q, k, v, out, lse, kv_lens, cu_q, cu_k = ctx.saved_tensors
        dq, dk, dv = backward(q, k, v, out, lse, dout.contiguous(), kv_lens, cu_q, cu_k, *ctx.ms)
        return dq, dk, dv, None, None, None, None, None, None, None

    torch.library.register_autograd(op, grad, setup_context=setup)


def operator_name(kernel, key: str) -> str:
    """<spec name>_<first 12 hex digits of the kernel's cache key `key`>: one per compiled plan."""
    base = re.sub(r"\W", "_", kernel.spec.name) or "kernel"
    return f"{base}_{key[:12]}"


__all__ = ["TorchOperator", "operator_name"]
