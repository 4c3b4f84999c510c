"""Target profiles: what a kernel may use on a target, read from targets/*.toml.

A profile is data: limits, storage dtypes, features, tuned defaults, and whatever other tables
its target needs (kept by name in `sections`, e.g. a device's architecture or a shading
language's dialect). This module reads and checks the common structure; each backend checks
the keys its target needs (attngen.backends.base.Backend.profile). The checker and the
planner read profiles; the runtimes pick one for the live device and may narrow its limits to
what the device reports with `Profile.narrowed`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
import functools
import tomllib

from ..errors import did_you_mean
from ..resources import resource_dir

# The tables every profile has; any other top-level table is kept in Profile.sections.
_COMMON = ("name", "target", "description", "limits", "dtypes", "features", "defaults")


class ProfileError(ValueError):
    """An unknown profile name or a malformed profile file."""


@dataclass(frozen=True)
class Profile:
    name: str
    target: str
    description: str
    limits: dict = field(hash=False)
    storage_dtypes: tuple
    features: dict = field(hash=False)  # guaranteed / optional feature names, and target-specific facts
    defaults: tuple = field(hash=False)  # rows of tuned defaults (dicts)
    sections: dict = field(default_factory=dict, hash=False)  # other tables, by name
    # The backend's tile table with these fields replaced (a benchmark's or A/B probe's choices,
    # passed as data: with_overrides); the backend checks the names (e.g. attngen/backends/cuda/
    # tiles.py, tiles_for). Empty for every profile of targets/.
    overrides: dict = field(default_factory=dict, hash=False)

    def limit(self, key: str) -> int:
        return self.limits[key]

    def section(self, name: str) -> dict:
        """A target-specific table of the profile ({} when absent)."""
        return self.sections.get(name, {})

    def has_feature(self, name: str) -> bool:
        """A feature the profile guarantees."""
        return name in self.features.get("guaranteed", ())

    def may_use_feature(self, name: str) -> bool:
        """A feature that is guaranteed or can be requested."""
        return self.has_feature(name) or name in self.features.get("optional", ())

    def default_row(self, head_dim: int, math: str | None = None, dtype: str | None = None,
                    schedule: str | None = None) -> dict:
        """The first [[defaults]] row whose head-dim bound holds (and whose `math`, and `dtype` and
        `schedule` where the row names them, match: a row with `dtype` serves only that storage
        dtype, one with `schedule` only "fused" or only "split" (split_kv, two_pass) kernels)."""
        for row in self.defaults:
            if (head_dim <= row["max_head_dim"] and (math is None or row.get("math") == math)
                    and row.get("dtype", dtype) == dtype and row.get("schedule", schedule) == schedule):
                return row
        raise ProfileError(f"profile {self.name} has no tuned defaults for head dim {head_dim}"
                           + (f" with math {math}" if math else ""))

    def with_overrides(self, **fields) -> "Profile":
        """This profile with fields of its backend's tile table replaced (added to any overrides
        it has): `get_profile("cuda-sm90", "cuda").with_overrides(clean_values=False)`. The
        backend refuses a name its table does not have when the profile is used."""
        return replace(self, overrides={**self.overrides, **fields})

    def narrowed(self, name: str | None = None, limits: dict | None = None,
                 features: dict | None = None, sections: dict | None = None) -> "Profile":
        """This profile with some limits / features / section keys replaced by what a live
        device reports."""
        merged = dict(self.sections)
        for key, table in (sections or {}).items():
            merged[key] = {**self.sections.get(key, {}), **table}
        return replace(
            self,
            name=name or self.name,
            limits={**self.limits, **(limits or {})},
            features={**self.features, **(features or {})},
            sections=merged,
        )


def require(profile: Profile, limits=(), defaults=(), sections=()) -> Profile:
    """Check that a profile has the keys its target needs (integer limits, keys of every
    [[defaults]] row, "table.key" entries of sections); raise ProfileError naming the first
    one missing."""
    where = f"profile {profile.name} (target {profile.target})"
    for key in limits:
        if not isinstance(profile.limits.get(key), int):
            raise ProfileError(f"{where}: [limits] {key} must be an integer")
    for row in profile.defaults:
        for key in defaults:
            if key not in row:
                raise ProfileError(f"{where}: missing '{key}' in a [[defaults]] row")
    for item in sections:
        table, _, key = item.partition(".")
        if table not in profile.sections or (key and key not in profile.sections[table]):
            raise ProfileError(f"{where}: missing '{key or table}' in [{table}]")
    return profile


def _validate(data: dict, path) -> Profile:
    def need(d, key, where):
        if key not in d:
            raise ProfileError(f"{path}: missing '{key}' in {where}")
        return d[key]

    target = need(data, "target", "the top level")
    if not isinstance(target, str) or not target:
        raise ProfileError(f"{path}: target must be a target's name, not {target!r}")
    limits = need(data, "limits", "the top level")
    if not isinstance(limits, dict):
        raise ProfileError(f"{path}: [limits] must be a table")
    defaults = tuple(need(data, "defaults", "the top level"))
    for row in defaults:
        need(row, "max_head_dim", "a [[defaults]] row")
    return Profile(
        name=need(data, "name", "the top level"),
        target=target,
        description=data.get("description", ""),
        limits=dict(limits),
        storage_dtypes=tuple(need(need(data, "dtypes", "the top level"), "storage", "[dtypes]")),
        features=dict(data.get("features", {})),
        defaults=defaults,
        sections={k: dict(v) for k, v in data.items() if k not in _COMMON and isinstance(v, dict)},
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


def find_profile(name: str, target: str, extra: tuple = ()) -> Profile:
    """The named profile, checked to be for `target`; `extra` holds profiles a backend brings
    besides those of targets/."""
    profiles = {**all_profiles(), **{p.name: p for p in extra}}
    if name not in profiles:
        known = ", ".join(p for p in profiles if profiles[p].target == target)
        raise ProfileError(f"unknown profile '{name}' for target {target} (known: {known})")
    prof = profiles[name]
    if prof.target != target:
        raise ProfileError(f"profile '{name}' is for target {prof.target}, not {target}")
    return prof


def profiles_for(target: str, extra: tuple = ()) -> list[Profile]:
    return [p for p in {**all_profiles(), **{p.name: p for p in extra}}.values() if p.target == target]


def with_overrides(default, profile: "Profile | None"):
    """A backend's tile table (`default`: a frozen dataclass of choices, e.g. CudaTiles) with the
    profile's overrides applied (Profile.with_overrides): the one check of their names and types.
    A ProfileError names an override that is not a field of the table, or a value not of the
    field's kind (bool, str, tuple and dict fields take their own type; int fields an int; float
    fields any number; a bool is never a number)."""
    overrides = getattr(profile, "overrides", None) or {}
    if not overrides:
        return default
    table = type(default).__name__
    names = [f.name for f in fields(default)]
    for name, value in overrides.items():
        if name not in names:
            hint = did_you_mean(name, names)
            raise ProfileError(f"profile {profile.name}: unknown override '{name}' ({table} has no such field"
                               + (f"; {hint})" if hint else f"; fields: {', '.join(names)})"))
        was = getattr(default, name)
        if isinstance(was, (bool, str, tuple, dict)):
            ok = isinstance(value, type(was))
        else:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (
                isinstance(was, float) or isinstance(value, int))
        if not ok:
            kind = type(was).__name__
            raise ProfileError(f"profile {profile.name}: override {name}={value!r} is not "
                               f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} ({table}.{name} = {was!r})")
    return replace(default, **overrides)
