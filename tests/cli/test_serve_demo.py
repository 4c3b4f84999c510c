"""attngen serve-demo: a folder with the kernel, its manifest, the web runtime and the demo page,
served on localhost (the page itself runs in tests/browser)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

from attngen.cli import main

from conftest import ROOT

LLAMA = os.path.join(ROOT, "examples", "llama3_8b.attn")


def test_the_folder(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["serve-demo", LLAMA, "--target", "wgsl", "--dir", str(out), "--no-serve"]) == 0
    assert sorted(os.listdir(out)) == ["attngen.js", "index.html", "kernel.wgsl", "kernel.wgsl.json"]
    manifest = json.loads((out / "kernel.wgsl.json").read_text())
    assert manifest["kernel"] == "llama3_8b_prefill" and manifest["profile"] == "webgpu-core"
    assert (out / "attngen.js").read_text() == open(os.path.join(ROOT, "examples", "web", "attngen.js")).read()
    assert f"to {out}" in capsys.readouterr().out


def test_a_target_without_a_web_runtime_is_a_usage_error(capsys):
    assert main(["serve-demo", LLAMA, "--target", "cuda", "--no-serve"]) == 2
    assert "target cuda has no web demo" in capsys.readouterr().err


def test_a_bad_spec_writes_nothing(tmp_path, capsys):
    bad = tmp_path / "bad.attn"
    bad.write_text("attention b {\n head_dim 64\n dtype bf16\n}\n")
    assert main(["serve-demo", str(bad), "--target", "wgsl", "--dir", str(tmp_path / "d"), "--no-serve"]) == 1
    assert "bf16" in capsys.readouterr().err and not (tmp_path / "d").exists()


def test_it_serves_the_folder(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "attngen", "serve-demo", LLAMA, "--target", "wgsl", "--port", "0",
                             "--dir", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))})
    try:
        proc.stdout.readline()  # wrote ...
        line = proc.stdout.readline()
        assert line.startswith("serving on http://127.0.0.1:"), line + proc.stderr.read()
        url = line.split()[2]
        page = urllib.request.urlopen(url + "index.html", timeout=30).read().decode()
        assert 'import { loadKernel } from "./attngen.js";' in page
        assert json.loads(urllib.request.urlopen(url + "kernel.wgsl.json", timeout=30).read())["target"] == "wgsl"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
