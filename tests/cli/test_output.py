"""Where `attngen build` writes: `-o` rules and write errors (a full disk, a closed pipe, no
permission, a FIFO, a directory): one line `error: ...`, exit 1, never a traceback, never a hang."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys

import pytest

from attngen.cli import main

from conftest import ROOT

LLAMA = os.path.join(ROOT, "examples", "llama3_8b.attn")


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def attngen(*argv, stdout=subprocess.PIPE, timeout=60):
    """`python -m attngen ARGV` in a child process: (exit code, stdout or None, stderr)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, "-m", "attngen", *argv], stdout=stdout, stderr=subprocess.PIPE,
                       text=True, cwd=ROOT, env=env, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err and "internal error" not in err and "Exception ignored" not in err
    return lines[0]


# ---- standard output ----------------------------------------------------------------------------

@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
@pytest.mark.parametrize("argv", [["build", LLAMA, "--target", "cuda"], ["check", LLAMA]], ids=["build", "check"])
def test_stdout_on_a_full_disk(argv):
    with open("/dev/full", "w") as full:
        code, _, err = attngen(*argv, stdout=full)
    line = one_error_line(err)
    assert code == 1 and "standard output" in line and "No space left on device" in line


@pytest.mark.skipif(os.name != "posix", reason="POSIX pipes")
@pytest.mark.parametrize("argv", [["build", LLAMA, "--target", "cuda"], ["check", LLAMA]], ids=["build", "check"])
def test_stdout_to_a_closed_pipe(argv):
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody reads: every write fails with EPIPE
    try:
        code, _, err = attngen(*argv, stdout=write_end)
    finally:
        os.close(write_end)
    line = one_error_line(err)
    assert code == 1 and "standard output" in line and "Broken pipe" in line


# ---- -o PATH ------------------------------------------------------------------------------------

@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_output_file_on_a_full_disk(capsys):
    code, out, err = run(capsys, "build", LLAMA, "--target", "cuda", "-o", "/dev/full")
    assert code == 1 and out == ""
    assert one_error_line(err) == "error: cannot write /dev/full: No space left on device"


def test_output_path_is_a_directory(capsys, tmp_path):
    code, _, err = run(capsys, "build", LLAMA, "--target", "cuda", "-o", str(tmp_path))
    line = one_error_line(err)
    assert code == 1 and line.startswith(f"error: cannot write {tmp_path}: ") and "directory" in line


def test_output_in_a_missing_directory(capsys, tmp_path):
    path = tmp_path / "no" / "k.cu"
    code, _, err = run(capsys, "build", LLAMA, "--target", "cuda", "-o", str(path))
    assert code == 1 and one_error_line(err) == f"error: cannot write {path}: No such file or directory"


@pytest.fixture
def read_only_file(tmp_path):
    """A file nobody may write: mode 444, or for root (who ignores modes) the immutable flag."""
    path = tmp_path / "k.cu"
    path.write_text("old\n")
    if os.geteuid() != 0:
        path.chmod(0o444)
        yield path
        return
    if not shutil.which("chattr") or subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode:
        pytest.skip("running as root without chattr +i: no file is read-only")
    try:
        yield path
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_output_file_without_permission(capsys, read_only_file):
    code, _, err = run(capsys, "build", LLAMA, "--target", "cuda", "-o", str(read_only_file))
    line = one_error_line(err)
    assert code == 1 and line.startswith(f"error: cannot write {read_only_file}: ")
    assert read_only_file.read_text() == "old\n"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_output_is_a_fifo_no_hang(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    code, out, err = attngen("build", LLAMA, "--target", "cuda", "-o", str(fifo), timeout=30)
    line = one_error_line(err)
    assert code == 1 and str(fifo) in line and "FIFO" in line and out == ""
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_output_empty_path_is_a_usage_error(capsys):
    code, out, err = run(capsys, "build", LLAMA, "--target", "cuda", "-o", "")
    assert code == 2 and out == "" and "-o" in err and "empty" in err


def test_output_dash_is_standard_output(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(capsys, "build", LLAMA, "--target", "cuda", "-o", "-")
    assert code == 0 and 'extern "C" __global__' in out
    assert os.listdir(tmp_path) == [], "no file named '-'"
    code, out, _ = run(capsys, "build", LLAMA, "--target", "cuda", "-o", "./-")
    assert code == 0 and out == "" and os.listdir(tmp_path) == ["-"]


def test_output_to_dev_null(capsys):
    code, out, err = run(capsys, "build", LLAMA, "--target", "wgsl", "-o", os.devnull)
    assert code == 0 and out == "" and err == ""
