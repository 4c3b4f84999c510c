"""split_kv(auto) / two_pass's choice of S is one rule (attngen.plan.schedule.SplitRule): the
runtimes apply it (choose_splits) and the manifests print it, as numbers and formulas, for
launchers outside Python. These tests read the printed rule back (the CUDA manifest's "splits"
formula, the WGSL manifest's "splits" formula and its "split_rule" numbers with their note),
evaluate it over a grid of launch shapes and compare with choose_splits, for both targets: a
manifest whose text drifted from the rule fails here.
"""

from __future__ import annotations

import itertools
import math
import re
from fractions import Fraction

import pytest

from attngen import SpecError
from attngen.api import emit, load
from attngen.plan.schedule import blocks_per_core, choose_splits, split_rule_for

from conftest import ROOT, spec_of

BODIES = [
    "head_dim 128\n heads q=32 kv=8\n dtype f16\n schedule split_kv(auto)",
    "head_dim 128\n heads q=32 kv=8\n dtype f16\n schedule two_pass",
    "head_dim 64\n dtype f32\n mask custom\n schedule split_kv(auto)",
    "head_dim 64\n dtype f16\n mask custom\n schedule two_pass",
    "head_dim qk=192 v=128\n dtype bf16\n mask causal\n schedule two_pass",
    "head_dim 256\n dtype f16\n schedule split_kv(auto)",
]
PROFILES = [("cuda", "cuda-sm80"), ("cuda", "cuda-sm90"), ("wgsl", "webgpu-core"), ("wgsl", "wgpu-vulkan-nvidia")]
# (B, Lq, Lk, Hq, Hkv, cores)
SHAPES = list(itertools.product((1, 3, 8), (1, 5, 64), (1, 63, 64, 1000, 4096, 32768), ((8, 8), (32, 8), (28, 4)),
                                (1, 8, 132)))


def _emitted():
    out = []
    specs = [spec_of(b) for b in BODIES] + [load(f"{ROOT}/examples/llama3_8b_decode.attn", "llama3_8b_decode")]
    for spec, (target, profile) in itertools.product(specs, PROFILES):
        try:
            out.append(emit(spec, target, profile))
        except SpecError:
            pass
    return out


EMITTED = _emitted()


def _evaluate(expr: str, names: dict) -> Fraction:
    """A formula of a manifest (integers, names, + * /, floor, ceil, min, max), exactly."""
    assert re.fullmatch(r"[\w\s+*/(),]+", expr), expr
    names = {k: Fraction(v) for k, v in names.items()}
    return eval(expr, {"__builtins__": {}}, {"floor": math.floor, "ceil": math.ceil, "min": min, "max": max, **names})


def _numeric(text: str, rows_per_kv_head: bool, sizes: dict) -> int:
    """S from a manifest's "splits" text: "S = ... with blocks = X (mask custom: Y) (...)"."""
    rule = text.split(" (attngen.plan.schedule.choose_splits")[0]
    s, blocks = rule.split(" with blocks = ")
    grouped, custom = re.fullmatch(r"(.*) \(mask custom: (.*)\)", blocks).groups()
    n_blocks = _evaluate(grouped if rows_per_kv_head else custom, sizes)
    return int(_evaluate(s.removeprefix("S = "), {**sizes, "blocks": n_blocks}))


def _from_fields(fields: dict, sizes: dict) -> int:
    """S from the WGSL manifest's split_rule: its numbers, evaluated by its note's formula."""
    note = fields["note"].split("; compute_units")[0]
    s, blocks = note.split(", blocks = ")
    grouped, custom = re.fullmatch(r"(.*) when rows_per_kv_head, else (.*)", blocks).groups()
    numbers = {k: v for k, v in fields.items() if isinstance(v, int) and not isinstance(v, bool)}
    env = {**sizes, **numbers, "G": Fraction(sizes["Hq"], sizes["Hkv"])}
    n_blocks = _evaluate(grouped if fields["rows_per_kv_head"] else custom, env)
    return int(_evaluate(s.removeprefix("S = "), {**env, "blocks": n_blocks}))


def test_the_grid_has_both_targets_and_both_row_groupings():
    auto = [e for e in EMITTED if e.plan.spec.schedule.splits is None]
    assert {e.plan.target for e in auto} == {"cuda", "wgsl"}
    assert {split_rule_for(e.plan).rows_per_kv_head for e in auto} == {True, False}
    assert {blocks_per_core(e.plan) for e in auto if e.plan.target == "cuda"} == {1, 2}  # resident_blocks counts


def test_manifests_print_the_rule_choose_splits_applies():
    checked = 0
    for e in EMITTED:
        plan, m = e.plan, e.manifest
        rule = split_rule_for(plan)
        splits_text = m["splits"] if plan.target == "cuda" else m["schedule"]["splits"]
        if plan.target == "wgsl":
            fields = m["schedule"]["split_rule"]
            # the WGSL numbers are the rule's: blocks_per_core the same function as CUDA's
            assert fields["blocks_per_core"] == blocks_per_core(plan) == rule.blocks_per_core
            assert fields["tile_q"] == plan.tile_q and fields["tile_kv"] == plan.tile_kv
        for b, lq, lk, (hq, hkv), cores in SHAPES:
            if plan.spec.heads_q and (hq, hkv) != (plan.spec.heads_q, plan.spec.heads_kv):
                continue
            want = choose_splits(plan, b, lq, lk, hq, hkv, cores)
            sizes = {"B": b, "Lq": lq, "Lk": lk, "Hq": hq, "Hkv": hkv, "compute_units": cores}
            assert _numeric(splits_text, rule.rows_per_kv_head, sizes) == want, (plan.profile, splits_text, sizes)
            if plan.target == "wgsl":
                assert _from_fields(fields, sizes) == want, (plan.profile, fields, sizes)
            checked += 1
    assert checked > 1000


@pytest.mark.parametrize("target, profile", PROFILES)
def test_fixed_splits_are_n(target, profile):
    """split_kv(N): S = N whatever the shapes, and the manifests say so."""
    e = emit(spec_of("head_dim 64\n dtype f16\n schedule split_kv(5)"), target, profile)
    assert choose_splits(e.plan, 3, 7, 100000, 8, 8, 132) == 5
    assert e.manifest["splits"] == "S = 5" if target == "cuda" else e.manifest["schedule"]["splits_fixed"] == 5
