"""The plain fused kernel's two entry points: padded launches take the main one (two fragments
per warp), launches with per-sequence lengths take <entry>_varlen (one), with its own grid, block
and shared memory. Checked without a GPU: the plan, the manifest, the source, and the launcher's
choice of entry point for each kind of launch. (The mma.sync family: cuda-sm80. The Hopper
family's own entry points: test_wgmma.py.)"""

from __future__ import annotations

import numpy as np
import pytest

import attngen
from attngen.api import emit_plan
from attngen.backends.cuda import args as cuda_args
from attngen.runtime.launch import resolve

from conftest import spec_of


def _plan(body="head_dim 128\n dtype f16\n mask causal", profile="cuda-sm80"):
    return attngen.lower(spec_of(body), "cuda", profile)


def test_the_plan_and_the_manifest_describe_both_entry_points():
    p = _plan()
    c, v = p.config, p.details.varlen
    assert c.fast_path and c.frags == 2 and c.varlen.frags == 1
    assert (v.entry, v.threads, v.smem_bytes) == (p.entry + "_varlen", c.varlen.threads, c.varlen.smem_bytes)
    assert v.grid == ("ceil(Lq / 64)", "Hq", "B") and p.grid == ("ceil(Lq / 128)", "Hq", "B")
    em = emit_plan(p)
    m = em.manifest["varlen_entry_point"]
    assert m["entry_point"] == v.entry and m["grid"] == list(v.grid) and m["block"] == [v.threads, 1, 1]
    src = em.source
    assert "namespace padded {" in src and "namespace varlen {" in src
    assert f"{p.entry}_varlen(" in src and "padded::attention<0, false>(" in src
    assert "varlen::attention<0, true>(" in src


def test_kernels_without_a_padded_path_have_one_entry_point():
    for body in ("head_dim 256\n dtype bf16\n mask causal",      # one fragment per warp already
                 "head_dim 128\n dtype f16\n mask custom",        # one general instantiation
                 "head_dim 128\n dtype f16\n kv_cache paged(page=16)",
                 "head_dim 128\n dtype f16\n schedule split_kv(2)"):
        p = _plan(body)
        assert p.details.varlen is None, body
        assert "_varlen" not in emit_plan(p).source
    custom = _plan("head_dim 128\n dtype f16\n mask custom")
    assert custom.config.frags == 1  # auto tiles of a general-only kernel: one fragment per warp
    given = _plan("head_dim 128\n dtype f16\n mask custom\n tile q=128\n target cuda { warps=4 }")
    assert given.config.frags == 2  # the spec's own tiles are kept


def _launch(plan, **opts):
    b, lq, lk, hq, hkv, d = 2, 100, 300, 4, 2, plan.d_qk
    shapes = {"q": (b, lq, hq, d), "k": (b, lk, hkv, d), "v": (b, lk, hkv, d)}
    dtypes = dict.fromkeys(shapes, plan.dtype)
    if "k_new" in opts:
        shapes.update(k_new=(b, 3, hkv, d), v_new=(b, 3, hkv, d))
        dtypes.update(k_new=plan.dtype, v_new=plan.dtype)
        opts = {k: v for k, v in opts.items() if k not in ("k_new", "v_new")}
    return resolve(plan, shapes, dtypes, cores=132, **opts)


@pytest.mark.parametrize("opts, varlen", [
    ({}, False),
    ({"kv_lens": np.array([10, 200], np.int32)}, True),
    ({"kv_lens": np.array([10, 200], np.int32), "k_new": True}, True),
])
def test_the_launcher_picks_the_entry_point(opts, varlen):
    p = _plan()
    launch = _launch(p, **opts)
    assert cuda_args.varlen_launch(launch) is varlen
    ((name, _params, grid, threads, smem),) = cuda_args.launches(p, launch)
    want = p.details.varlen if varlen else p
    assert name == (want.entry if varlen else p.entry)
    assert threads == (want.threads if varlen else p.threads)
    assert smem == (want.smem_bytes if varlen else p.smem_bytes)
    assert grid == (-(-100 // (64 if varlen else 128)), 4, 2)
    # the shared memory a launch needs is known for every entry point (the opt-in is per entry)
    assert {e[0]: e[4] for e in cuda_args.entry_points(p)}[name] == smem


def test_packed_launches_take_the_varlen_entry_point():
    p = _plan()
    shapes = {"q": (150, 4, 128), "k": (150, 2, 128), "v": (150, 2, 128)}
    launch = resolve(p, shapes, dict.fromkeys(shapes, "f16"), cu_seqlens_q=np.array([0, 50, 150], np.int32))
    ((name, _params, grid, *_),) = cuda_args.launches(p, launch)
    assert name == p.entry + "_varlen" and grid == (2, 4, 2)
