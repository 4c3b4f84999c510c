"""The lowered plan: everything an emitter needs to print a kernel, and a runtime to launch it.

A KernelPlan is made by attngen.plan from a checked spec and a target profile. Emitters turn
it into source text plus a manifest; they add no decisions of their own.
"""

from __future__ import annotations

from dataclasses import dataclass

from .spec import AttentionSpec, Mask
from .tiling import CudaConfig, WgslConfig


@dataclass(frozen=True)
class Param:
    """One kernel parameter (CUDA, in order) or binding (WGSL, by number)."""

    name: str
    kind: str  # "tensor" (a pointer / storage buffer), "scalar", or "uniform" (WGSL params struct)
    dtype: str  # f16 bf16 f32 i32 i64 u32, or "struct" for the uniform
    shape: tuple | None = None  # symbolic: ("B", "Lq", "Hq", "Dqk")
    access: str = "read"  # read | write
    optional: bool = False  # may be null (CUDA) / a 4-byte dummy (WGSL)
    binding: int | None = None  # WGSL binding number in group 0
    doc: str = ""


@dataclass(frozen=True)
class Entry:
    """A further entry point of the same source, launched after the main one (in order):
    the split_kv / two_pass combine, two_pass's second pass. Same fields as the main kernel's."""

    name: str  # role: "combine", "pv", ...
    entry: str  # function / entry-point name
    doc: str
    params: tuple  # Param, in launch order (CUDA) / by binding (WGSL)
    grid: tuple  # three formulas
    threads: int
    smem_bytes: int = 0


@dataclass(frozen=True)
class KernelPlan:
    target: str  # "cuda" | "wgsl"
    profile: str
    spec: AttentionSpec
    spec_text: str  # the normalised spec (format_spec)
    entry: str  # kernel / entry-point name
    config: CudaConfig | WgslConfig
    dtype: str
    acc_qk: str
    acc_pv: str
    d_qk: int
    d_v: int
    scale: float
    softcap: float | None
    mask: Mask  # with window sizes clamped to WINDOW_CAP
    threads: int  # per block / workgroup
    grid: tuple  # three formulas over B, Lq, Hq
    params: tuple  # Param, in launch order
    uniform_fields: tuple  # WGSL: (name, type, doc) of the params struct; CUDA: ()
    features: tuple  # WGSL features the source needs; CUDA: ()
    arch: str | None  # CUDA: minimum architecture, e.g. "sm_80"
    smem_bytes: int
    directives: tuple  # WGSL `enable ...;` lines; CUDA: ()
    # With f16 accumulators for Q K^T, Q is multiplied by the scale as it is staged, so the
    # f16 sums are sqrt(head_dim) times smaller; the score transform then leaves out the scale.
    prescale_q: bool = False
    # Launched after the main kernel, in order (split_kv: the combine; two_pass: P V, combine).
    entries: tuple = ()

    @property
    def tile_q(self) -> int:
        return self.config.tile_q

    @property
    def tile_kv(self) -> int:
        return self.config.tile_kv

    def summary(self) -> str:
        """One line a person reads in `attngen check` and in source headers."""
        c = self.config
        if self.target == "cuda":
            math = "tensor cores (mma.sync m16n8k16)" if c.math == "mma" else "CUDA cores (fma)"
            who = f"{c.warps} warps ({c.threads} threads), {c.stages} K/V stage(s), {math}"
        else:
            how = {"subgroup": "subgroup reductions", "workgroup": "workgroup-memory reductions",
                   "none": "no cross-invocation reductions"}[c.reduction]
            who = f"workgroup {c.workgroup} ({c.tile_q} rows x {c.threads_per_row} invocations), {how}"
        return f"tile q={c.tile_q} kv={c.tile_kv}, {who}"
