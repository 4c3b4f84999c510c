"""The WGSL benchmark's peers and section (issue 13) at tiny shapes on the live adapter (lavapipe
here): benchmarks/suite/wgsl_peers.py's three-pass attention against the float64 reference (one group
of (batch, head) pairs and one per pair), its timing, the FMA ceiling, and run_gpu.py's
wgsl_section rows, their table (markdown) and their latest.json rows (latest)."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

import attngen
from attngen.reference import relative_error, tolerance

from conftest import ROOT, require, spec_of

BENCHMARKS = os.path.join(ROOT, "benchmarks")
for _path in (BENCHMARKS, os.path.join(BENCHMARKS, "suite")):  # run_gpu.py; wgsl_peers.py
    if _path not in sys.path:
        sys.path.append(_path)  # appended: their module names (host, variants) shadow nothing


@pytest.fixture(scope="module")
def peers():
    require("wgsl")
    import wgsl_peers
    return wgsl_peers


@pytest.mark.parametrize("seqlen,causal,dtype", [(7, False, "f32"), (33, True, "f32"), (33, False, "f16"),
                                                 (7, True, "f16")])
def test_three_pass_matches_the_reference(peers, seqlen, causal, dtype):
    from attngen.backends.wgsl import WgslTensor
    rng = np.random.default_rng(seqlen)
    shape = (2, seqlen, 3, 64)
    host = [rng.standard_normal(shape).astype(np.float16 if dtype == "f16" else np.float32) for _ in range(3)]
    dev = [WgslTensor.from_numpy(a) for a in host]
    spec = spec_of(f"head_dim 64\n dtype {dtype}\n mask {'causal' if causal else 'none'}")
    ref = attngen.reference(spec, *host)
    whole = peers.three_pass(*dev, causal=causal)  # every pair in one group
    assert whole.shape == shape and whole.dtype == np.float32
    assert relative_error(whole, ref) <= 1e-5
    # room for one (L, L) score matrix: six groups of one pair, in one submission
    peer = peers.ThreePass(*dev, causal=causal, s_budget=seqlen * seqlen * 4)
    assert peer.chunks == 6 and len(peer.passes) == 18
    peer.run()
    assert relative_error(peer.output(), ref) <= 1e-5
    ms, timing, runs = peer.time(runs=2)
    assert ms > 0 and runs == 2 and timing in (peers.GPU_TIMING, peers.WALL_TIMING)
    assert peer.flops == 4.0 * 2 * 3 * seqlen * seqlen * 64 * (0.5 if causal else 1.0)
    peer.release()


def test_three_pass_refuses_what_it_does_not_run(peers):
    from attngen.backends.wgsl import WgslTensor
    q = WgslTensor.from_numpy(np.zeros((1, 4, 1, 6), np.float32))  # head dim not a multiple of 4
    with pytest.raises(ValueError, match="multiple of 4"):
        peers.ThreePass(q, q, q)
    k = WgslTensor.from_numpy(np.zeros((1, 4, 1, 8), np.float16))
    with pytest.raises(ValueError, match="one shape"):
        peers.ThreePass(WgslTensor.from_numpy(np.zeros((1, 4, 1, 8), np.float32)), k, k)


def test_fma_ceiling(peers):
    r = peers.fma_ceiling("f32", workgroups=2, iters=16, runs=2)
    assert r["tflops"] > 0 and r["timing"] in (peers.GPU_TIMING, peers.WALL_TIMING)
    assert r["flops"] == 2.0 * 2 * 256 * 16 * peers.CHAINS * peers.STEPS * 4
    assert "fma(x7, a, b);" in peers.fma_source("f32") and "enable f16;" in peers.fma_source("f16")


def test_wgsl_section_rows_table_and_latest(peers):
    import run_gpu
    results = []
    grid = {"dims": (64,), "lengths": (7, 33), "masks": ("none", "causal"), "dtypes": ("f32",), "tokens": 231,
            "heads": 2}
    run_gpu.wgsl_section(results, grid, {"workgroups": 2, "iters": 16}, runs=2)
    (section,) = results
    rows, wmeta = section["wgsl"], section["wgsl_meta"]
    assert [r["case"] for r in rows] == ["wgsl f32 d64 L7 full", "wgsl f32 d64 L7 causal", "wgsl f32 d64 L33 full",
                                         "wgsl f32 d64 L33 causal"]
    assert wmeta["fma_ceiling_tflops"] > 0 and wmeta["tokens"] == 231 and wmeta["heads"] == 2
    for r in rows:
        assert "error" not in r and "three_pass_error" not in r, r
        assert r["B"] * r["L"] == 231 and r["checked_pairs"] == [(0, 0), (r["B"] - 1, 1)]
        assert r["rel_err_vs_reference"] <= tolerance(run_gpu.spec_for("f32", 64, r["mask"]))
        assert r["three_pass_rel_err"] <= 1e-5 and r["three_pass_groups"] == 1
        assert r["vs_three_pass"] == pytest.approx(r["tflops"] / r["three_pass_tflops"])
        assert r["tflops"] > 0 and r["ms"] > 0 and r["runs"] == 2 and r["timing"] and r["plan"]
    failed = {"case": "wgsl f16 d64 L7 full", "ms": None, "tflops": None, "error": "LaunchError: too big"}
    meta = {"date": "2026-01-01", "gpu": "adapter", "commit": "abc1234", "torch": None, "cuda": None,
            "wgsl_adapter": wmeta["adapter"], "wgsl": wmeta}
    md = run_gpu.markdown(meta, [], rows + [failed])
    assert "| case | attngen TFLOP/s | attngen ms | three-pass TFLOP/s |" in md and "SDPA" not in md
    assert all(f"| {r['case']} |" in md for r in rows) and "failed: LaunchError: too big" in md
    out = json.loads(json.dumps(run_gpu.latest(meta, [], rows + [failed], [], [])))
    assert out["wgsl"]["fma_ceiling_tflops"] == wmeta["fma_ceiling_tflops"]
    assert [r["case"] for r in out["rows"]] == [r["case"] for r in rows]  # the failed case is absent
    for got, r in zip(out["rows"], rows):
        assert got["suite"] == "wgsl" and got["target"] == "wgsl" and got["plan"] == r["plan"]
        assert got["attngen"] == {"ms": r["ms"], "tflops": r["tflops"]}
        assert got["peers"]["three_pass"]["tflops"] == r["three_pass_tflops"]
        assert got["peers"]["three_pass"]["ms"] == r["three_pass_ms"]
