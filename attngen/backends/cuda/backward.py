"""The CUDA backward pass (issue 41; attngen/plan/backward.py, docs/backward.md): its three
families, their sources (a helper source of the forward plan: `attngen build SPEC --target cuda
--emit backward`) and what `attngen check` says of them; backward_launch.py runs them.
`family(plan)` picks one (target option backward=auto|fast|deterministic).

Each runs three entry points in order on the caller's stream (four with `grad` inputs summed
through partial sums): attngen_<name>_bwd_preprocess (D_i = rowsum(dO_i * O_i) into an f32
workspace), _bwd_dkdv (per key block, KV head and batch entry: dK_j and dV_j, summed over the query
tiles that see the block and the GQA group's heads) and _bwd_dq.
- "wgmma" (fast; templates/cuda/backward_wgmma.cu.j2): Hopper tensor cores, cuda-sm90, f16/bf16,
  head dims 64 and 128; qk = v = 256 in blocks of 64 keys (backward_wgmma_wide.cu.j2, `wide`; no score or mask expressions). The dK/dV step also
  computes every dQ_i contribution of its keys and adds it into an f32 accumulator through the
  tensor copy engine (reductions, in no fixed order); _bwd_dq converts the accumulator.
- "mma" (fast; templates/cuda/backward_mma.cu.j2, backward_mma.py): mma.sync tensor cores (sm_80+),
  f16/bf16, head dims 32 to 128, masks none / causal / window, where the wgmma family does not run
  (profile cuda-sm80); dQ by f32 atomics into an accumulator that _bwd_dq converts, as "wgmma".
- "fma" (deterministic; templates/cuda/backward.cu.j2): f32 on CUDA cores (every tile staged in
  shared memory as floats), every dtype and head dim that fits; no atomics, the same inputs give the
  same bits; _bwd_dq is one block per query tile computing dQ_i. Correct, not fast.

Score and mask expressions (issue 42) compile in wgmma's 128-key kernel and in fma
(`expression_sources`: score_expr, its derivative score_expr_ds, mask_expr per element and
mask_expr_tile's tile and step skipping; docs/backward.md). Expressions that read inputs take them
as the forward does (ExprInputs, the loaders, reads out of bounds reported in word kErrExprRead of
the errors); a mask that reads inputs, where the score reads none, is the forward's BlockMask
(expr_blockmask.MaskInputsKernel runs the `mask custom` backward), else tested per element as the
forward does. The gradients of `grad` inputs (expr_grads.py): the fast family adds them with
atomics (reads a step shares summed per step first), the deterministic one without (once per pair
directly, other reads through per-block partial sums and a fourth entry, _bwd_grads).

The runtime reads integer inputs (kv_lens, cu_seqlens) on the host and checks them with the
forward's rules (runtime.launch.resolve): a device integer array costs a copy to the host and a
synchronisation there, unlike the forward.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...errors import Diagnostic, SpecError
from ...plan import backward as neutral
from ...plan import masks
from ...plan.kernel_plan import KernelPlan, Problem
from ...version import __version__
from . import backward_mma, expr_grads

THREADS = 256  # per block, every entry point: 8 warps
# Shared memory a block may take (dK/dV and dQ steps): 96 KiB runs on every sm_80+ GPU (sm_86 and
# sm_89 allow 99 KiB per block) without depending on the profile.
SMEM_BUDGET = 96 * 1024
TILES = (64, 32, 16, 8)  # square tiles (query rows x keys), largest first
MAX_ACC = 64  # f32 accumulators per thread (the dK/dV step holds dK_j and dV_j in registers)
PRE_ROWS = THREADS // 32  # preprocess: one warp per (query row, head)

# The launch's argument struct, in this order in C and in ctypes: 8-byte fields first, so both
# lay it out without padding. (C type, name, doc); "ptr" types are device pointers.
_PTR, _I64, _I32 = "ptr", "i64", "i32"
ARG_FIELDS = (
    ("const elem_t*", "q", "(B, Lq, Hq, Dqk); packed (T, Hq, Dqk)"),
    ("const elem_t*", "k", "(B, Lk, Hkv, Dqk)"),
    ("const elem_t*", "v", "(B, Lk, Hkv, Dv)"),
    ("const elem_t*", "out", "the forward's output (B, Lq, Hq, Dv)"),
    ("const elem_t*", "dout", "the gradient of out"),
    ("const float*", "lse", "the forward's lse (B, Hq, Lq), natural log"),
    ("float*", "delta", "workspace D (lse's layout, contiguous): written by preprocess"),
    ("float*", "dq_accum", "the wgmma family's f32 dQ (q's shape, contiguous; dq's strides), or null"),
    ("elem_t*", "dq", "q's shape, contiguous"),
    ("elem_t*", "dk", "k's shape, contiguous"),
    ("elem_t*", "dv", "v's shape, contiguous"),
    ("const int*", "kv_lens", "(B,) or null"),
    ("const int*", "cu_seqlens_q", "(B + 1,) or null (padded)"),
    ("const int*", "cu_seqlens_k", "(B + 1,), cu_seqlens_q's when not given"),
    ("const unsigned*", "mask_bits", "mask custom, boolean: 32 keys per word, or null"),
    ("const float*", "mask_add", "mask custom, additive, or null"),
    ("const int*", "mask_counts", "the BlockMask's live kv tiles per q tile"),
    ("const int*", "mask_tiles", "the BlockMask's lists"),
    ("const int*", "block_counts", "fast family, mask custom: live query steps per key block (Bm, Hm, nkb)"),
    ("const int*", "block_lists", "their lists (Bm, Hm, nkb, n_steps): step * 2 + partial, ascending"),
) + tuple(("long long", f"{t}_s{a}", f"{t}'s {w} stride (elements)")
          for t in ("q", "k", "v", "o", "do", "dq", "dk", "dv") for a, w in (("b", "batch"), ("l", "row"),
                                                                              ("h", "head"))) + (
    ("long long", "lse_sb", "lse's strides (packed: 0, then (Hq, T))"),
    ("long long", "lse_sh", ""),
    ("long long", "lse_sl", ""),
    ("long long", "delta_sb", "delta's strides (rows contiguous)"),
    ("long long", "delta_sh", ""),
    ("long long", "mask_sb", "mask custom: the mask's strides (0 where broadcast)"),
    ("long long", "mask_sh", ""),
    ("long long", "mask_sl", ""),
    ("long long", "list_sb", "the lists' strides (in q tiles)"),
    ("long long", "list_sh", ""),
    ("long long", "blist_sb", "block_counts' strides (in key blocks; 0 where broadcast)"),
    ("long long", "blist_sh", ""),
    ("long long", "n_steps", "fast family, mask custom: block_lists' row length"),
    ("int", "len_q", "padded: Lq"),
    ("int", "len_k", "padded: Lk (keys before kv_lens)"),
    ("int", "rows_q", "preprocess: rows per batch entry (packed: T)"),
    ("int", "rows_k", "padded: k's rows per batch entry"),
    ("int", "group", "Hq / Hkv"),
    ("int", "n_kvtiles", "mask custom: the lists' row length"),
)


@dataclass(frozen=True)
class BackwardConfig:
    tile: int  # query rows and keys per tile
    threads: int
    smem_bytes: int  # the dK/dV and dQ steps (dynamic)
    acc_per_thread: int  # f32 accumulators of the dK/dV step per thread


def smem_bytes(tile: int, d_qk: int, d_v: int, partials: bool = False) -> int:
    """Q_i, dO_i, K_j, V_j (rows padded by a float), P_ij, dS_ij, lse_i and D_i, as f32; with
    `partials` each pair's ds and s too (expr_grads.py)."""
    return 4 * (2 * tile * (d_qk + 1) + 2 * tile * (d_v + 1) + (4 if partials else 2) * tile * (tile + 1) + 2 * tile)


def partials(plan: KernelPlan) -> bool:
    """Whether the deterministic family sums `grad` inputs through partials (expr_grads.py)."""
    return family(plan) == "fma" and bool(expr_grads.partials(plan.spec))


def _acc(tile: int, d_qk: int, d_v: int) -> int:
    return -(-tile * d_qk // THREADS) + -(-tile * d_v // THREADS)


def backward_config(plan: KernelPlan) -> BackwardConfig:
    """The largest square tile that fits the shared-memory budget and the accumulators; with
    `mask custom`, one that divides the forward's tiles (the BlockMask's)."""
    d_qk, d_v, part = plan.d_qk, plan.d_v, partials(plan)
    for tile in TILES:
        if plan.spec.mask.is_custom and (plan.tile_q % tile or plan.tile_kv % tile):
            continue
        if smem_bytes(tile, d_qk, d_v, part) <= SMEM_BUDGET and _acc(tile, d_qk, d_v) <= MAX_ACC:
            return BackwardConfig(tile, THREADS, smem_bytes(tile, d_qk, d_v, part), _acc(tile, d_qk, d_v))
    raise Problem(f"the cuda backward stages tiles of at least {TILES[-1]} rows in {SMEM_BUDGET // 1024} KiB of "
                  f"shared memory: head dims qk={d_qk} v={d_v} do not fit (the backward takes head dims up to "
                  "about 700)", key="head_dim")


# The Hopper family (backward_wgmma.cu.j2): keys per block, query rows per step (WGMMA_ROWS; 128 at
# head dim 64, wgmma_rows), head dims.
WGMMA_KEYS, WGMMA_ROWS, WGMMA_HEAD_DIMS = 128, 64, (64, 128)
# ... and its kernel for wide head dims (backward_wgmma_wide.cu.j2): keys per block, (qk, v).
WIDE_KEYS, WIDE_HEAD_DIMS = 64, ((256, 256),)


def wide(plan: KernelPlan) -> bool:
    """Whether the fast family computes `plan` with its wide-head-dim kernel (blocks of 64 keys)."""
    return (plan.d_qk, plan.d_v) in WIDE_HEAD_DIMS


def block_keys(plan: KernelPlan) -> int:
    """Keys per block of the fast family's dK/dV step."""
    return WIDE_KEYS if wide(plan) else WGMMA_KEYS


def wgmma_rows(plan: KernelPlan) -> int:
    """Query rows per step of the fast family's dK/dV loop: 128 where qk = v = 64 (each step's
    fixed costs, the waits, the barrier, the staging, spread over twice the rows: S^T is m64n128
    per warpgroup, dP^T two m64n64 halves, and each warpgroup computes dQ for half the rows), else
    64 (head dim 128 has no registers for 128 rows). So only with the named masks (none, causal,
    window) and no softcap or score expression: where P^T and dS^T are computed together (softcap,
    score expressions) S^T and dP^T are live whole (192 accumulators) and ptxas spills, as it does
    for a mask expression (its per-step classification's state: 44-64 bytes); mask custom's
    key-block lists are per 64-row step (BlockMask.derived)."""
    together = _wgmma_recompute(plan)["recompute_both"]
    named = plan.mask.kind in ("none", "causal", "window")
    return 128 if plan.d_qk == plan.d_v == 64 and named and not together else WGMMA_ROWS


def wgmma_smem_bytes(d_qk: int, d_v: int, m: int = WGMMA_ROWS, custom: bool = False) -> int:
    """K_j, V_j; Q_i, dO_i, dS, lse, D and a custom mask's bits in two stages of m rows; each
    warpgroup's dQ staging (64 x 64 floats); a flag per key; an mbarrier per stage (the tensor copy
    engine's Q_i and dO_i); with a custom mask two words per thread (lane_words); 1024 bytes of
    alignment (the template's kSmemBytes)."""
    k = WGMMA_KEYS
    return (2 * k * (d_qk + d_v) + 2 * 2 * m * (d_qk + d_v) + 2 * 2 * m * k + 2 * 2 * m * 4 + 2 * m * (k // 32) * 4
            + 2 * 64 * 64 * 4 + k + 2 * 8 + (2 * THREADS * 4 if custom else 0) + 1024)


def wide_smem_bytes(d_qk: int, d_v: int) -> int:
    """The wide kernel's: K_j, V_j; Q_i, dO_i (then dQ's staging), lse, D and a custom mask's bits in
    two stages; dS, P^T and dS^T; a flag per key; an mbarrier per stage (the tensor copy engine's
    Q_i and dO_i); 1024 bytes of alignment (the template's kSmemBytes)."""
    k, m = WIDE_KEYS, WGMMA_ROWS
    return (2 * k * (d_qk + d_v) + 2 * 2 * m * (d_qk + d_v) + 3 * 2 * m * k + 2 * 2 * m * 4 + 2 * m * (k // 32) * 4 + k
            + 2 * 8 + 1024)


def fast_smem_bytes(plan: KernelPlan) -> int:
    """The fast family's dK/dV step's shared memory for `plan`."""
    return (wide_smem_bytes(plan.d_qk, plan.d_v) if wide(plan)
            else wgmma_smem_bytes(plan.d_qk, plan.d_v, wgmma_rows(plan), plan.spec.mask.is_custom))


def _wgmma_refusal(plan: KernelPlan) -> str | None:
    """Why the Hopper family cannot compute `plan`'s backward (None: it can)."""
    if plan.dtype not in ("f16", "bf16"):
        return f"its products take f16 or bf16, not {plan.dtype}"
    if wide(plan):
        spec = plan.spec
        if spec.score is not None or plan.mask.kind == "expr" or spec.inputs:
            return ("its kernel for head dim 256 takes no score or mask expression nor inputs yet (the deterministic "
                    "family computes them)")
    elif plan.d_qk not in WGMMA_HEAD_DIMS or plan.d_v not in WGMMA_HEAD_DIMS:
        return f"it takes head dims 64 or 128 (qk and v each) or qk=v=256, not qk={plan.d_qk} v={plan.d_v}"
    if plan.details.arch != "sm_90a":
        return f"it runs on Hopper's wgmma (profile cuda-sm90, arch sm_90a), and this plan is for {plan.details.arch}"
    if plan.config.math != "wgmma":
        return f"it runs beside the forward's Hopper wgmma family, and this plan's forward is {plan.config.math}"
    return None


def _fast_refusal(plan: KernelPlan) -> str | None:
    """Why neither fast family can compute `plan`'s backward (None: one can)."""
    hopper, sm80 = _wgmma_refusal(plan), backward_mma.refusal(plan)
    return None if hopper is None or sm80 is None else f"the wgmma family: {hopper}; the mma family: {sm80}"


def family(plan: KernelPlan) -> str:
    """The backward family of `plan`: "wgmma" (fast: Hopper tensor cores) or "mma" (fast: mma.sync
    tensor cores, sm_80+), both with dQ by atomic f32 additions, so the bits of dq may vary between
    runs; or "fma" (deterministic: CUDA cores, no atomics). Option backward=auto takes a fast one
    where it can compute the spec, wgmma first."""
    if plan.spec.options("cuda").get("backward") == "deterministic":
        return "fma"
    if _wgmma_refusal(plan) is None:
        return "wgmma"
    return "mma" if backward_mma.refusal(plan) is None else "fma"


def backward_problems(plan: KernelPlan) -> list[Problem]:
    """Why `plan`'s spec has no CUDA backward (empty: it has one)."""
    out = neutral.problems(plan.spec, expressions="grads")  # (CudaBackend.backward_expressions)
    if not out and plan.spec.options("cuda").get("backward") == "fast":
        why = _fast_refusal(plan)
        if why is not None:
            out.append(Problem(f"backward=fast (the tensor-core families, atomic dQ): {why}", key="target.cuda",
                               hint="leave backward=auto: the deterministic family computes every spec"))
    if not out and family(plan) == "fma":
        try:
            backward_config(plan)
        except Problem as p:
            out.append(p)
    return out


def refuse(plan: KernelPlan):
    """A SpecError naming every reason `plan`'s spec has no CUDA backward; nothing if it has one."""
    found = backward_problems(plan)
    if found:
        spec = plan.spec
        raise SpecError([Diagnostic(f"target cuda, backward: {p.message}", spec.span(p.key), p.hint) for p in found])


def entry_names(plan: KernelPlan) -> tuple[str, str, str]:
    return tuple(f"{plan.entry}_bwd_{step}" for step in ("preprocess", "dkdv", "dq"))


def _steps(plan: KernelPlan) -> list[str]:
    """The backward's family and entry points, grids and shared memory, one line each (the
    source's header and `attngen check` print them)."""
    pre, dkdv, dq = entry_names(plan)
    if family(plan) == "wgmma" and wide(plan):
        return [
            "fast: Hopper tensor cores (wgmma m64nNk16, sm_90a), dQ accumulated by atomic f32 reductions (the bits "
            "of dq may differ between runs; target cuda { backward=deterministic } for the deterministic family)",
            f"{pre}: D_i = rowsum(dO_i * O_i), dQ's f32 accumulator zeroed; grid (ceil(Lq / {PRE_ROWS}), Hq, B) x "
            f"{THREADS} threads",
            f"{dkdv}: dK_j, dV_j and the dQ_i contributions; grid (ceil(Lk / {WIDE_KEYS}), Hkv, B) x {THREADS} "
            f"threads (2 warpgroups, each S^T and dP^T of half of a step's rows, P^T and dS^T through shared memory, "
            f"and half of the head-dim columns of dK, dV and dQ), steps of {WGMMA_ROWS} query rows (Q_i and dO_i by "
            f"the tensor copy engine), {fast_smem_bytes(plan)} bytes of shared memory (backward_wgmma_wide.cu.j2)",
            f"{dq}: dQ's accumulator to {plan.dtype}; grid (ceil(Lq / {PRE_ROWS}), Hq, B) x {THREADS} threads",
        ]
    if family(plan) == "wgmma":
        return [
            "fast: Hopper tensor cores (wgmma m64nNk16, sm_90a), dQ accumulated by atomic f32 reductions (the bits "
            "of dq may differ between runs; target cuda { backward=deterministic } for the deterministic family)",
            f"{pre}: D_i = rowsum(dO_i * O_i), dQ's f32 accumulator zeroed; grid (ceil(Lq / {PRE_ROWS}), Hq, B) x "
            f"{THREADS} threads",
            f"{dkdv}: dK_j, dV_j and the dQ_i contributions; grid (ceil(Lk / {WGMMA_KEYS}), Hkv, B) x {THREADS} "
            f"threads (2 warpgroups of {WGMMA_KEYS // 2} keys), steps of {wgmma_rows(plan)} query rows (Q_i and dO_i "
            f"by the tensor copy engine), {fast_smem_bytes(plan)} bytes of shared memory"
            + (f" ({dkdv}_add in its place for an additive mask)" if plan.spec.mask.is_custom and split_additive(plan)
               else ""),
            f"{dq}: dQ's accumulator to {plan.dtype}; grid (ceil(Lq / {PRE_ROWS}), Hq, B) x {THREADS} threads",
        ]
    if family(plan) == "mma":
        return backward_mma.steps(plan, (pre, dkdv, dq), PRE_ROWS, THREADS)
    c = backward_config(plan)
    return [
        "deterministic (no atomics: the same inputs give the same bits), f32 on CUDA cores"
        + (f" (not a fast family: {_fast_refusal(plan)})" if _fast_refusal(plan) else ""),
        f"{pre}: D_i = rowsum(dO_i * O_i); grid (ceil(Lq / {PRE_ROWS}), Hq, B) x {c.threads} threads",
        f"{dkdv}: dK_j, dV_j; grid (ceil(Lk / {c.tile}), Hkv, B) x {c.threads} threads, tiles {c.tile} x {c.tile}, "
        f"{c.smem_bytes} bytes of shared memory, {c.acc_per_thread} accumulators per thread",
        f"{dq}: dQ_i; grid (ceil(Lq / {c.tile}), Hq, B) x {c.threads} threads, {c.smem_bytes} bytes of shared memory",
    ] + ([f"{plan.entry}_bwd_grads: the `grad` inputs' partial sums added up, each entry once, in a fixed order; grid "
          f"({expr_grads.SUM_BLOCKS}, 1, 1) x {c.threads} threads"] if partials(plan) else [])


def _workspace(plan: KernelPlan) -> str:
    return ("D, 4 * B * Hq * Lq bytes (f32)" + (f", and dQ's accumulator, 4 * B * Lq * Hq * {plan.d_qk} bytes"
                                                if family(plan) != "fma" else "") + " (packed: B = 1, Lq = T)"
            + (", and the `grad` inputs' partial sums (4 bytes a word, at most 4 GiB)" if partials(plan) else ""))


def _header(plan: KernelPlan) -> str:
    from ...lang.expr import format_expr
    from ..render import comment_block, mask_doc
    first, *steps = _steps(plan)
    lines = [
        f"attngen {__version__}: flash-attention backward kernels for target cuda (profile {plan.profile}).",
        "Generated from the spec below; regenerate with `attngen build SPEC --target cuda"
        f" --kernel {plan.spec.name} --emit backward` rather than editing.",
        "",
        "Spec (normalised, every default filled in):",
        *("  " + ln for ln in plan.spec_text.rstrip("\n").splitlines()),
        "",
        f"Scale {plan.scale!r}" + (f", softcap {plan.softcap!r}" if plan.softcap is not None else "")
        + (f", score {format_expr(plan.spec.score)}" if plan.spec.score is not None else "") + f"; {mask_doc(plan)}",
        "Inputs: q, k, v, out and dout (the spec's dtype), lse (f32, natural log) of the forward call;",
        f"outputs dq, dk, dv in q's, k's and v's shapes. {'Four' if partials(plan) else 'Three'} steps in order on one "
        "stream; " + first + ":",
        *(f"  {i}. {line}" for i, line in enumerate(steps, 1)),
        f"Workspace: {_workspace(plan)}.",
    ]
    return comment_block(lines)


def _wgmma_recompute(plan: KernelPlan) -> dict:
    """How the fast family recomputes P: recompute_both, P^T and dS^T in one pass once dP^T is done
    (a softcap or a score expression: dS needs the derivative at s), else P^T while dP^T runs; and
    the extra parameters (and arguments) of its recompute functions: the custom mask's, the query
    head of a mask expression, the indices and inputs a score expression reads, the `grad` inputs'
    gradients."""
    from ...lang.expr import inputs_read
    from . import expr_grads
    custom, score = plan.spec.mask.is_custom, plan.spec.score is not None
    head = custom or score or plan.mask.kind == "expr"
    reads = score and bool(inputs_read(plan.spec.score))  # (a mask's inputs: the Mask's copy)
    grads = any(i.grad for i in plan.spec.inputs)
    staged = bool(expr_grads.staged_reads(plan.spec))
    extra = [(custom, "const Args&", "a"), (custom or score, "int", "b"), (head, "int", "h"),
             (custom, "const unsigned*", "words"), (score, "int", "hk"), (reads, "const ExprInputs&", "in"),
             (grads, "const ExprGrads&", "grads"), (staged, "float*", "gsum")]
    return {"recompute_both": plan.softcap is not None or score,
            "recompute_params": "".join(f", {t} {n}" for used, t, n in extra if used),
            "recompute_args": "".join(f", {n}" for used, _, n in extra if used)}


def render_backward(plan: KernelPlan) -> str:
    """The backward's CUDA source for `plan` (a SpecError when its spec has none): the family
    `family(plan)` picks."""
    from ..render import c_float, mask_doc, render
    from .emit import _TYPES
    refuse(plan)
    width = max(len(f"{t} {n};") for t, n, _ in ARG_FIELDS)
    fields = [(f"{t} {n};".ljust(width) + (f"  // {d}" if d else "")).rstrip() for t, n, d in ARG_FIELDS]
    types_template, mma_type = _TYPES[plan.dtype]
    common = dict(
        types_template=types_template, prescale_q=False, dtype=plan.dtype, d_qk=plan.d_qk, d_v=plan.d_v,
        scale=c_float(plan.scale), scale_doc="1 / sqrt(head_dim qk)" if plan.spec.scale is None else "from the spec",
        softcap=c_float(plan.softcap) if plan.softcap is not None else None,
        custom=plan.spec.mask.is_custom, fwd_tile_q=plan.tile_q, fwd_tile_kv=plan.tile_kv,
        fields=fields, mask=plan.mask, mask_doc=mask_doc(plan), entry=plan.entry, **expression_sources(plan),
        expressions=plan.mask.kind == "expr" or plan.spec.score is not None)  # (recompute takes b, h, hk)
    fast = family(plan) == "wgmma"
    # mask.j2's tile_is_empty: the deterministic family's loops skip the tiles an expression hides
    # (the fast family classifies its steps with mask_expr_tile itself)
    common["f"] = {"row_bits": False, "skip_holes": plan.mask.kind == "expr" and not fast, "tile_list": False}
    if fast:
        log2e = 1.4426950408889634
        extra = ({"scale_over_cap": c_float(plan.scale / plan.softcap), "softcap_log2": c_float(plan.softcap * log2e)}
                 if plan.softcap is not None else {} if plan.spec.score is not None
                 else {"scale_log2": c_float(plan.scale * log2e)})
        if wide(plan):
            return render("cuda/backward_wgmma_wide.cu.j2", header=_header(plan), clean_v=True, mma_type=mma_type,
                          smem_bytes=fast_smem_bytes(plan), lane_words=False, tid_per_call=False, **extra, **common)
        # (load_tile's offsets computed at each call where the kernel otherwise spills them: backward_wgmma_base.j2)
        return render("cuda/backward_wgmma.cu.j2", header=_header(plan), clean_v=True, mma_type=mma_type,
                      block_m=wgmma_rows(plan), smem_bytes=fast_smem_bytes(plan), lane_words=True,
                      tid_per_call=plan.spec.mask.is_custom or plan.mask.kind == "expr" or plan.spec.score is not None,
                      **extra, **_wgmma_recompute(plan), **common)
    if family(plan) == "mma":
        return render("cuda/backward_mma.cu.j2", header=_header(plan), clean_v=True, mma_type=mma_type,
                      **backward_mma.template_args(plan), **common)
    c = backward_config(plan)
    return render("cuda/backward.cu.j2", header=_header(plan), clean_v=False, threads=c.threads, tile=c.tile,
                  smem_bytes=c.smem_bytes, **common)


def expression_sources(plan: KernelPlan) -> dict:
    """The backward templates' score and mask expressions (issue 42; expr.py): the mask section's
    mask_expr and mask_expr_tile (as the forward's), and score_expr with its derivative
    score_expr_ds, d score / d s (attngen.plan.expr_grad), for the recompute section; the helpers
    they use, and the inputs' ExprInputs and loaders, before the first of them ("" where the spec
    has none). Expressions that read inputs take them as the kernels' last parameter, `const
    __grid_constant__ ExprInputs in` (dK/dV and dQ steps), passed down by reference (in_param /
    in_arg; the Mask holds a copy where the mask reads them, as the forward's; score_in and ds_in:
    the first argument of score_expr and score_expr_ds where they read inputs); a read in
    score_expr_ds reports the site of the same read in the score (expr.sites)."""
    from ...lang.expr import inputs_read, walk
    from ...plan.expr_grad import as_real, score_ds
    from ...plan.expr_reads import hoist_item_reads
    from . import expr as cuda_expr
    spec = plan.spec
    mask = spec.mask.expr if spec.mask.kind == "expr" else None
    ds = as_real(score_ds(spec.score)) if spec.score is not None else None
    helpers = "".join(h + "\n" for h in cuda_expr.helpers_of(mask, spec.score, ds, *expr_grads.derivatives(spec)))
    helpers += cuda_expr.inputs_source(spec) + ("\n" if spec.inputs else "")
    site_of = expr_grads.site_of(spec, [ds] if ds is not None else [])
    reads = bool(spec.inputs)
    # the score's reads of the head's inputs (ALiBi's slopes[h]; plan.expr_reads): the fast family
    # evaluates them once per step (items_init), the deterministic one at each pair (items_inline)
    score, items = hoist_item_reads(spec.score, spec.inputs) if spec.score is not None else (None, ())
    out = {"mask_expr_source": "", "score_expr_source": "",
           "mask_reads_inputs": mask is not None and bool(inputs_read(mask)),
           "in_param": ", const ExprInputs& in" if reads else "", "in_arg": ", in" if reads else "",
           "in_kernel_param": ", const __grid_constant__ ExprInputs in" if reads else "",
           "score_in": "in, " if score is not None and inputs_read(score) else "",
           # a read that may leave its input's bounds: the score is evaluated at visible pairs only
           # (reads proven in bounds, plan.expr_reads, are site 0: evaluated anywhere, hoisted by nvcc)
           "score_guard": score is not None and any(site_of.get(id(n)) for n in walk(score)),
           "ds_in": "in, " if ds is not None and inputs_read(ds) else ""}
    out.update(
        items_init="".join(f"    const {cuda_expr.C_TYPE[x.type]} item{i} = score_item{i}(in, b, h, hk, 0, 0, "
                           "mask.len_q, mask.len_k);  // the score's reads of the head's inputs, once\n"
                           for i, x in enumerate(items)),
        items_args="".join(f", item{i}" for i in range(len(items))),
        items_inline="".join(f", score_item{i}(in, b, h, hk, 0, 0, n_rows, n_keys)" for i in range(len(items))))
    # (the fast family: expr_grads.py with atomics; the fma one reads once per pair, without)
    grads = any(i.grad for i in spec.inputs)
    staged = grads and family(plan) == "wgmma" and bool(expr_grads.staged_reads(spec))  # (summed per step)
    out.update(grads_param=", const ExprGrads& grads" if grads else "", grads_arg=", grads" if grads else "",
               grads_kernel_param=", const __grid_constant__ ExprGrads grads" if grads else "",
               grads_staged=staged, grads_step_args=", i0, kj0, gsum, guni, gacc" if staged else "",
               grads_band=staged and any(d != 0 for *_, d in expr_grads.staged_reads(spec)),
               grad_partials=partials(plan))
    if mask is not None:
        out["mask_expr_source"] = (helpers + cuda_expr.function("mask_expr", mask, "mask", site_of) + "\n"
                                   + cuda_expr.INTERVAL_HELPERS + "\n" + cuda_expr.tile_function(mask) + "\n")
    if spec.score is not None:
        out["score_expr_source"] = (
            "// score expression (issue 42): the score the softmax saw, score_expr(s, b, h, hkv, q, k, Lq, Lk), of\n"
            "// the scaled score s = scale * q_i . k_j and the pair's indices (q and k 0-based, top-left, within the\n"
            "// sequence), and its derivative d score / d s (attngen.plan.expr_grad: simplified, with PyTorch's\n"
            "// subgradients where it is not differentiable), which multiplies dS_ij.\n"
            + ("" if mask is not None else helpers)
            + "".join(cuda_expr.function(f"score_item{i}", x, "item", site_of) + "\n" for i, x in enumerate(items))
            + cuda_expr.function("score_expr", score, "score", site_of, items, spec.score)
            + "\n" + cuda_expr.function("score_expr_ds", ds, "d score / d s =", site_of) + "\n"
            + (expr_grads.source(spec, atomic=family(plan) == "wgmma") + "\n" if grads else ""))
    return out


def describe_backward(plan: KernelPlan) -> list[str]:
    """Lines for `attngen check`: the backward's family, entry points, grids, tiles, shared memory
    and workspace (or why the spec has none)."""
    found = backward_problems(plan)
    if found:
        return ["backward: none (" + "; ".join(p.message for p in found) + ")"]
    first, *steps = _steps(plan)
    if plan.spec.mask.is_custom:
        how = (f"per key block of {block_keys(plan)}, the steps of {WGMMA_ROWS} rows that see it (derived from the "
               "mask once per BlockMask)" if family(plan) == "wgmma"
               else "q tiles scanned, each list binary-searched for the key tile")
    elif plan.mask.kind == "expr":
        rows = wgmma_rows(plan) if family(plan) == "wgmma" else backward_config(plan).tile
        how = (f"the {rows}-row tiles from the first to the last the mask expression may show (mask_expr_tile), "
               "those it hides skipped")
    else:
        how = "loop bounds from the mask" if masks.hides_loaded_keys(plan.mask) else "every tile"
    grads = [f"{i.name} ({', '.join(map(str, i.axes))})" for i in plan.spec.inputs if i.grad]
    from ...lang.expr import format_expr
    from . import expr_grads
    staged = [format_expr(ld) for _, _, ld, _ in expr_grads.staged_reads(plan.spec)]
    extra = [f"backward grad inputs: {', '.join(grads)}, f32, added into by the dK/dV step with atomicAdd at each "
             "visible pair (in no fixed order: the last bits may differ between runs)"
             + (f"; {', '.join(staged)} summed per step in shared memory first, one atomicAdd per entry"
                if staged else "")] if grads else []
    if grads and family(plan) == "fma":
        part, tile = expr_grads.partials(plan.spec), backward_config(plan).tile
        direct = [f"{i.name} ({', '.join(map(str, i.axes))})" for i in plan.spec.inputs
                  if i.grad and all(p.input is not i for p in part)]
        extra = [f"backward grad inputs: {', '.join(direct)}, f32, added into by the dK/dV step at each visible pair, "
                 "each entry by one thread (read once per pair; no atomics: the same bits on every run)"] if direct else []
        extra += [f"backward grad input {p.input.name}: f32 partial sums, a slice of {' * '.join(p.formula(str(tile)))} "
                  f"words per dK/dV block (ceil(Lk / {tile}) * Hkv * B of them), added up in a "
                  f"fixed order by {plan.entry}_bwd_grads (no atomics: the same bits on every run)" for p in part]
    return ([f"backward: {4 if partials(plan) else 3} entry points, {first}"] + [f"backward {line}" for line in steps]
            + [f"backward query tiles per key tile: {how}", f"backward workspace: {_workspace(plan)}"] + extra)


def split_additive(plan: KernelPlan) -> bool:
    """Whether `plan`'s backward has a dK/dV entry of its own for an additive custom mask (the
    128-key wgmma kernel: `<entry>_bwd_dkdv_add`)."""
    return family(plan) == "wgmma" and not wide(plan)


__all__ = ["ARG_FIELDS", "BackwardConfig", "backward_config", "backward_problems", "describe_backward",
           "entry_names", "refuse", "render_backward"]
