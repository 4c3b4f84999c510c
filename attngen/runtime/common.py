"""What both runtimes share: run-time shape checks against the plan, and the kernel object.

Every bad input becomes a LaunchError that names the argument and says what was expected.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..emit import Emitted
from ..errors import LaunchError
from ..ir import KernelPlan
from ..plan import MAX_SEQ_LEN

MAX_GRID_YZ = 65535  # CUDA grid.y / grid.z and WebGPU dispatch dimensions


@dataclass(frozen=True)
class Shapes:
    batch: int
    len_q: int
    len_k: int
    heads_q: int
    heads_kv: int

    @property
    def group(self) -> int:
        return self.heads_q // self.heads_kv

    def grid(self, tile_q: int) -> tuple[int, int, int]:
        return (-(-self.len_q // tile_q), self.heads_q, self.batch)


def validate(plan: KernelPlan, q, k, v, dtypes: dict) -> Shapes:
    """Check shapes (tuples) and dtype names of q, k, v against the plan; return the sizes.

    `dtypes` maps "q", "k", "v" to attngen dtype names (f16, bf16, f32) or to a description
    of an unsupported dtype.
    """
    spec = plan.spec
    for name, shape, d in (("q", q, plan.d_qk), ("k", k, plan.d_qk), ("v", v, plan.d_v)):
        if len(shape) != 4:
            raise LaunchError(f"{name} must have 4 dimensions (batch, seq, heads, head_dim), "
                              f"got shape {tuple(shape)}")
        if shape[3] != d:
            raise LaunchError(f"{name} has head_dim {shape[3]}, but kernel '{spec.name}' was built "
                              f"for head_dim {'qk' if name != 'v' else 'v'}={d} (shape {tuple(shape)})")
        if dtypes[name] != plan.dtype:
            raise LaunchError(f"{name} has dtype {dtypes[name]}, but kernel '{spec.name}' was built "
                              f"for dtype {plan.dtype}")
    b, len_q, hq, _ = q
    if k[0] != b or v[0] != b:
        raise LaunchError(f"batch sizes differ: q {b}, k {k[0]}, v {v[0]}")
    if k[1] != v[1]:
        raise LaunchError(f"k and v have different sequence lengths: k {k[1]}, v {v[1]}")
    if k[2] != v[2]:
        raise LaunchError(f"k and v have different head counts: k {k[2]}, v {v[2]}")
    len_k, hkv = k[1], k[2]
    if hkv == 0 or hq % hkv:
        raise LaunchError(f"q has {hq} heads, which is not a multiple of the {hkv} KV heads of k and v")
    if spec.heads_q is not None and (hq, hkv) != (spec.heads_q, spec.heads_kv):
        raise LaunchError(f"kernel '{spec.name}' was built for heads q={spec.heads_q} kv={spec.heads_kv}, "
                          f"but q has {hq} heads and k, v have {hkv}")
    for name, n in (("Lq", len_q), ("Lk", len_k)):
        if n > MAX_SEQ_LEN:
            raise LaunchError(f"sequence length {name}={n} exceeds {MAX_SEQ_LEN}")
    if b > MAX_GRID_YZ or hq > MAX_GRID_YZ:
        raise LaunchError(f"batch {b} and query heads {hq} must each be at most {MAX_GRID_YZ}")
    return Shapes(b, len_q, len_k, hq, hkv)


def reject_unsupported(plan: KernelPlan, mask, kv_lens) -> None:
    """Run-time options of features this version does not generate yet."""
    if mask is not None:
        raise LaunchError(f"mask= needs a kernel built with `mask custom`, which the {plan.target} "
                          "target does not support yet")
    if kv_lens is not None:
        raise LaunchError(f"kv_lens= (per-sequence KV lengths) is not supported yet by the {plan.target} target")


class Kernel:
    """A compiled kernel: call it with q, k, v (see attngen.compile)."""

    target = ""

    def __init__(self, emitted: Emitted):
        self.emitted = emitted
        self.plan = emitted.plan
        self.spec = emitted.plan.spec

    @property
    def source(self) -> str:
        return self.emitted.source

    @property
    def manifest(self) -> dict:
        return self.emitted.manifest

    def __repr__(self) -> str:
        return (f"<attngen {self.target} kernel '{self.spec.name}' ({self.plan.profile}): "
                f"{self.plan.summary()}>")
