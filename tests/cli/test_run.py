"""`attngen run`: progress as it goes, figures that mean something, warnings on one line."""

from __future__ import annotations

import os

import pytest

from attngen.cli import main

from conftest import ROOT

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
