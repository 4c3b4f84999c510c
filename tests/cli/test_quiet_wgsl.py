"""A WGSL run prints nothing of the Vulkan stack's: libwayland-client, called by Mesa's
device-selection layer, complained "XDG_RUNTIME_DIR is invalid or not set" twice per run when
the variable was unset or not an absolute path (attngen/backends/wgsl/devices.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import ROOT

VIT = os.path.join(ROOT, "examples", "vit_b16.attn")


@pytest.mark.parametrize("value", [None, "", "relative/dir", "/nonexistent/attngen-xdg"])
def test_no_xdg_runtime_dir_complaint(value):
    from conftest import wgsl_available
    if not wgsl_available():
        pytest.skip("no wgpu adapter")
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    if value is not None:
        env["XDG_RUNTIME_DIR"] = value
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    r = subprocess.run([sys.executable, "-m", "attngen", "run", VIT, "--target", "wgsl",
                        "--shape", "B=1,Lq=8,Lk=8"], capture_output=True, text=True, cwd=ROOT, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "XDG_RUNTIME_DIR" not in r.stderr, r.stderr
