"""The backends, by target name: the only place that knows which targets exist.

    from attngen import backends
    backend = backends.get("wgsl")          # the built-in ones load on first use
    backends.register(MyBackend())          # a new target: its options join the language

Registering a backend also registers its `target NAME { ... }` options with the language
(attngen.lang.options). Built-in backends are imported lazily, and their packages import
their device libraries (CuPy, wgpu) and jinja2 only when a kernel is rendered or compiled.
"""

from __future__ import annotations

import importlib
import threading

from ..lang.options import register_target, unregister_target
from .base import Backend

# The targets attngen ships, in the order they are listed (and printed in normalised specs).
BUILTIN = ("cuda", "wgsl")
DEFAULT_TARGET = "cuda"

_REGISTRY: dict[str, Backend] = {}
_LOCK = threading.RLock()
_loaded = False


def register(backend: Backend) -> Backend:
    """Add (or replace) a backend under its name."""
    if not backend.name or not backend.name.isidentifier():
        raise ValueError(f"a backend needs a name that is an identifier, not {backend.name!r}")
    if backend.name not in BUILTIN:
        load_builtin()  # the built-in targets come first, whatever registers when
    with _LOCK:
        _REGISTRY[backend.name] = backend
        register_target(backend.schema)
    return backend


def unregister(name: str) -> None:
    with _LOCK:
        _REGISTRY.pop(name, None)
        unregister_target(name)


def load_builtin() -> None:
    """Import and register the built-in backends (once)."""
    global _loaded
    if _loaded:
        return
    with _LOCK:
        if _loaded:
            return
        for name in BUILTIN:
            if name not in _REGISTRY:
                register(importlib.import_module(f"{__name__}.{name}").BACKEND)
        _loaded = True


def names() -> tuple[str, ...]:
    load_builtin()
    return tuple(_REGISTRY)


def get(name: str) -> Backend:
    """The backend of target `name`; a ValueError names the known targets."""
    load_builtin()
    if isinstance(name, str) and name in _REGISTRY:
        return _REGISTRY[name]
    raise ValueError(f"unknown target {name!r} (expected one of: {', '.join(_REGISTRY)})")


def for_torch_device(device_type: str) -> str:
    """The target whose kernels take PyTorch tensors on `device_type` (torch.device.type): the
    first registered backend that lists it in torch_devices; a ValueError names those known."""
    load_builtin()
    for name, backend in _REGISTRY.items():
        if device_type in backend.torch_devices:
            return name
    known = ", ".join(f"{d} ({n})" for n, b in _REGISTRY.items() for d in b.torch_devices)
    raise ValueError(f"no attngen target takes PyTorch tensors on {device_type!r} (known: {known})")


__all__ = ["BUILTIN", "DEFAULT_TARGET", "Backend", "for_torch_device", "get", "load_builtin", "names", "register", "unregister"]
