"""attngen tune on the adapter at hand (lavapipe in CI): every candidate checked against the
reference before it is timed, the fastest stored per device, spec and shape class; compile uses
it when the spec leaves the tiles at auto; check lists it; the cache counts and clears it."""

from __future__ import annotations

import json

import pytest

import attngen
from attngen.cli import main
from attngen.harness import tune
from attngen.runtime import cache

from conftest import require, spec_of

SPEC = "attention t {\n head_dim 32\n heads q=4 kv=2\n dtype f32\n mask causal\n}\n"


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "t.attn"
    path.write_text(SPEC)
    return path


def test_tune_stores_the_fastest_and_compile_uses_it(own_cache, capsys):
    require("wgsl")
    assert main(["tune", str(own_cache), "--target", "wgsl", "--shape", "B=1,Lq=40,Lk=40", "--repeat", "1", "-q"]) == 0
    out = capsys.readouterr().out
    assert "the defaults: q=" in out and "fastest: " in out  # refusals: none needed (all may fit)
    assert out.count(" ok") >= 5
    (entry,) = [json.loads(d) for d in cache.entries(tune.SUFFIX)]
    result = entry["results"]["prefill Lk<=512"]
    choice = result["choice"]
    assert entry["target"] == "wgsl" and result["shape"]["Lq"] == 40 and result["ms"] > 0
    spec = spec_of("head_dim 32\n heads q=4 kv=2\n dtype f32\n mask causal")
    kernel = attngen.compile(spec, target="wgsl")
    c = kernel.plan.config
    if tune.is_defaults(choice):  # the defaults were the fastest: compile keeps them
        d = attngen.compile(spec, target="wgsl", tuned=False).plan.config
        assert (c.tile_q, c.tile_kv, c.workgroup) == (d.tile_q, d.tile_kv, d.workgroup)
    else:
        assert (c.tile_q, c.tile_kv, c.workgroup) == (choice["tile_q"], choice["tile_kv"], choice["options"]["workgroup"])
    # a spec that fixes its tiles is compiled as written
    fixed = spec_of("head_dim 32\n heads q=4 kv=2\n dtype f32\n mask causal\n tile q=8 kv=16")
    assert attngen.compile(fixed, target="wgsl").plan.config.tile_q == 8
    # check says where the tiles come from
    assert main(["check", str(own_cache), "--target", "wgsl"]) == 0
    text = capsys.readouterr().out
    assert f"tuned {tune.label(choice)} on " in text and "for prefill Lk<=512" in text
    # the cache counts the result and clears it
    assert main(["cache", "info"]) == 0 and ".tuned" in capsys.readouterr().out
    assert main(["cache", "clear"]) == 0
    assert list(cache.entries(tune.SUFFIX)) == []


def test_tune_refuses_what_it_cannot_tune(own_cache, tmp_path, capsys):
    fixed = tmp_path / "fixed.attn"
    fixed.write_text(SPEC.replace("mask causal", "mask causal\n tile q=16"))
    assert main(["tune", str(fixed), "--target", "wgsl", "-q"]) == 2
    assert "leave them at auto" in capsys.readouterr().err


def test_the_key_leaves_out_what_is_tuned():
    a = spec_of("head_dim 32\n dtype f32")
    b = spec_of("head_dim 32\n dtype f32\n tile q=8 kv=16\n target wgsl { workgroup=32 }", name="other")
    assert tune.spec_key(a, "wgsl") == tune.spec_key(b, "wgsl")
    assert tune.spec_key(a, "wgsl") != tune.spec_key(spec_of("head_dim 64\n dtype f32"), "wgsl")
    assert tune.shape_class({"Lq": 1, "Lk": 5000}) == "decode Lk<=8192"
    assert tune.shape_class({"Lq": 7, "Lk": 100000}) == "prefill Lk>32768"


def _failing_compile(fail_at: int, lose_device: bool):
    """compile_ for tune.sweep: candidate number fail_at raises; with lose_device, every kernel
    (the defaults' too) raises from then on, as after a lost device."""
    state = {"n": 0, "lost": False}

    def compile_(s):
        kernel = attngen.compile(s, target="wgsl", tuned=False)
        state["n"] += 1
        if state["n"] == fail_at + 1:  # (call 1 is the defaults)
            state["lost"] = lose_device
            raise RuntimeError("device lost (simulated)\nmore detail")
        if state["lost"]:
            def dead(*a, **k):
                raise RuntimeError("device lost (simulated)")
            return dead
        return kernel
    return compile_


@pytest.mark.parametrize("lose_device", [False, True])
def test_a_failing_candidate_or_a_lost_device_keeps_what_ran(own_cache, lose_device, monkeypatch):
    require("wgsl")
    from attngen.api import check
    from attngen.backends import get
    backend = get("wgsl")
    space = backend.tune_space
    monkeypatch.setattr(backend, "tune_space", lambda spec: space(spec)[:7])  # (the third fails: four after it)
    spec = spec_of("head_dim 32\n heads q=4 kv=2\n dtype f32\n mask causal")
    lines = []
    default, rows = tune.sweep(backend, spec, {"B": 1, "Lq": 24, "Lk": 24, "Hq": 4, "Hkv": 2}, repeat=1,
                               progress=lines.append, check=lambda s: check(s, "wgsl"),
                               compile_=_failing_compile(3, lose_device))
    assert default[1] == "ok"
    failed = [r for r in rows if r[1].startswith("FAILED: RuntimeError: device lost (simulated)")]
    assert len(failed) == 1 and "more detail" not in failed[0][1]
    ok = [r for r in rows if r[1] == "ok"]
    not_run = [r for r in rows if r[1].startswith("not run")]
    if lose_device:
        assert any("the sweep stops here" in ln for ln in lines) and not_run
        assert len(ok) <= 2  # only the candidates before the loss ran
    else:
        assert not not_run and len(ok) >= 3  # the sweep went on past the failure
    assert all(r[2] is not None for r in ok) and rows[:len(ok)] == ok  # the fastest first, failures after



def test_tune_keeps_the_target_options_it_does_not_sweep(own_cache, tmp_path, capsys, monkeypatch):
    """A spec with only `target wgsl { prefetch=off }` was refused ("fixes its own tiles") and
    `check` said its tiles came from the spec; the sweep sets tile q, kv and workgroup only. (The
    sweep's first 4 candidates: every one is applied to the spec alike; the whole space took 30 s.)"""
    require("wgsl")
    backend = attngen.api.backends.get("wgsl")
    space = backend.tune_space
    monkeypatch.setattr(backend, "tune_space", lambda spec: space(spec)[:4])
    path = tmp_path / "p.attn"
    path.write_text(SPEC.replace("mask causal", "mask causal\n target wgsl { prefetch=off }"))
    assert main(["check", str(path), "--target", "wgsl"]) == 0
    assert "tiles: the profile's defaults" in capsys.readouterr().out
    assert main(["tune", str(path), "--target", "wgsl", "--shape", "B=1,Lq=40,Lk=40", "--repeat", "1", "-q"]) == 0
    capsys.readouterr()
    spec = attngen.load(path)
    (entry,) = [json.loads(d) for d in cache.entries(tune.SUFFIX)]
    assert "prefetch=off" in entry["spec"]  # another kernel than the spec without the option
    assert tune.stored_for("wgsl", spec) and not tune.stored_for("wgsl", spec_of(
        "head_dim 32\n heads q=4 kv=2\n dtype f32\n mask causal"))
    choice = tune.lookup(attngen.api.backends.get("wgsl"), spec)["choice"]
    tuned = tune.apply(spec, "wgsl", choice)
    assert tuned.options("wgsl")["prefetch"] == "off"
    assert attngen.compile(spec, target="wgsl").plan.config.prefetch is False


def test_a_sweep_whose_candidates_are_slower_stores_the_defaults(own_cache, monkeypatch, capsys):
    """tune stored its fastest candidate even when the defaults were faster, so compile then
    used a slower kernel than the profile's."""
    require("wgsl")
    chosen = {"tile_q": 8, "tile_kv": 16, "options": {"workgroup": 32}}
    monkeypatch.setattr(tune, "sweep", lambda *a, **k: ((None, "ok", 1.0, 0.0, "tile q=16 kv=16, ..."),
                                                         [(chosen, "ok", 2.0, 0.0, "tile q=8 kv=16, ...")]))
    assert main(["tune", str(own_cache), "--target", "wgsl", "--shape", "B=1,Lq=40,Lk=40", "-q"]) == 0
    assert "fastest: the profile's defaults, 1 ms" in capsys.readouterr().out
    (entry,) = [json.loads(d) for d in cache.entries(tune.SUFFIX)]
    choice = entry["results"]["prefill Lk<=512"]["choice"]
    assert choice == {"tile_q": None, "tile_kv": None, "options": {}}  # every choice auto (older versions read it)
    spec = spec_of("head_dim 32\n heads q=4 kv=2\n dtype f32\n mask causal")
    assert tune.apply(spec, "wgsl", choice) is spec and tune.label(choice) == "the profile's defaults"


def _table(out: str) -> list[str]:
    """The labels of tune's table, the defaults' first ("the defaults: " taken off)."""
    lines = out.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.strip().startswith("candidate"))
    labels = []
    for ln in lines[head + 1:]:
        if ln.startswith("fastest:") or ln.startswith("no candidate"):
            break
        text = ln.strip().removeprefix("the defaults: ")
        labels.append(text.rsplit(None, 2)[0] if " ok" in ln else text)
    return labels


def test_each_candidate_is_labelled_by_what_differs_between_the_plans(own_cache, monkeypatch, capsys):
    """(issue 40) The defaults showed only their tiles ("tile q=32 kv=16") and the candidates the
    choice swept, so the defaults' plan and a candidate of the same tiles and workgroup but other
    rows per invocation looked alike: every row now names the same fields, those that vary."""
    require("wgsl")
    seen = {}
    real = tune.sweep

    def keep(*a, **k):
        seen["rows"] = result = real(*a, **k)
        return result
    monkeypatch.setattr(tune, "sweep", keep)
    assert main(["tune", str(own_cache), "--target", "wgsl", "--shape", "B=1,Lq=24,Lk=24", "--repeat", "1", "-q"]) == 0
    labels = _table(capsys.readouterr().out)
    default, rows = seen["rows"]
    rows = [default] + rows
    assert len(labels) == len(rows)
    fields = [dict(p.split("=", 1) for p in text.split() if "=" in p) for text in labels]
    planned = [(f, r[4]) for f, r in zip(fields, rows) if r[4] is not None]
    assert len({tuple(sorted(f)) for f, _ in planned}) == 1, labels  # the same fields on every row
    assert "workgroup" in planned[0][0] and "q" in planned[0][0]
    for i, (fa, sa) in enumerate(planned):
        for fb, sb in planned[i + 1:]:
            assert (fa == fb) == (sa == sb), (fa, sa, sb)  # other plans, other labels; one plan, one label


def test_plans_whose_fields_agree_are_told_apart_by_their_summaries():
    fields = {"q": 16, "kv": 16}
    rows = [(None, "ok", 1.0, 0.0, "tile q=16 kv=16, workgroup 64 (a, b), x", fields),
            ({"tile_q": 16}, "ok", 1.0, 0.0, "tile q=16 kv=16, workgroup 64 (a, b), y", fields),
            ({"tile_q": 8, "tile_kv": 16, "options": {}}, "refused: too big", None, None, None, None)]
    labels = tune.plan_labels(rows)
    assert labels[0] != labels[1] and labels[0].endswith("(x)") and labels[1].endswith("(y)")
    assert labels[2] == "q=8 kv=16"  # no plan: the choice
