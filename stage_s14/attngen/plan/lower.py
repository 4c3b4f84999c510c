"""The lowering driver: AttentionSpec + profile + a target's backend -> KernelPlan.

The neutral decisions are made here (names, the normalised spec text, scale, the clamped
mask); the backend, handed in by the caller, checks the spec, searches its configuration once
and lowers the target's part (parameters, grid, entry points, workspaces). Nothing here
imports a backend: attngen.api looks the backend up and passes it.
"""

from __future__ import annotations

from dataclasses import fields

from ..errors import SpecError
from ..lang.spec import AttentionSpec, format_spec
from . import masks
from .check import check, normalised, planned_as
from .kernel_plan import KernelPlan
from .profiles import Profile

ENTRY_PREFIX = "attngen_"


def lower(spec: AttentionSpec, backend, profile: Profile) -> KernelPlan:
    """Check `spec` on `profile` and lower it with `backend`; raises SpecError with every problem."""
    config, diags = check(spec, backend, profile)
    if diags:
        raise SpecError(diags)
    notes = planned_as(spec)
    spec = normalised(spec)  # (a soft-cap written as a score expression: plan.check)
    entry = ENTRY_PREFIX + spec.name
    low = backend.lower(spec, profile, config, entry)
    return KernelPlan(
        target=backend.name,
        profile=profile.name,
        spec=spec,
        spec_text=format_spec(spec),
        entry=entry,
        config=config,
        dtype=spec.dtype,
        acc_qk=spec.acc_qk,
        acc_pv=spec.acc_pv,
        d_qk=spec.head_dim_qk,
        d_v=spec.head_dim_v,
        scale=spec.resolved_scale,
        softcap=spec.softcap,
        mask=masks.clamp(spec.mask),
        prescale_q=spec.acc_qk == "f16",
        notes=notes,
        **{f.name: getattr(low, f.name) for f in fields(low)},  # the backend's part
    )
