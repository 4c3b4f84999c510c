"""WGSL runtime: every argument is checked before anything is written, and a launch refused on
a software adapter says what to change."""

from __future__ import annotations

import numpy as np
import pytest

import attngen

from conftest import kernel_for, require, spec_of

pytestmark = pytest.mark.wgsl


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("readonly", ["k", "v"])
def test_append_to_a_read_only_cache_writes_nothing(paged, readonly):
    """A paged append with a read-only V raised only after K had been written: half an append."""
    require("wgsl")
    rng = np.random.default_rng(31)
    cache = "paged(page=8)" if paged else "contiguous"
    spec = spec_of(f"head_dim 32\n dtype f32\n mask causal(bottom_right)\n kv_cache {cache}")
    shape = (6, 8, 2, 32) if paged else (2, 24, 2, 32)
    k = rng.standard_normal(shape).astype(np.float32)
    v = rng.standard_normal(shape).astype(np.float32)
    before = k.copy(), v.copy()
    {"k": k, "v": v}[readonly].flags.writeable = False
    q = rng.standard_normal((2, 3, 4, 32)).astype(np.float32)
    kn = rng.standard_normal((2, 3, 2, 32)).astype(np.float32)
    opts = {"kv_lens": np.array([5, 9], np.int32), "k_new": kn, "v_new": kn}
    if paged:
        opts["block_table"] = np.array([[0, 1, 2], [3, 4, 5]], np.int32)
    with pytest.raises(attngen.LaunchError, match=f"{readonly} is read-only"):
        kernel_for(spec, "wgsl")(q, k, v, **opts)
    assert np.array_equal(k, before[0]) and np.array_equal(v, before[1])


def test_too_many_splits_for_a_software_adapter_says_so():
    """split_kv(1024) failed with a message about a loop budget that advised shorter sequences."""
    require("wgsl")
    from attngen.backends import wgsl
    if wgsl.device_state().loop_budget is None:
        pytest.skip("not llvmpipe: no loop budget")
    spec = spec_of("head_dim 64\n dtype f32\n schedule split_kv(1024)")
    rng = np.random.default_rng(32)
    q = rng.standard_normal((1, 1, 2, 64)).astype(np.float32)
    k = rng.standard_normal((1, 100, 2, 64)).astype(np.float32)
    with pytest.raises(attngen.LaunchError) as info:
        kernel_for(spec, "wgsl")(q, k, k)
    message = str(info.value)
    most = int(message.split("use at most ")[1].split()[0])
    assert "1024 KV splits" in message and 900 < most < 1024
    assert "shorter key sequences" not in message
    ok = spec_of(f"head_dim 64\n dtype f32\n schedule split_kv({most})")  # the advice works
    out = kernel_for(ok, "wgsl")(q, k, k)
    assert np.isfinite(out).all()


def test_device_inputs_with_a_numpy_out_are_refused():
    """With WgslTensor q, k, v a numpy out= was ignored: it stayed zeros while a new WgslTensor
    came back. The result of device inputs stays on the device, as on cuda."""
    require("wgsl")
    from attngen.backends.wgsl import WgslTensor
    rng = np.random.default_rng(5)
    spec = spec_of("head_dim 8\n dtype f32")
    q, k, v = (WgslTensor.from_numpy(rng.standard_normal(s).astype(np.float32))
               for s in ((2, 5, 3, 8), (2, 6, 3, 8), (2, 6, 3, 8)))
    kern = kernel_for(spec, "wgsl")
    with pytest.raises(attngen.LaunchError, match="q, k and v are WgslTensors, so the result stays on the GPU: out "
                                                  "must be a WgslTensor too"):
        kern(q, k, v, out=np.zeros((2, 5, 3, 8), np.float32))
    out = WgslTensor.from_numpy(np.zeros((2, 5, 3, 8), np.float32))
    assert kern(q, k, v, out=out) is out
    ref = attngen.reference(spec, q.numpy(), k.numpy(), v.numpy())
    assert np.abs(out.numpy() - ref).max() < 1e-5


@pytest.mark.parametrize("buffer, shape, dtype, message", [
    (None, (2, 3), "f32", "WgslTensor's buffer must be a wgpu buffer"),
    ("gpu", (2, -1), "f32", "WgslTensor's shape must be a tuple of non-negative integers"),
    ("gpu", (2.5, 3), "f32", "WgslTensor's shape"),
    ("gpu", "abc", "f32", "WgslTensor's shape"),
    ("gpu", (2, 3), "f64", "WgslTensor's dtype must be one of f16, f32"),
])
def test_a_wgsl_tensor_is_checked_when_it_is_made(buffer, shape, dtype, message):
    """WgslTensor(None, shape, dtype) failed later, inside a call, with an AttributeError."""
    require("wgsl")
    import wgpu
    from attngen.backends.wgsl import WgslTensor, device
    if buffer == "gpu":
        buffer = device().create_buffer(size=64, usage=wgpu.BufferUsage.STORAGE)
    with pytest.raises(attngen.LaunchError, match=message):
        WgslTensor(buffer, shape, dtype)


# The bits of the runtime's "not written" marker of out (devices.SENTINEL), as input values: a
# NaN in V with exactly these bits reaches out through P V; one in K (or Q) makes its row's
# result NaN. Either way the call is correct, and must say so, not blame a loop budget.
_MARKER_BITS = {"f32": (np.uint32, 0x7FC0DEAD), "f16": (np.uint16, 0x7E5A)}


@pytest.mark.parametrize("where", ["v", "k", "q"])
@pytest.mark.parametrize("body", [
    "head_dim 32\n dtype f32\n mask causal",
    "head_dim 32\n dtype f16\n mask causal",
    "head_dim 32\n dtype f32\n mask causal\n schedule split_kv(3)",
    "head_dim 32\n dtype f16\n mask causal\n schedule two_pass",
], ids=["f32", "f16", "f32-split_kv", "f16-two_pass"])
def test_a_nan_with_the_markers_bits_is_nan_out_not_an_error(body, where):
    """A NaN in V with the out marker's bits made a correct call on llvmpipe raise a LaunchError
    about a loop-iteration limit: NaN in must give NaN out (rows that see it), never an error."""
    require("wgsl")
    from attngen.reference import reference
    spec = spec_of(body)
    bits_type, bits = _MARKER_BITS[spec.dtype]
    np_dtype = np.float32 if spec.dtype == "f32" else np.float16
    rng = np.random.default_rng(40)
    q, k, v = (rng.standard_normal((1, 40, 2, 32)).astype(np_dtype) for _ in range(3))
    x = {"q": q, "k": k, "v": v}[where]
    x.view(bits_type)[0, 17, 1, 5] = bits  # key 17 (query row 17 for q), head 1, column 5
    out, lse = kernel_for(spec, "wgsl")(q, k, v, return_lse=True)
    ref, ref_lse = reference(spec, q, k, v, return_lse=True)
    out, ref = out.astype(np.float32), np.asarray(ref, np.float32)
    assert np.isnan(ref).any()
    assert np.array_equal(np.isnan(out), np.isnan(ref))
    assert np.array_equal(np.isnan(lse), np.isnan(np.asarray(ref_lse)))
    fine = ~np.isnan(ref)
    assert np.allclose(out[fine], ref[fine], atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("left", ["lse", "out"])
def test_unwritten_rows_are_still_refused(left):
    """The check that replaced out's marker alone: a row whose lse kept its marker is refused at
    once; an element of out that holds the marker in both dispatches (here: a kernel with no
    pipelines, which writes nothing) is refused too, while one the kernel writes is not."""
    require("wgsl")
    from types import SimpleNamespace
    from attngen.backends import wgsl
    from attngen.backends.wgsl import devices, launch
    if wgsl.device_state().loop_budget is None:
        pytest.skip("not llvmpipe: no loop budget")
    real = kernel_for(spec_of("head_dim 32\n dtype f32"), "wgsl")
    nothing = SimpleNamespace(state=real.state, plan=real.plan, pipelines=[], sentinel=real.sentinel,
                              budget_error=real.budget_error)
    dev = real.state.device
    usage = devices.wgpu.BufferUsage.STORAGE | devices.wgpu.BufferUsage.COPY_SRC
    lse = np.zeros(4, np.uint32)
    if left == "lse":
        lse[2] = devices.LSE_SENTINEL
    out = np.zeros(8, np.uint32)
    out[5] = devices.SENTINEL["f32"][1]
    bufs = {"lse": dev.create_buffer_with_data(data=lse.tobytes(), usage=usage),
            "out": dev.create_buffer_with_data(data=out.tobytes(), usage=usage)}
    with pytest.raises(attngen.LaunchError, match="65535 iterations") as info:
        launch._check_written(nothing, bufs, {}, out.tobytes(), 8, 4, 100)
    assert ("1 of 4 rows" if left == "lse" else "1 of 8 output elements") in str(info.value)
