"""Semantic checks of a spec against a target profile; every problem reported at once.

The reader has already checked the language (known keys, value ranges, heads that divide).
Here the target's backend checks what depends on the target (dtypes and features it has),
then searches its tile configuration once: a configuration that cannot work (memory,
threads, registers) is a Problem. Each message names the target and profile and the reason;
nothing is silently changed. The configuration found is the one the plan is built from, so
`attngen check` shows what `attngen build` uses.
"""

from __future__ import annotations

import functools

from ..errors import Diagnostic
from ..lang import validate
from ..lang.spec import AttentionSpec, typed_key
from .kernel_plan import Problem
from .profiles import Profile


def where(profile: Profile) -> str:
    return f"target {profile.target} (profile {profile.name})"


def check(spec: AttentionSpec, backend, profile: Profile) -> tuple[object | None, list[Diagnostic]]:
    """(configuration, diagnostics) for building `spec` with `backend` on `profile`; the
    configuration is None unless the diagnostics are empty (it builds)."""
    def diagnostic(p: Problem) -> Diagnostic:
        return Diagnostic(f"{where(profile)}: {p.message}", spec.span(p.key), p.hint)

    diags = _validated(spec)  # the language's rules first, whoever built the spec
    if diags:
        return None, diags
    diags = [diagnostic(p) for p in backend.check(spec, profile)]
    config = None
    if not diags:
        try:
            config = backend.configure(spec, profile)
        except Problem as p:
            diags.append(diagnostic(p))
    return config, sorted(diags, key=Diagnostic.sort_key)


def _validated(spec) -> list[Diagnostic]:
    """attngen.lang.validate, remembered per spec (a spec is checked once however often it is
    planned); an unhashable spec is invalid anyway and is checked every time."""
    try:
        key = typed_key(spec)
        hash(key)
    except TypeError:
        return validate(spec)
    return list(_validate_cached(key, spec))


@functools.lru_cache(maxsize=1024)
def _validate_cached(key, spec) -> tuple:
    """Keyed by typed_key(spec) first: specs equal in value but not in type (head_dim 32 and
    32.0) share no entry, so neither one's answer is given for the other."""
    return tuple(validate(spec))
