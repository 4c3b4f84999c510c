"""Merge attention results over disjoint key sets by their log-sum-exp.

    out, lse = attngen.merge([out_a, out_b], [lse_a, lse_b])

With lse_s the natural-log sum of exp(scores) of part s and out_s its normalised output,
the attention over the union of the key sets is

    lse = log(sum_s exp(lse_s)),   out = sum_s exp(lse_s - lse) * out_s

(the split_kv combine of the kernels computes the same). Parts that saw no key of a row
have lse_s = -inf and weight 0; a row no part saw stays 0 with lse -inf, never NaN. A row for
which any part's lse is NaN merges to out = NaN and lse = NaN (NaN in, NaN out, for that row
only; docs/architecture.md "Numerics"), never to the -inf of a row no part saw. Works on
numpy, CuPy and PyTorch arrays alike (the result is of the inputs' kind and dtype; the
arithmetic is float32, or float64 for float64 inputs).
"""

from __future__ import annotations

from .errors import LaunchError


# Array libraries whose arrays merge takes, by the top-level module of the array's type: numpy,
# PyTorch, and CuPy (the CUDA backend's outputs); each provides the numpy-like functions below.
_NAMESPACES = ("numpy", "torch", "cupy")


def _namespace(x):
    import importlib
    mod = type(x).__module__.split(".")[0]
    if mod in _NAMESPACES:
        return mod, importlib.import_module(mod)
    raise LaunchError(f"merge takes numpy, CuPy or PyTorch arrays, not {type(x).__name__} (results kept "
                      "in GPU buffers: read them back with .numpy() first)")


def merge(outs, lses):
    """(out, lse) of attention over all parts' keys; see the module docstring.

    outs: a list of (..., L, H, Dv) arrays (packed: (total, H, Dv)); lses: the matching
    (..., H, L) (packed: (H, total)) arrays, as the kernels return them with return_lse=True.
    """
    for name, x in (("outs", outs), ("lses", lses)):
        if hasattr(x, "shape") or not hasattr(x, "__iter__"):
            raise LaunchError(f"merge takes a list of arrays for {name}, one per part (merge([out_a, out_b], "
                              f"[lse_a, lse_b])), not a single {type(x).__name__}")
    outs, lses = list(outs), list(lses)
    if not outs or len(outs) != len(lses):
        raise LaunchError(f"merge needs as many lse arrays as outputs (at least one), got {len(outs)} "
                          f"outputs and {len(lses)} lse arrays")
    kind, xp = _namespace(outs[0])
    for i, (o, l) in enumerate(zip(outs, lses)):
        for name, x in (("outs", o), ("lses", l)):
            if _namespace(x)[0] != kind:
                raise LaunchError(f"merge: {name}[{i}] is a {type(x).__module__} array, outs[0] a {kind} one")
        if tuple(o.shape) != tuple(outs[0].shape) or tuple(l.shape) != tuple(lses[0].shape):
            raise LaunchError(f"merge: part {i} has out {tuple(o.shape)} and lse {tuple(l.shape)}, part 0 has "
                              f"{tuple(outs[0].shape)} and {tuple(lses[0].shape)}")
    shape = tuple(outs[0].shape)
    if len(shape) < 3 or tuple(lses[0].shape) != shape[:-3] + (shape[-2], shape[-3]):
        raise LaunchError(f"merge: out {shape} and lse {tuple(lses[0].shape)} do not match: lse must be "
                          "(..., H, L) for out (..., L, H, Dv)")
    if kind == "torch":
        wide = xp.float64 if outs[0].dtype == xp.float64 else xp.float32
        stack = lambda xs: xp.stack([x.to(wide) for x in xs])  # noqa: E731
        amax = lambda x: x.amax(dim=0)  # noqa: E731
    else:
        wide = xp.float64 if outs[0].dtype == xp.float64 else xp.float32
        stack = lambda xs: xp.stack([x.astype(wide) for x in xs])  # noqa: E731
        amax = lambda x: x.max(axis=0)  # noqa: E731
    L = stack(lses)  # (S, ..., H, L)
    # A NaN lse poisons its row: without this the row max would be NaN, fail `seen` and come
    # out as a row no part saw (0, -inf).
    poisoned = xp.isnan(L).any(0)
    L = xp.where(poisoned[None], xp.full_like(L, -float("inf")), L)
    m = amax(L)
    seen = m > -float("inf")
    m_safe = xp.where(seen, m, xp.zeros_like(m))
    w = xp.exp(L - m_safe[None])  # exp(-inf) = 0 for parts that saw nothing
    total = w.sum(0)
    lse = xp.where(seen, m_safe + xp.log(xp.where(seen, total, xp.ones_like(total))),
                   xp.full_like(m, -float("inf")))
    weight = xp.where(seen[None], w / xp.where(seen, total, xp.ones_like(total))[None], xp.zeros_like(w))
    lse = xp.where(poisoned, xp.full_like(lse, float("nan")), lse)
    weight = xp.where(poisoned[None], xp.full_like(weight, float("nan")), weight)  # NaN * out = NaN
    # (S, ..., H, L) -> (S, ..., L, H, 1) to scale the outputs
    nd = weight.ndim
    perm = tuple(range(nd - 2)) + (nd - 1, nd - 2)
    weight = weight.permute(*perm) if kind == "torch" else weight.transpose(perm)
    out = (stack(outs) * weight[..., None]).sum(0)
    out = out.to(outs[0].dtype) if kind == "torch" else out.astype(outs[0].dtype)
    lse = lse.to(lses[0].dtype) if kind == "torch" else lse.astype(lses[0].dtype)
    return out, lse
