"""attngen tune: sweep a kernel's legal tile choices on this machine's device, check every
candidate against the float64 reference before timing it, and store the fastest.

A result is a cache entry (<key>.tuned, JSON) keyed by the target, the device's identity (the
backend's `device_identity()`: vendor, architecture, device, driver) and the spec with its
tuned choices taken out (`spec_key`); it records the shape class it was tuned for. attngen.compile
uses a stored result for the live device when the spec leaves those choices at auto;
`attngen check` lists the stored results of a spec. The backend says what to sweep
(`tune_space`); this module knows no target.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import replace

from ..lang.spec import AttentionSpec, Tile
from ..lang.options import target_schema
from ..lang.spec import format_spec
from ..runtime import cache
from .runner import draw_inputs
from ..reference import reference, relative_error, to_numpy, tolerance

SUFFIX = ".tuned"


def _kept(spec: AttentionSpec, target: str) -> dict:
    """The spec's options for `target` that a tuned choice keeps: those that do not shape the
    tiles (lang.options: `tiling`), e.g. wgsl's f16 storage or cuda's producer."""
    schema = target_schema(target)
    tiling = {o.name for o in schema.options if o.tiling} if schema else set()
    return {k: v for k, v in spec.options(target).items() if k not in tiling}


def _with_options(spec: AttentionSpec, target: str, options: dict) -> tuple:
    return tuple((t, o) for t, o in spec.targets if t != target) + (((target, options),) if options else ())


def spec_key(spec: AttentionSpec, target: str) -> str:
    """The spec without its name, tile q / kv and this target's tiling options: what a tuned
    result stands for (options it keeps, such as wgsl's f16 storage, stay in: another kernel)."""
    bare = replace(spec, name="tuned", tile=Tile(d=spec.tile.d),
                   targets=_with_options(spec, target, _kept(spec, target)))
    return format_spec(bare)


def is_auto(spec: AttentionSpec, target: str) -> bool:
    """Whether the spec leaves every tuned choice to attngen: tile q, kv and the target's tiling
    options (its other options are kept through the tuned choice)."""
    return (spec.tile.q is None and spec.tile.kv is None
            and spec.options(target).keys() == _kept(spec, target).keys())


def shape_class(shape: dict) -> str:
    """Decode (Lq = 1) or prefill, and the order of magnitude of Lk."""
    kind = "decode" if shape["Lq"] == 1 else "prefill"
    bucket = next((b for b in (512, 2048, 8192, 32768) if shape["Lk"] <= b), None)
    return f"{kind} Lk<={bucket}" if bucket else f"{kind} Lk>32768"


# The stored choice when no candidate beat the profile's defaults: every choice left at auto (an
# older attngen reading it applies it as the defaults too).
DEFAULTS = {"tile_q": None, "tile_kv": None, "options": {}}


def is_defaults(choice: dict | None) -> bool:
    return not choice or (choice.get("tile_q") is None and choice.get("tile_kv") is None
                          and not choice.get("options"))


def apply(spec: AttentionSpec, target: str, choice: dict | None) -> AttentionSpec:
    """The spec with a tuned choice: {"tile_q", "tile_kv", "options"}; DEFAULTS (the defaults won
    the sweep): the spec as it is."""
    if is_defaults(choice):
        return spec
    options = {**_kept(spec, target), **(choice.get("options") or {})}
    return replace(spec, tile=replace(spec.tile, q=choice.get("tile_q"), kv=choice.get("tile_kv")),
                   targets=_with_options(spec, target, options))


def label(choice: dict | None) -> str:
    if is_defaults(choice):
        return "the profile's defaults"
    parts = [f"q={choice['tile_q']}", f"kv={choice['tile_kv']}"]
    parts += [f"{k}={v}" for k, v in sorted((choice.get("options") or {}).items())]
    return " ".join(parts)


def _parts(summary: str) -> list[str]:
    """A plan summary's comma-separated parts (commas inside brackets stay in their part)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(summary):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(summary[start:i].strip())
            start = i + 1
    return parts + [summary[start:].strip()]


def plan_labels(rows) -> list[str]:
    """A label per sweep row (the defaults' first): the plan's fields (Backend.plan_fields) that
    vary among the rows that have a plan, as k=v; a row without a plan (refused, failed, not run)
    is labelled by its choice. Two different plans never get the same label: where their fields
    agree, the parts of their summaries that differ are added."""
    fields = [r[5] if len(r) > 5 else None for r in rows]
    planned = [f for f in fields if f is not None]
    keys = list(dict.fromkeys(k for f in planned for k in f))
    varying = [k for k in keys if len({str(f.get(k)) for f in planned}) > 1] or keys[:2]
    out = [label(r[0]) if f is None else " ".join(f"{k}={f[k]}" for k in varying if k in f)
           for r, f in zip(rows, fields)]
    groups: dict = {}
    for i, (r, f) in enumerate(zip(rows, fields)):
        if f is not None:
            groups.setdefault(out[i], []).append(i)
    for same in groups.values():
        summaries = {rows[i][4] for i in same}
        if len(summaries) < 2:
            continue
        common = set.intersection(*(set(_parts(s)) for s in summaries))
        for i in same:
            extra = [p for p in _parts(rows[i][4]) if p not in common]
            out[i] += f" ({'; '.join(extra)})" if extra else ""
    return out


def _key(target: str, identity: str, spec: AttentionSpec) -> str:
    return cache.cache_key(kind="tuned", target=target, device=identity, spec=spec_key(spec, target))


def sweep(backend, spec: AttentionSpec, shape: dict, *, repeat: int = 5, seed: int = 0, progress=None,
          check=None, compile_=None):
    """The profile's defaults, then every candidate of backend.tune_space(spec), each checked
    against the float64 reference before it is timed: (default row, candidate rows fastest first
    among the ok ones). A row is (choice, status, ms, rel_err, plan summary, plan fields), the last
    two None where no plan ran (refused, failed), the fields Backend.plan_fields' (plan_labels
    labels the rows by them); the default's choice is None. A candidate that raises (compile,
    launch, a device error) is a FAILED row; if the
    device then no longer runs the defaults (lost, or reset after a timeout) the sweep stops and
    the rows so far stand (the caller stores the fastest of them). `check(spec) -> problems` and `compile_(spec) -> kernel` come from the caller (the
    API layer)."""
    say = progress or (lambda line: None)
    host, args, opts = draw_inputs(spec, backend, shape, seed)
    ref = reference(spec, *host, **{n: to_numpy(x) for n, x in opts.items()})

    def run(choice, cand, where):
        kernel = compile_(cand)
        err = relative_error(to_numpy(kernel(*args, **opts)), ref)
        if not err <= tolerance(cand):
            say(f"{where}: wrong result, not timed")
            return (choice, f"WRONG (error {err:.2e})", None, err, kernel.plan.summary(),
                    backend.plan_fields(kernel.plan))
        ms = backend.time_call(kernel, args, opts, repeat)
        say(f"{where}: {ms:.4g} ms")
        return (choice, "ok", ms, err, kernel.plan.summary(), backend.plan_fields(kernel.plan))

    default = run(None, spec, "the profile's defaults")

    def device_still_runs() -> bool:
        """After a candidate failed: whether the device still runs the defaults (a lost device,
        or one the driver reset after a timeout, does not)."""
        try:
            to_numpy(compile_(spec)(*args, **opts))
            return True
        except Exception:  # noqa: BLE001  (whatever the runtime raises for a lost device)
            return False

    space = backend.tune_space(spec)
    rows = []
    for i, choice in enumerate(space):
        cand = apply(spec, backend.name, choice)
        where = f"[{i + 1}/{len(space)}] {label(choice)}"
        problems = check(cand)
        if problems:
            reason = problems[0].message.split(": ", 1)[-1][:60]
            rows.append((choice, "refused: " + reason, None, None, None, None))
            say(f"{where}: refused by the planner")
            continue
        try:
            rows.append(run(choice, cand, where))
        except Exception as e:  # noqa: BLE001  (a candidate that fails to compile, launch or finish)
            reason = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:70]}"
            say(f"{where}: failed ({reason})")
            rows.append((choice, "FAILED: " + reason, None, None, None, None))
            if not device_still_runs():
                rest = len(space) - i - 1
                say(f"the device no longer runs the defaults: the sweep stops here ({rest} candidate(s) not run); "
                    "the results so far stand")
                rows += [(c, "not run: the device was lost", None, None, None, None) for c in space[i + 1:]]
                break
    ok = sorted((r for r in rows if r[2] is not None), key=lambda r: r[2])
    return default, ok + [r for r in rows if r[2] is None]


def store(backend, spec: AttentionSpec, shape: dict, choice: dict, ms: float, default_ms: float | None) -> str:
    """Record the winner for this device and spec (one entry per shape class inside); returns
    where, or why it could not be stored."""
    identity = backend.device_identity()
    key = _key(backend.name, identity, spec)
    found = cache.get(key, SUFFIX)
    entry = json.loads(found) if found else {"target": backend.name, "device": identity,
                                             "spec": spec_key(spec, backend.name), "results": {}}
    entry["results"][shape_class(shape)] = {
        "choice": choice, "ms": ms, "default_ms": default_ms, "shape": shape,
        "date": datetime.date.today().isoformat()}
    entry["latest"] = shape_class(shape)
    problem = cache.put(key, SUFFIX, json.dumps(entry, indent=1).encode())
    return problem or str(cache.cache_dir() / f"{key}{SUFFIX}")


def lookup(backend, spec: AttentionSpec) -> dict | None:
    """The stored result for this device (the most recently tuned shape class), or None."""
    found = cache.get(_key(backend.name, backend.device_identity(), spec), SUFFIX)
    if not found:
        return None
    entry = json.loads(found)
    result = entry["results"].get(entry.get("latest", ""))
    return {**result, "device": entry["device"], "shape_class": entry.get("latest")} if result else None


def stored_for(target: str, spec: AttentionSpec) -> list[dict]:
    """Every stored result for this spec and target, whatever the device (attngen check)."""
    want = spec_key(spec, target)
    out = []
    for data in cache.entries(SUFFIX):
        try:
            entry = json.loads(data)
        except ValueError:
            continue
        if entry.get("target") != target or entry.get("spec") != want:
            continue
        for cls, r in sorted(entry.get("results", {}).items()):
            out.append({**r, "device": entry["device"], "shape_class": cls})
    return out
