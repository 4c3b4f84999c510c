"""The CUDA block-mask builder of a mask expression over inputs (issue 42,
attngen/backends/cuda/expr_blockmask.py), without a GPU: its source compiles (nvcc -cubin), and
its mask_element, built by nvcc as a host program, writes the mask the float64 reference's
evaluation gives (document ids, prefix-LM, u8 / bool inputs indexed by h, kv_lens, a read out
of bounds flagged with its site). tests/equivalence/test_cuda_expr_builder.py runs it on a GPU."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from attngen.backends.cuda.expr_blockmask import builder_source, sites
from attngen.plan import mask_inputs
from attngen.reference_expr import evaluate

from conftest import spec_of
from test_expr_source import _nvcc, needs_nvcc

SPECS = {
    "documents": "input doc[b, q] i32\nmask k <= q && doc[b, q] == doc[b, k]",
    "prefix_lm": "input prefix[b] i32\nmask k <= q || k < prefix[b]",
    "heads": "input allow[h, k] bool\ninput shift[b] u8\nmask allow[h, k] || k + shift[b] <= q || "
             "where(q % 3 == 0, k // 2 == q // 2, k < 0)",
}
C_TYPE = {"i32": "int", "u8": "unsigned char", "bool": "unsigned char"}


def _spec(body):
    return spec_of(f"head_dim 16\nheads q=6 kv=2\ndtype f32\n{body}")


def _inputs(spec, rng, b, lq, lk):
    out = {}
    for i in spec.inputs:
        shape = tuple({"b": b, "h": 6, "hkv": 2, "q": lq, "k": lk}.get(a, a) for a in i.axes)
        if i.dtype == "bool":
            out[i.name] = rng.random(shape) < 0.2
        elif i.name == "doc":
            out[i.name] = np.sort(rng.integers(0, 3, size=shape), axis=-1).astype(np.int32)
        else:
            out[i.name] = rng.integers(0, lk + 1, size=shape).astype(np.int32 if i.dtype == "i32" else np.uint8)
    return out


def _host_program(spec, b, lq, lk, inputs, lens):
    """The builder's source with a main() that writes every element's byte (and the flag) to stdout,
    and the mask's (Bm, Hm)."""
    arrays = "".join(f"static const {C_TYPE[i.dtype]} data_{i.name}[] = {{"
                     f"{', '.join(str(int(x)) for x in np.asarray(inputs[i.name]).reshape(-1)) or '0'}}};\n"
                     for i in mask_inputs.mask_inputs(spec))
    names = "".join(f", data_{i.name}" for i in mask_inputs.mask_inputs(spec))
    bm_b, bm_h = mask_inputs.slices(spec, b, 6, lens is not None)
    elements = bm_b * bm_h * lq * lk
    lens_c = ", ".join(str(int(x)) for x in (lens if lens is not None else [lk] * b))
    return builder_source(spec) + f"""
#include <cstdio>
{arrays}static const int kv_lens[] = {{{lens_c}}};
int main() {{
    int flag = 0;
    const MaskInputs in{{{b}, 6, 2, {lq}, {lk}, &flag{names}}};
    for (long long e = 0; e < {elements}LL; e++) {{
        std::printf("%d", mask_element(in, e, {bm_h}, kv_lens) ? 1 : 0);
    }}
    std::printf(" %d\\n", flag);
    return 0;
}}
""", (bm_b, bm_h)


def _want(spec, b, lq, lk, inputs, lens, shape):
    bm_b, bm_h = shape
    bi = np.arange(bm_b)[:, None, None, None]
    hi = np.arange(bm_h)[None, :, None, None]
    qi = np.arange(lq)[None, None, :, None]
    ki = np.arange(lk)[None, None, None, :]
    seq = np.asarray(lens if lens is not None else [lk] * b)[:bm_b][:, None, None, None]
    live = np.broadcast_to(ki < seq, (bm_b, bm_h, lq, lk))
    names = {"b": bi, "h": hi, "hkv": hi // 3, "q": qi, "k": ki, "Lq": np.int64(lq), "Lk": seq}
    got = evaluate(spec.mask.expr, names, {n: np.asarray(a).astype(bool if a.dtype == bool else np.int64)
                                           for n, a in inputs.items()}, live=live)
    return np.broadcast_to(got, live.shape) & live


@needs_nvcc
@pytest.mark.parametrize("name", sorted(SPECS))
def test_the_builder_compiles_and_writes_the_reference_mask(name):
    spec = _spec(SPECS[name])
    if name == "heads":  # the device code compiles (every input type, a where, floor division)
        _nvcc(["-gencode=arch=compute_90a,code=sm_90a", "-cubin"], builder_source(spec))
    rng = np.random.default_rng(1)
    for b, lq, lk, lens in [(1, 13, 20, None), (3, 9, 11, np.array([11, 4, 0]))]:
        inputs = _inputs(spec, rng, b, lq, lk)
        source, shape = _host_program(spec, b, lq, lk, inputs, lens)
        exe, _ = _nvcc(["-gencode=arch=compute_80,code=sm_80"], source)
        bits, flag = subprocess.run([exe], capture_output=True, text=True, check=True).stdout.split()
        got = np.array([c == "1" for c in bits]).reshape(shape + (lq, lk))
        assert flag == "0"
        assert np.array_equal(got, _want(spec, b, lq, lk, inputs, lens, shape)), (name, b, lq, lk)


@needs_nvcc
def test_a_read_out_of_bounds_writes_its_site():
    spec = _spec("input doc[b, q] i32\nmask doc[b, q] < 0 || doc[b, k] == 1")  # k reaches past Lq: site 2
    assert [s.input for s in sites(spec)] == ["doc", "doc"]
    source, _ = _host_program(spec, 1, 3, 5, {"doc": np.zeros((1, 3), np.int32)}, None)
    exe, _ = _nvcc(["-gencode=arch=compute_80,code=sm_80"], source)
    assert subprocess.run([exe], capture_output=True, text=True, check=True).stdout.split()[1] == "2"


def test_slices_and_the_custom_spec():
    spec = _spec(SPECS["heads"])
    assert mask_inputs.slices(spec, 4, 6, False) == (4, 6)
    assert mask_inputs.slices(_spec("input allow[h, k] bool\nmask allow[h, k]"), 4, 6, False) == (1, 6)
    assert mask_inputs.slices(_spec("input allow[h, k] bool\nmask allow[h, k]"), 4, 6, True) == (4, 6)
    custom = mask_inputs.custom_spec(_spec("input slopes[h] f32\ninput doc[b, q] i32\n"
                                           "score s - slopes[h] * abs(q - k)\nmask doc[b, q] == doc[b, k]"))
    assert custom.mask.kind == "custom" and [i.name for i in custom.inputs] == ["slopes"]
