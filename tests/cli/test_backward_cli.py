"""The backward on the command line (issue 41, docs/backward.md): `attngen check` prints its plan
under the forward's, `attngen build --emit backward` writes its source, and a spec without one
says why."""

from __future__ import annotations

import os

import pytest

from attngen.cli import main

from conftest import ROOT

LLAMA = os.path.join(ROOT, "examples", "llama3_8b.attn")
PAGED = os.path.join(ROOT, "examples", "llama3_8b_decode.attn")


@pytest.mark.parametrize("target", ["cuda", "wgsl"])
def test_check_shows_the_backward_plan(capsys, target):
    assert main(["check", LLAMA, "--target", target]) == 0
    out = capsys.readouterr().out
    all_lines = [ln.strip() for ln in out.splitlines()]
    start = next(i for i, ln in enumerate(all_lines) if ln.startswith("backward:"))
    end = next(i for i, ln in enumerate(all_lines) if i > start and ln.startswith("tiles:"))
    lines = all_lines[start:end]
    first = {"cuda": "fast: tensor cores (mma.sync", "wgsl": "deterministic (no atomics"}[target]  # (cuda-sm80's)
    assert lines[0].startswith(f"backward: 3 entry points, {first}")
    assert not any(ln.startswith("backward: backward") for ln in lines)
    assert any("_dkdv" in ln for ln in lines) and any("_dq" in ln for ln in lines)
    assert any("workspace" in ln for ln in lines)


@pytest.mark.parametrize("target, marker", [("cuda", "__global__"), ("wgsl", "@compute")])
def test_build_emits_the_backward_source(capsys, target, marker):
    assert main(["build", LLAMA, "--target", target, "--emit", "backward"]) == 0
    src = capsys.readouterr().out
    assert marker in src and "preprocess" in src and "dK and dV" in src and "dQ" in src


def test_a_paged_spec_has_no_backward_and_says_why(capsys):
    assert main(["check", PAGED, "--target", "wgsl", "--kernel", "llama3_8b_decode"]) == 0
    assert "backward: none (a paged KV cache is an inference cache" in capsys.readouterr().out
    assert main(["build", PAGED, "--target", "cuda", "--kernel", "llama3_8b_decode", "--emit", "backward"]) == 2
    err = capsys.readouterr().err
    assert "has no backward" in err and "paged" in err and "Traceback" not in err
