"""GPU time of the WGSL kernels (issue 13, part 3): timestamp queries around the dispatches where
the adapter has them (lavapipe does), inputs resident on the device; wall time otherwise, and
the timing line says which."""

from __future__ import annotations

import time

import numpy as np
import pytest

import attngen
from attngen.backends import wgsl as wgsl_backend
from attngen.backends.wgsl.launch import gpu_timer

from conftest import require, spec_of

SPEC = "head_dim 64\n dtype f32\n mask causal\n schedule split_kv(3)"  # two entry points: attention, combine


def _inputs(spec):
    from attngen.backends.wgsl import WgslTensor
    rng = np.random.default_rng(0)
    return [WgslTensor.from_numpy(rng.standard_normal((1, 5, 4, 64)).astype(np.float32))] + [
        WgslTensor.from_numpy(rng.standard_normal((1, 300, 2, 64)).astype(np.float32)) for _ in range(2)]


def test_timestamps_measure_every_entry_point_of_a_call():
    require("wgsl")
    spec = spec_of(SPEC)
    kernel = attngen.compile(spec, target="wgsl")
    q, k, v = _inputs(spec)
    kernel(q, k, v)
    with gpu_timer(kernel) as times:
        if times is None:
            pytest.skip("this adapter has no timestamp-query")
        t0 = time.perf_counter()
        kernel(q, k, v)
        wall = (time.perf_counter() - t0) * 1e3
    assert len(times) == 1 and 0 < times[0] <= wall  # one span over both passes, within the call
    with gpu_timer(kernel) as again:
        pass
    assert again == [] and times == [times[0]]  # nothing recorded outside a timer block


def test_attngen_run_reports_gpu_time():
    require("wgsl")
    spec = spec_of(SPEC)
    kernel = attngen.compile(spec, target="wgsl")
    backend = wgsl_backend.BACKEND
    ms = backend.time_call(kernel, tuple(_inputs(spec)), {}, repeat=3)
    assert ms > 0
    if "timestamp-query" in kernel.state.features:
        assert backend.timing == backend.gpu_timing and "timestamp queries" in backend.timing
