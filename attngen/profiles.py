"""Target profiles: what a kernel may use on a target, read from targets/*.toml.

A profile is data (limits, dtypes, features, dialect, tuned defaults). The checker and the
planner read it; the runtimes pick one for the live device (runtime/*.py) and may narrow its
limits to what the device reports with `Profile.narrowed`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
import functools
import tomllib

from .resources import resource_dir

DEFAULT_PROFILE = {"cuda": "cuda-sm80", "wgsl": "webgpu-core"}

_REQUIRED_LIMITS = {
    "cuda": ("shared_memory_bytes", "threads_per_block", "registers_per_thread", "registers_per_block"),
    "wgsl": ("workgroup_storage_bytes", "invocations_per_workgroup", "storage_buffers_per_stage",
             "workgroups_per_dimension", "storage_buffer_binding_bytes"),
}
_REQUIRED_DEFAULTS = {
    "cuda": ("math", "max_head_dim", "tile_q", "tile_kv", "stages"),
    "wgsl": ("max_head_dim", "tile_q", "threads_per_row", "tile_kv"),
}


class ProfileError(ValueError):
    """An unknown profile name or a malformed profile file."""


@dataclass(frozen=True)
class Profile:
    name: str
    target: str
    description: str
    limits: dict = field(hash=False)
    storage_dtypes: tuple
    features: dict = field(hash=False)  # cuda: flags; wgsl: guaranteed/optional/subgroup sizes
    defaults: tuple = field(hash=False)  # rows of tuned defaults (dicts)
    device: dict = field(default_factory=dict, hash=False)  # cuda: arch, compute_capability
    dialect: dict = field(default_factory=dict, hash=False)  # wgsl: subgroups_directive
    match: dict = field(default_factory=dict, hash=False)  # wgsl: adapter matching

    def limit(self, key: str) -> int:
        return self.limits[key]

    # -- WGSL features ------------------------------------------------------------------
    def has_feature(self, name: str) -> bool:
        """A feature the profile guarantees."""
        return name in self.features.get("guaranteed", ())

    def may_use_feature(self, name: str) -> bool:
        """A feature that is guaranteed or can be requested."""
        return self.has_feature(name) or name in self.features.get("optional", ())

    def default_row(self, head_dim: int, math: str | None = None) -> dict:
        for row in self.defaults:
            if head_dim <= row["max_head_dim"] and (math is None or row.get("math") == math):
                return row
        raise ProfileError(f"profile {self.name} has no tuned defaults for head dim {head_dim}"
                           + (f" with math {math}" if math else ""))

    def narrowed(self, name: str | None = None, limits: dict | None = None,
                 features: dict | None = None, device: dict | None = None) -> "Profile":
        """This profile with some limits/features replaced by what a live device reports."""
        return replace(
            self,
            name=name or self.name,
            limits={**self.limits, **(limits or {})},
            features={**self.features, **(features or {})},
            device={**self.device, **(device or {})},
        )


def _validate(data: dict, path) -> Profile:
    def need(d, key, where):
        if key not in d:
            raise ProfileError(f"{path}: missing '{key}' in {where}")
        return d[key]

    target = need(data, "target", "the top level")
    if target not in _REQUIRED_LIMITS:
        raise ProfileError(f"{path}: target must be cuda or wgsl, not {target!r}")
    limits = need(data, "limits", "the top level")
    for key in _REQUIRED_LIMITS[target]:
        if not isinstance(need(limits, key, "[limits]"), int):
            raise ProfileError(f"{path}: [limits] {key} must be an integer")
    defaults = tuple(need(data, "defaults", "the top level"))
    for row in defaults:
        for key in _REQUIRED_DEFAULTS[target]:
            need(row, key, "a [[defaults]] row")
    if target == "cuda":
        need(need(data, "device", "the top level"), "arch", "[device]")
    else:
        need(data, "dialect", "the top level")
    return Profile(
        name=need(data, "name", "the top level"),
        target=target,
        description=data.get("description", ""),
        limits=dict(limits),
        storage_dtypes=tuple(need(need(data, "dtypes", "the top level"), "storage", "[dtypes]")),
        features=dict(data.get("features", {})),
        defaults=defaults,
        device=dict(data.get("device", {})),
        dialect=dict(data.get("dialect", {})),
        match=dict(data.get("match", {})),
    )


@functools.lru_cache(maxsize=1)
def all_profiles() -> dict[str, Profile]:
    out = {}
    for path in sorted(resource_dir("targets").glob("*.toml")):
        with open(path, "rb") as f:
            try:
                data = tomllib.load(f)
            except tomllib.TOMLDecodeError as e:
                raise ProfileError(f"{path}: {e}") from None
        prof = _validate(data, path)
        if prof.name != path.stem:
            raise ProfileError(f"{path}: name {prof.name!r} differs from the file name")
        out[prof.name] = prof
    return out


def get_profile(name: str | None, target: str) -> Profile:
    """The named profile (or the target's default), checked to be for `target`."""
    profiles = all_profiles()
    name = name or DEFAULT_PROFILE[target]
    if name not in profiles:
        known = ", ".join(p for p in profiles if profiles[p].target == target)
        raise ProfileError(f"unknown profile '{name}' for target {target} (known: {known})")
    prof = profiles[name]
    if prof.target != target:
        raise ProfileError(f"profile '{name}' is for target {prof.target}, not {target}")
    return prof


def profiles_for(target: str) -> list[Profile]:
    return [p for p in all_profiles().values() if p.target == target]
