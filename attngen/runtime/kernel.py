"""What every target's compiled kernel shares: the Kernel object. Run-time inputs are checked
in attngen/runtime/launch.py; each backend subclasses Kernel with its own call."""

from __future__ import annotations

from ..plan.kernel_plan import Emitted


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

    def block_mask(self, mask):
        """A BlockMask of `mask` for this kernel's tiles, on its device (attngen.block_mask)."""
        raise NotImplementedError(f"target {self.target} builds no block masks")

    def __repr__(self) -> str:
        return (f"<attngen {self.target} kernel '{self.spec.name}' ({self.plan.profile}): "
                f"{self.plan.summary()}>")
