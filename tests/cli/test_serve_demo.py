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

from conftest import ROOT, sigint_default

LLAMA = os.path.join(ROOT, "examples", "llama3_8b.attn")


def test_the_folder(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["serve-demo", LLAMA, "--target", "wgsl", "--dir", str(out), "--no-serve"]) == 0
    assert sorted(os.listdir(out)) == ["attngen.js", "builds.json", "index.html", "kernel-matrix.wgsl",
                                       "kernel-matrix.wgsl.json", "kernel.wgsl", "kernel.wgsl.json"]
    manifest = json.loads((out / "kernel.wgsl.json").read_text())
    assert manifest["kernel"] == "llama3_8b_prefill" and manifest["profile"] == "webgpu-core"
    assert (out / "attngen.js").read_text() == open(os.path.join(ROOT, "examples", "web", "attngen.js")).read()
    assert f"to {out}" in capsys.readouterr().out


FEATURE = "chromium-experimental-subgroup-matrix"


def _builds(folder):
    listed = json.loads((folder / "builds.json").read_text())
    manifests = {b["kernel"]: json.loads((folder / (b["kernel"] + ".json")).read_text()) for b in listed["builds"]}
    return listed, manifests


def test_two_builds_the_subgroup_matrix_one_first(tmp_path):
    """Both builds of the kernel, listed in the page's order: the subgroup-matrix family's (for
    Chrome on NVIDIA: its features, the config the page looks for among the adapter's), then the
    scalar family's for webgpu-core, byte for byte what `attngen build` writes."""
    assert main(["serve-demo", LLAMA, "--target", "wgsl", "--dir", str(tmp_path), "--no-serve"]) == 0
    listed, manifests = _builds(tmp_path)
    assert [(b["kernel"], b["family"], b["profile"]) for b in listed["builds"]] == [
        ("kernel-matrix.wgsl", "subgroup-matrix", "dawn-vulkan-nvidia"), ("kernel.wgsl", "scalar", "webgpu-core")]
    assert listed["builds"][0]["config"] == "16x16x16 f16 -> f32 at subgroup size 32" and listed["not_built"] == []
    mm, sm = manifests["kernel-matrix.wgsl"], manifests["kernel.wgsl"]
    assert mm["features"] == ["shader-f16", "subgroups", FEATURE] and mm["f16_storage"] == "native"
    assert {k: mm["subgroup_matrix"][k] for k in ("m", "n", "k", "component", "result", "max_subgroup_size")} == {
        "m": 16, "n": 16, "k": 16, "component": "f16", "result": "f32", "max_subgroup_size": 32}
    assert "enable chromium_experimental_subgroup_matrix;" in (tmp_path / "kernel-matrix.wgsl").read_text()
    assert FEATURE not in sm["features"] and "subgroup_matrix" not in sm and sm["f16_storage"] == "packed"
    built = tmp_path / "built.wgsl"
    assert main(["build", LLAMA, "--target", "wgsl", "-o", str(built)]) == 0
    assert (tmp_path / "kernel.wgsl").read_text() == built.read_text()


def test_a_profile_with_subgroup_matrices_gives_both_builds_for_it(tmp_path):
    assert main(["serve-demo", LLAMA, "--target", "wgsl", "--profile", "dawn-vulkan-nvidia", "--dir", str(tmp_path),
                 "--no-serve"]) == 0
    listed, manifests = _builds(tmp_path)
    assert [b["profile"] for b in listed["builds"]] == ["dawn-vulkan-nvidia", "dawn-vulkan-nvidia"]
    assert FEATURE in manifests["kernel-matrix.wgsl"]["features"]
    assert FEATURE not in manifests["kernel.wgsl"]["features"] and "subgroup_matrix" not in manifests["kernel.wgsl"]


@pytest.mark.parametrize("change, new, why", [
    ("    dtype      f16\n", "    dtype      f32\n", "does not take storage f32"),
    ("    mask       causal\n", "    mask       causal\n    target     wgsl { matrix=off }\n",
     "the spec says target wgsl { matrix=off }"),
    ("    mask       causal\n", "    mask       causal\n    target     wgsl { f16=packed }\n", "f16=packed"),
    ("    mask       causal\n", "    mask       causal\n    schedule   split_kv(auto)\n", "schedule split_kv"),
], ids=["f32", "matrix=off", "f16=packed", "split_kv"])
def test_a_spec_the_family_does_not_serve_gets_the_scalar_build_and_the_reason(tmp_path, change, new, why):
    text = open(LLAMA).read()
    assert change in text
    (tmp_path / "s.attn").write_text(text.replace(change, new, 1))
    assert main(["serve-demo", str(tmp_path / "s.attn"), "--target", "wgsl", "--dir", str(tmp_path / "d"),
                 "--no-serve"]) == 0
    listed, _ = _builds(tmp_path / "d")
    assert [b["kernel"] for b in listed["builds"]] == ["kernel.wgsl"]
    assert not (tmp_path / "d" / "kernel-matrix.wgsl").exists()
    (gone,) = listed["not_built"]
    assert gone["family"] == "subgroup-matrix" and why in gone["why"], gone


def test_matrix_on_gives_both_builds_and_refuses_what_the_family_does_not_serve(tmp_path, capsys):
    text = open(LLAMA).read().replace("    mask       causal\n", "    mask       causal\n    target     wgsl { matrix=on }\n")
    (tmp_path / "on.attn").write_text(text)
    assert main(["serve-demo", str(tmp_path / "on.attn"), "--target", "wgsl", "--dir", str(tmp_path / "d"),
                 "--no-serve"]) == 0
    listed, manifests = _builds(tmp_path / "d")
    assert [b["family"] for b in listed["builds"]] == ["subgroup-matrix", "scalar"]
    assert "subgroup_matrix" not in manifests["kernel.wgsl"] and "matrix=off" in manifests["kernel.wgsl"]["spec"]
    (tmp_path / "bad.attn").write_text(text.replace("dtype      f16", "dtype      f32"))
    assert main(["serve-demo", str(tmp_path / "bad.attn"), "--target", "wgsl", "--dir", str(tmp_path / "e"),
                 "--no-serve"]) == 1
    assert "the subgroup-matrix family does not take storage f32" in capsys.readouterr().err
    assert not (tmp_path / "e").exists()


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
                            preexec_fn=sigint_default, env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))})
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
        assert 'from "./attngen.js";' in page and "pickKernel(adapter, manifests)" in page
        listed = json.loads(urllib.request.urlopen(url + "builds.json", timeout=30).read())
        for build in listed["builds"]:  # both manifests, and their sources
            manifest = json.loads(urllib.request.urlopen(url + build["kernel"] + ".json", timeout=30).read())
            assert manifest["target"] == "wgsl" and ("subgroup_matrix" in manifest) == (build["family"] != "scalar")
            assert "@compute" in urllib.request.urlopen(url + build["kernel"], timeout=30).read().decode()
        assert [b["family"] for b in listed["builds"]] == ["subgroup-matrix", "scalar"]
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
