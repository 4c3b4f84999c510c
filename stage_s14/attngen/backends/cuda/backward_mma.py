"""The sm_80 tensor-core backward family (issue 41; templates/cuda/backward_mma.cu.j2,
docs/backward.md): FlashAttention-2's backward on mma.sync.m16n8k16 (f16 / bf16 operands, f32
accumulators), for the plans that are not Hopper's wgmma ones (profile cuda-sm80: A100, sm_86,
sm_89, and Hopper when a spec or the call asks for cuda-sm80). backward.py's `family` picks it
("mma"); this module says what it computes, its shared memory and the template's parameters.

One block of 8 warps per 64 keys (K_j, V_j in shared memory) walks the query tiles of 64 rows that
can see them, for each query head of its GQA group; dQ is added with f32 atomics into an
accumulator that the third entry converts (as the wgmma family: dq's last bits may differ between
runs).
"""

from __future__ import annotations

from ...plan.kernel_plan import KernelPlan

KEYS, ROWS = 64, 64          # keys per block, query rows per step
HEAD_DIMS = (32, 64, 96, 128)  # multiples of 32 (dQ: two warps of kHeadDimQK / 2 columns); d128 takes 252 registers
# Q_i, dO_i, lse_i and D_i take two stages (the next step's copies overlap this one's math) where
# the block's shared memory stays within 96 KiB, which every sm_80+ GPU gives a block (sm_86 and
# sm_89: 99 KiB); otherwise one.
SMEM_BUDGET = 96 * 1024


def smem_bytes(d_qk: int, d_v: int, stages: int) -> int:
    """K_j, V_j; Q_i, dO_i per stage (rows padded by 8 elements); dS^T; lse_i and D_i per stage; a
    flag per key (the template's kSmemBytes)."""
    return (2 * KEYS * (d_qk + 8) + 2 * KEYS * (d_v + 8) + stages * 2 * ROWS * (d_qk + 8 + d_v + 8)
            + 2 * KEYS * (ROWS + 8) + stages * 2 * ROWS * 4 + KEYS)


def stages(d_qk: int, d_v: int) -> int:
    return 2 if smem_bytes(d_qk, d_v, 2) <= SMEM_BUDGET else 1


def refusal(plan: KernelPlan) -> str | None:
    """Why this family cannot compute `plan`'s backward (None: it can)."""
    spec = plan.spec
    if plan.dtype not in ("f16", "bf16"):
        return f"its products take f16 or bf16, not {plan.dtype}"
    if plan.d_qk not in HEAD_DIMS or plan.d_v not in HEAD_DIMS:
        return f"it takes head dims 32, 64, 96 or 128, not qk={plan.d_qk} v={plan.d_v}"
    if spec.mask.is_custom or plan.mask.kind == "expr":
        return "it takes the masks none, causal and window (a custom mask or a mask expression runs on the " \
               "deterministic family)"
    if spec.score is not None or spec.inputs:
        return "it takes no score expression or expression inputs (they run on the deterministic family)"
    return None


def template_args(plan: KernelPlan) -> dict:
    """The template's parameters beyond the families' common ones."""
    from ..render import c_float
    log2e = 1.4426950408889634
    extra = ({"scale_over_cap": c_float(plan.scale / plan.softcap), "softcap_log2": c_float(plan.softcap * log2e)}
             if plan.softcap is not None else {"scale_log2": c_float(plan.scale * log2e)})
    n = stages(plan.d_qk, plan.d_v)
    return dict(block_n=KEYS, block_m=ROWS, stages=n, smem_bytes=smem_bytes(plan.d_qk, plan.d_v, n), **extra)


def steps(plan: KernelPlan, names: tuple, pre_rows: int, threads: int) -> list[str]:
    """The family's lines for the source's header and `attngen check` (backward._steps)."""
    pre, dkdv, dq = names
    n = stages(plan.d_qk, plan.d_v)
    return [
        "fast: tensor cores (mma.sync m16n8k16, sm_80+), dQ accumulated by atomic f32 additions (the bits of dq "
        "may differ between runs; target cuda { backward=deterministic } for the deterministic family)",
        f"{pre}: D_i = rowsum(dO_i * O_i), dQ's f32 accumulator zeroed; grid (ceil(Lq / {pre_rows}), Hq, B) x "
        f"{threads} threads",
        f"{dkdv}: dK_j, dV_j and the dQ_i contributions; grid (ceil(Lk / {KEYS}), Hkv, B) x {threads} threads "
        f"(8 warps of 16 keys x 32 rows), steps of {ROWS} query rows ({n} stage{'s' if n > 1 else ''}), "
        f"{smem_bytes(plan.d_qk, plan.d_v, n)} bytes of shared memory",
        f"{dq}: dQ's accumulator to {plan.dtype}; grid (ceil(Lq / {pre_rows}), Hq, B) x {threads} threads",
    ]


__all__ = ["HEAD_DIMS", "KEYS", "ROWS", "refusal", "smem_bytes", "stages", "steps", "template_args"]
