"""The default plan of every example spec compiles without register spills in a loop for sm_80
and sm_90: ptxas's own report, for every entry point of each source, through NVRTC (the pip
wheel the `gpu` extra installs) and through nvcc where one is on PATH (the toolkit a GPU machine
has; ptxas versions allocate registers differently near the 255 limit, so both are held to it).
(Spills are local memory traffic in the inner loop; the tile defaults and the varlen entry point
are chosen so that there are none: benchmarks/NOTES.md, issue 10.) Where ptxas reports a spill,
the SASS (nvdisasm) must show every spill instruction outside every loop: a value stored once
before the main loop and loaded once after it costs a few bytes per block, not per tile (ptxas
13.0 and 13.5 differ in such spills near 255 registers: benchmarks/NOTES.md, 2026-11-26, sixth
session)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

import pytest

import attngen
from attngen.api import emit_plan
from attngen.backends.cuda import nvrtc

from conftest import example_specs, nvrtc_compile
from test_sass import NVDISASM, loops

pytestmark = pytest.mark.skipif(not nvrtc.available(), reason="NVRTC not installed (pip install -e '.[test]')")

CASES = [(f, s, p) for f, s in example_specs() for p in ("cuda-sm80", "cuda-sm90")]
COMPILERS = ["nvrtc", "nvcc"]


def ptxas_report(compiler, source, arch):
    """(cubin, ptxas's report)."""
    if compiler == "nvrtc":
        return nvrtc_compile(source, arch)  # (one compile per source for the whole suite)
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc on PATH (NVRTC's report is checked by the nvrtc cases)")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cu")
        with open(path, "w") as f:
            f.write(source)
        # the -gencode form: nvcc's -arch=sm_90a shorthand also runs a plain sm_90 pass, which
        # rejects wgmma
        target = f"-gencode=arch=compute_{arch.removeprefix('sm_')},code={arch}"
        run = subprocess.run([nvcc, "-cubin", *nvrtc.OPTIONS, target, "-Xptxas", "-v",
                              "-o", os.path.join(tmp, "kernel.cubin"), path], capture_output=True, text=True,
                             timeout=600)
        assert run.returncode == 0, run.stderr
        with open(os.path.join(tmp, "kernel.cubin"), "rb") as f:
            return f.read(), run.stderr


def spills_in_loops(cubin: bytes) -> dict:
    """{function: the spill instructions (nvdisasm marks them SpillRefill) inside a loop}."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        sass = subprocess.run([NVDISASM, "-c", path], capture_output=True, text=True, timeout=300, check=True).stdout
    out = {}
    for name, found in loops(sass).items():
        inside = sorted({line.strip() for loop in found for line in loop if "SpillRefill" in line})
        if inside:
            out[name] = inside
    return out


@pytest.mark.parametrize("compiler", COMPILERS)
@pytest.mark.parametrize("case", CASES, ids=[f"{s.name}-{p}" for _, s, p in CASES])
def test_default_plan_does_not_spill(case, compiler):
    _, spec, profile = case
    plan = attngen.lower(spec, "cuda", profile)
    cubin, log = ptxas_report(compiler, emit_plan(plan).source, plan.details.arch)
    # no compiler warning either: the front end of nvcc 13.0 (the GPU machine's NVRTC) warns where
    # NVRTC 13.5 does not (a constexpr declared and not used: 2026-11-27, third session)
    assert not [line for line in log.splitlines() if "warning #" in line], log
    usage = nvrtc.resource_usage(log)
    assert usage, log
    spilling = {name: u for name, u in usage.items() if u[1] or u[2]}
    if not spilling:
        return
    where = f"{spec.name} on {profile} ({compiler}): (registers, spill stores, spill loads) {spilling}"
    assert NVDISASM is not None, f"{where}, and no nvdisasm here to show that no spill is in a loop"
    in_loops = spills_in_loops(cubin)
    assert not in_loops, f"{where}, in loops: {in_loops}"


def test_spills_in_loops_are_found():
    sass_loops = loops(".text.k:\n        /*0000*/ STL [R1], R4 (*\"SpillRefill\"*) ;\n.L_x_1:\n"
                       "        /*0010*/ LDL R4, [R1] (*\"SpillRefill\"*) ;\n        /*0020*/ @P0 BRA `(.L_x_1) ;\n"
                       "        /*0030*/ EXIT ;\n")
    (loop,) = sass_loops["k"]
    assert [line for line in loop if "SpillRefill" in line] == ['        /*0010*/ LDL R4, [R1] (*"SpillRefill"*) ;']


def test_the_report_is_read():
    log = ("ptxas info    : Compiling entry function 'attngen_x' for 'sm_90'\n"
           "ptxas         .     8 bytes stack frame, 4 bytes spill stores, 8 bytes spill loads\n"
           "ptxas info    : Used 40 registers, used 0 barriers\n")
    assert nvrtc.resource_usage(log) == {"attngen_x": (40, 4, 8)}
