"""The public API: parse, load, emit, compile, reference (see README's "Python API")."""

from __future__ import annotations

import os

from .emit import Emitted, emit_plan
from .errors import Diagnostic, SpecError
from .frontend import decode_source, parse
from .plan import plan as _plan
from .reference import reference
from .spec import TARGETS, AttentionSpec


def load(path, name: str | None = None) -> AttentionSpec:
    """The spec in file `path`; `name` picks one when the file defines several."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        data = f.read()
    specs = parse(decode_source(data, path), filename=path)
    return pick(specs, name, path)


def pick(specs: list[AttentionSpec], name: str | None, where: str) -> AttentionSpec:
    """One spec of several, by name; an error names the choices."""
    names = [s.name for s in specs]
    if name is None:
        if len(specs) == 1:
            return specs[0]
        raise SpecError([Diagnostic(f"{where} defines {len(specs)} kernels ({', '.join(names)}); "
                                    "pick one by name", specs[0].span("name"))])
    for s in specs:
        if s.name == name:
            return s
    from .errors import did_you_mean
    hint = did_you_mean(name, names) or f"kernels in this file: {', '.join(names)}"
    raise SpecError([Diagnostic(f"{where} has no kernel named '{name}'", None, hint)])


def _target(target: str) -> str:
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r} (expected one of: {', '.join(TARGETS)})")
    return target


def emit(spec: AttentionSpec, target: str = "cuda", profile=None) -> Emitted:
    """Generate source + manifest for `target` (default profiles: cuda-sm80, webgpu-core)."""
    return emit_plan(_plan(spec, _target(target), profile))


def compile(spec: AttentionSpec, target: str = "cuda", profile=None):
    """A runnable, cached kernel for this machine's device: kernel(q, k, v) -> out."""
    if _target(target) == "cuda":
        from .runtime.cuda import compile_kernel
    else:
        from .runtime.wgsl import compile_kernel
    return compile_kernel(spec, profile)


__all__ = ["compile", "emit", "load", "parse", "pick", "reference"]
