"""attngen serve-demo: a folder with the kernel, its manifest, the web runtime and the demo page,
served on localhost (the page itself runs in tests/browser)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

import pytest

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


def _serve(tmp_path):
    """serve-demo on 127.0.0.1, any free port; (process, base URL). The caller stops it."""
    proc = subprocess.Popen([sys.executable, "-m", "attngen", "serve-demo", LLAMA, "--target", "wgsl", "--port", "0",
                             "--dir", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))})
    try:
        proc.stdout.readline()  # wrote ...
        line = proc.stdout.readline()
        assert line.startswith("serving on http://127.0.0.1:"), line
    except BaseException:
        proc.kill()
        proc.wait(timeout=30)
        raise
    return proc, line.split()[2]


def test_it_serves_the_folder(tmp_path):
    proc, url = _serve(tmp_path)
    try:
        page = urllib.request.urlopen(url + "index.html", timeout=30).read().decode()
        assert 'import { loadKernel } from "./attngen.js";' in page
        assert json.loads(urllib.request.urlopen(url + "kernel.wgsl.json", timeout=30).read())["target"] == "wgsl"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _raw(port: int, request: bytes) -> bytes:
    import socket
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(request)
        chunks = []
        while True:
            data = s.recv(65536)
            if not data:
                return b"".join(chunks)
            chunks.append(data)


def test_a_nul_byte_in_the_path_is_a_bad_request_without_a_traceback(tmp_path):
    proc, url = _serve(tmp_path)
    port = int(url.rstrip("/").rsplit(":", 1)[1])
    try:
        for path in (b"/%00", b"/index.html%00.txt", b"/a\0b"):
            answer = _raw(port, b"GET " + path + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert answer.split(b"\r\n", 1)[0].split()[1] in (b"400", b"404"), (path, answer[:200])
        # the server still serves
        assert b"loadKernel" in urllib.request.urlopen(url + "index.html", timeout=30).read()
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "Traceback" not in err, err


def test_ctrl_c_exits_130(tmp_path):
    import signal
    proc, _ = _serve(tmp_path)
    try:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted" in err


@pytest.mark.parametrize("port", ["70000", "-1", "65536"])
def test_a_port_out_of_range_is_a_usage_error_before_anything_is_written(tmp_path, capsys, port):
    out = tmp_path / "d"
    assert main(["serve-demo", LLAMA, "--target", "wgsl", "--dir", str(out), "--port", port]) == 2
    err = capsys.readouterr().err
    assert "--port" in err and "65535" in err and "internal error" not in err
    assert not out.exists()
