"""`attngen run`: progress as it goes, figures that mean something, warnings on one line."""

from __future__ import annotations

import os

import pytest

from attngen.cli import main

from conftest import ROOT, sigint_default

VIT = os.path.join(ROOT, "examples", "vit_b16.attn")


@pytest.fixture(autouse=True)
def _wgsl():
    from conftest import wgsl_available
    if not wgsl_available():
        pytest.skip("no wgpu adapter")


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def rows(out: str) -> list[list[str]]:
    lines = out.splitlines()
    head = next(i for i, ln in enumerate(lines) if "rel. error" in ln)
    return [ln.split() for ln in lines[head + 1:] if ln.strip() and not ln.startswith("times:")]


def test_run_prints_progress_and_meaningful_figures(capsys):
    code, out, err = run(capsys, "run", VIT, "--target", "wgsl", "--shape", "B=1,Lq=8,Lk=8",
                         "--shape", "B=1,Lq=16,Lk=24", "--repeat", "2")
    assert code == 0, err
    for step in ("compiling", "drawing inputs", "timing", "float64 reference"):
        assert step in err, f"no progress line for {step!r}:\n{err}"
    assert "shape 2/2" in err
    table = rows(out)
    assert len(table) == 2
    for row in table:
        err_text, ms, tflops, verdict = row[5], row[6], row[7], row[8]
        assert float(err_text) < 1e-5 and verdict == "ok"
        assert float(ms) > 0 and len(ms.replace(".", "").lstrip("0").split("e")[0]) >= 3, ms
        assert float(tflops) > 0, f"a tiny run shows {tflops} TFLOP/s"
    assert out.rstrip().splitlines()[-1].startswith("times: median of 2 runs after a warm-up")


def test_run_quiet_and_no_reference(capsys):
    code, out, err = run(capsys, "run", VIT, "--target", "wgsl", "--shape", "B=1,Lq=8,Lk=8", "--repeat", "1",
                         "--no-reference")
    assert code == 0 and "not checked" in out
    assert "timing" in err and "reference" not in err
    code, out, err = run(capsys, "run", VIT, "--target", "wgsl", "--shape", "B=1,Lq=8,Lk=8", "--repeat", "1",
                         "--quiet")
    assert code == 0 and err == "" and " ok" in out


def test_cache_warnings_are_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path))
    from attngen.backends.wgsl import kernel as wgsl_kernel
    monkeypatch.setattr(wgsl_kernel, "_PIPELINES", {})  # compile afresh: the records get written
    assert run(capsys, "run", VIT, "--target", "wgsl", "--shape", "B=1,Lq=8,Lk=8", "--repeat", "1")[0] == 0
    records = [p for p in tmp_path.iterdir() if p.suffix in (".wgsl", ".json")]
    assert records
    for p in records:
        p.write_bytes(p.read_bytes() + b" corrupted")
    monkeypatch.setattr(wgsl_kernel, "_PIPELINES", {})
    code, _, err = run(capsys, "run", VIT, "--target", "wgsl", "--shape", "B=1,Lq=8,Lk=8", "--repeat", "1")
    warned = [ln for ln in err.splitlines() if "attngen cache entry" in ln]
    assert code == 0 and len(warned) == len(records)
    assert all(ln.startswith("warning: attngen cache entry ") and "corrupt" in ln for ln in warned)
    assert "warnings.warn" not in err


@pytest.mark.parametrize("shape, words", [
    ("B=65536,Lq=1,Lk=1", ("batch 65536", "65535")),
    # q: 65536 rows x 12 heads x 64 columns x 4 bytes, above webgpu-core's 128 MiB binding
    ("B=1,Lq=65536,Lk=1", ("q ", "201326592 bytes", "storage binding limit")),
])
def test_a_shape_beyond_the_limits_is_refused_before_any_input_is_drawn(capsys, shape, words):
    code, out, err = run(capsys, "run", VIT, "--target", "wgsl", "--profile", "webgpu-core", "--shape", shape,
                         "--repeat", "1", "--no-reference")
    assert code == 2, err
    assert "drawing inputs" not in err and "internal error" not in err
    line = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(line) == 1 and all(w in line[0] for w in words), err
    assert "--shape" in line[0]


def test_a_bad_later_shape_is_refused_before_the_first_runs(capsys):
    code, out, err = run(capsys, "run", VIT, "--target", "wgsl", "--shape", "B=1,Lq=8,Lk=8",
                         "--shape", "B=65536,Lq=1,Lk=1", "--repeat", "1")
    assert code == 2 and "drawing inputs" not in err and "shape 2" in err


def test_ctrl_c_says_interrupted_and_exits_130():
    import signal
    import subprocess
    import sys
    import time
    proc = subprocess.Popen([sys.executable, "-m", "attngen", "run", VIT, "--target", "wgsl", "--shape",
                             "B=1,Lq=2048,Lk=2048", "--repeat", "1000"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=sigint_default,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))})
    try:
        lines = []
        for line in proc.stderr:  # wait until it is timing (a long step in the GPU runtime)
            lines.append(line)
            if "timing" in line:
                break
        time.sleep(1)
        start = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    err = "".join(lines) + err
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert took < 10, f"Ctrl-C took {took:.1f} s"
