"""The Hopper family's hot loop runs on Hopper's warpgroup tensor cores: the SASS of every
example's default sm_90a plan (NVRTC's cubin, disassembled by nvdisasm from NVIDIA's
`nvidia-cuda-nvdisasm` wheel, which the test extra installs) has HGMMA inside a loop and no
HMMA (the mma.sync instruction), in every entry point of the family (head dims above 256 send
launches with per-sequence lengths to an mma.sync entry point). No GPU needed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile

import pytest

import attngen
from attngen.api import emit_plan
from attngen.backends.cuda import nvrtc

from conftest import example_specs, nvrtc_compile


def _nvdisasm():
    try:
        import nvidia  # the namespace package of NVIDIA's wheels
    except ImportError:
        nvidia = None
    for root in list(getattr(nvidia, "__path__", [])):
        path = os.path.join(root, "cu13", "bin", "nvdisasm")
        if os.path.exists(path):
            return path
    return shutil.which("nvdisasm")


NVDISASM = _nvdisasm()
pytestmark = pytest.mark.skipif(not nvrtc.available() or NVDISASM is None,
                                reason="needs NVRTC and nvdisasm (pip install -e '.[test]')")

CASES = [(f, s) for f, s in example_specs() if attngen.lower(s, "cuda", "cuda-sm90").config.math == "wgmma"]


def loops(sass: str) -> dict:
    """{function: [the instructions of each loop]}: a loop is the code from a label back to a
    branch that jumps to it."""
    out = {}
    for name, body in re.findall(r"\.text\.(\w+):\n(.*?)(?=\n\s*\.section|\Z)", sass, re.S):
        lines = body.splitlines()
        labels = {}
        found = []
        for i, line in enumerate(lines):
            m = re.match(r"\s*(\.L_x_\d+):", line)
            if m:
                labels[m.group(1)] = i
            m = re.search(r"\bBRA\b.*?(\.L_x_\d+)", line)
            if m and m.group(1) in labels:
                found.append(lines[labels[m.group(1)]:i + 1])
        out[name] = found
    return out


def test_the_loop_finder_reads_nvdisasm():
    sass = (".text.k:\n        /*0000*/ MOV R1, c[0x0][0x28] ;\n.L_x_1:\n        /*0010*/ HGMMA.64x128x16.F32 R24, gdesc[UR4], RZ ;\n"
            "        /*0020*/ @P0 BRA `(.L_x_1) ;\n        /*0030*/ EXIT ;\n")
    (loop,) = loops(sass)["k"]
    assert any("HGMMA" in line for line in loop)


@pytest.mark.parametrize("case", CASES, ids=[s.name for _, s in CASES])
def test_hgmma_in_the_hot_loop(case):
    _, spec = case
    plan = attngen.lower(spec, "cuda", "cuda-sm90")
    cubin, _ = nvrtc_compile(emit_plan(plan).source, plan.details.arch)  # (one compile per source for the suite)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        sass = subprocess.run([NVDISASM, "-c", path], capture_output=True, text=True, timeout=300, check=True).stdout
    found = loops(sass)
    # (attngen_report_*: the empty kernel that nvrtc_compile's report adds)
    entries = [name for name in found if name.startswith("attngen_") and not name.endswith("_combine")
               and not name.startswith("attngen_report_")]
    if plan.config.varlen is not None and plan.config.varlen.math != "wgmma":
        # head dims above 256: launches with per-sequence lengths take the mma.sync family's
        # chunked path (the plan says so: test_head_dims.py); the main entry is the Hopper kernel
        entries = [name for name in entries if not name.endswith("_varlen")]
    assert entries, sass[:2000]
    for name in entries:
        body = sass.split(f".text.{name}:", 1)[1]
        assert "HMMA" not in body.split(".section", 1)[0], f"{name}: mma.sync (HMMA) in the Hopper family"
        assert any(any("HGMMA" in line for line in loop) for loop in found[name]), f"{name}: no HGMMA in a loop"
