"""Q, K and V tiles by the tensor copy engine (`target cuda { tma=auto|on|off }`, issue 11): which
plans take it, what the checker refuses, the kernel parameters and their packing (no GPU), and
on the GPU machine the reference's function through tensor maps built by the runtime: odd
lengths (keys past Lk zero-filled by the engine), head dims that are not whole 64-column blocks
(columns zero-filled), MLA dims, GQA 7, one head and one sequence (axes of size 1), K and V that
are views of larger tensors (strides of their own), zero strides (copied first), and a new
address at every call of one signature (the map re-encoded)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import attngen
from attngen.api import emit_plan
from attngen.backends.cuda.launch import Packed
from attngen.backends.cuda.tensor_maps import MAP_BYTES, TensorMapEncoder, tma_layout_problem
from attngen.errors import SpecError

from conftest import kernel_for, require, spec_of, to_device
from test_variants import _np, check


def _plan(body, profile="cuda-sm90"):
    return attngen.lower(spec_of(body), "cuda", profile)


# ---- the plan (no GPU) ----------------------------------------------------------------------------

@pytest.mark.parametrize("body, on", [
    ("head_dim 128\n dtype f16", True),
    ("head_dim 64\n dtype bf16\n mask causal", True),
    ("head_dim 128\n dtype f16\n mask custom", True),
    ("head_dim qk=192 v=128\n dtype bf16\n mask causal\n tile q=128 kv=128\n target cuda { producer=on }", True),
    ("head_dim 128\n dtype f16\n target cuda { tma=off }", False),
    ("head_dim 128\n dtype f16\n softcap 30", True),   # with the producer since 2026-11-27
    ("head_dim 128\n dtype f16\n softcap 30\n target cuda { producer=off }", False),  # no producer
    ("head_dim 256\n dtype f16", True),  # producer and persistent blocks above d128 (CudaTiles.wide_d_tiles)
    ("head_dim 256\n dtype f16\n mask window(left=64)", True),   # the producer above d128 too
    ("head_dim 256\n dtype f16\n mask window(left=64)\n target cuda { producer=off }", False),  # no producer
])
def test_which_plans_take_the_tensor_copy_engine(body, on):
    p = _plan(body)
    assert p.config.tma is on
    assert ("K and V by the tensor copy engine" in p.summary()) is on
    src = emit_plan(p).source
    assert ("cp.async.bulk.tensor.4d" in src) is on
    assert ("const __grid_constant__ TensorMap tmap_k" in src) is on
    names = [q.name for q in p.params]
    assert (("tmap_k" in names) and ("tmap_v" in names)) is on
    # Q by the same engine wherever K and V are (a block's rows are one query head's)
    assert p.config.tma_q is on and ("tmap_q" in names) is on
    assert ("Q, K and V by the tensor copy engine" in p.summary()) is on
    assert ("tma_tile<kBlockQ, kHeadDimQKPad>(sQ, tmap_q" in src) is on
    if p.config.varlen is not None:  # launches with per-sequence lengths keep cp.async
        assert not p.config.varlen.tma


def test_tma_on_without_a_producer_is_refused():
    with pytest.raises(SpecError) as e:
        _plan("head_dim 128\n dtype f16\n target cuda { producer=off tma=on }")
    assert "tma=on" in str(e.value) and "no producer" in str(e.value)
    with pytest.raises(SpecError) as e:
        _plan("head_dim 128\n dtype f16\n target cuda { tma=on }", "cuda-sm80")
    assert "tma=on" in str(e.value)


def test_manifest_describes_the_tensor_maps():
    manifest = emit_plan(_plan("head_dim 128\n dtype f16")).manifest
    params = {p["name"]: p for p in manifest["parameters"]}
    assert [n for n in params if n.startswith("tmap_")] == ["tmap_q", "tmap_k", "tmap_v"]
    assert "dims (Dqk, Hq, Lq, B)" in params["tmap_q"]["doc"] and "box (64, 1, tile q, 1)" in params["tmap_q"]["doc"]
    assert "dims (Dv, Hkv, Lk, B)" in params["tmap_v"]["doc"] and "box (64, 1, tile kv, 1)" in params["tmap_v"]["doc"]
    for name in ("tmap_q", "tmap_k", "tmap_v"):
        assert params[name]["kind"] == "tensor_map"
        assert "cuTensorMapEncodeTiled" in params[name]["doc"] and "128-byte swizzle" in params[name]["doc"]


class _Fn:
    ptr = 0


class _Driver:
    def __init__(self):
        self.seen = []

    def launchKernel(self, fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra):  # noqa: N802 (CuPy's name)
        self.seen.append(params)


class _Encoder:
    source = "k"

    def __init__(self):
        self.buf = ctypes.create_string_buffer(bytes(range(MAP_BYTES)), MAP_BYTES)
        self.calls = 0

    def encode(self, ptr):
        self.calls += 1
        return ctypes.addressof(self.buf)


def test_packed_places_the_maps_and_encodes_once_per_address():
    """Each parameter's pointer in the launch's parameter array; the tensor maps 64-byte aligned
    after the struct of scalars and addresses, re-encoded only when their tensor moves."""
    p = _plan("head_dim 128\n dtype f16")
    values = {q.name: 1 for q in p.params if q.kind == "scalar"}
    enc = _Encoder()
    values["tmap_k"] = enc  # tmap_v: None (an entry point that does not read it gets zeros)
    slots = frozenset(q.name for q in p.params if q.kind == "tensor")
    packed = Packed(_Fn(), (1, 1, 1), 384, 0, p.params, values, slots)
    addrs = [int(a) for a in packed.params]
    assert len(addrs) == len(p.params)
    kinds = [q.kind for q in p.params]
    k_at, v_at = addrs[[q.name for q in p.params].index("tmap_k")], addrs[[q.name for q in p.params].index("tmap_v")]
    assert k_at % 64 == 0 and v_at % 64 == 0 and abs(k_at - v_at) >= MAP_BYTES
    assert all(a < min(k_at, v_at) for a, kind in zip(addrs, kinds) if kind != "tensor_map")
    drv = _Driver()
    for ptr in (4096, 4096, 8192):
        packed.launch(drv, {"k": ptr}, 0)
    assert enc.calls == 2  # the same address again: the bytes already there
    assert ctypes.string_at(k_at, MAP_BYTES) == bytes(range(MAP_BYTES))
    assert ctypes.string_at(v_at, MAP_BYTES) == bytes(MAP_BYTES)


def test_encoder_strides_and_layouts_it_cannot_map():
    # (B, L, H, D) = (1, 300, 1, 96): axes of one element get the contiguous stride
    enc = TensorMapEncoder("k", (1, 300, 1, 96), (999, 96, 7, 1), "f16", 80)
    assert tuple(enc.dims) == (96, 1, 300, 1)
    assert tuple(enc.strides) == (192, 192, 57600)
    assert tuple(enc.box) == (64, 1, 80, 1)
    assert enc.address % 64 == 0
    # a view of a larger tensor keeps its strides
    enc = TensorMapEncoder("v", (2, 7, 3, 64), (7 * 3 * 128, 3 * 128, 128, 1), "bf16", 128)
    assert tuple(enc.strides) == (256, 3 * 256, 7 * 3 * 256)
    assert tma_layout_problem((2, 7, 3, 64), (0, 192, 64, 1), "f16") is not None  # expanded batch
    assert tma_layout_problem((2, 7, 3, 64), (1344, -192, 64, 1), "f16") is not None
    assert tma_layout_problem((1, 7, 3, 64), (0, 192, 64, 1), "f16") is None  # one sequence: never stepped


# ---- against the reference (GPU) ------------------------------------------------------------------

def _rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("body, b, lq, lk, hq, hkv", [
    ("head_dim 128\n dtype f16", 1, 1, 1, 1, 1),
    ("head_dim 128\n dtype f16\n mask causal(bottom_right)", 2, 113, 1023, 14, 2),
    ("head_dim 96\n dtype bf16\n mask causal", 1, 300, 300, 7, 7),
    ("head_dim 64\n dtype f16\n mask window(left=40)", 3, 7, 413, 3, 1),
    ("head_dim 32\n dtype f16\n target cuda { producer=on }", 2, 129, 77, 2, 2),
    ("head_dim qk=192 v=128\n dtype bf16\n mask causal\n tile q=128 kv=128\n target cuda { producer=on }",
     1, 200, 333, 4, 1),
    # three consumer warpgroups with a mask: Q's box of 192 rows past Lq (zeros), Lq != Lk
    ("head_dim 64\n dtype f16\n mask causal\n tile q=192 kv=128\n target cuda { producer=on }", 2, 385, 1023, 7, 7),
    ("head_dim 64\n dtype bf16\n mask causal(bottom_right)\n tile q=192 kv=96\n target cuda { producer=on }",
     1, 113, 700, 6, 2),
    ("head_dim 64\n dtype f16\n mask window(left=100)\n tile q=192 kv=128\n target cuda { producer=on }", 1, 1023, 1023, 3, 1),
    ("head_dim 256\n dtype f16\n mask causal\n tile q=128 kv=64\n target cuda { producer=on persistent=on }",
     2, 300, 300, 2, 1),
])
def test_matches_the_reference(body, b, lq, lk, hq, hkv):
    require("cuda")
    spec = spec_of(body + f"\n heads q={hq} kv={hkv}")
    assert kernel_for(spec, "cuda").plan.config.tma
    rng = np.random.default_rng(lq * 7 + lk)
    q, k, v = _rand(rng, b, lq, hq, spec.head_dim_qk), _rand(rng, b, lk, hkv, spec.head_dim_qk), \
        _rand(rng, b, lk, hkv, spec.head_dim_v)
    check(spec, "cuda", q, k, v)


def test_views_zero_strides_and_new_addresses():
    """K and V as slices of wider tensors (strides of their own), an expanded batch (stride 0:
    copied first), and one call signature with a new address each call: every result is the
    reference's."""
    require("cuda")
    import cupy
    from attngen.reference import reference, relative_error, tolerance
    spec = spec_of("head_dim 128\n heads q=4 kv=2\n dtype f16\n mask causal")
    kern = kernel_for(spec, "cuda")
    assert kern.plan.config.tma
    rng = np.random.default_rng(3)
    for trial in range(3):
        q, k, v = _rand(rng, 2, 257, 4, 128), _rand(rng, 2, 301, 2, 128), _rand(rng, 2, 301, 2, 128)
        dq = to_device("cuda", "f16", q)[0]
        wide = cupy.zeros((2, 301, 2, 3 * 128), cupy.float16)
        wide[..., 128:256] = cupy.asarray(k.astype(np.float16))
        wide[..., 256:] = cupy.asarray(v.astype(np.float16))
        dk, dv = wide[..., 128:256], wide[..., 256:]
        out = _np(kern(dq, dk, dv))
        ref = reference(spec, q, k, v)
        assert relative_error(out, ref) <= tolerance(spec), trial
    # Q as a slice of a wider tensor (its own row and head strides) and Q expanded over the batch
    # (stride 0: copied first)
    q = _rand(rng, 2, 257, 4, 128)
    k, v = _rand(rng, 2, 301, 2, 128), _rand(rng, 2, 301, 2, 128)
    wide = cupy.zeros((2, 257, 4, 2 * 128), cupy.float16)
    wide[..., 128:] = cupy.asarray(q.astype(np.float16))
    out = _np(kern(wide[..., 128:], *to_device("cuda", "f16", k, v)))
    assert relative_error(out, reference(spec, q, k, v)) <= tolerance(spec)
    q1 = _rand(rng, 1, 257, 4, 128)
    dq = cupy.broadcast_to(cupy.asarray(q1.astype(np.float16)), (2, 257, 4, 128))
    out = _np(kern(dq, *to_device("cuda", "f16", k, v)))
    assert relative_error(out, reference(spec, np.broadcast_to(q1, (2, 257, 4, 128)), k, v)) <= tolerance(spec)
    # one sequence of K and V expanded over the batch: stride 0 along it
    k1, v1 = _rand(rng, 1, 301, 2, 128), _rand(rng, 1, 301, 2, 128)
    dk, dv = (cupy.broadcast_to(cupy.asarray(a.astype(np.float16)), (2, 301, 2, 128)) for a in (k1, v1))
    q = _rand(rng, 2, 257, 4, 128)
    out = _np(kern(to_device("cuda", "f16", q)[0], dk, dv))
    ref = reference(spec, q, np.broadcast_to(k1, (2, 301, 2, 128)), np.broadcast_to(v1, (2, 301, 2, 128)))
    assert relative_error(out, ref) <= tolerance(spec)


def test_the_same_function_without_it():
    """tma=on and off agree closely on a grid of many items (a missed byte count or a wrong
    coordinate shows here)."""
    require("cuda")
    rng = np.random.default_rng(9)
    q, k, v = _rand(rng, 3, 1000, 8, 128), _rand(rng, 3, 1000, 4, 128), _rand(rng, 3, 1000, 4, 128)
    outs = []
    for mode in ("on", "off"):
        spec = spec_of(f"head_dim 128\n heads q=8 kv=4\n dtype f16\n mask causal\n target cuda {{ tma={mode} }}")
        assert kernel_for(spec, "cuda").plan.config.tma is (mode == "on")
        outs.append(_np(kernel_for(spec, "cuda")(*to_device("cuda", spec.dtype, q, k, v))).astype(np.float32))
    assert np.abs(outs[0] - outs[1]).max() <= 2e-3
