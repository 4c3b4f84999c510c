"""attngen run's check of a --shape before any input is drawn (attngen.harness.runner.check_shape),
without a device: the cuda target's rules need only the plan."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from attngen import api, backends
from attngen.errors import LaunchError
from attngen.harness import runner

from conftest import ROOT


def _kernel(name: str, target: str = "cuda"):
    spec = api.parse(open(os.path.join(ROOT, "examples", name)).read())[0]
    return SimpleNamespace(spec=spec, plan=api.lower(spec, target, backends.get(target).profile(None)))


def _shape(**kw):
    return {"B": 1, "Lq": 256, "Lk": 256, "Hq": 12, "Hkv": 12, **kw}


def test_a_shape_within_the_limits_passes():
    runner.check_shape(_kernel("vit_b16.attn"), backends.get("cuda"), _shape())


@pytest.mark.parametrize("shape, words", [
    (_shape(B=65536, Lq=1, Lk=1), "batch 65536"),
    (_shape(B=4096, Lq=2**20, Lk=1), "GiB of host memory"),
])
def test_a_shape_past_a_limit_is_refused_from_the_shape_alone(shape, words, monkeypatch):
    def no_drawing(*a, **k):
        raise AssertionError("inputs drawn")
    monkeypatch.setattr(runner.np.random, "default_rng", no_drawing)
    with pytest.raises(LaunchError, match=words):
        runner.check_shape(_kernel("vit_b16.attn"), backends.get("cuda"), shape)


def test_paged_caches_are_checked_too(monkeypatch):
    monkeypatch.setattr(runner, "MAX_HOST_INPUT_BYTES", 1 << 50)  # past the host's check, to the call's
    kernel = _kernel("llama3_8b.attn")
    paged = [f for f in sorted(os.listdir(os.path.join(ROOT, "examples"))) if f.endswith(".attn")
             and "paged" in open(os.path.join(ROOT, "examples", f)).read()]
    if paged:
        kernel = _kernel(paged[0])
    hq, hkv = kernel.spec.heads_q or 8, kernel.spec.heads_kv or 8
    runner.check_shape(kernel, backends.get("cuda"), _shape(Hq=hq, Hkv=hkv, Lq=1, Lk=1000))
    with pytest.raises(LaunchError, match="65535"):
        runner.check_shape(kernel, backends.get("cuda"), _shape(B=70000, Hq=hq, Hkv=hkv, Lq=1, Lk=1))
