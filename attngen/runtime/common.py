"""What both runtimes share: the kernel object. Run-time inputs are checked in runtime/launch.py."""

from __future__ import annotations

from ..emit import Emitted


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
