"""The float64 numpy oracle: what every kernel must compute, for every feature of the language.

    out = attngen.reference(spec, q, k, v)                      # (B, Lq, Hq, Dv) float64
    out, lse = attngen.reference(spec, q, k, v, return_lse=True)

Inputs are first rounded to the spec's dtype (so the oracle sees exactly what a kernel
reads), then computed in float64: scores s = scale * q.k, optional softcap c * tanh(s / c),
the mask, a softmax over the visible keys, and the weighted sum of v. A row that sees no key
gives 0 and lse = -inf. Besides the spec's structured masks it takes the run-time inputs of
later features: a custom mask (boolean, True = attend, or additive), per-sequence KV lengths
(`kv_lens`), packed variable-length batches (`cu_seqlens_q` / `cu_seqlens_k`) and paged KV
caches (`block_table`). Masks align per sequence (Lk is that sequence's key count).
"""

from __future__ import annotations

import numpy as np

from .errors import LaunchError
from .lang.spec import AttentionSpec
from .plan import masks
from .reference_expr import Env, check_inputs, has_expressions

_ROW_CHUNK = 512  # query rows per step, to keep the float64 score block small


def to_numpy(x) -> np.ndarray:
    """Host copy of a numpy / PyTorch / device array (bf16 tensors become float32). Device
    arrays copy themselves to the host with .get() (CuPy) or .numpy() (a GPU buffer's handle)."""
    if isinstance(x, np.ndarray):
        return x
    mod = type(x).__module__.split(".")[0]
    if mod == "torch":
        t = x.detach()
        if str(t.dtype) == "torch.bfloat16":
            t = t.float()
        elif str(t.dtype).startswith("torch.float8"):  # a quantized cache's FP8 bytes, as uint8
            import torch
            t = t.view(torch.uint8)
        return t.cpu().numpy()
    if callable(getattr(x, "get", None)) and hasattr(x, "shape") and hasattr(x, "dtype"):
        return x.get()
    if callable(getattr(x, "numpy", None)) and hasattr(x, "shape"):
        return x.numpy()
    return np.asarray(x)


def round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), returned as float32."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return bits.astype(np.uint32).view(np.float32)


def round_to_dtype(x, dtype: str) -> np.ndarray:
    """The values a kernel with storage `dtype` reads, as float64."""
    a = to_numpy(x)
    if a.dtype == np.uint16 and dtype == "bf16":  # raw bf16 bits
        a = (a.astype(np.uint32) << 16).view(np.float32)
    if dtype == "f16":
        a = a.astype(np.float16)
    elif dtype == "bf16":
        a = round_bf16(a.astype(np.float32))
    else:
        a = a.astype(np.float32)
    return a.astype(np.float64)


def structured_mask(spec: AttentionSpec, len_q: int, len_k: int) -> np.ndarray | None:
    """(Lq, Lk) boolean visibility of the spec's mask (None = everything visible)."""
    return masks.visible(spec.mask, len_q, len_k)


def _weights(spec, q, k, visible, bias, r0, r1, env=None):
    """Query rows r0:r1 of one head group: (ok, t, m, l, w). ok: which (head, row, key) entries
    are seen (the mask expression too, with `env`: attngen.reference_expr.Env); t: tanh(s /
    softcap) of the scaled scores s (None without a softcap; the score expression, with `env`,
    replaces s where ok); m, l: each
    row's maximum and sum (m NaN where a seen score is NaN); w: the softmax weights, exactly 0
    where not seen and in rows that see no key."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        s = np.einsum("igd,jd->gij", q[r0:r1], k) * spec.resolved_scale
        t = np.tanh(s / spec.softcap) if spec.softcap is not None else None
        if t is not None:
            s = spec.softcap * t
        ok = np.ones(s.shape, bool) if bias is None else (bias[:, r0:r1] > -np.inf)
        if visible is not None:
            ok &= visible[:, r0:r1]
        if env is not None:
            seen = env.visible(r0, r1)
            if seen is not None:
                ok &= seen
            s = env.score(s, ok, r0, r1)
        s = np.where(ok, s if bias is None else s + np.where(ok, bias[:, r0:r1], 0.0), -np.inf)
        m = s.max(axis=-1, keepdims=True)
        p = np.where(ok, np.exp(s - np.where(np.isfinite(m), m, 0.0)), 0.0)
        l = p.sum(axis=-1, keepdims=True)
        w = p / np.where(l > 0, l, 1.0)
    return ok, t, m, l, w


def _attend(spec, q, k, v, visible, bias, env=None):
    """One sequence, one KV head group. q (Lq, G, D), k (Lk, D), v (Lk, Dv) -> out, lse.

    A key a row does not see contributes nothing to it, whatever its values: scores and P V
    select on visibility, never multiply a hidden key's values by zero (0 * inf is NaN). A
    non-finite value a row does see makes that row non-finite (NaN in, NaN out)."""
    len_q, groups = q.shape[0], q.shape[1]
    out = np.zeros((len_q, groups, v.shape[1]))
    lse = np.full((groups, len_q), -np.inf)
    if k.shape[0] == 0:
        return out, lse
    finite_v = np.isfinite(v)
    v_clean = np.where(finite_v, v, 0.0)
    poisoned = np.nonzero(~finite_v.all(axis=1))[0]  # keys with a non-finite value
    for r0 in range(0, len_q, _ROW_CHUNK):
        r1 = min(r0 + _ROW_CHUNK, len_q)
        _, _, m, l, w = _weights(spec, q, k, visible, bias, r0, r1, env)
        with np.errstate(invalid="ignore"):
            o = np.einsum("gij,jd->igd", w, v_clean)
            for j in poisoned:  # only the rows that see key j take its non-finite values
                wj = w[:, :, j][..., None]
                if spec.is_fp8:  # FP8: every column of such a row (docs/language.md, "FP8 prefill")
                    o += np.transpose(np.where(wj != 0, np.nan, 0.0) * np.ones(v.shape[1]), (1, 0, 2))
                    continue
                o += np.transpose(np.where(wj != 0, wj * np.where(finite_v[j], 0.0, v[j]), 0.0), (1, 0, 2))
        out[r0:r1] = o
        with np.errstate(divide="ignore", invalid="ignore"):
            # no key seen: -inf; a NaN (or inf) in the row's inputs: NaN
            lse[:, r0:r1] = np.where(l[..., 0] > 0, (m + np.log(np.where(l > 0, l, 1.0)))[..., 0],
                                     np.where(l[..., 0] == 0, -np.inf, np.nan))
    return out, lse


def _mask_for(mask, b, hq0, groups, len_q, len_k):
    """Slice a run-time mask (broadcastable to (B, Hq, Lq, Lk)) for one batch and head group."""
    if mask is None:
        return None, None
    m = np.asarray(mask)
    while m.ndim < 4:
        m = m[None]
    m = m[b if m.shape[0] > 1 else 0]
    m = m[hq0:hq0 + groups] if m.shape[0] > 1 else np.repeat(m, groups, axis=0)
    m = np.broadcast_to(m[:, :len_q], (groups, len_q, len_k))  # packed: the sequence's top-left corner
    if m.dtype == bool:
        return m, None
    return None, m.astype(np.float64)


def _group_mask(mask, visible, b, hq0, groups, len_q, len_k):
    """(visibility, additive bias) of one sequence's head group: the run-time mask's slice (its
    keys cut to the sequence's len_k) combined with the spec's structured mask `visible`."""
    vis, bias = _mask_for(mask, b, hq0, groups, len_q, mask.shape[-1] if mask is not None else len_k)
    if vis is not None:
        vis = vis[..., :len_k]
    if bias is not None:
        bias = bias[..., :len_k]
    if visible is not None:
        vis = visible[None] if vis is None else (vis & visible[None])
    return vis, bias


class _SpecOnly:
    """What the runtime's input checks (attngen.runtime.launch.resolve) read of a kernel plan,
    from the spec alone: the oracle checks its inputs by the same rules as the kernels."""

    def __init__(self, spec: AttentionSpec):
        self.spec, self.d_qk, self.d_v, self.dtype = spec, spec.head_dim_qk, spec.head_dim_v, spec.dtype


def _check_inputs(spec: AttentionSpec, q, k, v, mask, kv_lens, cu_seqlens_q, cu_seqlens_k, block_table) -> None:
    """A LaunchError (naming the argument) for inputs a kernel of `spec` would refuse: shapes,
    heads and head dims against the spec, kv_lens / block_table / cu_seqlens contents, the
    mask's shape. Dtypes are free: the oracle rounds every input to the spec's dtype."""
    from dataclasses import replace
    from .lang.spec import KVCache, Mask
    from .runtime.blockmask import check_mask_shape, mask_keys, mask_shape4
    from .runtime.launch import resolve
    shapes = {"q": np.shape(q), "k": np.shape(k), "v": np.shape(v)}
    # The oracle computes the function, whatever the storage: a paged spec's attention from
    # contiguous K/V (no block_table), a mask beside any mask mode. So the layout and the mask
    # checked are the inputs' own.
    paged = KVCache("paged", int(shapes["k"][1])) if block_table is not None and len(shapes["k"]) == 4 else KVCache()
    mask_mode = Mask("custom") if mask is not None else (Mask() if spec.mask.is_custom else spec.mask)
    spec = replace(spec, kv_cache=paged, mask=mask_mode, kv_dtype=None)  # a quantized cache: checked as values
    # packed sequences with a mask: its rows and keys bound the longest sequence, as the kernels'
    # max_seqlen_q / max_seqlen_k do (each sequence reads the top-left corner)
    bound = (int(np.shape(mask)[-2]), int(np.shape(mask)[-1])) if (
        mask is not None and cu_seqlens_q is not None and np.ndim(mask) >= 2) else (None, None)
    for what, n, cu in (("query rows", bound[0], cu_seqlens_q),
                        ("keys", bound[1], cu_seqlens_k if cu_seqlens_k is not None else cu_seqlens_q)):
        longest = int(np.diff(np.asarray(cu)).max()) if n is not None and np.ndim(cu) == 1 and len(cu) > 1 else 0
        if n is not None and n < longest:
            raise LaunchError(f"attngen.reference: mask covers {n} {what}, but cu_seqlens holds a sequence of "
                              f"{longest}")
    try:
        launch = resolve(_SpecOnly(spec), shapes, dict.fromkeys(shapes, spec.dtype), kv_lens=kv_lens,
                         cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, block_table=block_table,
                         has_mask=mask is not None, cores=None, max_seqlen_q=bound[0], max_seqlen_k=bound[1],
                         mask_keys=None if mask is None else mask_keys(mask))
        if mask is not None:
            check_mask_shape(mask_shape4(np.shape(mask)), launch.batch, launch.heads_q, launch.len_q, launch.mask_lk)
    except LaunchError as e:
        raise LaunchError(f"attngen.reference: {e}") from None


def _stored_kv(spec, q, k, v, k_scale, v_scale, ints):
    """A quantized cache's values (float64) and, for a paged FP8 cache, the per-sequence scales
    still to apply ((k_scale, v_scale) as float64, else None), after the kernels' checks of the
    stored bytes (dtype, shape) and scales (runtime/kvquant.py)."""
    from .runtime import kvquant
    from .runtime.launch import KV_STORED
    kv_dtype = spec.kv_dtype
    for name, x in (("k", k), ("v", v)):
        if x.dtype.name != KV_STORED[kv_dtype]:
            raise LaunchError(f"attngen.reference: {name} has dtype {x.dtype}, but spec '{spec.name}' stores K and V "
                              f"as kv_dtype {kv_dtype}: numpy {KV_STORED[kv_dtype]} (attngen.quantize_kv makes them)")
    if ints[1] is not None:
        raise LaunchError(f"attngen.reference: packed sequences (cu_seqlens_q=) with a quantized cache are not built "
                          f"yet (issue 44), as on the kernels")
    if k.ndim != 4 or v.ndim != 4:
        raise LaunchError(f"attngen.reference: a quantized cache is (B, Lk, Hkv, D) or paged (pages, page, Hkv, D), "
                          f"not k {k.shape}, v {v.shape}")
    _check_inputs(spec, q, k, v, None, *ints)  # shapes first: the scales' follow them
    table = ints[3]
    batch = table.shape[0] if table is not None else k.shape[0]
    scales = []
    for name, x, sc in (("k_scale", k, k_scale), ("v_scale", v, v_scale)):
        try:
            scales.append(kvquant.check_scales(name, spec.name, kv_dtype, x, None if sc is None else to_numpy(sc),
                                               batch, table, ints[0]).astype(np.float64))
        except LaunchError as e:
            raise LaunchError(f"attngen.reference: {e}") from None
    k, v = kvquant.unscaled(k, kv_dtype), kvquant.unscaled(v, kv_dtype)
    if kv_dtype in kvquant.FP8 and table is not None:
        return k, v, scales
    return (k * kvquant.expand_scale(scales[0], kv_dtype, k.shape),
            v * kvquant.expand_scale(scales[1], kv_dtype, v.shape), None)


def _appended(spec: AttentionSpec, q, k, v, k_scale, v_scale, k_new, v_new, kv_lens, block_table, packed):
    """(k, v, k_scale, v_scale, kv_lens) after a call's append of k_new / v_new at keys kv_lens[b] ..
    (docs/variants.md), checked as the kernels check it: copies, the rows in the spec's dtype, or
    for a quantized cache quantized as the kernels' append quantizes them (runtime/kvquant.py:
    quantize_rows, append_kv)."""
    from dataclasses import replace
    from .lang.spec import KVCache, Mask
    from .runtime import kvquant
    from .runtime.launch import resolve
    if k_new is None or v_new is None:
        raise LaunchError("attngen.reference: k_new and v_new go together: pass both or neither")
    if packed:
        raise LaunchError("attngen.reference: packed sequences (cu_seqlens_q=) cannot be combined with k_new/v_new")
    k_new, v_new = round_to_dtype(k_new, spec.dtype), round_to_dtype(v_new, spec.dtype)
    shapes = {"q": np.shape(q), "k": np.shape(k), "v": np.shape(v), "k_new": k_new.shape, "v_new": v_new.shape}
    paged = KVCache("paged", int(shapes["k"][1])) if block_table is not None and len(shapes["k"]) == 4 else KVCache()
    checked = replace(spec, kv_cache=paged, kv_dtype=None, mask=Mask())  # (the shapes only: the call's own checks follow)
    try:
        resolve(_SpecOnly(checked), shapes, dict.fromkeys(shapes, spec.dtype), kv_lens=kv_lens, block_table=block_table,
                cores=None)
    except LaunchError as e:
        raise LaunchError(f"attngen.reference: {e}") from None
    lens = np.asarray(to_numpy(kv_lens)).astype(np.int64)
    table = None if block_table is None else to_numpy(block_table)
    if spec.kv_dtype is not None:
        try:
            k, v, k_scale, v_scale = kvquant.append_kv(spec.kv_dtype, k, v, to_numpy(k_scale), to_numpy(v_scale),
                                                       k_new, v_new, lens, table)
        except ValueError as e:
            raise LaunchError(f"attngen.reference: k_new / v_new: {e}") from None
    else:
        k, v = np.array(k, dtype=np.float64), np.array(v, dtype=np.float64)
        for cache, new in ((k, k_new), (v, v_new)):
            for b in range(new.shape[0]):
                for r in range(new.shape[1]):
                    j = int(lens[b]) + r
                    cache[(int(table[b, j // cache.shape[1]]), j % cache.shape[1]) if table is not None else (b, j)] = \
                        new[b, r]
    return k, v, k_scale, v_scale, lens + k_new.shape[1]
def _fp8_inputs(spec, q, k, v, descales: dict, mask, ints):
    """The float64 values of FP8 q, k, v (docs/language.md, "FP8 prefill"): each byte's exact value
    times its (sequence, KV head)'s descale, after the kernels' checks (bytes, shapes, descales)."""
    from .runtime.fp8 import check_descales, dequantize_fp8, fp8_bytes
    who = "attngen.reference"
    if any(x is not None for x in ints):
        raise LaunchError(f"{who}: FP8 kernels take padded batches (no kv_lens, cu_seqlens or block_table) yet "
                          "(issue 44), and so does the reference")
    q, k, v = (fp8_bytes(n, x, spec.dtype, who) for n, x in (("q", q), ("k", k), ("v", v)))
    _check_inputs(spec, q, k, v, mask, *ints)  # shapes first: the descales' follow them
    scales = check_descales({n: None if x is None else to_numpy(x) for n, x in descales.items()}, q.shape[0],
                            k.shape[2], who)
    group = q.shape[2] // k.shape[2]
    return (dequantize_fp8(q, scales["q_descale"], spec.dtype, group), dequantize_fp8(k, scales["k_descale"], spec.dtype),
            dequantize_fp8(v, scales["v_descale"], spec.dtype))


def reference(spec: AttentionSpec, q, k, v, *, mask=None, kv_lens=None, cu_seqlens_q=None,
              cu_seqlens_k=None, block_table=None, return_lse: bool = False, k_scale=None, v_scale=None,
              k_new=None, v_new=None, q_descale=None, k_descale=None, v_descale=None, **inputs):
    """float64 attention as the spec defines it (see the module docstring for the inputs).

    The spec's `input` tensors are passed by keyword (`slopes=...`), for its score and mask
    expressions (attngen.reference_expr); inputs take padded batches (no cu_seqlens, no paged
    cache), with or without kv_lens; index-only expressions take every layout.

    Shapes: q (B, Lq, Hq, Dqk), k (B, Lk, Hkv, Dqk), v (B, Lk, Hkv, Dv); packed varlen:
    q (total_q, Hq, Dqk), k/v (total_k, Hkv, D) with cu_seqlens_* (B + 1,); paged: k/v
    (pages, page_size, Hkv, D) with block_table (B, max_pages) and kv_lens (B,).
    Returns out (B, Lq, Hq, Dv) (packed: (total_q, Hq, Dv)) and, with return_lse, lse
    (B, Hq, Lq) (packed: (Hq, total_q)).

    With `kv_dtype` (docs/language.md, "Quantized KV caches"), k and v are the stored bytes
    (uint8 FP8 patterns or int8) and k_scale / v_scale their float32 scales: each value is the
    float64 of its decoded byte times the float64 of its scale, exactly.

    With an FP8 dtype (docs/language.md, "FP8 prefill"), q, k and v are FP8 bytes (uint8 arrays, or
    torch float8 tensors of the spec's format) and q_descale / k_descale / v_descale (B, Hkv) their
    descales (None: 1): each value is its decoded byte times its descale, exactly.

    k_new / v_new (B, Lnew, Hkv, D), with kv_lens: the call appends them at keys kv_lens[b] .. (the
    kernels' fused append) and attends to kv_lens[b] + Lnew keys; a quantized cache gets them as
    the kernels quantize them (runtime/kvquant.py: quantize_rows). The arrays given are not changed.
    """
    if k_new is not None or v_new is not None:
        if kv_lens is None:
            raise LaunchError("attngen.reference: k_new/v_new append to a cache: pass kv_lens= (keys already in each "
                              "sequence's cache, before the append)")
        k, v, k_scale, v_scale, kv_lens = _appended(spec, q, to_numpy(k), to_numpy(v), k_scale, v_scale, k_new,
                                                    v_new, kv_lens, block_table, cu_seqlens_q is not None)
    mask_np = None if mask is None else to_numpy(mask)
    ints = [None if x is None else to_numpy(x) for x in (kv_lens, cu_seqlens_q, cu_seqlens_k, block_table)]
    descales = {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale}
    if not spec.is_fp8 and any(x is not None for x in descales.values()):
        raise LaunchError(f"attngen.reference: {next(n for n, x in descales.items() if x is not None)}= needs a spec "
                          f"with an FP8 dtype (dtype e4m3 or e5m2); '{spec.name}' is {spec.dtype}")
    if spec.kv_dtype is not None:
        q = round_to_dtype(q, spec.dtype)
        k, v, kv_scales = _stored_kv(spec, q, to_numpy(k), to_numpy(v), k_scale, v_scale, ints)
    else:
        for name, x in (("k_scale", k_scale), ("v_scale", v_scale)):
            if x is not None:
                raise LaunchError(f"attngen.reference: {name}= needs a spec with kv_dtype; '{spec.name}' keeps K "
                                  "and V in its dtype")
        if spec.is_fp8:
            q, k, v = _fp8_inputs(spec, q, k, v, descales, mask_np, ints)
        else:
            q, k, v = (round_to_dtype(x, spec.dtype) for x in (q, k, v))
        kv_scales = None
    _check_inputs(spec, q, k, v, mask_np, *ints)
    named = None  # the checked inputs of the expressions
    if has_expressions(spec) or inputs:
        if cu_seqlens_q is not None or block_table is not None:
            if spec.inputs or inputs:  # index-only expressions need no extents: each sequence's own
                raise LaunchError("attngen.reference: expression inputs take a padded batch (B, L, H, D), not "
                                  "packed sequences or a paged cache (not yet)")
            named = {}
        else:
            named = check_inputs(spec, {n: None if x is None else to_numpy(x) for n, x in inputs.items()},
                                 {"b": q.shape[0], "h": q.shape[2], "hkv": k.shape[2], "q": q.shape[1],
                                  "k": k.shape[1]}, round_to_dtype)
    packed = cu_seqlens_q is not None
    if packed:
        cq = to_numpy(cu_seqlens_q).astype(np.int64)
        ck = to_numpy(cu_seqlens_k if cu_seqlens_k is not None else cu_seqlens_q).astype(np.int64)
        seqs = [(q[cq[b]:cq[b + 1]], k[ck[b]:ck[b + 1]], v[ck[b]:ck[b + 1]]) for b in range(len(cq) - 1)]
    elif block_table is not None:
        table = to_numpy(block_table).astype(np.int64)
        lens = to_numpy(kv_lens).astype(np.int64)
        page = k.shape[1]
        seqs = []
        for b in range(table.shape[0]):
            n_pages = -(-int(lens[b]) // page)
            pages = table[b, :n_pages]
            kb = k[pages].reshape(-1, *k.shape[2:])[: lens[b]]
            vb = v[pages].reshape(-1, *v.shape[2:])[: lens[b]]
            if kv_scales is not None:  # FP8: each sequence's per-head scales (i8's travel with the rows)
                kb, vb = kb * kv_scales[0][b][None, :, None], vb * kv_scales[1][b][None, :, None]
            seqs.append((q[b], kb, vb))
    else:
        lens = None if kv_lens is None else to_numpy(kv_lens).astype(np.int64)
        seqs = [(q[b], k[b, : (lens[b] if lens is not None else k.shape[1])],
                 v[b, : (lens[b] if lens is not None else v.shape[1])]) for b in range(q.shape[0])]

    outs, lses = [], []
    for b, (qb, kb, vb) in enumerate(seqs):
        len_q, heads_q = qb.shape[0], qb.shape[1]
        heads_kv = kb.shape[1]
        groups = heads_q // heads_kv
        len_k = kb.shape[0]
        visible = structured_mask(spec, len_q, len_k)
        ob = np.zeros((len_q, heads_q, vb.shape[2]))
        lb = np.full((heads_q, len_q), -np.inf)
        for h in range(heads_kv):
            sl = slice(h * groups, (h + 1) * groups)
            vis, bias = _group_mask(mask_np, visible, b, h * groups, groups, len_q, len_k)
            env = None if named is None else Env(spec, named, b, h * groups, groups, h, len_q, len_k)
            o, l = _attend(spec, qb[:, sl], kb[:, h], vb[:, h], vis, bias, env)
            ob[:, sl] = o
            lb[sl] = l
        outs.append(ob)
        lses.append(lb)
    if packed:
        out = np.concatenate(outs, axis=0) if outs else np.zeros((0,) + q.shape[1:2] + v.shape[-1:])
        lse = np.concatenate(lses, axis=1) if lses else np.zeros((q.shape[1], 0))
    elif outs:
        out = np.stack(outs)
        lse = np.stack(lses)
    else:  # B = 0
        out = np.zeros((0, q.shape[1], q.shape[2], v.shape[-1]))
        lse = np.zeros((0, q.shape[2], q.shape[1]))
    return (out, lse) if return_lse else out


def _attend_grad(spec, q, k, v, do, o, visible, bias, env=None, grads=None):
    """One sequence, one KV head group: the gradients of _attend's out. q (Lq, G, D), k (Lk, D),
    v (Lk, Dv), do and o (Lq, G, Dv) -> dq (Lq, G, D), dk (Lk, D), dv (Lk, Dv).

    With P the softmax weights and s the soft-capped scores (t = tanh(scale q.k / c)):
    dv = P^T dO; dP = dO v^T; dS = P (dP - D), D = rowsum(dO * O); through the soft-cap
    dS *= 1 - t^2, through a score expression (`env`) dS *= d score / d s (attngen.plan.
    expr_grad), whose dS also flows to the `grad` inputs: `grads` maps each such input's name
    to (its gradient array, [(Load, d score / d Load)]), and each read entry adds dS times the
    read's derivative. dq = scale dS k; dk = scale dS^T q. An entry a row does not see is 0 in
    P and dS, and contributes nothing, whatever the key's values (matmuls take non-finite
    values as 0 where the weight is 0); a non-finite value a row does see makes its gradients
    non-finite. A row that sees no key has P = 0: no gradient flows through it."""
    from .plan.expr_grad import score_ds
    scale, cap = spec.resolved_scale, spec.softcap
    ds_expr = score_ds(spec.score) if env is not None else None
    len_q, groups = q.shape[0], q.shape[1]
    dq = np.zeros(q.shape)
    dk = np.zeros(k.shape)
    dv = np.zeros(v.shape)
    if k.shape[0] == 0:
        return dq, dk, dv

    def clean(x):
        return np.where(np.isfinite(x), x, 0.0)
    qc, kc, doc = clean(q), clean(k), clean(do)
    bad_do = ~np.isfinite(do).all(axis=-1)  # (Lq, G)
    for r0 in range(0, len_q, _ROW_CHUNK):
        r1 = min(r0 + _ROW_CHUNK, len_q)
        ok, t, _, _, w = _weights(spec, q, k, visible, bias, r0, r1, env)
        with np.errstate(invalid="ignore", over="ignore"):
            dv += np.einsum("gij,igd->jd", w, doc[r0:r1])
            seen_by_bad = ((w != 0) & bad_do[r0:r1].T[..., None]).any(axis=(0, 1))
            dv[seen_by_bad] = np.nan  # a non-finite dout row reaches the keys it sees
            d_p = np.where(ok, np.einsum("igd,jd->gij", do[r0:r1], v), 0.0)
            d_row = np.einsum("igd,igd->gi", do[r0:r1], o[r0:r1])[..., None]
            ds = np.where(ok, w * (d_p - d_row), 0.0)  # d loss / d (the score the softmax sees)
            if cap is not None:
                ds = np.where(ok, ds * (1.0 - t * t), 0.0)
            if ds_expr is not None:
                s = np.einsum("igd,jd->gij", q[r0:r1], k) * scale
                for grad, derivs in (grads or {}).values():
                    for load, d_load in derivs:
                        env.scatter(grad, load, ds * env.real(d_load, s, ok, r0, r1), s, ok, r0, r1)
                ds = np.where(ok, ds * env.real(ds_expr, s, ok, r0, r1), 0.0)
            ds *= scale
            dq[r0:r1] = np.einsum("gij,jd->igd", ds, kc)
            dk += np.einsum("gij,igd->jd", ds, qc[r0:r1])
    return dq, dk, dv


def reference_backward(spec: AttentionSpec, q, k, v, dout, *, mask=None, kv_lens=None, cu_seqlens_q=None,
                       cu_seqlens_k=None, **inputs):
    """float64 gradients (dq, dk, dv) of the loss whose gradient with respect to the output is
    `dout`, for the attention the spec defines (the same inputs as `reference`, without paged
    caches: a cache is not trained). dq has q's shape, dk and dv k's and v's: with GQA, a KV
    head's gradient sums its group's query heads; keys past a sequence's kv_lens get 0.

    dout is rounded to the spec's dtype, as q, k and v are (what a backward kernel reads).
    Score and mask expressions (issue 42) take their inputs by keyword, as `reference`; where the
    spec declares `grad` inputs the result is (dq, dk, dv, {name: gradient}), each gradient
    float64 of its input's shape (an entry sums d loss / d score times d score / d entry over
    every visible pair that reads it; docs/backward.md)."""
    from .plan.expr_grad import input_derivatives
    q = round_to_dtype(q, spec.dtype)
    k = round_to_dtype(k, spec.dtype)
    v = round_to_dtype(v, spec.dtype)
    do = round_to_dtype(dout, spec.dtype)
    out = reference(spec, q, k, v, mask=mask, kv_lens=kv_lens, cu_seqlens_q=cu_seqlens_q,
                    cu_seqlens_k=cu_seqlens_k, **inputs)  # checks the inputs as the kernels do
    if do.shape != out.shape:
        raise LaunchError(f"attngen.reference_backward: dout has shape {do.shape}; the output's is {out.shape}")
    named = None
    if has_expressions(spec) and cu_seqlens_q is not None:
        named = {}  # index-only (reference() above refused inputs with packed sequences)
    elif has_expressions(spec):
        named = check_inputs(spec, {n: None if x is None else to_numpy(x) for n, x in inputs.items()},
                             {"b": q.shape[0], "h": q.shape[2], "hkv": k.shape[2], "q": q.shape[1],
                              "k": k.shape[1]}, round_to_dtype)
    grads = {i.name: (np.zeros(named[i.name].shape), input_derivatives(spec.score, i.name))
             for i in spec.inputs if i.grad}
    mask_np = None if mask is None else to_numpy(mask)
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    if cu_seqlens_q is not None:
        cq = to_numpy(cu_seqlens_q).astype(np.int64)
        ck = to_numpy(cu_seqlens_k if cu_seqlens_k is not None else cu_seqlens_q).astype(np.int64)
        seqs = [((slice(cq[b], cq[b + 1]),), (slice(ck[b], ck[b + 1]),)) for b in range(len(cq) - 1)]
    else:
        lens = None if kv_lens is None else to_numpy(kv_lens).astype(np.int64)
        seqs = [((b,), (b, slice(0, lens[b] if lens is not None else k.shape[1]))) for b in range(q.shape[0])]
    for b, (iq, ik) in enumerate(seqs):
        qb, kb, vb, ob, dob = q[iq], k[ik], v[ik], out[iq], do[iq]
        len_q, heads_q, len_k, heads_kv = qb.shape[0], qb.shape[1], kb.shape[0], kb.shape[1]
        groups = heads_q // heads_kv
        visible = structured_mask(spec, len_q, len_k)
        for h in range(heads_kv):
            sl = slice(h * groups, (h + 1) * groups)
            vis, bias = _group_mask(mask_np, visible, b, h * groups, groups, len_q, len_k)
            env = None if named is None else Env(spec, named, b, h * groups, groups, h, len_q, len_k)
            gq, gk, gv = _attend_grad(spec, qb[:, sl], kb[:, h], vb[:, h], dob[:, sl], ob[:, sl], vis, bias,
                                      env, grads)
            dq[iq][:, sl] = gq  # (views of dq: basic indexing)
            dk[ik][:, h] = gk
            dv[ik][:, h] = gv
    if grads:
        return dq, dk, dv, {name: g for name, (g, _) in grads.items()}
    return dq, dk, dv


def relative_error(out, ref) -> float:
    """||out - ref|| / ||ref|| in float64 (NaN anywhere gives inf)."""
    o = np.asarray(to_numpy(out), dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    if not np.all(np.isfinite(o)):
        return float("inf")
    denom = np.linalg.norm(r)
    diff = np.linalg.norm(o - r)
    return float(diff / denom) if denom > 0 else float(diff)


# FP8: P is quantized to e4m3 for P V (3 mantissa bits): benchmarks/probes/emulate_fp8_p.py measures up
# to 2.5e-2 on random inputs (docs/language.md, "FP8 prefill")
TOLERANCE = {"f32": 1e-5, "f16": 2e-3, "bf16": 1e-2, "e4m3": 5e-2, "e5m2": 5e-2}
F16_ACCUMULATOR_TOLERANCE = 1e-2


def tolerance(spec: AttentionSpec) -> float:
    """Relative L2 error allowed against the reference (docs/architecture.md, "Numerics")."""
    if "f16" in (spec.acc_qk, spec.acc_pv):
        return max(F16_ACCUMULATOR_TOLERANCE, TOLERANCE[spec.dtype])
    return TOLERANCE[spec.dtype]
