"""Options anywhere on the line (--debug), and --shape checked against the spec's heads."""

from __future__ import annotations

import os

import pytest

from attngen.cli import main
from attngen.errors import LaunchError

from conftest import ROOT

LLAMA = os.path.join(ROOT, "examples", "llama3_8b.attn")
VIT = os.path.join(ROOT, "examples", "vit_b16.attn")


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


@pytest.mark.parametrize("argv", [
    ["--debug", "build", LLAMA, "--target", "cuda"],
    ["build", "--debug", LLAMA, "--target", "cuda"],
    ["build", LLAMA, "--target", "cuda", "--debug"],
    ["check", LLAMA, "--debug", "--target", "wgsl"],
])
def test_debug_anywhere_on_the_line(capsys, argv):
    code, out, _ = run(capsys, *argv)
    assert code == 0 and out


def test_debug_after_the_command_shows_the_traceback():
    from conftest import cuda_available
    if cuda_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(LaunchError):
        main(["run", LLAMA, "--target", "cuda", "--shape", "B=1,Lq=8,Lk=8", "--debug"])


@pytest.mark.parametrize("shape", ["B=1,Lq=8,Lk=8,Hq=8,Hkv=2", "Hq=8", "Hkv=2", "hq=64,hkv=16"])
def test_shape_heads_must_match_the_spec(capsys, shape):
    code, _, err = run(capsys, "run", LLAMA, "--target", "cuda", "--shape", shape)
    assert code == 2, err
    assert "heads q=32 kv=8" in err and "llama3_8b_prefill" in err


def test_shape_heads_equal_to_the_spec_are_fine(capsys):
    from conftest import wgsl_available
    if not wgsl_available():
        pytest.skip("no wgpu adapter")
    code, out, _ = run(capsys, "run", VIT, "--target", "wgsl", "--shape", "B=1,Lq=8,Lk=8,Hq=12,Hkv=12",
                       "--repeat", "1")
    assert code == 0 and " ok" in out


def test_shape_heads_any_when_the_spec_leaves_them_open(capsys, tmp_path):
    path = tmp_path / "x.attn"
    path.write_text("attention x {\n    head_dim 64\n    dtype f32\n}\n")
    code, _, err = run(capsys, "run", str(path), "--target", "cuda", "--shape", "Hq=6,Hkv=4")
    assert code == 2 and "--shape Hq=6 is not a multiple of Hkv=4" in err


@pytest.mark.parametrize("target", ["WGSL", "Wgsl", "CUDA"])
def test_target_names_are_case_insensitive(capsys, target):
    assert main(["build", os.path.join(ROOT, "examples", "vit_b16.attn"), "--target", target]) == 0
    assert capsys.readouterr().out.strip()


@pytest.mark.parametrize("argv", [
    ["build", VIT, "--target", "wgls"],
    ["check", VIT, "--target", "wgls"],
    ["run", VIT, "--target", "wgls"],
    ["tune", VIT, "--target", "wgls"],
    ["precompile", VIT, "--target", "wgls"],
])
def test_an_unknown_target_is_one_line_with_a_did_you_mean(capsys, argv):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.strip().splitlines() == ["error: unknown target 'wgls' for --target: did you mean 'wgsl'? "
                                        "(targets: cuda, wgsl)"], err
    code, _, err = run(capsys, "build", VIT, "--target", "metal")
    assert code == 2 and err.strip().splitlines() == ["error: unknown target 'metal' for --target (targets: cuda, "
                                                      "wgsl)"], err
