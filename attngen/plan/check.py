"""Semantic checks of a spec against a target profile; every problem reported at once.

The reader has already checked the language (known keys, value ranges, heads that divide).
Here the target's backend checks what depends on the target (dtypes and features it has),
then searches its tile configuration once: a configuration that cannot work (memory,
threads, registers) is a Problem. Each message names the target and profile and the reason;
nothing is silently changed. The configuration found is the one the plan is built from, so
`attngen check` shows what `attngen build` uses.

A score expression that is exactly a soft-cap, `score C * tanh(s / C)` (or `tanh(s / C) * C`),
is planned as `softcap C` (`normalised`): the language defines the two as the same function, so
they get the same plan and the same kernels, forward and backward, on every target.
"""

from __future__ import annotations

import functools

from ..errors import Diagnostic
from ..lang import validate
from ..lang.expr import REAL, Binary, Const, Fn, Var
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
    spec = normalised(spec)
    diags = [diagnostic(p) for p in backend.check(spec, profile)]
    config = None
    if not diags:
        try:
            config = backend.configure(spec, profile)
        except Problem as p:
            diags.append(diagnostic(p))
    return config, sorted(diags, key=Diagnostic.sort_key)


def _softcap_of(e) -> float | None:
    """C where `e` is C * tanh(s / C) or tanh(s / C) * C with the same constant C, within the
    range `softcap` takes (the reader's MIN_REAL..MAX_REAL; the reader is loaded by then: validate)."""
    from ..lang.reader import MAX_REAL, MIN_REAL
    if not (isinstance(e, Binary) and e.op == "*"):
        return None
    for c, t in ((e.a, e.b), (e.b, e.a)):
        if (isinstance(c, Const) and isinstance(t, Fn) and t.name == "tanh" and isinstance(t.args[0], Binary)
                and t.args[0].op == "/" and t.args[0].a == Var("s", REAL) and isinstance(t.args[0].b, Const)
                and t.args[0].b.value == c.value and MIN_REAL <= c.value <= MAX_REAL):
            return float(c.value)  # (as the reader reads `softcap C`)
    return None


def normalised(spec: AttentionSpec) -> AttentionSpec:
    """`spec` as planned: a score expression that is a soft-cap becomes `softcap C` (module
    docstring); any other spec is returned as it is."""
    from dataclasses import replace
    cap = _softcap_of(spec.score) if spec.score is not None else None
    return spec if cap is None else replace(spec, score=None, softcap=cap)


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
