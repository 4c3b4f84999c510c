"""The attngen command: outputs, exit codes (0 ok, 1 invalid spec / failed check, 2 usage),
and no traceback for any input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from attngen.cli import main

from conftest import ROOT

LLAMA = os.path.join(ROOT, "examples", "llama3_8b.attn")
GEMMA = os.path.join(ROOT, "examples", "gemma2_9b.attn")
GOOD = "attention ok {\n    head_dim 64\n    dtype f16\n}\n"


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def spec_file(tmp_path, text, name="x.attn"):
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(p)


def test_build_cuda_and_wgsl_source(capsys, tmp_path):
    code, out, _ = run(capsys, "build", LLAMA, "--target", "cuda")
    assert code == 0 and 'extern "C" __global__' in out and "attngen_llama3_8b_prefill" in out
    target = tmp_path / "k.wgsl"
    code, out, _ = run(capsys, "build", LLAMA, "--target", "wgsl", "-o", str(target))
    assert code == 0 and out == ""
    assert "@compute" in target.read_text()


def test_build_ir_round_trips(capsys, tmp_path):
    import attngen
    code, out, _ = run(capsys, "build", LLAMA, "--target", "cuda", "--emit", "ir")
    assert code == 0 and "# plan for cuda (profile cuda-sm80)" in out
    assert attngen.parse(out) == [attngen.load(LLAMA)]


def test_build_manifest_is_json(capsys):
    code, out, _ = run(capsys, "build", LLAMA, "--target", "wgsl", "--emit", "manifest")
    m = json.loads(out)
    assert code == 0 and m["entry_point"] == "attngen_llama3_8b_prefill" and m["target"] == "wgsl"
    assert [p["name"] for p in m["parameters"]][:2] == ["params", "q"]


def test_build_needs_kernel_when_several(capsys):
    code, _, err = run(capsys, "build", GEMMA, "--target", "cuda")
    assert code == 2 and "--kernel" in err and "gemma2_9b_local" in err
    code, out, _ = run(capsys, "build", GEMMA, "--target", "cuda", "--kernel", "gemma2_9b_global")
    assert code == 0 and "attngen_gemma2_9b_global" in out
    code, _, err = run(capsys, "build", GEMMA, "--target", "cuda", "--kernel", "gemma2_9b_locl")
    assert code == 2 and "did you mean 'gemma2_9b_local'" in err


def test_check_prints_the_plan(capsys):
    code, out, _ = run(capsys, "check", LLAMA)
    assert code == 0
    assert "cuda (cuda-sm80): ok" in out and "wgsl (webgpu-core): ok" in out
    assert "shared memory: 69632 bytes" in out and "f16 packed in u32 words" in out
    code, out, _ = run(capsys, "check", LLAMA, "--target", "wgsl", "--profile", "all")
    assert code == 0 and "wgpu-software" in out and "wgpu-vulkan-nvidia" in out


def test_check_says_what_an_expression_is_planned_as(capsys, tmp_path):
    """A mask expression that is a named mask, and a score that is a soft-cap, plan as those
    (attngen.plan.check.normalised): check says so, for both targets; an expression that is not
    gets no such line."""
    path = spec_file(tmp_path, "attention a {\n head_dim 64\n dtype f16\n mask k <= q + Lk - Lq\n"
                               " score 30 * tanh(s / 30)\n}\nattention b {\n head_dim 64\n dtype f16\n mask k < q\n}\n")
    code, out, _ = run(capsys, "check", path, "--kernel", "a")
    assert code == 0 and out.count("mask k <= q + Lk - Lq is planned as mask causal(bottom_right)") == 2
    assert out.count("score 30 * tanh(s / 30) is planned as softcap 30") == 2
    code, out, _ = run(capsys, "check", path, "--kernel", "b")
    assert code == 0 and "planned as" not in out


def test_check_reports_target_errors(capsys):
    code, out, err = run(capsys, "check", GEMMA, "--target", "wgsl")
    assert code == 1 and "WGSL has no bf16" in err and err.count("error:") == 2


@pytest.mark.parametrize("argv", [
    [], ["frobnicate"], ["build"], ["build", LLAMA], ["build", LLAMA, "--target", "metal"],
    ["build", "/nonexistent/x.attn", "--target", "cuda"], ["check", LLAMA, "--profile", "nope"],
    ["check", LLAMA, "--profile", "cuda-sm80"], ["build", LLAMA, "--target", "wgsl", "--profile", "cuda-sm80"],
    ["run", LLAMA, "--target", "cuda", "--shape", "B=x"], ["run", LLAMA, "--target", "cuda", "--shape", "Q=3"],
    ["run", LLAMA, "--target", "cuda", "--shape", "Lq=0"], ["run", LLAMA, "--target", "cuda", "--repeat", "0"],
    ["build", LLAMA, "--target", "cuda", "--emit", "asm"],
    # duplicate, empty and missing items (ran with the last B, or with the default shape, before)
    ["run", LLAMA, "--target", "cuda", "--shape", "Lq=4,Lk=4,B=1,B=2"], ["run", LLAMA, "--target", "cuda", "--shape", "Lq=4,,Lk=3"],
    ["run", LLAMA, "--target", "cuda", "--shape", ""], ["tune", LLAMA, "--target", "cuda", "--shape", " "],
])
def test_usage_errors_exit_2(capsys, argv):
    code, _, err = run(capsys, *argv)
    assert code == 2 and err.strip()


BAD_SPECS = {
    "misspelt key": ("attention x {\n head_dm 64\n dtype f16\n}\n", "did you mean 'head_dim'"),
    "misspelt value": ("attention x {\n head_dim 64\n dtype f16\n mask caual\n}\n", "did you mean 'causal'"),
    "missing head_dim": ("attention x {\n dtype f16\n}\n", "has no 'head_dim'"),
    "missing dtype": ("attention x {\n head_dim 64\n}\n", "has no 'dtype'"),
    "zero size": ("attention x {\n head_dim 0\n dtype f16\n}\n", "at least 8"),
    "negative size": ("attention x {\n head_dim 64\n dtype f16\n tile q=-16\n}\n", "at least 1"),
    "huge integer": ("attention x {\n head_dim 64\n dtype f16\n heads q=" + "9" * 60 + "\n}\n", "too large"),
    "duplicate key": ("attention x {\n head_dim 64\n dtype f16\n dtype f32\n}\n", "duplicate key 'dtype'"),
    "duplicate kernel": (GOOD + GOOD, "duplicate kernel name 'ok'"),
    "heads not divisible": ("attention x {\n head_dim 64\n dtype f16\n heads q=32 kv=5\n}\n", "not a multiple"),
    "tile too big": ("attention x {\n head_dim 256\n dtype f32\n tile q=128 kv=128\n}\n", "bytes of shared memory"),
    "unbalanced open": ("attention x {\n head_dim 64\n dtype f16\n", "not closed"),
    "unbalanced close": (GOOD + "}\n", "unexpected '}'"),
    "empty file": ("", "no attention kernel"),
    "binary garbage": (bytes(range(256)) * 4, "not UTF-8"),
    "nul bytes": (b"attention x {\x00}", "NUL byte"),
    "bad name": ("attention foo-bar {\n head_dim 64\n dtype f16\n}\n", "unexpected character '-'"),
    "injection": ("attention x*/ {\n head_dim 64\n dtype f16\n}\n", "unexpected character"),
    "nan scale": ("attention x {\n head_dim 64\n dtype f16\n scale nan\n}\n", "positive finite"),
    "zero scale": ("attention x {\n head_dim 64\n dtype f16\n scale 0\n}\n", "positive finite"),
    "negative softcap": ("attention x {\n head_dim 64\n dtype f16\n softcap -3.5\n}\n", "positive finite"),
    "inf softcap": ("attention x {\n head_dim 64\n dtype f16\n softcap 1e999\n}\n", "positive finite"),
    "bad tile d": ("attention x {\n head_dim 512\n dtype f16\n tile d=24\n schedule two_pass\n}\n",
                   "tile d=24 is not a multiple of 16"),
}


@pytest.mark.parametrize("case", list(BAD_SPECS), ids=str)
@pytest.mark.parametrize("command", ["check", "build"])
def test_bad_specs_exit_1_with_position(capsys, tmp_path, case, command):
    text, expected = BAD_SPECS[case]
    path = spec_file(tmp_path, text)
    argv = [command, path, "--target", "cuda"]
    code, _, err = run(capsys, *argv)
    assert code == 1, err
    assert expected in err
    assert f"{path}:" in err  # file:line:col
    assert "^" in err         # a caret under the source


def test_large_comment_file_is_fast(capsys, tmp_path):
    path = spec_file(tmp_path, "# a comment line that is not short at all\n" * 200_000 + GOOD)
    best = float("inf")
    for _ in range(3):  # best of three: CI machines are shared
        t0 = time.perf_counter()
        code, _, _ = run(capsys, "check", path, "--target", "cuda")
        best = min(best, time.perf_counter() - t0)
        assert code == 0
    assert best < 1.0


def test_build_is_fast(capsys):
    for target in ("cuda", "wgsl"):
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            assert run(capsys, "build", LLAMA, "--target", target)[0] == 0
            best = min(best, time.perf_counter() - t0)
        assert best < 1.0, f"attngen build --target {target} took {best:.2f} s"


def test_run_without_a_device_fails_cleanly(capsys):
    from conftest import cuda_available
    if cuda_available():
        pytest.skip("this machine has a GPU")
    code, _, err = run(capsys, "run", LLAMA, "--target", "cuda", "--shape", "B=1,Lq=8,Lk=8")
    assert code == 1 and "error:" in err


def test_run_wgsl_against_the_reference(capsys):
    from conftest import wgsl_available
    if not wgsl_available():
        pytest.skip("no wgpu adapter")
    path = os.path.join(ROOT, "examples", "whisper_large_v3.attn")
    code, out, _ = run(capsys, "run", path, "--target", "wgsl", "--shape", "B=1,Lq=7,Lk=150",
                       "--shape", "B=2,Lq=1,Lk=33", "--repeat", "2")
    assert code == 0 and out.count(" ok") == 2 and "rel. error" in out


def test_subprocess_has_no_traceback(tmp_path):
    path = spec_file(tmp_path, b"\xff\xfe garbage \x00")
    for argv in (["check", path], ["build", path, "--target", "wgsl"], ["--version"]):
        r = subprocess.run([sys.executable, "-m", "attngen", *argv], capture_output=True, text=True,
                           cwd=ROOT, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                               filter(None, [ROOT, os.environ.get("PYTHONPATH")]))})
        assert "Traceback" not in r.stdout + r.stderr
        assert r.returncode == (0 if argv == ["--version"] else 1), r.stderr
