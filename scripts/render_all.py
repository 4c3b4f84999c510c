"""Render every spec of a large grid for every profile of every target, and compare with a snapshot.

A refactor of the generator must not change what it prints. This script is the check:

    python scripts/render_all.py snapshot /tmp/before     # before the change
    python scripts/render_all.py compare  /tmp/before     # after: lists every spec whose output moved

The grid is every kernel of examples/*.attn and tests/golden/variants.attn, plus a product of head
dims, dtypes, accumulators, masks, softcap, schedules, caches, GQA groups, tile sizes and target
options (the forms the configuration search branches on), each for every profile in targets/.
What is recorded per (spec, profile): the source, the manifest (without the generator digest,
which changes with every edit of the package) and `attngen check`'s description lines, or the
checker's refusal when the profile cannot build it. The snapshot is one JSON line per case.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import attngen  # noqa: E402
from attngen import backends  # noqa: E402
from attngen.api import emit_plan, lower, parse  # noqa: E402
from attngen.errors import SpecError  # noqa: E402
from attngen.plan import profiles as profiles_mod  # noqa: E402

HEAD_DIMS = ["32", "64", "80", "96", "128", "qk=192 v=128", "256", "320", "512", "qk=576 v=512", "1024"]
DTYPES = ["f32", "f16", "bf16"]
MASKS = ["none", "causal", "causal(bottom_right)", "window(left=256)", "window(left=1024, right=16)", "custom"]
SCHEDULES = ["fused", "split_kv(auto)", "split_kv(4)", "two_pass"]


def grid_specs() -> list[tuple[str, str]]:
    """(label, spec text) of the generated grid."""
    out = []

    def add(label, **keys):
        body = "\n".join(f"    {k} {v}" for k, v in keys.items() if v is not None)
        out.append((label, f"attention g{len(out)} {{\n{body}\n}}\n"))

    # the main product: head dims x dtypes x masks (MHA and GQA), fused
    for d, dt, m, heads in itertools.product(HEAD_DIMS, DTYPES, MASKS, ["q=8 kv=8", "q=28 kv=4"]):
        add("main", head_dim=d, heads=heads, dtype=dt, mask=m)
    # softcap and f16 accumulators and scale
    for d, dt, m in itertools.product(HEAD_DIMS, ["f16", "bf16", "f32"], ["none", "causal", "window(left=256)"]):
        add("softcap", head_dim=d, heads="q=16 kv=8", dtype=dt, mask=m, softcap="30.0")
    for d, m in itertools.product(["64", "128", "256"], ["none", "causal(bottom_right)"]):
        add("acc16", head_dim=d, heads="q=16 kv=8", dtype="f16", accumulate="qk=f16 pv=f16", mask=m, scale="0.1")
        add("acc16pv", head_dim=d, heads="q=16 kv=8", dtype="f16", accumulate="qk=f32 pv=f16", mask=m)
    # decode schedules and caches
    for d, dt, s, c, m, heads in itertools.product(
            ["64", "128", "256", "qk=576 v=512"], ["f16", "bf16", "f32"], SCHEDULES,
            ["contiguous", "paged(page=16)", "paged(page=64)"], ["none", "causal(bottom_right)", "custom"],
            ["q=32 kv=8", "q=16 kv=1"]):
        add("decode", head_dim=d, heads=heads, dtype=dt, mask=m, schedule=s, kv_cache=c)
    # tiles
    for d, t, dt in itertools.product(["64", "128", "256", "qk=576 v=512", "1024"],
                                      ["q=64 kv=64", "q=128 kv=64", "q=64 kv=32 d=64", "d=64", "q=16 kv=64"],
                                      ["f16", "f32"]):
        add("tile", head_dim=d, heads="q=8 kv=2", dtype=dt, mask="causal", tile=t)
    # CUDA options
    cuda_opts = ["warps=4", "warps=8", "stages=1", "stages=2", "stages=3", "key_warps=2", "producer=on",
                 "producer=off", "persistent=on", "persistent=off", "tma=on", "tma=off",
                 "producer=on tma=off", "producer=on persistent=off", "warps=8 stages=2 tma=off"]
    for d, dt, m, o in itertools.product(["64", "96", "128", "192", "256", "512"], ["f16", "bf16", "f32"],
                                         ["none", "causal", "window(left=512)", "custom"], cuda_opts):
        add("cuda-opt", head_dim=d, heads="q=16 kv=8", dtype=dt, mask=m, target=f"cuda {{ {o} }}")
    # WGSL options
    wgsl_opts = ["workgroup=64", "workgroup=128", "workgroup=256", "subgroups=on", "subgroups=off",
                 "f16=native", "f16=packed", "prefetch=on", "prefetch=off", "f16=packed subgroups=off"]
    for d, dt, m, s, o in itertools.product(["32", "64", "128", "256"], ["f16", "f32"],
                                            ["none", "causal", "custom"], ["fused", "split_kv(2)"], wgsl_opts):
        add("wgsl-opt", head_dim=d, heads="q=8 kv=2", dtype=dt, mask=m, schedule=s, target=f"wgsl {{ {o} }}")
    return out


def file_specs() -> list[tuple[str, object]]:
    out = []
    paths = sorted(os.path.join(ROOT, "examples", f) for f in os.listdir(os.path.join(ROOT, "examples"))
                   if f.endswith(".attn"))
    paths.append(os.path.join(ROOT, "tests", "golden", "variants.attn"))
    for path in paths:
        with open(path) as f:
            for spec in parse(f.read(), os.path.basename(path)):
                out.append((os.path.basename(path), spec))
    return out


def all_profiles() -> list[tuple[str, str]]:
    """(target, profile) for every profile file in targets/."""
    out = []
    for target in backends.names():
        for prof in backends.get(target).profiles():
            out.append((target, prof.name))
    return sorted(out)


def record(spec, target, profile) -> dict:
    try:
        plan = lower(spec, target, profile)
    except SpecError as e:
        return {"refused": str(e)}
    emitted = emit_plan(plan)
    manifest = dict(emitted.manifest)
    manifest.pop("generator", None)
    return {
        "source": emitted.source,
        "manifest": json.dumps(manifest, sort_keys=True),
        "describe": "\n".join(backends.get(target).describe(plan)),
    }


def cases(only=None):
    specs = [(label, spec) for label, spec in file_specs()]
    for label, text in grid_specs():
        try:
            parsed = parse(text, label)
        except SpecError as e:  # a grid point the language refuses: recorded as such
            specs.append((label, text))
            continue
        specs.append((label, parsed[0]))
    for (target, profile) in all_profiles():
        if only and profile not in only and target not in only:
            continue
        for i, (label, spec) in enumerate(specs):
            yield f"{i:05d} {label} {getattr(spec, 'name', 'refused')} {profile}", spec, target, profile


def run(path: str, compare: bool, only=None, ignore=()) -> int:
    t0 = time.time()
    before = {}
    if compare:
        with open(path) as f:
            for line in f:
                row = json.loads(line)
                before[row["case"]] = row
    rows, moved, n_built = [], [], 0
    for case, spec, target, profile in cases(only):
        if isinstance(spec, str):
            rec = {"refused": "language"}
        else:
            rec = record(spec, target, profile)
        n_built += "source" in rec
        row = {"case": case, **rec}
        if compare:
            if case not in before:
                moved.append((case, None, row))
                continue
            old = before.pop(case)
            if {k: v for k, v in old.items() if k not in ignore} != {k: v for k, v in row.items() if k not in ignore}:
                moved.append((case, old, row))
        else:
            rows.append(row)
    if not compare:
        with open(path, "w") as f:
            for row in rows:
                f.write(json.dumps(row, sort_keys=True) + "\n")
        digest = hashlib.sha256(open(path, "rb").read()).hexdigest()[:16]
        print(f"{len(rows)} cases ({n_built} built) in {time.time() - t0:.0f} s -> {path} (sha256 {digest})")
        return 0
    for case in before:
        if not only or case.split()[-1] in only or _target_of(case.split()[-1]) in only:
            moved.append((case, before[case], None))
    for case, old, new in moved[:20]:
        print(f"MOVED {case}")
        for key in ("refused", "source", "manifest", "describe"):
            a, b = (old or {}).get(key), (new or {}).get(key)
            if a != b:
                print(f"  {key}: {_first_difference(a, b)}")
    print(f"{n_built} built; {len(moved)} of the cases differ from {path} ({time.time() - t0:.0f} s)")
    return 1 if moved else 0


def _target_of(profile: str) -> str:
    return "cuda" if profile.startswith("cuda") else "wgsl"


def _first_difference(a, b) -> str:
    if a is None or b is None:
        return f"{'absent' if a is None else 'present'} -> {'absent' if b is None else 'present'}"
    la, lb = a.splitlines(), b.splitlines()
    for i, (x, y) in enumerate(zip(la, lb)):
        if x != y:
            return f"line {i + 1}:\n    - {x[:200]}\n    + {y[:200]}"
    return f"{len(la)} lines -> {len(lb)} lines"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("snapshot", "compare"))
    ap.add_argument("path")
    ap.add_argument("--only", default="", help="comma-separated targets or profiles to render (compare: "
                                                 "only those are checked), e.g. cuda or cuda-sm90,webgpu-core")
    ap.add_argument("--ignore", default="", help="comma-separated keys not compared (source, manifest, describe, "
                                                   "refused): for a change meant to move one of them")
    args = ap.parse_args(argv)
    only = {w for w in args.only.split(",") if w} or None
    return run(args.path, args.mode == "compare", only, tuple(w for w in args.ignore.split(",") if w))


if __name__ == "__main__":
    sys.exit(main())
