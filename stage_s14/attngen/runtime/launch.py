"""Run-time inputs of a call, checked and resolved the same way for both targets.

`resolve()` takes the shapes and dtypes of q, k, v and the integer inputs (kv_lens,
cu_seqlens_q/k, block_table), checks every one against the plan and each other, and returns a
`Launch`: the layout, the per-sequence lengths, the output shapes and the number of KV splits.
Nothing here touches a device. An integer input is either a host array (`host_ints()`: its
contents are checked here, at once) or an `OnDevice` description of one that stays on the
device (`on_device()`: only its shape and dtype are checked here; the kernels check its
contents and raise the device's error flag, docs/variants.md "Integer inputs on the device"):
reading it here would cost a device-to-host copy and a synchronisation per call. The grid then
covers the bounds the shapes give (or max_seqlen_q / max_seqlen_k). docs/variants.md is the
contract these checks implement.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import LaunchError
from ..limits import INT32_MAX, MAX_GRID_YZ, MAX_SEQ_LEN
from ..plan.kernel_plan import KernelPlan
from ..plan.schedule import choose_splits
from .kvquant import STORED


def _module(x) -> str:
    return type(x).__module__.split(".")[0]


def host_ints(name: str, x, ndim: int) -> np.ndarray:
    """A host int64 copy of an integer array (numpy, lists, PyTorch, device arrays that copy to
    the host with .get() or .numpy()), checked for dimensionality and int32 range; anything
    else is a LaunchError naming `name`."""
    mod = _module(x)
    try:
        if mod == "torch":
            if x.dtype.is_floating_point or x.dtype.is_complex or str(x.dtype) == "torch.bool":
                raise LaunchError(f"{name} must be an integer tensor, not {x.dtype}")
            a = x.detach().cpu().numpy()
        elif isinstance(x, (np.ndarray, list, tuple)) or np.isscalar(x):
            a = np.asarray(x)
        elif callable(getattr(x, "get", None)) and hasattr(x, "shape"):  # a device array: copy to the host
            a = np.asarray(x.get())
        elif callable(getattr(x, "numpy", None)) and hasattr(x, "shape"):  # a GPU buffer's handle
            a = np.asarray(x.numpy())
        else:
            a = np.asarray(x)
    except LaunchError:
        raise
    except Exception as e:
        raise LaunchError(f"{name}: cannot read it as an integer array ({e})") from None
    if a.dtype == bool or not (np.issubdtype(a.dtype, np.integer) or a.size == 0):
        raise LaunchError(f"{name} must hold integers, not {a.dtype}")
    if a.ndim != ndim:
        raise LaunchError(f"{name} must have {ndim} dimension(s), got shape {tuple(a.shape)}")
    a = a.astype(np.int64)
    if a.size and (a.min() < -INT32_MAX or a.max() > INT32_MAX):
        raise LaunchError(f"{name} has values outside the int32 range")
    return a


@dataclass(frozen=True)
class OnDevice:
    """An integer input that stays on the device: its shape here, its contents checked by the
    kernel (see the module docstring)."""

    shape: tuple

    @property
    def ndim(self) -> int:
        return len(self.shape)


def on_device(name: str, shape: tuple, dtype: str, ndim: int) -> OnDevice:
    """The OnDevice of a device integer tensor of `shape` and `dtype` (its name in numpy's terms:
    int32, int64, float16, ...): device tensors must be int32 (the kernels read them as is, with
    no conversion kernel: a narrowing of int64 could wrap silently)."""
    if dtype != "int32":
        raise LaunchError(f"{name} is a device tensor of {dtype}; integer inputs on the GPU must be int32 "
                          "(e.g. torch: x.to(torch.int32), CuPy: x.astype(cupy.int32)), or pass a host array")
    if len(shape) != ndim:
        raise LaunchError(f"{name} must have {ndim} dimension(s), got shape {tuple(shape)}")
    return OnDevice(tuple(int(n) for n in shape))


def _max_seqlen(name: str, given, bound: int, actual: int | None) -> int:
    """The grid's length bound for packed sequences: `given` (max_seqlen_q / _k) when passed,
    else the exact longest sequence (`actual`, from host cu_seqlens) or the packed rows (`bound`)."""
    if given is None:
        return bound if actual is None else actual
    if isinstance(given, bool) or not isinstance(given, (int, np.integer)) or given < 0:
        raise LaunchError(f"{name} must be a non-negative int, got {given!r}")
    if given > bound:
        raise LaunchError(f"{name}={given} exceeds the {bound} rows of the packed tensor")
    if actual is not None and given < actual:
        raise LaunchError(f"{name}={given}, but cu_seqlens holds a sequence of {actual}")
    return int(given)


@dataclass(frozen=True)
class Launch:
    """One call's sizes, after every check. Lengths are per sequence."""

    layout: str  # padded | packed | paged
    batch: int
    len_q: int  # padded/paged: Lq; packed: the longest query sequence
    len_k: int  # keys the kernel may see in the longest sequence, after the append
    heads_q: int
    heads_kv: int
    total_q: int  # packed: rows of q; else B * Lq
    # Host arrays (checked), OnDevice (checked by the kernel) or None:
    kv_lens: np.ndarray | OnDevice | None  # (B,) keys before the append; None: all Lk (padded)
    cu_seqlens_q: np.ndarray | OnDevice | None  # (B + 1,)
    cu_seqlens_k: np.ndarray | OnDevice | None
    block_table: np.ndarray | OnDevice | None  # (B, max_pages)
    page: int  # paged: page size; else 0
    capacity: int  # padded: Lk of the k/v tensors; paged: num_pages * page; packed: total_k
    len_new: int  # rows appended per sequence (0: no append)
    splits: int  # KV splits (1 for fused)
    cores: int = 1  # the device's multiprocessors (grid symbol SM: persistent blocks)
    # mask custom with host kv_lens and a device block table: the mask's key axis, which may be
    # narrower than len_k (the cache's rows, the grid's bound there) down to the longest sequence's
    # keys; None: the mask covers len_k exactly (with host kv_lens and table, len_k is the mask's)
    mask_len_k: int | None = None

    @property
    def mask_lk(self) -> int:
        """The key axis a custom mask of this call must have."""
        return self.len_k if self.mask_len_k is None else self.mask_len_k

    @property
    def group(self) -> int:
        return self.heads_q // self.heads_kv

    def sizes(self, plan: KernelPlan | None = None) -> dict:
        """The values of the formulas' symbols for this call (attngen.plan.formulas): B, Lq, Lk,
        Hq, Hkv, G, S, SM (multiprocessors), and the head dims Dqk, Dv of `plan`."""
        out = dict(B=self.batch, Lq=self.len_q, Lk=self.len_k, Hq=self.heads_q, Hkv=self.heads_kv,
                   G=self.group, S=self.splits, SM=self.cores)
        if plan is not None:
            out.update(Dqk=plan.d_qk, Dv=plan.d_v)
        return out

    def out_shape_for(self, d_v: int) -> tuple:
        if self.layout == "packed":
            return (self.total_q, self.heads_q, d_v)
        return (self.batch, self.len_q, self.heads_q, d_v)

    @property
    def lse_shape(self) -> tuple:
        if self.layout == "packed":
            return (self.heads_q, self.total_q)
        return (self.batch, self.heads_q, self.len_q)

    def seq_lens_k(self) -> np.ndarray:
        """(B,) keys each sequence attends to (after the append); host integer inputs only."""
        if self.cu_seqlens_k is not None:
            return np.diff(self.cu_seqlens_k)
        if self.kv_lens is not None:
            return self.kv_lens + self.len_new
        return np.full(self.batch, self.len_k, np.int64)

    @property
    def empty(self) -> bool:
        return self.batch == 0 or self.len_q == 0 or self.heads_q == 0


KV_STORED = {name: np.dtype(t).name for name, t in STORED.items()}  # a quantized cache's bytes: uint8 / int8


def _check_tensor(plan: KernelPlan, name: str, shape, dtype: str, ndim: int, d: int, what: str):
    if len(shape) != ndim:
        raise LaunchError(f"{name} must have {ndim} dimensions ({what}), got shape {tuple(shape)}")
    if shape[-1] != d:
        which = "v" if name in ("v", "v_new") else "qk"
        raise LaunchError(f"{name} has head_dim {shape[-1]}, but kernel '{plan.spec.name}' was built "
                          f"for head_dim {which}={d} (shape {tuple(shape)})")
    kv_dtype = plan.spec.kv_dtype if name in ("k", "v") else None
    if kv_dtype is not None:  # stored quantized (runtime/kvquant.py): uint8 FP8 bytes or int8
        if dtype != KV_STORED[kv_dtype]:
            raise LaunchError(f"{name} has dtype {dtype}, but kernel '{plan.spec.name}' stores K and V as "
                              f"kv_dtype {kv_dtype}: numpy {KV_STORED[kv_dtype]} (attngen.quantize_kv makes them)")
    elif dtype != plan.dtype and not (plan.spec.is_fp8 and dtype == "uint8"):  # (FP8: its bytes as uint8)
        raise LaunchError(f"{name} has dtype {dtype}, but kernel '{plan.spec.name}' was built "
                          f"for dtype {plan.dtype}" + (" (torch.float8_e4m3fn / float8_e5m2 tensors, or uint8 arrays "
                                                       "of the FP8 bytes)" if plan.spec.is_fp8 else ""))


def _check_heads(plan: KernelPlan, hq: int, hkv: int):
    spec = plan.spec
    if hkv == 0 or hq % hkv:
        raise LaunchError(f"q has {hq} heads, which is not a multiple of the {hkv} KV heads of k and v")
    if spec.heads_q is not None and (hq, hkv) != (spec.heads_q, spec.heads_kv):
        raise LaunchError(f"kernel '{spec.name}' was built for heads q={spec.heads_q} kv={spec.heads_kv}, "
                          f"but q has {hq} heads and k, v have {hkv}")


def _cu_seqlens(name: str, x, total: int, batch: int | None) -> np.ndarray | OnDevice:
    if isinstance(x, OnDevice):
        if x.ndim != 1:
            raise LaunchError(f"{name} must have 1 dimension(s), got shape {x.shape}")
        n = x.shape[0]
        if n < 1:
            raise LaunchError(f"{name} must have B + 1 entries (at least 1), got 0")
        if batch is not None and n != batch + 1:
            raise LaunchError(f"{name} has {n} entries, but cu_seqlens_q has {batch + 1}: both are B + 1")
        return x
    cu = host_ints(name, x, 1)
    if len(cu) < 1:
        raise LaunchError(f"{name} must have B + 1 entries (at least 1), got 0")
    if batch is not None and len(cu) != batch + 1:
        raise LaunchError(f"{name} has {len(cu)} entries, but cu_seqlens_q has {batch + 1}: both are B + 1")
    if cu[0] != 0:
        raise LaunchError(f"{name} must start at 0, got {cu[0]}")
    steps = np.diff(cu)
    if (steps < 0).any():
        b = int(np.argmax(steps < 0))
        raise LaunchError(f"{name} must be non-decreasing, but entry {b + 1} ({cu[b + 1]}) is below "
                          f"entry {b} ({cu[b]})")
    if cu[-1] != total:
        raise LaunchError(f"{name} ends at {cu[-1]}, but the packed tensor has {total} rows: "
                          "the last entry must be the total length")
    return cu


def _mask_width(mask_keys: int, longest: int, room: int, len_new: int) -> int:
    """A custom mask's key axis with kv_lens known on the host: its keys are positions in the
    cache, so any width from the longest sequence's keys up to what the cache holds (one mask
    serves every step of a decode). The kernels bound each sequence's keys by its kv_len and read
    the mask by its own width; split_kv(auto) counts the sequences' keys, not the mask's."""
    if not longest <= mask_keys <= room:
        raise LaunchError(f"mask covers {mask_keys} keys; with kv_lens it must cover the longest sequence's "
                          f"{longest} keys" + (" (kv_lens + the appended rows)" if len_new else "")
                          + f" and at most the {room} keys the cache holds per sequence")
    return mask_keys


def _check_appends_own_their_pages(table: np.ndarray, kvl: np.ndarray, need: np.ndarray, page: int) -> None:
    """A LaunchError when a page that one sequence's append writes is also used by another
    sequence (read, or written by its own append): the blocks of the two sequences run at the
    same time, so the other would read half-written keys or lose its own. Pages shared by rows
    read-only (a common prefix, as prefix caching shares them) are fine. Host inputs only: with
    a device block table or device kv_lens this is the caller's to keep (docs/variants.md)."""
    if table.size == 0:
        return
    cols = np.arange(table.shape[1])
    used = cols[None, :] < (-(-need.astype(np.int64) // page))[:, None]  # the pages each row uses
    rows, at = np.nonzero(used)
    n = table.shape[0]
    pairs = np.unique(table[rows, at].astype(np.int64) * n + rows)  # (page, row) once each, as page * B + row
    pages, users = np.unique(pairs // n, return_counts=True)
    shared = pages[users > 1]
    if shared.size == 0:
        return
    written = used & (cols[None, :] >= (kvl.astype(np.int64) // page)[:, None])  # the pages each append writes
    wrows, wat = np.nonzero(written)
    hit = np.isin(table[wrows, wat], shared)
    if hit.any():
        i = int(np.argmax(hit))
        bi, j = int(wrows[i]), int(wat[i])
        p = int(table[bi, j])
        other = int(next(r for r in pairs[pairs // n == p] % n if r != bi))
        raise LaunchError(f"block_table[{bi}, {j}] = {p}: row {bi}'s append writes page {p}, which row {other} also "
                          "uses; a page an append writes must belong to that sequence alone (copy a shared page "
                          "before appending to it)")


def resolve(plan: KernelPlan, shapes: dict, dtypes: dict, *, kv_lens=None, cu_seqlens_q=None,
            cu_seqlens_k=None, block_table=None, has_mask: bool = False, cores: int = 1, max_seqlen_q=None,
            max_seqlen_k=None, mask_keys: int | None = None) -> Launch:
    """Check a call's inputs against the plan and each other; see the module docstring.

    `shapes` / `dtypes` map q, k, v (and k_new, v_new when given) to shape tuples and attngen
    dtype names; the integer inputs are host arrays (anything host_ints reads) or OnDevice;
    `cores` is the device's multiprocessors / compute units (for split_kv(auto); None: inputs only,
    no launch: one split, and `plan` needs only spec, d_qk, d_v and dtype); max_seqlen_q /
    max_seqlen_k bound the packed sequences' lengths (the grid's rows and keys); `mask_keys`: the
    custom mask's key axis, which with host kv_lens may be as wide as the cache (_mask_width).
    """
    spec = plan.spec
    paged = spec.kv_cache.is_paged
    packed = cu_seqlens_q is not None
    append = "k_new" in shapes or "v_new" in shapes
    if spec.mask.is_custom and not has_mask:
        raise LaunchError(f"kernel '{spec.name}' was built with `mask custom`: pass mask= (a BlockMask from "
                          "attngen.block_mask, or a boolean / additive mask tensor)")
    if not spec.mask.is_custom and has_mask:
        raise LaunchError(f"mask= needs a kernel built with `mask custom`; kernel '{spec.name}' has "
                          f"mask {spec.mask.kind}")
    if block_table is not None and not paged:
        raise LaunchError(f"block_table= needs a kernel built with `kv_cache paged(page=N)`; kernel "
                          f"'{spec.name}' has kv_cache contiguous")
    if paged and block_table is None:
        raise LaunchError(f"kernel '{spec.name}' was built with `kv_cache paged`: pass block_table= "
                          "(B, max_pages) and kv_lens= (B,)")
    if cu_seqlens_k is not None and not packed:
        raise LaunchError("cu_seqlens_k= needs cu_seqlens_q= too (packed queries and keys)")
    if not packed and (max_seqlen_q is not None or max_seqlen_k is not None):
        raise LaunchError("max_seqlen_q= / max_seqlen_k= bound packed sequences: pass cu_seqlens_q= too")
    if packed and (paged or append or kv_lens is not None):
        what = "kv_cache paged" if paged else ("k_new/v_new" if append else "kv_lens=")
        raise LaunchError(f"packed sequences (cu_seqlens_q=) cannot be combined with {what}; give each "
                          "sequence's keys through cu_seqlens_k instead")
    if ("k_new" in shapes) != ("v_new" in shapes):
        raise LaunchError("k_new and v_new go together: pass both or neither")
    if spec.kv_dtype is not None and packed:
        raise LaunchError(f"kernel '{spec.name}' stores K and V as kv_dtype {spec.kv_dtype}: packed sequences "
                          "(cu_seqlens_q=) are not built for a quantized cache yet (issue 44); pass a padded batch "
                          "with kv_lens, or a paged cache")
    if append and kv_lens is None:
        raise LaunchError("k_new/v_new append to a cache: pass kv_lens= (keys already in each sequence's "
                          "cache, before the append)")

    dqk, dv = plan.d_qk, plan.d_v
    if packed:
        _check_tensor(plan, "q", shapes["q"], dtypes["q"], 3, dqk, "total_q, heads, head_dim")
        _check_tensor(plan, "k", shapes["k"], dtypes["k"], 3, dqk, "total_k, heads, head_dim")
        _check_tensor(plan, "v", shapes["v"], dtypes["v"], 3, dv, "total_k, heads, head_dim")
        (tq, hq, _), (tk, hkv, _), (tv, hv, _) = shapes["q"], shapes["k"], shapes["v"]
    else:
        kv_what = "num_pages, page, heads, head_dim" if paged else "batch, seq, heads, head_dim"
        _check_tensor(plan, "q", shapes["q"], dtypes["q"], 4, dqk, "batch, seq, heads, head_dim")
        _check_tensor(plan, "k", shapes["k"], dtypes["k"], 4, dqk, kv_what)
        _check_tensor(plan, "v", shapes["v"], dtypes["v"], 4, dv, kv_what)
        (b, len_q, hq, _), k, v = shapes["q"], shapes["k"], shapes["v"]
        if k[1] != v[1] or k[0] != v[0]:
            raise LaunchError(f"k and v must have the same leading dimensions: k {tuple(k)}, v {tuple(v)}")
        hkv, hv = k[2], v[2]
        if not paged and k[0] != b:
            raise LaunchError(f"batch sizes differ: q {b}, k {k[0]}, v {v[0]}")
    if hkv != hv:
        raise LaunchError(f"k and v have different head counts: k {hkv}, v {hv}")
    _check_heads(plan, hq, hkv)

    page, cap, kvl, table, cuq, cuk, len_new, mask_len_k, split_len_k = 0, 0, None, None, None, None, 0, None, None
    if packed:
        if tk != tv:
            raise LaunchError(f"k and v have different lengths: k {tk}, v {tv}")
        cuq = _cu_seqlens("cu_seqlens_q", cu_seqlens_q, tq, None)
        b = cuq.shape[0] - 1
        cuk = cuq if cu_seqlens_k is None else _cu_seqlens("cu_seqlens_k", cu_seqlens_k, tk, b)
        if cu_seqlens_k is None and tk != tq:
            raise LaunchError(f"q has {tq} packed rows and k {tk}: pass cu_seqlens_k for keys packed "
                              "differently from the queries")
        host_q = None if isinstance(cuq, OnDevice) else (int(np.diff(cuq).max()) if b else 0)
        host_k = None if isinstance(cuk, OnDevice) else (int(np.diff(cuk).max()) if b else 0)
        len_q = _max_seqlen("max_seqlen_q", max_seqlen_q, tq, host_q)
        len_k = _max_seqlen("max_seqlen_k", max_seqlen_k, tk, host_k)
        cap = tk
        total_q = tq
    else:
        total_q = b * len_q
        if paged:
            page = shapes["k"][1]
            if page != spec.kv_cache.page:
                raise LaunchError(f"k and v have pages of {page} rows, but kernel '{spec.name}' was built for "
                                  f"kv_cache paged(page={spec.kv_cache.page}): shape (num_pages, page, heads, "
                                  "head_dim)")
            num_pages = shapes["k"][0]
            cap = num_pages * page
            table = block_table if isinstance(block_table, OnDevice) else host_ints("block_table", block_table, 2)
            if table.ndim != 2:
                raise LaunchError(f"block_table must have 2 dimension(s), got shape {table.shape}")
            if table.shape[0] != b:
                raise LaunchError(f"block_table has {table.shape[0]} rows, but the batch is {b}")
            if kv_lens is None:
                raise LaunchError("kv_cache paged needs kv_lens= (B,): keys in each sequence's pages")
        else:
            cap = shapes["k"][1]
        if isinstance(kv_lens, OnDevice):
            kvl = kv_lens
            if kvl.ndim != 1:
                raise LaunchError(f"kv_lens must have 1 dimension(s), got shape {kvl.shape}")
            if kvl.shape[0] != b:
                raise LaunchError(f"kv_lens has {kvl.shape[0]} entries, but the batch is {b}")
        elif kv_lens is not None:
            kvl = host_ints("kv_lens", kv_lens, 1)
            if len(kvl) != b:
                raise LaunchError(f"kv_lens has {len(kvl)} entries, but the batch is {b}")
            if (kvl < 0).any():
                raise LaunchError(f"kv_lens must be >= 0, got {int(kvl.min())}")
        if append:
            kn, vn = shapes["k_new"], shapes["v_new"]
            _check_tensor(plan, "k_new", kn, dtypes["k_new"], 4, dqk, "batch, new rows, heads, head_dim")
            _check_tensor(plan, "v_new", vn, dtypes["v_new"], 4, dv, "batch, new rows, heads, head_dim")
            if kn[:3] != (b, kn[1], hkv) or vn[:3] != kn[:3]:
                raise LaunchError(f"k_new and v_new must be (B={b}, Lnew, Hkv={hkv}, D) with the same Lnew: "
                                  f"k_new {tuple(kn)}, v_new {tuple(vn)}")
            len_new = kn[1]
            if len_new and (len_q == 0 or hq == 0):
                raise LaunchError("k_new/v_new are appended by the attention kernels, and a call with no query "
                                  f"rows (q has shape {tuple(shapes['q'])}) launches none: pass the new tokens' "
                                  "queries too")
        if kvl is not None and (isinstance(kvl, OnDevice) or isinstance(table, OnDevice)):
            # contents on the device: the grid covers what the cache can hold; the kernels check
            # kv_lens[b] + len_new against it and every page they use (the device's error flag)
            room = table.shape[1] * page if paged else cap
            if len_new > room:
                raise LaunchError(f"k_new has {len_new} rows per sequence, but the cache holds {room} keys per "
                                  "sequence" + (f" (block_table gives {table.shape[1]} pages of {page})" if paged
                                                else f" (k has shape {tuple(shapes['k'])})"))
            if not isinstance(kvl, OnDevice):
                worst = int(np.argmax(kvl + len_new)) if b else 0
                if b and kvl[worst] + len_new > room:
                    raise LaunchError(f"kv_lens[{worst}] = {kvl[worst]}" + (f" + {len_new} new" if len_new else "")
                                      + f" keys exceed the {room} keys the cache holds per sequence")
            len_k = room
            if mask_keys is not None and isinstance(kvl, OnDevice):
                if mask_keys != room:
                    raise LaunchError(f"mask covers {mask_keys} keys, but with kv_lens on the device a mask covers the "
                                      f"cache: {room} keys per sequence" + (f" ({table.shape[1]} block-table columns "
                                                                            f"x page {page})" if paged else ""))
            elif mask_keys is not None:  # kv_lens on the host (the block table on the device)
                mask_len_k = _mask_width(mask_keys, int((kvl + len_new).max()) if b else 0, room, len_new)
        elif kvl is not None:
            need = kvl + len_new
            if paged:
                room = table.shape[1] * page
                worst = int(np.argmax(need)) if b else 0
                if b and need[worst] > room:
                    raise LaunchError(f"kv_lens[{worst}] = {kvl[worst]}" + (f" + {len_new} new" if len_new else "")
                                      + f" keys need {-(-int(need[worst]) // page)} pages, but block_table rows "
                                      f"give {table.shape[1]} (page={page})")
                for bi in range(b):
                    used = table[bi, : -(-int(need[bi]) // page)]
                    bad = (used < 0) | (used >= shapes["k"][0])
                    if bad.any():
                        j = int(np.argmax(bad))
                        raise LaunchError(f"block_table[{bi}, {j}] = {used[j]} points outside the cache "
                                          f"(k and v have {shapes['k'][0]} pages)")
                    if len_new and len(set(used.tolist())) != len(used):
                        raise LaunchError(f"block_table row {bi} repeats a page: appending would overwrite "
                                          "keys it still reads")
                if len_new:
                    _check_appends_own_their_pages(table, kvl, need, page)
            else:
                worst = int(np.argmax(need)) if b else 0
                if b and need[worst] > cap:
                    raise LaunchError(f"kv_lens[{worst}] = {kvl[worst]}" + (f" + {len_new} new" if len_new else "")
                                      + f" keys exceed the cache's {cap} rows (k has shape "
                                      f"{tuple(shapes['k'])})")
            len_k = int(need.max()) if b else 0
            if mask_keys is not None:
                # the launch covers the mask's keys (workspaces, lists); its splits, the keys'
                split_len_k = len_k
                len_k = _mask_width(mask_keys, len_k, table.shape[1] * page if paged else cap, len_new)
        else:
            len_k = cap
    for name, n in (("Lq", len_q), ("Lk", len_k)):
        if n > MAX_SEQ_LEN:
            raise LaunchError(f"sequence length {name}={n} exceeds {MAX_SEQ_LEN}")
    if b > MAX_GRID_YZ or hq > MAX_GRID_YZ:
        raise LaunchError(f"batch {b} and query heads {hq} must each be at most {MAX_GRID_YZ}")
    splits = choose_splits(plan, b, len_q, len_k if split_len_k is None else split_len_k, hq, hkv,
                           cores) if cores is not None else 1
    return Launch(layout="packed" if packed else ("paged" if paged else "padded"), batch=b, len_q=len_q,
                  len_k=len_k, heads_q=hq, heads_kv=hkv, total_q=total_q, kv_lens=kvl, cu_seqlens_q=cuq,
                  cu_seqlens_k=cuk, block_table=table, page=page, capacity=cap, len_new=len_new,
                  splits=splits, cores=max(1, int(cores or 1)), mask_len_k=mask_len_k)
