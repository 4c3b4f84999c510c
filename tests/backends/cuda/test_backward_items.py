"""The fast backward's persistent dK/dV grid (backends/cuda/backward_items.py,
templates/cuda/backward_wgmma_dkdv.j2; docs/backward.md): the rendered `work_item` run on the host
with g++ visits every (key block, KV head, batch entry) once, in the order the launcher means
(causal: a chunk's longest key blocks first; otherwise the order of a (key blocks, Hkv, B) grid),
and what `attngen check` says. On a GPU: tests/equivalence/test_backward_wgmma.py
(`test_persistent_items`)."""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import pytest

import attngen
from attngen.backends.cuda import backward, backward_items

from conftest import spec_of

HOST = "#define __device__\n#define __forceinline__ inline\n#include <algorithm>\nusing std::min;\n"


def _plan(mask: str, d: int = 64):
    return attngen.lower(spec_of(f"head_dim {d}\ndtype f16\nmask {mask}", name="e"), "cuda", "cuda-sm90")


def _cut(source: str, start: str) -> str:
    at = source.index(start)
    return source[at:source.index("\n}", at) + 3]


def _work_items(tmp_path, plan, n_kb: int, heads_kv: int, batch: int, len_q: int) -> tuple[list, tuple]:
    """[(kb, hk, b)] in item order, from the rendered work_item, and the launch's grid."""
    source = backward.render_backward(plan)
    program = (HOST + _cut(source, "struct Work {") + _cut(source, "struct Item {")
               + _cut(source, "__device__ __forceinline__ Item work_item(")
               + 'extern "C" void run(const Work* w, int* out) {\n'
                 "    for (int i = 0; i < w->n_items; ++i) {\n"
                 "        const Item it = work_item(*w, i);\n"
                 "        out[3 * i] = it.kb, out[3 * i + 1] = it.hk, out[3 * i + 2] = it.b;\n"
                 "    }\n}\n")
    (tmp_path / "w.cpp").write_text(program)
    subprocess.run(["g++", "-std=c++17", "-O1", "-shared", "-fPIC", "-o", str(tmp_path / "w.so"),
                    str(tmp_path / "w.cpp")], check=True, capture_output=True)
    lib = ctypes.CDLL(str(tmp_path / "w.so"))
    work, grid = backward_items.work(plan, n_kb, heads_kv, batch, len_q, 1, 132)
    out = np.zeros(3 * work.n_items, np.int32)
    lib.run(ctypes.byref(work), out.ctypes.data_as(ctypes.c_void_p))
    return [tuple(x) for x in out.reshape(-1, 3)], grid


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ on PATH")
@pytest.mark.parametrize("mask", ["none", "causal", "causal(bottom_right)"])
@pytest.mark.parametrize("n_kb,heads_kv,batch,len_q", [(8, 40, 3, 1023), (1, 1, 1, 7), (3, 5, 7, 300),
                                                        (128, 2, 1, 16384)])
def test_every_item_once_in_order(tmp_path, mask, n_kb, heads_kv, batch, len_q):
    plan = _plan(mask)
    items, grid = _work_items(tmp_path, plan, n_kb, heads_kv, batch, len_q)
    want = sorted((kb, hk, b) for kb in range(n_kb) for hk in range(heads_kv) for b in range(batch))
    assert sorted(items) == want and len(items) == len(want)
    assert grid == (min(len(want), 132), 1, 1)
    chunk = backward_items.chunk_pairs(plan, len_q, 1)
    if mask == "none":
        assert chunk == 1 and items == [(kb, hk, b) for b in range(batch) for hk in range(heads_kv) for kb in range(n_kb)]
    else:  # within a chunk of pairs, key block by key block: the longest first
        assert chunk >= 1
        pairs = [b * heads_kv + hk for _, hk, b in items]
        per = chunk * n_kb
        for c in range(0, len(items), per):
            kbs = [kb for kb, _, _ in items[c:c + per]]
            assert kbs == sorted(kbs)
            assert len(set(pairs[c:c + per])) == min(chunk, heads_kv * batch - c // n_kb)


def test_causal_chunks_fit_the_l2_share():
    plan = _plan("causal", 128)
    assert backward_items.chunk_pairs(plan, 1024, 1) == (16 << 20) // (1024 * (256 * 2 + 4 * 128))
    assert backward_items.chunk_pairs(plan, 1 << 20, 4) == 1  # one pair more than the share: still one
    assert backward_items.chunk_pairs(_plan("window(left=64, right=0)"), 1024, 1) == 1


def test_check_names_the_persistent_grid():
    text = "\n".join(backward.describe_backward(_plan("causal")))
    assert "persistent: min(SMs, items) blocks x 256 threads taking the items (ceil(Lk / 128), Hkv, B) longest first" in text
    assert "longest first" not in "\n".join(backward.describe_backward(_plan("none")))


def test_the_tail_copies_the_next_item_except_custom_at_head_dim_128():
    for mask, d, staged in (("causal", 128, True), ("none", 64, True), ("custom", 64, True), ("custom", 128, False)):
        plan = _plan(mask, d)
        assert backward_items.stage_next(plan) == staged
        assert ("bool staged = false;" in backward.render_backward(plan)) == staged
