"""Expression inputs (issue 42: `input NAME[AXES] DTYPE`) on target cuda, against the float64
reference (GPU machine): the issue's examples (ALiBi, prefix-LM, document ids, Swin's table, T5's
bucketed bias, a full f16 bias) in f16, bf16 and f32, odd lengths, Lq != Lk, GQA groups of 3,
kv_lens, rows that see no key, bf16 / u8 / bool inputs, several kernel families, PyTorch tensors,
a second call of the same signature with new input values; every bad input a LaunchError that
names it; reads out of an input's bounds reported (check=True: by the call; else by the next
one), and not where `&&`, `||` or `where` keep the read from being made. Without a GPU every
test skips (tests/backends/cuda/test_expr_inputs_source.py compiles the same source and checks
the loaders on the host)."""

from __future__ import annotations

import numpy as np
import pytest

import attngen
from attngen.errors import LaunchError
from attngen.reference import reference, relative_error, tolerance

from conftest import random_qkv, require, spec_of, to_device
from test_variants import _device_ints, _np

HEADS = "q=6 kv=2"  # GQA, groups of 3
T5 = ("score s + table[h, where(k > q, 16, 0) + where(abs(k - q) < 8, abs(k - q), "
      "min(8 + floor(log(abs(k - q) / 8) / log(16) * 8), 15))]")


def _slopes(rng, b, hq, lq, lk):
    return {"slopes": (2.0 ** (-8.0 * np.arange(1, hq + 1) / hq)).astype(np.float32)}


def _prefix(rng, b, hq, lq, lk):
    return {"prefix": rng.integers(0, lk + 2, size=b).astype(np.int32)}


def _docs(rng, b, hq, lq, lk):
    doc = np.sort(rng.integers(0, 4, size=(b, lq)), axis=1).astype(np.int32)
    doc[:, lq // 2:] += rng.integers(0, 2, size=(b, 1)).astype(np.int32) * 7
    return {"doc": doc}


def _table(n):
    return lambda rng, b, hq, lq, lk: {"table": rng.standard_normal((hq, n)).astype(np.float32)}


def _bias(rng, b, hq, lq, lk):
    return {"bias": rng.standard_normal((b, hq, lq, lk)).astype(np.float16)}


EXAMPLES = {
    "alibi": ("input slopes[h] f32\nscore s - slopes[h] * abs(q - k)\nmask causal", _slopes),
    "prefix_lm": ("input prefix[b] i32\nmask k <= q || k < prefix[b]", _prefix),
    # (doc[b, k] reads the key's id from the query rows' ids: keys past Lq are read only where k <= q)
    "documents": ("input doc[b, q] i32\nmask k <= q && doc[b, q] == doc[b, k]", _docs),
    "swin": ("input table[h, 169] f32\nscore s + table[h, (q // 7 - k // 7 + 6) * 13 + (q % 7 - k % 7 + 6)]\n"
             "mask q // 49 == k // 49", _table(169)),
    "t5": (f"input table[h, 32] f32\n{T5}", _table(32)),
    "bias": ("input bias[b, h, q, k] f16\nscore s + bias[b, h, q, k]", _bias),
}
SHAPES = [(1, 1, 1), (2, 7, 7), (1, 113, 113), (2, 7, 20), (1, 20, 7)]
_KERNELS: dict = {}


def _spec(dtype, body, extra=""):
    return spec_of(f"head_dim 64\nheads {HEADS}\ndtype {dtype}\n{body}\n{extra}")


def _kernel(spec, profile=None):
    key = (spec, profile)
    if key not in _KERNELS:
        _KERNELS[key] = attngen.compile(spec, target="cuda", profile=profile)
    return _KERNELS[key]


def _on_gpu(spec, inputs: dict, torch_tensors=False) -> dict:
    """Host inputs as the kernel takes them: CuPy arrays (bf16: PyTorch), or PyTorch tensors."""
    import cupy
    out = {}
    for inp in spec.inputs:
        a = inputs[inp.name]
        if inp.dtype == "bf16" or torch_tensors:
            import torch
            t = torch.from_numpy(np.ascontiguousarray(a)).cuda()
            out[inp.name] = t.to(torch.bfloat16) if inp.dtype == "bf16" else t
        else:
            out[inp.name] = cupy.asarray(a)
    return out


def _check(spec, b, lq, lk, make, seed=0, profile=None, torch_tensors=False, **options):
    """The kernel's out and lse against the reference's on random data and inputs."""
    q, k, v = random_qkv(spec, b, lq, lk, seed=seed)
    inputs = make(np.random.default_rng(seed), b, q.shape[2], lq, lk)
    dev_opts = {n: _device_ints("cuda", a) for n, a in options.items()}
    out, lse = _kernel(spec, profile)(*to_device("cuda", spec.dtype, q, k, v), return_lse=True, check=True,
                                      **dev_opts, **_on_gpu(spec, inputs, torch_tensors))
    ref, ref_lse = reference(spec, q, k, v, return_lse=True, **options, **inputs)
    out, lse = _np(out), _np(lse)
    assert not np.isnan(out).any() and not np.isnan(lse).any()
    err = relative_error(out, ref)
    assert err <= tolerance(spec), f"{spec.name} {(b, lq, lk)}: relative L2 error {err:.3g}"
    empty = np.isneginf(ref_lse)
    assert np.array_equal(np.isneginf(lse), empty)
    assert np.all(out[np.transpose(empty, (0, 2, 1))] == 0)
    if (~empty).any():
        assert np.abs(lse[~empty] - ref_lse[~empty]).max() <= 1e-2 * max(1.0, np.abs(ref_lse[~empty]).max())
    return empty


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_the_issues_examples_f16(name):
    require("cuda")
    body, make = EXAMPLES[name]
    spec = _spec("f16", body)
    for n, (b, lq, lk) in enumerate(SHAPES):
        _check(spec, b, lq, lk, make, seed=n)


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
@pytest.mark.parametrize("name", ["alibi", "documents"])
def test_bf16_and_f32(name, dtype):
    require("cuda")
    body, make = EXAMPLES[name]
    spec = _spec(dtype, body)
    for n, (b, lq, lk) in enumerate([(2, 7, 20), (1, 113, 113)]):
        _check(spec, b, lq, lk, make, seed=n)


@pytest.mark.parametrize("profile, extra", [
    ("cuda-sm80", ""),                                      # mma.sync
    ("cuda-sm80", "schedule split_kv(3)"),                  # a GQA group packed in a block
    ("cuda-sm80", "schedule two_pass"),
    ("cuda-sm80", "tile d=32"),                             # head dims in chunks
    (None, "target cuda { producer=off stages=2 }"),        # (the H100: wgmma, the plain loop)
    (None, "target cuda { producer=off stages=3 }"),        # the overlapped loop
])
def test_kernel_families(profile, extra):
    require("cuda")
    for name in ("swin", "documents"):
        body, make = EXAMPLES[name]
        spec = _spec("f16", body, extra)
        for n, (b, lq, lk) in enumerate([(2, 7, 20), (1, 113, 113)]):
            _check(spec, b, lq, lk, make, seed=n, profile=profile)


def test_kv_lens_and_a_row_that_sees_no_key():
    require("cuda")
    spec = _spec("f16", "input prefix[b] i32\nmask k + 2 <= q || k < prefix[b]")
    fixed = lambda rng, b, hq, lq, lk: {"prefix": np.array([0, 3, 40], np.int32)}  # noqa: E731
    empty = _check(spec, 3, 9, 30, fixed, kv_lens=np.array([30, 5, 17], np.int32))
    assert empty[0, :, :2].all() and not empty[1:].any()  # sequence 0's rows 0 and 1 see no key


def test_bf16_u8_bool_inputs_and_torch_tensors():
    require("cuda")
    pytest.importorskip("torch")
    spec = _spec("f16", "input w[h] bf16\ninput allow[hkv, k] bool\ninput shift[b] u8\n"
                        "mask allow[hkv, k] || k + shift[b] <= q\nscore s * w[h]")

    def make(rng, b, hq, lq, lk):
        w = (rng.standard_normal(hq).astype(np.float32).view(np.uint32) & 0xffff0000).view(np.float32)  # bf16 values
        return {"w": w, "allow": rng.random((2, lk)) < 0.3, "shift": rng.integers(0, 256, size=b).astype(np.uint8)}
    for n, (b, lq, lk) in enumerate([(2, 7, 7), (2, 7, 20), (1, 113, 113)]):
        _check(spec, b, lq, lk, make, seed=n, torch_tensors=n == 1)


def test_a_second_call_reads_the_new_inputs():
    """The same signature twice (the call's recipe is kept): the inputs' addresses come per call."""
    require("cuda")
    body, make = EXAMPLES["alibi"]
    spec = _spec("f16", body)
    q, k, v = random_qkv(spec, 2, 33, 33, seed=1)
    dq, dk, dv = to_device("cuda", "f16", q, k, v)
    kernel = _kernel(spec)
    for scale in (1.0, 4.0):
        slopes = {"slopes": make(None, 2, 6, 33, 33)["slopes"] * np.float32(scale)}
        out = _np(kernel(dq, dk, dv, **_on_gpu(spec, slopes)))
        assert relative_error(out, reference(spec, q, k, v, **slopes)) <= tolerance(spec)


def test_bad_inputs_are_launch_errors_naming_them():
    require("cuda")
    import cupy
    body, make = EXAMPLES["documents"]
    spec = _spec("f16", body)
    q, k, v = random_qkv(spec, 2, 7, 7, seed=0)
    args = to_device("cuda", "f16", q, k, v)
    kernel = _kernel(spec)
    doc = make(np.random.default_rng(0), 2, 6, 7, 7)["doc"]
    cases = [
        ({}, r"reads input 'doc' \(i32, axes \[b, q\]\): pass doc=\.\.\."),
        ({"doc": cupy.asarray(doc), "other": cupy.asarray(doc)}, r"unknown input other"),
        ({"doc": cupy.asarray(doc.astype(np.int64))}, r"input 'doc' is int64; it is declared i32"),
        ({"doc": cupy.asarray(doc[:, :5])}, r"input 'doc' has shape \(2, 5\); its axes \[b=2, q=7\] need \(2, 7\)"),
        ({"doc": [1, 2]}, r"input 'doc'"),
    ]
    for given, message in cases:
        with pytest.raises(LaunchError, match=message):
            kernel(*args, **given)
    # (a mask over inputs runs as the builder + mask custom, which takes host arrays too; a kernel
    # whose score reads an input takes device arrays only)
    alibi_body, alibi_make = EXAMPLES["alibi"]
    alibi = _kernel(_spec("f16", alibi_body))
    slopes = alibi_make(np.random.default_rng(0), 2, 6, 7, 7)["slopes"]
    with pytest.raises(LaunchError, match=r"input 'slopes' is a numpy array in host memory"):
        alibi(*args, slopes=slopes)
    # a strided input is copied: the same result as a contiguous one
    wide = cupy.asarray(np.repeat(doc, 2, axis=1))[:, ::2]
    assert not wide.flags.c_contiguous
    out = _np(kernel(*args, doc=wide))
    assert relative_error(out, reference(spec, q, k, v, doc=doc)) <= tolerance(spec)
    # packed sequences: the extents of b, q and k are not defined there
    cu = _device_ints("cuda", [0, 7, 14])
    packed = to_device("cuda", "f16", *(x.reshape(14, *x.shape[2:]) for x in (q, k, v)))
    with pytest.raises(LaunchError, match="take a padded batch"):
        kernel(*packed, cu_seqlens_q=cu, max_seqlen_q=7, max_seqlen_k=7, doc=cupy.asarray(doc))


# ---- reads out of bounds ------------------------------------------------------------------------

def _bounds_case(body, lq=7, lk=7):
    spec = _spec("f32", "input tab[4] i32\n" + body)
    q, k, v = random_qkv(spec, 1, lq, lk, seed=2)
    return spec, (q, k, v), {"tab": np.array([1, -1, 2, 3], np.int32)}


def test_a_read_out_of_bounds_is_reported():
    require("cuda")
    import cupy
    spec, qkv, inputs = _bounds_case("score s + tab[q - k]\nmask k <= q")
    with pytest.raises(LaunchError, match="out of"):
        reference(spec, *qkv, **inputs)
    args, tab = to_device("cuda", "f32", *qkv), cupy.asarray(inputs["tab"])
    kernel = _kernel(spec)
    message = r"kernel '\w+' \(cuda\): the score expression read input 'tab' out of its bounds in tab\[q - k\]"
    with pytest.raises(LaunchError, match=message):
        kernel(*args, tab=tab, check=True)  # this call, synchronised
    kernel(*args, tab=tab)  # without check: returns; the next attngen call raises what it found
    cupy.cuda.get_current_stream().synchronize()
    with pytest.raises(LaunchError, match="a kernel launched by an earlier attngen call found that " + message):
        kernel(*args, tab=tab)  # (raised before it launches anything)
    spec, qkv, inputs = _bounds_case("mask k <= q && tab[q - k] > 0")
    with pytest.raises(LaunchError, match="the mask expression read input 'tab'"):
        _kernel(spec)(*to_device("cuda", "f32", *qkv), tab=cupy.asarray(inputs["tab"]), check=True)


@pytest.mark.parametrize("body", [
    "mask k <= q && q - k < 4 && tab[q - k] > 0",           # && decides first
    "mask k > q || q - k >= 4 || tab[q - k] > 0",           # || decides first
    "score where(q - k < 4, s + tab[q - k], s)\nmask k <= q",  # where: only the branch that is the result
    "score s + tab[q - k]\nmask k <= q && q - k < 4",       # the score only at visible pairs
])
def test_reads_the_language_keeps_in_bounds_are_not_reported(body):
    require("cuda")
    import cupy
    spec, qkv, inputs = _bounds_case(body, lq=113, lk=113)
    out = _np(_kernel(spec)(*to_device("cuda", "f32", *qkv), tab=cupy.asarray(inputs["tab"]), check=True))
    assert relative_error(out, reference(spec, *qkv, **inputs)) <= tolerance(spec)
