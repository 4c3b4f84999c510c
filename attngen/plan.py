"""AttentionSpec + target profile -> KernelPlan.

The plan is where target decisions are made (and written down): tiles and threads
(attngen.tiling), the parameter list, the grid, the features and directives a WGSL source
needs, and legalisation. Emitters only print what the plan says.
"""

from __future__ import annotations

import ast
from dataclasses import replace

from .check import check_or_raise
from .ir import KernelPlan, Param
from .profiles import Profile, get_profile
from .spec import AttentionSpec, format_spec
from .tiling import cuda_config, wgsl_config
from . import cuda_plan, wgsl_plan

# Window sizes at or above this are unbounded for every sequence the runtimes accept
# (they refuse lengths above MAX_SEQ_LEN), and keep the kernels' index arithmetic in 32 bits.
MAX_SEQ_LEN = 2**30
WINDOW_CAP = 2**30

ENTRY_PREFIX = "attngen_"

_TENSOR_SHAPES = {
    "q": ("B", "Lq", "Hq", "Dqk"),
    "k": ("B", "Lk", "Hkv", "Dqk"),
    "v": ("B", "Lk", "Hkv", "Dv"),
    "out": ("B", "Lq", "Hq", "Dv"),
    "lse": ("B", "Hq", "Lq"),
}
_TENSOR_DOCS = {
    "q": "queries",
    "k": "keys",
    "v": "values",
    "out": "attention output",
    "lse": "log-sum-exp of each row's scores (natural log; -inf where a row sees no key); "
           "written only when requested",
}


def _tensor(name, dtype, **kw) -> Param:
    access = "write" if name in ("out", "lse") else "read"
    return Param(name, "tensor", dtype, _TENSOR_SHAPES[name], access, doc=_TENSOR_DOCS[name], **kw)


def _cuda_params(spec: AttentionSpec) -> tuple:
    return cuda_plan.main_params(spec)


def grid_size(grid: tuple, **sizes: int) -> tuple[int, ...]:
    """The numbers of a plan's grid formulas (as in the manifest) for run-time sizes B, Lq, Hq,
    ...: a runtime launches what a foreign one reading the manifest would. The formulas use
    names, integers, +, *, / (exact) and ceil(a / b) only."""
    def value(node):
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.Name) and node.id in sizes:
            return sizes[node.id]
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            a, b = value(node.left), value(node.right)
            return a + b if isinstance(node.op, ast.Add) else a * b
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "ceil"
                and len(node.args) == 1 and isinstance(node.args[0], ast.BinOp)
                and isinstance(node.args[0].op, ast.Div)):
            return -(-value(node.args[0].left) // value(node.args[0].right))
        raise ValueError(f"unexpected term in a grid formula: {ast.dump(node)}")
    return tuple(value(ast.parse(f, mode="eval").body) for f in grid)


def _clamped_mask(spec: AttentionSpec):
    m = spec.mask
    if m.kind != "window":
        return m
    return replace(m, left=min(m.left, WINDOW_CAP), right=min(m.right, WINDOW_CAP))


def cuda_grid(spec: AttentionSpec, cfg) -> tuple[str, str, str]:
    """The CUDA launch grid as formulas of the run-time shapes (the manifest's `grid`).

    x: tiles of query rows times KV splits; y: query heads (KV heads for split schedules) times the blocks that split
    the output columns (head = blockIdx.y / v_blocks); z: batch. The runtime evaluates these
    formulas (grid_size), so it launches what a foreign runtime reading the manifest would.
    """
    return cuda_plan.grid(spec, cfg)


def plan(spec: AttentionSpec, target: str, profile: Profile | str | None = None) -> KernelPlan:
    """Check `spec` for `target` and lower it; raises SpecError with every problem."""
    if not isinstance(profile, Profile):
        profile = get_profile(profile, target)
    check_or_raise(spec, profile)
    common = dict(
        target=target,
        profile=profile.name,
        spec=spec,
        spec_text=format_spec(spec),
        entry=ENTRY_PREFIX + spec.name,
        dtype=spec.dtype,
        acc_qk=spec.acc_qk,
        acc_pv=spec.acc_pv,
        d_qk=spec.head_dim_qk,
        d_v=spec.head_dim_v,
        scale=spec.resolved_scale,
        softcap=spec.softcap,
        mask=_clamped_mask(spec),
        prescale_q=spec.acc_qk == "f16",
    )
    if target == "cuda":
        cfg = cuda_config(spec, profile)
        return KernelPlan(
            **common,
            config=cfg,
            threads=cfg.threads,
            grid=cuda_grid(spec, cfg),
            params=_cuda_params(spec),
            entries=cuda_plan.entries(spec, ENTRY_PREFIX + spec.name, cfg),
            uniform_fields=(),
            features=(),
            arch=profile.device["arch"],
            smem_bytes=cfg.smem_bytes,
            directives=(),
        )
    cfg = wgsl_config(spec, profile)
    features, directives = [], []
    if spec.dtype == "f16" or "f16" in (spec.acc_qk, spec.acc_pv):
        features.append("shader-f16")
        directives.append("f16")
    if cfg.subgroups:
        features.append("subgroups")
        if profile.dialect.get("subgroups_directive", False):
            directives.append("subgroups")
    return KernelPlan(
        **common,
        config=cfg,
        threads=cfg.workgroup,
        # x: row tiles (split schedules: row tiles of (query row, head in group) pairs x splits;
        # with mask custom, q tiles x splits); y: (query head, or KV head for split schedules that
        # pack GQA groups (wgsl_plan.pack_gqa); block of output columns), head-major; z: batch
        grid=wgsl_plan.grids(spec, cfg.tile_q, cfg.v_blocks)["main"],
        params=wgsl_plan.main_params(spec),
        uniform_fields=wgsl_plan.uniform_fields(spec),
        entries=wgsl_plan.entries(spec, ENTRY_PREFIX + spec.name, cfg.tile_q, cfg.v_blocks, cfg.workgroup),
        features=tuple(features),
        arch=None,
        smem_bytes=cfg.smem_bytes,
        directives=tuple(directives),
    )
