"""The manifest's Params values are what attngen's own runtime writes: each field's `value`
formula, evaluated over the grid symbols and the launch symbols as a foreign runtime computes
them (examples/web/attngen.js), equals args.params_words for the same launch: padded, kv_lens,
paged, appends, packed sequences, split schedules. No device needed."""

from __future__ import annotations

import numpy as np
import pytest

import attngen
from attngen.api import emit_plan
from attngen.backends.wgsl.args import LAYOUT_CODE, meta_words, params_words
from attngen.plan.formulas import evaluate
from attngen.runtime.launch import resolve

from conftest import spec_of

I32 = np.int32


def _launch_symbols(plan, L, offsets, write_lse):
    """What a foreign runtime knows of a launch, named as the manifest's launch_symbols."""
    return {**L.sizes(plan), "write_lse": int(write_lse), "layout": LAYOUT_CODE[L.layout],
            "has_kv_lens": int(L.kv_lens is not None), "cap": L.page if L.layout == "paged" else L.capacity,
            "Tq": L.total_q, "Lnew": L.len_new,
            "Pmax": L.block_table.shape[1] if L.block_table is not None else 0, **offsets}


CASES = {
    "padded": ("head_dim 64\n dtype f16", dict(q=(2, 5, 4, 64), k=(2, 7, 2, 64)), {}),
    "kv_lens append": ("head_dim 32\n dtype f32\n mask causal(bottom_right)",
                       dict(q=(3, 3, 4, 32), k=(3, 40, 2, 32), k_new=(3, 3, 2, 32)),
                       dict(kv_lens=np.array([0, 13, 30], I32))),
    "paged split_kv(auto)": ("head_dim 64\n dtype f16\n kv_cache paged(page=16)\n schedule split_kv(auto)",
                             dict(q=(3, 1, 8, 64), k=(20, 16, 2, 64)),
                             dict(kv_lens=np.array([100, 1, 33], I32),
                                  block_table=np.arange(21, dtype=I32)[:21].reshape(3, 7) % 20)),
    "packed two_pass": ("head_dim 32\n dtype f32\n mask causal\n schedule two_pass",
                        dict(q=(23, 4, 32), k=(23, 2, 32)), dict(cu_seqlens_q=np.array([0, 5, 6, 23], I32))),
}


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("write_lse", [False, True])
def test_manifest_values_equal_the_runtimes(name, write_lse):
    body, shapes, opts = CASES[name]
    plan = attngen.lower(spec_of(body), "wgsl", "webgpu-core")
    shapes = {**shapes, "v": shapes["k"], **({"v_new": shapes["k_new"]} if "k_new" in shapes else {})}
    L = resolve(plan, shapes, dict.fromkeys(shapes, plan.dtype), cores=8, **opts)
    _, offsets = meta_words(L)
    want = params_words(plan, L, write_lse=write_lse, offsets=offsets, bm=None)
    fields = emit_plan(plan).manifest["bindings"][0]["fields"]
    symbols = _launch_symbols(plan, L, offsets, write_lse)
    got = [evaluate(f["value"], symbols) for f in fields]
    assert got == [int(w) for w in want], {f["name"]: (g, int(w)) for f, g, w in zip(fields, got, want) if g != w}


def test_the_inputs_offsets_are_the_runtimes():
    """The manifest's input_NAME values (word offsets in the inputs binding) are what
    args.input_words packs: i32, u8 (4 per word, rounded up) and f16 (widened) inputs."""
    from attngen.backends.wgsl.args import input_words
    spec = spec_of("head_dim 32\n dtype f32\n input shift[b] u8\n input doc[b, q] i32\n input bias[h, k] f16\n"
                   " mask k <= q + shift[b] && doc[b, q] == doc[b, k]\n score s + bias[h, k]")
    plan = attngen.lower(spec, "wgsl", "webgpu-core")
    shapes = dict(q=(3, 5, 4, 32), k=(3, 7, 2, 32), v=(3, 7, 2, 32))
    L = resolve(plan, shapes, dict.fromkeys(shapes, plan.dtype), cores=8)
    rng = np.random.default_rng(0)
    arrays = {"shift": rng.integers(0, 9, 3).astype(np.uint8), "doc": rng.integers(0, 3, (3, 5)).astype(I32),
              "bias": rng.standard_normal((4, 7)).astype(np.float16)}
    words, in_offsets = input_words(spec, arrays)
    assert in_offsets == {"input_shift": 1, "input_doc": 2, "input_bias": 17} and len(words) == 17 + 28
    assert words[0] == 0 and words[1] == int.from_bytes(arrays["shift"].tobytes() + b"\0", "little")
    assert np.array_equal(words[2:17].view(np.int32), arrays["doc"].reshape(-1))
    assert np.array_equal(words[17:].view(np.float32), arrays["bias"].astype(np.float32).reshape(-1))
    _, offsets = meta_words(L)
    want = params_words(plan, L, write_lse=False, offsets={**offsets, **in_offsets}, bm=None)
    fields = emit_plan(plan).manifest["bindings"][0]["fields"]
    symbols = _launch_symbols(plan, L, offsets, False)
    assert [evaluate(f["value"], symbols) for f in fields] == [int(w) for w in want]
