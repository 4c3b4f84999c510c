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


def _run_refused_before_drawing(tmp_path, monkeypatch, capsys, text: str, shape: str) -> str:
    """`attngen run` of the spec `text` on wgsl with --shape `shape`: a usage error before any
    input is drawn; its message."""
    from conftest import wgsl_available
    from attngen.cli import main
    if not wgsl_available():
        pytest.skip("no wgpu adapter")

    def no_drawing(*a, **k):
        raise AssertionError("inputs drawn")
    monkeypatch.setattr(runner, "draw_inputs", no_drawing)
    # the software adapter's storage binding limit (128 MiB), whatever adapter runs the test
    from attngen.backends.wgsl.kernel import WgslKernel
    monkeypatch.setattr(WgslKernel, "binding_limit", lambda self: 1 << 27)
    path = tmp_path / "s.attn"
    path.write_text(text)
    code = main(["run", str(path), "--target", "wgsl", "--shape", shape, "-q"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    return err


def test_a_split_kv_workspace_is_counted_with_its_real_splits(tmp_path, monkeypatch, capsys):
    """(issue 40) check_shape counted split_kv's workspaces with one split: 8 splits' o_part of
    256 MiB passed, and the inputs were drawn before the call refused it."""
    err = _run_refused_before_drawing(tmp_path, monkeypatch, capsys, "attention s {\n head_dim 64\n heads q=8 kv=8\n"
                                      " dtype f32\n schedule split_kv(8)\n}\n", "B=1,Lq=16384,Lk=64")
    assert "o_part would be 268435456 bytes" in err, err  # 8 x 16384 x 8 x 64 x 4


def test_a_custom_mask_is_checked_against_the_binding_limit_before_anything_is_drawn(tmp_path, monkeypatch, capsys):
    """(issue 40) attngen run drew a custom mask (and q, k, v) whose BlockMask buffer passes the
    storage binding limit, then failed in the block-mask builder."""
    err = _run_refused_before_drawing(tmp_path, monkeypatch, capsys, "attention m {\n head_dim 32\n heads q=1 kv=1\n"
                                      " dtype f32\n mask custom\n}\n", "B=1,Lq=12288,Lk=12288")
    assert "mask: its BlockMask buffer would be" in err and "storage binding limit" in err, err


def test_the_block_mask_builder_checks_the_size_before_it_copies(monkeypatch):
    """The builder refuses a mask too big for the buffer before its host copies (from the shape)."""
    from conftest import wgsl_available
    if not wgsl_available():
        pytest.skip("no wgpu adapter")
    import numpy as np
    import attngen
    from attngen.backends.wgsl import blockmask
    text = "attention m {\n head_dim 32\n heads q=1 kv=1\n dtype f32\n mask custom\n}\n"
    kernel = attngen.compile(api.parse(text)[0], target="wgsl")
    monkeypatch.setattr(kernel, "binding_limit", lambda: 1000)
    copies = []
    monkeypatch.setattr(blockmask.np, "ascontiguousarray", lambda *a, **k: copies.append(1) or np.asarray(*a))
    with pytest.raises(LaunchError, match="BlockMask buffer would be 4[0-9]{3} bytes"):
        blockmask.build_block_mask(kernel, np.ones((1, 1, 64, 64), bool))
    assert not copies
