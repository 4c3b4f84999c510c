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


def _sass(plan) -> str:
    cubin, _ = nvrtc_compile(emit_plan(plan).source, plan.details.arch)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        return subprocess.run([NVDISASM, "-c", path], capture_output=True, text=True, timeout=300, check=True).stdout


def test_the_quantized_decode_loop_copies_from_one_place_and_converts_upper_halves():
    """The e4m3 decode's main loop (issue 44; benchmarks/NOTES.md, sixteenth session: the kernel is
    instruction-bound): a thread's copies of a K or V tile land at one register plus constant offsets
    (load_tile: rows 16 apart share their chunk permutation), and a word's upper byte pair is
    converted from the register's upper half (kv_pair_hi: F2FP ... R.H1), with no 16-bit shift."""
    spec = attngen.parse("attention d {\n head_dim 128\n heads q=32 kv=8\n dtype f16\n kv_dtype e4m3\n"
                         " schedule split_kv(auto)\n}\n")[0]
    sass = _sass(attngen.lower(spec, "cuda", "cuda-sm90"))
    main = max(loops(sass)["attngen_d"], key=len)
    # a whole tile's 8 copies a thread (K and V): the first at [R], the others at [R + 0x800 i] (16 rows of
    # 128 bytes apart); the guarded copies of a partial last tile compute each place, as before
    offsets = [m.group(1) for line in main for m in [re.search(r"LDGSTS\S* \[R\d+\+(0x[0-9a-f]+)\]", line)] if m]
    assert sorted(set(offsets), key=lambda x: int(x, 16)) == [hex(0x800 * i) for i in range(1, 8)], offsets
    assert len(offsets) >= 14, offsets
    assert sum("UNPACK_B" in line and ".H1" in line for line in main) >= 32
    # (x >> 16 before each upper pair's conversion was 64 shifts in this loop; a bit test of a mask word remains)
    assert len([line for line in main if re.search(r"SHF\.R\.U32\.HI R\d+, RZ, 0x10,", line)]) <= 2


@pytest.mark.parametrize("kv", ["e4m3", "i8", None], ids=["e4m3", "i8", "f16"])
def test_the_decode_loops_softmax_is_one_ffma_and_one_mufu_a_score(kv):
    """The split schedules' mma.sync loops (the decode kernels, f16 and quantized caches; issue 44,
    benchmarks/NOTES.md, seventeenth session): the scale folded into the exp2 argument (fold_scale)
    and exp2 as one MUFU.EX2 (exp2_approx), as in the Hopper family: exp2f's denormal-range fix-up
    (a compare with -126, a halving and a squaring around each MUFU) is not in the loop, and full
    tiles skip the mask's selects."""
    spec = attngen.parse("attention d {\n head_dim 128\n heads q=32 kv=8\n dtype f16\n schedule split_kv(auto)\n"
                         + (f" kv_dtype {kv}\n" if kv else "") + "}\n")[0]
    plan = attngen.lower(spec, "cuda", "cuda-sm90")
    assert plan.config.math == "mma"
    main = max(loops(_sass(plan))["attngen_d"], key=len)
    assert sum("MUFU.EX2" in line for line in main) >= 16, main
    assert not [line for line in main if re.search(r"FSETP\.GEU\.AND .*-126", line)], "exp2f's fix-up in the loop"
