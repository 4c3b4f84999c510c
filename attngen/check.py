"""Semantic checks of a spec against a target profile; every problem reported at once.

The frontend has already checked the language (known keys, value ranges, heads that divide).
Here we check what depends on the target: dtypes and features it has, and whether the tiles
fit its memory and threads. Each message names the
target and profile and the reason; nothing is silently changed.
"""

from __future__ import annotations

from .errors import Diagnostic, SpecError
from .profiles import Profile
from .spec import AttentionSpec
from .tiling import TileProblem, cuda_config, wgsl_config


def _where(profile: Profile) -> str:
    return f"target {profile.target} (profile {profile.name})"


def check(spec: AttentionSpec, profile: Profile) -> list[Diagnostic]:
    """All diagnostics for building `spec` on `profile`, sorted by position (empty: it builds)."""
    diags: list[Diagnostic] = []
    where = _where(profile)

    def error(key, message, hint=None):
        diags.append(Diagnostic(f"{where}: {message}", spec.span(key), hint))

    # Both targets generate every key of the language (docs/variants.md: mask custom, kv_cache
    # paged, split_kv, two_pass, head dims up to 1024 in chunks); what is left to check is what
    # the target's dtypes, features, memory and threads allow.

    # -- dtypes and features ---------------------------------------------------------------
    if spec.dtype not in profile.storage_dtypes:
        if profile.target == "wgsl" and spec.dtype == "bf16":
            error("dtype", "dtype bf16 is not available: WGSL has no bf16 type",
                  "use dtype f16 (needs the shader-f16 feature) or f32 for WGSL; bf16 runs on cuda")
        else:
            error("dtype", f"dtype {spec.dtype} is not available (has: {', '.join(profile.storage_dtypes)})")
    if profile.target == "wgsl":
        uses_f16 = spec.dtype == "f16" or "f16" in (spec.acc_qk, spec.acc_pv)
        if uses_f16 and not profile.may_use_feature("shader-f16"):
            error("dtype", "f16 needs the shader-f16 feature, which this profile does not offer",
                  "use dtype f32")
        if spec.wgsl.subgroups == "on" and not profile.may_use_feature("subgroups"):
            error("target.wgsl", "subgroups=on, but this profile has no subgroups feature",
                  "use subgroups=auto or off")

    # -- tiles, threads, memory --------------------------------------------------------------
    if not diags:
        try:
            if profile.target == "cuda":
                cuda_config(spec, profile)
            else:
                wgsl_config(spec, profile)
        except TileProblem as p:
            error(p.key, p.message, p.hint)
    return sorted(diags, key=Diagnostic.sort_key)


def check_or_raise(spec: AttentionSpec, profile: Profile) -> None:
    diags = check(spec, profile)
    if diags:
        raise SpecError(diags)
