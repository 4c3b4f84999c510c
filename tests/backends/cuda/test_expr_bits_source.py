"""The bits path of index-only mask expressions on cuda (attngen/backends/cuda/expr_bits.py; issue
42) without a GPU: the block-mask builder of masks over inputs, rendered for expressions that read
none, compiles (nvcc) and its mask_element, run on the host, writes the reference's mask (with
kv_lens, and per batch / head where the expression names b or h); the bits path's decision for a
call's shapes (MaskBitsKernel._decide); the spec's `attngen build --emit block-mask`.
tests/equivalence/test_cuda_expr_bits.py runs both paths on a GPU."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from attngen.backends.cuda import BACKEND
from attngen.backends.cuda.expr_bits import MaskBitsKernel, bits_spec
from attngen.backends.cuda.expr_blockmask import builder_source
from attngen.plan import expr_bits
from attngen.plan.lower import lower
from attngen.runtime.kernel import Rendered

from conftest import spec_of
from test_expr_builder_source import _host_program, _want
from test_expr_source import _nvcc, needs_nvcc

HOOD = "abs(q // 4 - k // 4) <= 1 && abs(q % 4 - k % 4) <= 1"
SPECS = {"neighbourhood": f"mask {HOOD}", "per head and sequence": "mask k <= q + h - b && k + Lk - Lq >= q - 3"}


def _spec(body):
    return spec_of(f"head_dim 16\nheads q=6 kv=2\ndtype f32\n{body}")


@needs_nvcc
@pytest.mark.parametrize("name", sorted(SPECS))
def test_the_builder_of_an_index_only_expression_writes_the_reference_mask(name):
    spec = _spec(SPECS[name])
    _nvcc(["-gencode=arch=compute_90a,code=sm_90a", "-cubin"], builder_source(spec))
    for b, lq, lk, lens in [(1, 1, 1, None), (2, 7, 20, None), (1, 113, 37, None), (3, 9, 11, np.array([11, 4, 0]))]:
        source, shape = _host_program(spec, b, lq, lk, {}, lens)
        exe, _ = _nvcc(["-gencode=arch=compute_80,code=sm_80"], source)
        bits, flag = subprocess.run([exe], capture_output=True, text=True, check=True).stdout.split()
        got = np.array([c == "1" for c in bits]).reshape(shape + (lq, lk))
        assert flag == "0"
        assert np.array_equal(got, _want(spec, b, lq, lk, {}, lens, shape)), (name, b, lq, lk)


class _Inline:
    """What MaskBitsKernel reads of its inline kernel, without a GPU: the plan's Rendered."""

    def __init__(self, spec):
        self.emitted = Rendered(lower(spec, BACKEND, BACKEND.profile("cuda-sm90")), BACKEND.render, BACKEND.manifest)


def _decide(mask, b, lq, lk, option="", kv_lens=None, h=6):
    spec = spec_of(f"head_dim 128\nheads q={h} kv=2\ndtype f16\nmask {mask}\n{option}")
    kernel = MaskBitsKernel(_Inline(spec), lambda: None)
    shapes = {"q": (b, lq, h, 128), "k": (b, lk, 2, 128), "v": (b, lk, 2, 128)}
    return kernel._decide(shapes, "f16", kv_lens)[:2]


def test_the_decision_of_a_call():
    big = "abs(q // 64 - k // 64) <= 7 && abs(q % 64 - k % 64) <= 7"
    assert _decide(big, 1, 4096, 4096)[0] == "bits"
    assert _decide(big, 2, 4096, 3001)[0] == "bits"
    assert _decide("!(k > q)", 1, 4096, 4096) == ("inline", "mask_expr=auto: fewer partial than full live tiles, "
                                                           "or a short call")
    assert _decide(big, 1, 113, 7)[0] == "inline"  # short
    assert _decide("!(k > q)", 1, 113, 7, "target cuda { mask_expr=bits }") == ("bits", "mask_expr=bits")
    # kv_lens on the host: one slice per sequence (its own Lk), within the bound; on the GPU: inline
    assert _decide(big, 2, 4096, 4096, kv_lens=np.array([4096, 100], np.int32))[0] == "bits"
    path, why = _decide(big, 2, 4096, 4096, kv_lens=_DeviceArray())
    assert path == "inline" and "kv_lens on the GPU" in why
    assert _decide(big, 0, 4096, 4096, "target cuda { mask_expr=bits }")[0] == "inline"  # an empty batch
    assert _decide(big, 1, 7, 0, "target cuda { mask_expr=bits }") == ("inline", "no rows or no keys: nothing to build")


class _DeviceArray:
    """What a device array looks like to the bits path's test (__cuda_array_interface__)."""

    shape = (2,)
    __cuda_array_interface__: dict = {}


def test_the_memory_bound_falls_back_inline():
    per_head = "abs(q // 128 - k // 128) <= 7 && abs(q % 128 - k % 128) <= 7 + h"
    path, why = _decide(per_head, 1, 16384, 16384, h=4)  # 4 slices of 16384^2: 2^30 elements
    assert path == "inline" and why == f"the mask would have {1 << 30} elements, above {expr_bits.MAX_ELEMENTS}"
    assert _decide(per_head, 1, 16384, 16384, h=2)[0] == "bits"


def test_build_emits_the_builder_where_a_call_may_take_bits():
    assert "block-mask" in BACKEND.helper_sources(_Inline(_spec(f"mask {HOOD}")).emitted.plan)
    for body in (f"mask {HOOD}\ntarget cuda {{ mask_expr=inline }}", "mask causal",
                 f"mask {HOOD}\nkv_cache paged(page=16)"):
        assert "block-mask" not in BACKEND.helper_sources(_Inline(_spec(body)).emitted.plan), body


def test_the_bits_kernel_is_the_spec_with_mask_custom():
    """bits_spec: `mask custom`, the score's inputs, the other cuda options kept, mask_expr left out
    (the checker refuses it on a custom mask); it lowers, and precompiles with the spec (nvrtc)."""
    spec = spec_of(f"head_dim 64\nheads q=6 kv=2\ndtype f16\ninput slopes[h] f32\nscore s - slopes[h] * abs(q - k)\n"
                   f"mask {HOOD}\ntarget cuda {{ mask_expr=bits warps=4 }}")
    custom = bits_spec(spec)
    assert custom.mask.kind == "custom" and [i.name for i in custom.inputs] == ["slopes"]
    assert custom.options("cuda") == {"warps": 4} and custom.score == spec.score
    assert lower(custom, BACKEND, BACKEND.profile("cuda-sm90")).spec.mask.is_custom


def test_a_custom_kernel_that_does_not_plan_keeps_every_call_inline():
    spec = spec_of(f"head_dim 128\ndtype f16\nmask {HOOD}\ntile q=128 kv=176\n"
                   "target cuda { producer=on mask_expr=bits }")
    tries = []

    def compile_bits():
        tries.append(1)
        return lower(bits_spec(spec), BACKEND, BACKEND.profile("cuda-sm90"))  # raises the SpecError

    kernel = MaskBitsKernel(_Inline(spec), compile_bits)
    kernel._choose = lambda *args: ("bits", "mask_expr=bits", object())  # a call the path would serve
    for _ in range(2):
        assert kernel._bits_mask(None, None, (), None, None, {}) is None
        assert kernel.last_path == "inline" and kernel.last_reason.startswith(
            "the spec with mask custom does not plan with these options (target cuda (profile cuda-sm90): "
            "producer=on with mask custom and tile kv=176")
    assert len(tries) == 1  # tried once
