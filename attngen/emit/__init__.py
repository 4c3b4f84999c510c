"""Emitters: KernelPlan -> source text + manifest, one module per target."""

from .common import Emitted, generator_version
from .cuda import emit_cuda
from .wgsl import emit_wgsl

EMITTERS = {"cuda": emit_cuda, "wgsl": emit_wgsl}


def emit_plan(plan) -> Emitted:
    return EMITTERS[plan.target](plan)


__all__ = ["Emitted", "EMITTERS", "emit_plan", "generator_version"]
