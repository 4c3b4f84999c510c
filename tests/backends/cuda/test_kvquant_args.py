"""A quantized cache's scales as the CUDA runtime takes them (attngen/backends/cuda/args.py: kv_scales,
scale_strides), with stand-ins for device arrays: no GPU needed. What they check per call
signature (shape, dtype, GPU, an i8 row layout the kernels' copies can read) and what they leave
to the kernels (values: tests/equivalence/test_cuda_kv_quant.py)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import pytest

import attngen
from attngen.api import lower
from attngen.backends.cuda.args import kv_scales, scale_strides
from attngen.runtime.launch import resolve

from conftest import spec_of


@dataclass
class Fake:
    """A device array seen as kernel.py's _Tensor sees one."""

    shape: tuple
    dtype: str = "f32"
    strides: tuple = None
    ptr: int = 4096
    device: int = 0
    kind: str = "cupy"
    obj: object = None

    def __post_init__(self):
        if self.strides is None:
            st, acc = [], 1
            for n in reversed(self.shape):
                st.append(acc)
                acc *= n
            self.strides = tuple(reversed(st))


def _plan(kv_dtype, paged=False):
    cache = "\n kv_cache paged(page=16)" if paged else ""
    return lower(spec_of(f"head_dim 128\n dtype f16\n schedule split_kv(auto){cache}\n kv_dtype {kv_dtype}"),
                 "cuda", "cuda-sm90")


def _launch(plan, k_shape, new=0):
    shapes = {"q": (2, 1, 4, 128), "k": k_shape, "v": k_shape}
    dtypes = {"q": "f16", "k": {"i8": "int8", None: "f16"}.get(plan.spec.kv_dtype, "uint8")}
    dtypes["v"] = dtypes["k"]
    if new:
        shapes.update(k_new=(2, new, 2, 128), v_new=(2, new, 2, 128))
        dtypes.update(k_new="f16", v_new="f16")
    table = np.zeros((2, 2), np.int32) if plan.spec.kv_cache.is_paged else None
    return resolve(plan, shapes, dtypes, kv_lens=np.array([3, 4]), block_table=table, cores=4)


def _take(plan, scales, k_shape=(2, 9, 2, 128), new=0):
    named = {"k": Fake(k_shape, "int8"), "v": Fake(k_shape, "int8")}
    return kv_scales(plan, named, scales, _launch(plan, k_shape, new), 0, lambda name, x: x,
                     contextlib.nullcontext())


def test_fp8_scales_are_read_in_place_with_their_strides():
    plan = _plan("e4m3")
    ks = Fake((2, 2), strides=(1, 2))  # a transposed (B, Hkv) view: any strides
    got, keep, cacheable = _take(plan, {"k_scale": ks, "v_scale": Fake((2, 2))})
    assert got["k_scale"] is ks and keep == [] and cacheable
    assert scale_strides(got) == {"ks_sb": 1, "ks_sl": 0, "ks_sh": 2, "vs_sb": 2, "vs_sl": 0, "vs_sh": 1}


@pytest.mark.parametrize("scales, message", [
    ({}, "stores K and V as e4m3: pass k_scale= and v_scale="),
    ({"k_scale": Fake((2, 3)), "v_scale": Fake((2, 2))}, "k_scale has shape (2, 3), but kv_dtype e4m3 needs (2, 2)"),
    ({"k_scale": Fake((2, 2), "f16"), "v_scale": Fake((2, 2))}, "k_scale has dtype float16, but scales are float32"),
    ({"k_scale": Fake((2, 2)), "v_scale": Fake((2, 2), device=1)}, "v_scale is on GPU 1, but q is on GPU 0"),
])
def test_bad_scales_are_launch_errors_naming_them(scales, message):
    with pytest.raises(attngen.LaunchError) as e:
        _take(_plan("e4m3"), scales)
    assert message in str(e.value)


def test_a_scale_on_a_kernel_without_kv_dtype_is_refused():
    plan = lower(spec_of("head_dim 128\n dtype f16"), "cuda", "cuda-sm90")
    with pytest.raises(attngen.LaunchError, match="v_scale= needs a kernel built with `kv_dtype"):
        kv_scales(plan, {}, {"v_scale": Fake((2, 2))}, _launch(plan, (2, 9, 2, 128)), 0, None, None)


def test_i8_scale_rows_the_copies_cannot_read_are_copied_or_refused_when_the_append_writes_them():
    plan = _plan("i8")
    ok = Fake((2, 9, 2, 4))
    got, keep, cacheable = _take(plan, {"k_scale": ok, "v_scale": Fake((2, 9, 2, 4))})
    assert cacheable and scale_strides(got)["ks_sl"] == 8
    odd = Fake((2, 9, 2, 4), strides=(80, 8, 6, 1))  # rows 6 floats apart: not the 16-byte rows the copies take
    with pytest.raises(attngen.LaunchError, match="k_scale is written by this call's append"):
        _take(plan, {"k_scale": odd, "v_scale": Fake((2, 9, 2, 4))}, new=1)
    with pytest.raises(attngen.LaunchError, match="k_scale has shape .*needs \\(2, 9, 2, 4\\)"):
        _take(plan, {"k_scale": Fake((2, 9, 2, 1)), "v_scale": ok})


def test_host_i8_scales_cannot_take_an_append():
    plan = _plan("i8")
    host = np.ones((2, 9, 2, 4), np.float32)
    with pytest.raises(attngen.LaunchError, match="which writes k_scale at the new rows: pass it as a CUDA array"):
        _take(plan, {"k_scale": host, "v_scale": host}, new=1)
    with pytest.raises(attngen.LaunchError, match=r"k_scale\[0, 1, 0, 0\] is inf"):
        bad = host.copy()
        bad[0, 1, 0, 0] = np.inf
        _take(plan, {"k_scale": bad, "v_scale": host})
