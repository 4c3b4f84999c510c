"""(issue 40, first-hour frictions) `attngen run` and `attngen check` say which profile they plan
with and why (run: the device's; check: the target's default unless --profile), and run says
what it made up for the inputs a spec needs beyond q, k and v (a custom mask, a paged cache)."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

from attngen.cli import main
from attngen.harness import runner

from conftest import ROOT, spec_of

VIT = os.path.join(ROOT, "examples", "vit_b16.attn")


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


@pytest.fixture
def wgsl():
    from conftest import wgsl_available
    if not wgsl_available():
        pytest.skip("no wgpu adapter")


def test_check_says_which_profile_it_plans_with_and_why(capsys):
    code, out, _ = run(capsys, "check", VIT, "--target", "wgsl")
    assert code == 0
    assert ("    profile: webgpu-core (the target's default: no --profile given; attngen run picks this machine's "
            "device's)") in out.splitlines()
    code, out, _ = run(capsys, "check", VIT, "--target", "cuda", "--profile", "cuda-sm90")
    assert code == 0 and "    profile: cuda-sm90 (--profile cuda-sm90; attngen run picks" in out
    code, out, _ = run(capsys, "check", VIT, "--profile", "all")
    assert code == 0 and out.count("    profile: ") == out.count(": ok") and "(--profile all;" in out


def test_run_says_which_profile_it_compiled_with_and_why(capsys, wgsl, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path / "cache"))  # no tuned result
    code, out, _ = run(capsys, "run", VIT, "--target", "wgsl", "--shape", "B=1,Lq=8,Lk=8", "--repeat", "1", "-q")
    assert code == 0
    lines = out.splitlines()
    profile = re.search(r"^vit_b16 on wgsl \((.*)\): tile", lines[0]).group(1)
    assert lines[1] == (f"profile: {profile} (this machine's device's, as no --profile was given; attngen check "
                        "plans with the target's default, webgpu-core, unless given --profile)")
    code, out, _ = run(capsys, "run", VIT, "--target", "wgsl", "--profile", "webgpu-core", "--shape", "B=1,Lq=8,Lk=8",
                       "--repeat", "1", "-q")
    assert code == 0 and out.splitlines()[1].endswith("(--profile webgpu-core)")


def _made_up(out: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln.startswith("made up")]


def test_run_says_what_it_made_up_for_a_custom_mask(capsys, wgsl, tmp_path):
    path = tmp_path / "m.attn"
    path.write_text("attention m {\n head_dim 32\n heads q=2 kv=2\n dtype f32\n mask custom\n}\n")
    code, out, _ = run(capsys, "run", str(path), "--target", "wgsl", "--shape", "B=2,Lq=40,Lk=64", "--repeat", "1",
                       "-q", "--seed", "3")
    assert code == 0
    qkv, mask = _made_up(out)
    assert qkv.startswith("made up: q, k, v: standard normal (seed 3), stored as f32; 2 batch entries, each one "
                          "sequence of 40 queries and 64 keys (no cu_seqlens, no kv_lens)")
    assert mask.startswith("made up: mask: random boolean (B, 1, Lq, Lk), one per batch entry for every head: 3 "
                           "documents on the diagonal")
    # what it says is what was drawn: the share of pairs kept
    said = int(re.search(r"about (\d+)% of the pairs kept", mask).group(1))
    spec = spec_of("head_dim 32\n heads q=2 kv=2\n dtype f32\n mask custom")
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, n, 2, 32), dtype=np.float32) for n in (40, 64, 64))
    drawn = runner.runtime_inputs(spec, q, k, v, rng)[2]["mask"]
    assert abs(100 * drawn.mean() - said) <= 4, (drawn.mean(), said)
    # every document's block on the diagonal: 14 x 22 + 13 x 21 + 13 x 21 of 40 x 64, 0.9 kept
    assert said == round(100 * 0.9 * (14 * 22 + 13 * 21 + 13 * 21) / (40 * 64))


def test_run_says_what_it_made_up_for_a_paged_cache(capsys, wgsl, tmp_path):
    path = tmp_path / "p.attn"
    path.write_text("attention p {\n head_dim 32\n heads q=2 kv=1\n dtype f32\n kv_cache paged(page=16)\n}\n")
    code, out, _ = run(capsys, "run", str(path), "--target", "wgsl", "--shape", "B=2,Lq=1,Lk=40",
                       "--shape", "B=1,Lq=1,Lk=16", "--repeat", "1", "-q")
    assert code == 0
    lines = _made_up(out)
    assert ("made up for shape 1: block_table: 3 page(s) of 16 keys per sequence, drawn at random without repeats "
            "from a cache of 7 pages (one unused, random values), so pages are shuffled; kv_lens = 40 for every "
            "sequence") in lines
    assert any(ln.startswith("made up for shape 2: block_table: 1 page(s) of 16 keys per sequence") and
               "a cache of 2 pages" in ln and "kv_lens = 16 " in ln for ln in lines)
    assert any("(no cu_seqlens)" in ln for ln in lines) and not any("no kv_lens" in ln for ln in lines)
    spec = spec_of("head_dim 32\n heads q=2 kv=1\n dtype f32\n kv_cache paged(page=16)")
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, n, h, 32), dtype=np.float32) for n, h in ((1, 2), (40, 1), (40, 1)))
    kc, _, opts = runner.runtime_inputs(spec, q, k, v, rng)
    assert kc.shape[0] == 7 and opts["block_table"].shape == (2, 3) and list(opts["kv_lens"]) == [40, 40]
    assert len(set(opts["block_table"].ravel().tolist())) == 6


def test_a_plain_spec_makes_up_q_k_and_v_only():
    spec = spec_of("head_dim 32\n dtype f16")
    (line,) = runner.made_up(spec, {"B": 1, "Lq": 8, "Lk": 8, "Hq": 8, "Hkv": 8}, 0)
    assert line.startswith("q, k, v: standard normal (seed 0), stored as f16; 1 batch entry, each")


def test_run_says_when_it_took_a_tuned_result(capsys, wgsl, monkeypatch):
    """The other reason run's plan differs from check's: a stored `attngen tune` result."""
    from attngen.harness import tune
    choice = {"tile_q": 8, "tile_kv": 16, "options": {"workgroup": 16}}
    monkeypatch.setattr(tune, "lookup", lambda backend, spec: {"choice": choice, "shape_class": "prefill Lk<=512",
                                                              "date": "2026-11-27", "device": "d"})
    code, out, _ = run(capsys, "run", VIT, "--target", "wgsl", "--shape", "B=1,Lq=8,Lk=8", "--repeat", "1", "-q")
    assert code == 0 and out.splitlines()[0].startswith("vit_b16 on wgsl (") and "tile q=8 kv=16, workgroup 16" in out
    assert ("tiles: q=8 kv=16 workgroup=16, attngen tune's result for this device (prefill Lk<=512, 2026-11-27); "
            "attngen check shows the profile's defaults") in out.splitlines()
