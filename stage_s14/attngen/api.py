"""The public API: parse, load, emit, compile, reference, and the steps between them.

    specs  = parse(text, filename="x.attn")     # list[AttentionSpec]
    spec   = load("x.attn", name=None)          # one spec
    plan   = lower(spec, target="wgsl")         # the KernelPlan (what `attngen check` shows)
    out    = emit(spec, target="cuda")          # .source, .manifest
    kernel = compile(spec, target="wgsl")       # runnable, cached
    ref    = reference(spec, q, k, v)           # float64 numpy oracle

This module and the command line are the only places that see every layer: they look the
target's backend up (attngen.backends) and hand it to the target-neutral core.
"""

from __future__ import annotations

import hashlib
import os
import json

from . import backends
from .errors import Diagnostic, Source, SpecError, did_you_mean
from .lang import decode_source, mark_read, read_source
from .lang import parse as _parse
from .lang import parse_collect as _parse_collect
from .lang.spec import AttentionSpec
from .lang.spec import format_spec as _format_spec
from .lang.spec import specs_from_data, specs_to_data
from .plan.check import check as _check
from .plan.kernel_plan import Emitted, KernelPlan
from .plan.lower import lower as _lower
from .reference import reference
from .resources import generator_version
from .runtime import cache as disk_cache
from .harness import tune as tune_results


def parse(text, filename: str = "<string>") -> list[AttentionSpec]:
    """Parse spec text into validated AttentionSpecs; raise SpecError with every problem.

    Text parsed before (same text, file name and generator version) comes from the disk cache:
    a process that compiles a known spec never loads the parser (docs/architecture.md, "Start-up")."""
    backends.load_builtin()  # the targets' options are part of the language
    key = _parse_key(text, filename)
    if key is not None:
        data = disk_cache.get(key, ".spec")
        if data is not None:
            # JSON data, never a pickle: whoever wrote the entry chooses only field values
            try:
                specs = specs_from_data(json.loads(data), Source(filename, text))
            except (ValueError, TypeError, KeyError):  # not JSON, or JSON of another form: parse again
                specs = None
            if specs:
                mark_read(specs)
                return specs
    specs = _parse(text, filename)
    if key is not None and specs:
        source = next(iter(specs[0].spans.values())).source if specs[0].spans else None
        data = specs_to_data(specs, source) if source and (source.name, source.text) == (filename, text) else None
        if data is not None:  # an unwritable cache only costs time
            disk_cache.put(key, ".spec", json.dumps(data, separators=(",", ":")).encode())
    return specs


def _parse_key(text, filename: str) -> str | None:
    """The disk-cache key of parsing `text` as `filename`, or None where the cache is not used
    (text that is not str; targets registered besides the built-in ones, whose options are part
    of the language but not of the generator version)."""
    if not isinstance(text, str) or set(backends.names()) != set(backends.BUILTIN):
        return None
    return disk_cache.cache_key(kind="spec", form="json", generator=generator_version(), filename=filename,
                                text=hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest())


def parse_collect(text, filename: str = "<string>"):
    """Like parse, but return (specs, diagnostics) without raising for semantic errors."""
    backends.load_builtin()
    return _parse_collect(text, filename)


def format_spec(spec: AttentionSpec) -> str:
    """Print a spec in the language, every default filled in; parse(format_spec(s)) == [s]."""
    backends.load_builtin()
    return _format_spec(spec)


def read_spec_file(path) -> tuple[str, str]:
    """(text, name) of a spec file; SpecError for text that is not UTF-8 or a file longer than
    attngen.lang.MAX_SOURCE_BYTES (64 MiB: reading stops there), OSError as raised."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        return read_source(f, path), path  # at most MAX_SOURCE_BYTES are read


def load(path, name: str | None = None) -> AttentionSpec:
    """The spec in file `path`; `name` picks one when the file defines several."""
    if name is not None and not isinstance(name, str):
        raise TypeError(f"load: name must be a kernel's name (a str) or None, not {type(name).__name__}")
    text, where = read_spec_file(path)
    return pick(parse(text, filename=where), name, where)


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
    hint = did_you_mean(name, names) or f"kernels in this file: {', '.join(names)}"
    raise SpecError([Diagnostic(f"{where} has no kernel named '{name}'", None, hint)])


def _a_spec(spec, what: str) -> AttentionSpec:
    """`spec` when it is one AttentionSpec; a TypeError that says how to get one otherwise."""
    if isinstance(spec, AttentionSpec):
        return spec
    if isinstance(spec, (str, bytes)):
        hint = "parse the text first: attngen.parse(text)[0], or attngen.load(path) for a file"
    elif isinstance(spec, (list, tuple)) and all(isinstance(s, AttentionSpec) for s in spec):
        hint = "pass one of them: attngen.pick(specs, name, where) picks one by name"
    else:
        hint = "get one from attngen.parse(text) or attngen.load(path)"
    raise TypeError(f"{what} takes an AttentionSpec, not {type(spec).__name__}: {hint}")


def targets() -> tuple[str, ...]:
    """The names of the registered targets."""
    return backends.names()


def get_profile(name: str | None, target: str):
    """The named profile of `target` (None: the target's default), checked for its keys."""
    return backends.get(target).profile(name)


def check(spec: AttentionSpec, target: str = backends.DEFAULT_TARGET, profile=None) -> list[Diagnostic]:
    """Every problem of building `spec` for `target` (empty: it builds)."""
    spec = _a_spec(spec, "check")
    backend = backends.get(target)
    return _check(spec, backend, backend.profile(profile))[1]


def lower(spec: AttentionSpec, target: str = backends.DEFAULT_TARGET, profile=None) -> KernelPlan:
    """Check `spec` for `target` and lower it to a KernelPlan; SpecError with every problem.
    `profile`: a profile name or Profile (default: the target's default profile)."""
    spec = _a_spec(spec, "lower")
    backend = backends.get(target)
    return _lower(spec, backend, backend.profile(profile))


def emit_plan(plan: KernelPlan) -> Emitted:
    """Source and manifest of a plan, by its target's backend."""
    backend = backends.get(plan.target)
    return Emitted(backend.render(plan), backend.manifest(plan), plan)


def emit(spec: AttentionSpec, target: str = backends.DEFAULT_TARGET, profile=None) -> Emitted:
    """Generate source + manifest for `target` (default profiles: cuda-sm80, webgpu-core)."""
    return emit_plan(lower(_a_spec(spec, "emit"), target, profile))


def compile(spec: AttentionSpec, target: str = backends.DEFAULT_TARGET, profile=None, tuned: bool = True):
    """A runnable, cached kernel for this machine's device: kernel(q, k, v) -> out. When the spec
    leaves its tiles and the target's tiling options at auto and `attngen tune` stored a result
    for this device and spec, that result is used (tuned=False: the profile's defaults)."""
    spec = _a_spec(spec, "compile")
    backend = backends.get(target)
    if tuned and profile is None and tune_results.is_auto(spec, target):
        try:
            found = tune_results.lookup(backend, spec)
        except Exception:  # no device or no runtime here: backend.compile says so in its own words
            found = None
        if found is not None:
            spec = tune_results.apply(spec, target, found["choice"])
    return backend.compile(spec, profile)


__all__ = ["check", "compile", "decode_source", "emit", "emit_plan", "format_spec", "get_profile", "load", "lower",
           "parse", "parse_collect", "pick", "read_source", "read_spec_file", "reference", "targets"]
