"""ATTNGEN_WGSL_RECORD and scripts/tint_check.py: the runtime leaves a copy of each WGSL module it
compiles, and the script compiles such copies with Tint (Dawn's null backend). The test command
runs its first pass recording and the script after it (scripts/test.sh), so these check the two
halves of that step: what is recorded is what was compiled, and a module Tint rejects fails the
step with its file named."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import attngen
from attngen.backends.wgsl import devices

from conftest import ROOT, require, spec_of

pytestmark = pytest.mark.wgsl
SCRIPT = os.path.join(ROOT, "scripts", "tint_check.py")


def _tint_check(*dirs):
    return subprocess.run([sys.executable, SCRIPT, *map(str, dirs)], capture_output=True, text=True, timeout=300)


def test_the_runtime_records_the_modules_it_compiles(tmp_path, monkeypatch):
    require("wgsl")
    monkeypatch.setenv("ATTNGEN_WGSL_RECORD", str(tmp_path))
    # (a name of its own: a spec another test compiled is in the process's pipeline cache)
    spec = spec_of("head_dim 16\n dtype f32\n mask causal\n schedule split_kv(2)", name="tint_record_probe")
    kernel = attngen.compile(spec, target="wgsl")
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 5, 4, 16)).astype(np.float32) for _ in range(3))
    kernel(q, k, v)
    files = sorted(os.listdir(tmp_path))
    texts = [open(tmp_path / f).read() for f in files]
    assert kernel.source in texts, files
    devices.record_source(kernel.source)  # the same text again: no second file
    assert sorted(os.listdir(tmp_path)) == files


def test_tint_check_compiles_recorded_modules_and_names_one_it_rejects(tmp_path):
    pytest.importorskip("wgpudawn", reason="scripts/tint_check.py needs Dawn for Python (the test extra)")
    good = attngen.compile(spec_of("head_dim 16\n dtype f32\n mask causal"), target="wgsl").source
    (tmp_path / "good.wgsl").write_text(good)
    run = _tint_check(tmp_path)
    assert run.returncode == 0, run.stderr
    assert "1 WGSL modules" in run.stdout and "all compiled with Tint" in run.stdout
    # a barrier in control flow that depends on the invocation's index: Tint's uniformity analysis
    # refuses it
    bad = good.replace("workgroupBarrier();", "if (lid > 3u) { workgroupBarrier(); }", 1)
    assert bad != good
    (tmp_path / "bad.wgsl").write_text(bad)
    run = _tint_check(tmp_path)
    assert run.returncode == 1
    assert "bad.wgsl" in run.stderr and "good.wgsl" not in run.stderr, run.stderr
    assert "1 failed" in run.stdout


def test_tint_check_fails_where_nothing_was_recorded(tmp_path):
    run = _tint_check(tmp_path)
    assert run.returncode == 1 and "no *.wgsl" in run.stderr


def test_every_pattern_of_the_dawn_pass_names_a_test():
    """TINT_PASS_SAMPLED / TINT_PASS_SAMPLE / TINT_PASS_EXCEPT (tests/conftest.py) name tests by id: a
    test renamed or a parameter changed would leave a pattern matching nothing, and the Dawn pass
    would drop its sample without a word. Every pattern matches a test of the pass's collection."""
    import conftest
    run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "tests/backends/wgsl", "tests/equivalence", "tests/cli", "tests/fuzz", "-k", "wgsl"],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    ids = [line for line in run.stdout.splitlines() if "::" in line]
    assert len(ids) > 500, run.stdout[-2000:] + run.stderr[-2000:]
    unmatched = [p for p in conftest.TINT_PASS_SAMPLED + conftest.TINT_PASS_SAMPLE + conftest.TINT_PASS_EXCEPT
                 if not any(conftest._matches(i, [p]) for i in ids)]
    assert not unmatched, unmatched
