"""attngen as an attention implementation of transformers (AttentionInterface).

transformers calls `attention_forward(module, query, key, value, attention_mask, scaling=,
sliding_window=, softcap=, ...)` in every attention layer, with q (B, Hq, Lq, D) and k, v
(B, Hkv, Lk, D), and wants (B, Lq, Hq, Dv) back. The kernel of a call follows from what the
layer passes (heads and head dims from the shapes, dtype from the tensors, the window, softcap
and scale from the arguments) and is compiled once per kind of layer, phase (prefill, or decode:
one query row) and mask (the spec's own, or a run-time tensor), then kept.

The mask: `attention_mask` is what `mask_interface` (registered beside the attention) made. It
is None where the spec's mask says everything (no padding, every key of the cache is a real
token: dynamic caches, or a prefill from an empty cache, whose keys past the prompt are cropped
as transformers' SDPA path crops them); then the kernel's causal(bottom_right) or window mask
skips whole tiles. Anything else (left padding, a static cache's unused rows, packed sequences,
masks transformers combines for a model) is the dense boolean mask transformers builds for SDPA,
run by a `mask custom` kernel with the same softcap and scale.

Under torch.compile, and whenever q, k or v need gradients (training), a call is one of two
PyTorch operators, `torch.ops.attngen.hf_attention` (the spec's mask) and `..._masked` (a mask
tensor): their fake implementations give the output's shape, so a model traces without a graph
break, and autograd differentiates them through `hf_attention_backward` (kernel.backward,
docs/backward.md). Otherwise (inference, eager) their function is called directly.
"""

from __future__ import annotations

import threading

from .. import api, backends
from ..errors import LaunchError
from .config import LayerAttention, _model_name, spec_text

_DTYPES = {"torch.float16": "f16", "torch.bfloat16": "bf16", "torch.float32": "f32"}
_KERNELS: dict = {}  # (target, layer key, phase, custom) -> compiled kernel
_BY_CALL: dict = {}  # a call's dtypes, device, shapes and arguments -> its kernel (in _KERNELS)
_LOCK = threading.Lock()
_OP = None
_TARGET: dict = {"forced": None}


def cached_kernels() -> dict:
    """{spec name: kernel} of the kernels compiled for transformers models so far."""
    with _LOCK:
        return {k.spec.name: k for k in _KERNELS.values()}


def clear_kernels() -> None:
    with _LOCK:
        _KERNELS.clear()
        _BY_CALL.clear()


def _kernel(target: str, la: LayerAttention, phase: str, custom: bool, model: str):
    if custom:  # the mask tensor says which keys, the window included: one kernel for every layer type
        la = LayerAttention(la.heads_q, la.heads_kv, la.head_dim_qk, la.head_dim_v, la.dtype, None, la.softcap,
                            la.scale, True)
    key = (target, la, phase, custom)
    kernel = _KERNELS.get(key)
    if kernel is None:
        with _LOCK:
            kernel = _KERNELS.get(key)
            if kernel is None:
                kind = "masked" if custom else "global" if la.window is None else "local"
                name = f"{_model_name({}, model)}_{kind}_{phase}"
                spec = api.parse(spec_text(name, la, phase, custom_mask=custom), filename=f"<{name}>")[0]
                kernel = _KERNELS[key] = api.compile(spec, target=target)
    return kernel


def _kernel_of(q, k, v, mask, window, softcap, scale, causal, model):
    phase = "decode" if q.shape[1] == 1 else "prefill"
    # a decode step is a few tens of microseconds of GPU time: the kernel of a call signature seen
    # before is one dictionary lookup away
    key = (q.dtype, k.dtype, v.dtype, q.device.type, q.shape[2], k.shape[2], q.shape[3], v.shape[3], window,
           softcap, scale, causal, phase, mask is None, _TARGET["forced"], model)
    kernel = _BY_CALL.get(key)
    if kernel is None:
        kernel = _BY_CALL[key] = _resolve(q, k, v, mask, window, softcap, scale, causal, model, phase)
    return kernel


def _host(*xs):
    return [None if x is None else x.detach().contiguous().numpy() for x in xs]


def _run(q, k, v, mask, window: int, softcap: float, scale: float, causal: bool, model: str,
         return_lse: bool = False):
    """out (B, Lq, Hq, Dv) of q (B, Lq, Hq, D), k / v (B, Lk, Hkv, D) (views are fine); with
    return_lse, (out, lse (B, Hq, Lq) f32)."""
    kernel = _kernel_of(q, k, v, mask, window, softcap, scale, causal, model)
    if q.device.type != "cpu":
        return kernel(q, k, v, mask=mask, return_lse=return_lse)
    import torch
    host = _host(q, k, v, mask)
    res = kernel(*host[:3], mask=host[3], return_lse=return_lse)
    return tuple(torch.from_numpy(x) for x in res) if return_lse else torch.from_numpy(res)


def _run_backward(q, k, v, out, lse, dout, mask, window: int, softcap: float, scale: float, causal: bool,
                  model: str):
    """(dq, dk, dv) of _run's attention, in q's, k's and v's shapes (kernel.backward, docs/backward.md)."""
    kernel = _kernel_of(q, k, v, mask, window, softcap, scale, causal, model)
    if q.device.type != "cpu":
        return kernel.backward(q, k, v, out, lse, dout, mask=mask)
    import torch
    host = _host(q, k, v, out, lse, dout, mask)
    return tuple(torch.from_numpy(x) for x in kernel.backward(*host[:6], mask=host[6]))


def _resolve(q, k, v, mask, window, softcap, scale, causal, model, phase):
    """The kernel of a call, checked: its dtypes, its device's target, its layer type."""
    dtype = _DTYPES.get(str(q.dtype))
    if dtype is None or str(k.dtype) != str(q.dtype) or str(v.dtype) != str(q.dtype):
        raise LaunchError(f"attngen: q, k, v are {q.dtype}, {k.dtype}, {v.dtype}: one of float16, bfloat16, float32 "
                          "is needed for all three")
    device = q.device.type
    target = _TARGET["forced"] or backends.for_torch_device(device)
    if device == "cpu" and dtype == "bf16":
        raise LaunchError(f"attngen: a bfloat16 model on the CPU: the {target} target computes in f16 or f32; load "
                          "the model with dtype=torch.float32 (or float16)")
    la = LayerAttention(q.shape[2], k.shape[2], q.shape[3], v.shape[3], dtype, None if window < 0 else window,
                        None if softcap <= 0 else softcap, scale, causal)
    return _kernel(target, la, phase, mask is not None, model)


def _operator():
    """(torch.ops.attngen.hf_attention, torch.ops.attngen.hf_attention_masked): _run as operators
    returning (out, lse) for every device, with fake implementations for torch.compile, and
    differentiable: their backward is torch.ops.attngen.hf_attention_backward (kernel.backward);
    lse is not differentiated. The masked one builds its BlockMask from the mask on each call,
    which a graph capture cannot hold: it carries the tags the targets ask for that
    (Backend.torch_tags; CUDA: cudagraph_unsafe, so that torch.compile's CUDA graphs, e.g.
    transformers' compiled static-cache generation, leave it out of the graph)."""
    global _OP
    if _OP is not None:
        return _OP
    import typing

    import torch
    with _LOCK:
        if _OP is not None:
            return _OP
        names = {"Tensor": torch.Tensor, "Optional": typing.Optional, "Tuple": typing.Tuple,
                 "int": int, "float": float, "bool": bool, "str": str}

        def impl(q: Tensor, k: Tensor, v: Tensor, window: int, softcap: float, scale: float, causal: bool,
                 model: str) -> Tuple[Tensor, Tensor]:
            return _run(q, k, v, None, window, softcap, scale, causal, model, return_lse=True)

        def impl_masked(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, window: int, softcap: float, scale: float,
                        causal: bool, model: str) -> Tuple[Tensor, Tensor]:
            return _run(q, k, v, mask, window, softcap, scale, causal, model, return_lse=True)

        def impl_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dout: Tensor,
                          mask: Optional[Tensor], window: int, softcap: float, scale: float, causal: bool,
                          model: str) -> Tuple[Tensor, Tensor, Tensor]:
            return tuple(g.contiguous() for g in _run_backward(q, k, v, out, lse, dout, mask, window, softcap,
                                                               scale, causal, model))

        def fake(q, k, v, *rest):
            return (q.new_empty((q.shape[0], q.shape[1], q.shape[2], v.shape[3])),
                    q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32))

        def fake_backward(q, k, v, *rest):
            return (torch.empty(q.shape, dtype=q.dtype, device=q.device),
                    torch.empty(k.shape, dtype=k.dtype, device=k.device),
                    torch.empty(v.shape, dtype=v.dtype, device=v.device))

        # the tags every target asks of an operator whose call reads the host (the masked one)
        host_tags = tuple(dict.fromkeys(t for n in backends.names() for t in backends.get(n).torch_tags(torch, True)))
        ops = []
        for fn, fk, name, tags in ((impl, fake, "hf_attention", ()),
                                   (impl_masked, fake, "hf_attention_masked", host_tags),
                                   (impl_backward, fake_backward, "hf_attention_backward", host_tags)):
            fn.__annotations__ = {n: eval(t, names) for n, t in fn.__annotations__.items()}  # noqa: S307
            op = torch.library.custom_op(f"attngen::{name}", mutates_args=(), tags=tags)(fn)
            op.register_fake(fk)
            ops.append(op)
        backward_op = ops[2]
        for op, masked in ((ops[0], False), (ops[1], True)):
            _differentiable(torch, op, backward_op, masked)
        _OP = tuple(ops)
    return _OP


def _differentiable(torch, op, backward_op, masked: bool) -> None:
    """register_autograd of a forward operator: dq, dk, dv through backward_op; no gradient for
    the mask, the numbers, or lse."""
    def setup(ctx, inputs, output):
        q, k, v = inputs[:3]
        mask = inputs[3] if masked else None
        ctx.rest = inputs[4 if masked else 3:]
        ctx.masked = masked
        ctx.save_for_backward(q, k, v, output[0], output[1], mask)
        ctx.mark_non_differentiable(output[1])

    def grad(ctx, dout, _dlse):
        q, k, v, out, lse, mask = ctx.saved_tensors
        dq, dk, dv = backward_op(q, k, v, out, lse, dout.contiguous(), mask, *ctx.rest)
        return (dq, dk, dv) + (None,) * (len(ctx.rest) + (1 if ctx.masked else 0))

    torch.library.register_autograd(op, grad, setup_context=setup)


def attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                      sliding_window=None, softcap=None, is_causal=None, **kwargs):
    """transformers' attention function for attn_implementation="attngen": (out (B, Lq, Hq, Dv), None)."""
    import torch
    if dropout:
        raise LaunchError(f"attngen: attention dropout ({dropout}) is not computed by attngen's kernels; set the "
                          "config's attention_dropout to 0 (or call model.eval())")
    for name in ("s_aux", "sinks", "position_bias"):
        if kwargs.get(name) is not None:
            raise LaunchError(f"attngen: this model's attention passes {name!r}, which attngen's kernels do not "
                              "compute; use another attn_implementation for it")
    for what, x in (("query", query), ("key", key), ("value", value)):
        if x.dim() != 4 or x.shape[-1] == 0:
            raise LaunchError(f"attngen: {what} has shape {tuple(x.shape)}; transformers passes (B, heads, L, head "
                              "dim) with a head dim of at least 1")
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    lq, lk = query.shape[2], key.shape[2]
    if attention_mask is None and causal and 1 < lq < lk:
        # a prefill from an empty static cache: the keys past the prompt are not tokens yet (mask_interface
        # returns None here only when the cache held nothing before: q_offset 0)
        key, value = key[:, :, :lq], value[:, :, :lq]
    if attention_mask is not None and attention_mask.dim() != 4:
        raise LaunchError(f"attngen: attention_mask has shape {tuple(attention_mask.shape)}; the mask interface "
                          "registered with attngen gives (B, 1, Lq, Lk) masks or None (register() sets both)")
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    model = getattr(getattr(module, "config", None), "model_type", None) or "model"
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    rest = (-1 if sliding_window is None else int(sliding_window), 0.0 if softcap is None else float(softcap),
            float(scaling), causal, model)
    if torch.compiler.is_compiling() or (torch.is_grad_enabled() and (
            query.requires_grad or key.requires_grad or value.requires_grad)):
        # the operators (registered by register(), outside any trace): traced by torch.compile, and
        # differentiated by autograd in training (their backward: kernel.backward)
        if attention_mask is None:
            return _OP[0](q, k, v, *rest)[0], None
        return _OP[1](q, k, v, attention_mask, *rest)[0], None
    return _run(q, k, v, attention_mask, *rest), None


def mask_interface(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                   attention_mask=None, local_size=None, allow_is_causal_skip=True,
                   allow_is_bidirectional_skip=False, device="cpu", **kwargs):
    """transformers' mask function for attn_implementation="attngen": None where the kernel's own
    mask is exact (module doc), else SDPA's dense boolean mask (B, 1, Lq, Lk)."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask
    mask_function = mask_function or causal_mask_function
    if (allow_is_causal_skip or allow_is_bidirectional_skip) and _spec_mask_is_exact(
            attention_mask, q_length, kv_length, q_offset, kv_offset):
        return None
    return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                     kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
                     local_size=local_size, allow_is_causal_skip=False, allow_is_bidirectional_skip=False,
                     device=device, **{k: v for k, v in kwargs.items() if k in ("allow_torch_fix", "use_vmap")})


def _spec_mask_is_exact(padding, q_length: int, kv_length: int, q_offset, kv_offset) -> bool:
    """Whether no padding is masked and every key is a token the queries may see by position
    alone: then causal(bottom_right) / window over the keys is the mask transformers means."""
    import torch
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return False  # decided at run time by the dense mask instead (a traced graph keeps one branch)
    if padding is not None and padding.shape[-1] > kv_length:
        padding = padding[:, torch.arange(kv_length, device=padding.device) + kv_offset]
    # keys past the 2D mask's end are not tokens (a static cache's unwritten rows)
    if padding is None or (padding.shape[-1] == kv_length and bool(padding.all())):
        return q_length == 1 or kv_length == q_length or bool(q_offset == 0)
    # a prefill into an empty static cache: the prompt's rows are all real, the rest not yet written
    return (bool(q_offset == 0) and padding.shape[-1] >= q_length and bool(padding[:, :q_length].all())
            and not bool(padding[:, q_length:].any()))


def register(name: str = "attngen", target: str | None = None) -> str:
    """Register attngen's attention and mask functions with transformers under `name`, so that
    `from_pretrained(..., attn_implementation=name)` (or `from_config`) uses attngen's kernels.
    target: None picks it by the tensors' device (CUDA tensors: cuda; CPU tensors: wgsl, on this
    machine's WebGPU adapter); a name forces it. Returns the name."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError:
        raise LaunchError("attngen.transformers.register needs transformers (pip install 'attngen[transformers]')") \
            from None
    if target is not None:
        backends.get(target)  # a ValueError naming the known targets
    _TARGET["forced"] = target
    _operator()
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, mask_interface)
    return name
