"""What every target's compiled kernel shares: the Kernel object. Run-time inputs are checked
in attngen/runtime/launch.py; each backend subclasses Kernel with its own call."""

from __future__ import annotations

import functools

from ..errors import LaunchError
from ..plan.kernel_plan import Emitted, KernelPlan


class Rendered:
    """The Emitted of a plan, rendered when first asked for: a kernel whose compiled object
    comes from the disk cache runs from its plan alone, and renders its source and manifest
    only if someone reads them (the same text the object was built from: the cache key
    covers the plan and every file of the generator)."""

    def __init__(self, plan: KernelPlan, render, manifest):
        self.plan = plan
        self._render, self._manifest = render, manifest

    @functools.cached_property
    def source(self) -> str:
        return self._render(self.plan)

    @functools.cached_property
    def manifest(self) -> dict:
        return self._manifest(self.plan)

    def __str__(self) -> str:
        return self.source


class Kernel:
    """A compiled kernel: call it with q, k, v (see attngen.compile)."""

    target = ""

    def __init__(self, emitted: Emitted | Rendered):
        self.emitted = emitted
        self.plan = emitted.plan
        self.spec = emitted.plan.spec

    @property
    def source(self) -> str:
        return self.emitted.source

    @property
    def manifest(self) -> dict:
        return self.emitted.manifest

    def compute_units(self) -> int | None:
        """The device's multiprocessors / compute units, which a call's split_kv(auto) and two_pass
        plan their KV splits with (attngen.runtime.launch.resolve's `cores`); None: unknown."""
        return None

    def block_mask(self, mask):
        """A BlockMask of `mask` for this kernel's tiles, on its device (attngen.block_mask)."""
        raise NotImplementedError(f"target {self.target} builds no block masks")

    def backward(self, q, k, v, out, lse, dout, **options):
        """(dq, dk, dv) of this kernel's attention (docs/backward.md): q, k, v and the call's options
        as the forward took them, its out and lse, and dout (out's shape)."""
        raise LaunchError(f"target {self.target} has no backward kernels yet (docs/backward.md)")

    def torch_operator(self, name: str | None = None):
        """This kernel as a PyTorch operator (attngen.torch.operator)."""
        raise LaunchError(f"target {self.target}'s kernels are not PyTorch operators: attngen.torch takes "
                          "kernels whose target runs on the devices PyTorch computes on")

    def __repr__(self) -> str:
        return (f"<attngen {self.target} kernel '{self.spec.name}' ({self.plan.profile}): "
                f"{self.plan.summary()}>")
