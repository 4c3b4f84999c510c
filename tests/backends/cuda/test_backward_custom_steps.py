"""The fast CUDA backward's `mask custom` step (templates/cuda/backward_wgmma_steps.j2), without a
GPU: the rendered `lane_words` (a step's mask bits, per lane, in the bit order the probabilities
test them) and the `Steps` walk over the key-block lists (an entry read one step ahead) run on the
host with g++ against numpy; the boolean and additive masks' dK/dV entry points compile (NVRTC,
sm_90a) with no more spills than mask none's. The results on a GPU: tests/equivalence/
test_backward_wgmma.py (custom masks, boolean and additive)."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess

import numpy as np
import pytest

import attngen
from attngen.backends.cuda import backward, nvrtc

from conftest import nvrtc_compile, spec_of

GXX = shutil.which("g++")
HOST = ("#include <cstring>\n#define __device__\n#define __forceinline__ inline\n"
        "struct Dim { unsigned x; };\nstatic Dim threadIdx;\n"
        "inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }\n"
        "constexpr int kThreads = 256, kBlockN = 128, kBlockM = 64;\n")


def _source(body: str) -> str:
    return backward.render_backward(attngen.lower(spec_of(body, name="e"), "cuda", "cuda-sm90"))


def _cut(source: str, start: str) -> str:
    """The definition that begins with `start` up to its closing brace at column 0."""
    at = source.index(start)
    return source[at:source.index("\n}", at) + 3]


def _library(tmp_path, program: str):
    (tmp_path / "h.cpp").write_text(program)
    subprocess.run(["g++", "-std=c++17", "-O1", "-shared", "-fPIC", "-o", str(tmp_path / "h.so"),
                    str(tmp_path / "h.cpp")], check=True, capture_output=True)
    return ctypes.CDLL(str(tmp_path / "h.so"))


def _ptr(a):
    return a.ctypes.data_as(ctypes.c_void_p)


@pytest.mark.skipif(GXX is None, reason="no g++ on PATH")
@pytest.mark.parametrize("any_bad", [False, True])
def test_lane_words_hold_the_bits_the_probabilities_test(tmp_path, any_bad):
    """Bit 4 n + e of a lane's first word is whether row c = 8 n + 2 t + (e & 1) of the step sees key
    r = 16 wi + g + 8 (e >= 2) of its warpgroup (the element s[n][e] of probabilities / recompute),
    hidden past len_k; the second word marks the visible ones whose key is flagged non-finite on a
    row with a finite lse (NaN), none without any_bad."""
    source = _source("head_dim 64\ndtype f16\nmask custom")
    lib = _library(tmp_path, HOST + "constexpr int kOffsetBits = 0, kOffsetRows = 2 * kThreads * 4;\n"
                   "constexpr int kOffsetBad = kOffsetRows + 2 * 2 * kBlockM * 4, kOffsetLanes = kOffsetBad + kBlockN;\n"
                   + _cut(source, "__device__ __forceinline__ void lane_words(")
                   + 'extern "C" void run(unsigned char* smem, int st, int any_bad, int j0, int len_k) {\n'
                   "    for (unsigned x = 0; x < kThreads; ++x) {\n"
                   "        threadIdx.x = x;\n"
                   "        const int warp = x / 32, w = warp / 4;\n"
                   "        lane_words(smem, st, any_bad, j0 + 64 * w, len_k, w, warp % 4, x % 32);\n"
                   "    }\n}\n")
    rng = np.random.default_rng(5)
    st, j0, len_k = 1, 256, 256 + 101  # the block's last 27 keys past the sequence
    smem = np.zeros(2 * 256 * 4 + 2 * 2 * 64 * 4 + 128 + 2 * 256 * 4, np.uint8)
    bits = rng.integers(0, 2**32, (2, 64, 4), dtype=np.uint64).astype(np.uint32)  # (stage, row, word)
    lse = np.where(rng.random(64) < 0.2, np.inf, rng.standard_normal(64)).astype(np.float32)
    bad = (rng.random(128) < 0.1).astype(np.uint8)
    smem[:2 * 256 * 4] = bits.view(np.uint8).ravel()
    rows_at = 2 * 256 * 4 + st * 2 * 64 * 4
    smem[rows_at:rows_at + 256] = lse.view(np.uint8)
    smem[2 * 256 * 4 + 2 * 2 * 64 * 4:][:128] = bad
    lib.run(_ptr(smem), st, int(any_bad), j0, len_k)
    words = smem[-2 * 256 * 4:].view(np.uint32)
    for x in range(256):
        w, wi, g, t = x // 128, (x // 32) % 4, (x % 32) // 4, x % 4
        for n in range(8):
            for e in range(4):
                r, c = 16 * wi + g + (8 if e >= 2 else 0), 8 * n + 2 * t + (e & 1)
                key = 64 * w + r
                seen = bool((int(bits[st, c, key // 32]) >> (key % 32)) & 1) and j0 + key < len_k
                nan = seen and any_bad and bool(bad[key]) and np.isfinite(lse[c])
                assert (int(words[x]) >> (4 * n + e)) & 1 == seen, (x, n, e)
                assert (int(words[256 + x]) >> (4 * n + e)) & 1 == nan, (x, n, e)


@pytest.mark.skipif(GXX is None, reason="no g++ on PATH")
def test_steps_walk_the_key_block_lists(tmp_path):
    """first / next visit, for each head of the GQA group in turn, the entries of its key-block list
    whose rows start inside the sequence, in order (step * 2 + partial), whatever the lists hold past
    their counts; empty lists and lists whose later steps are past the rows included."""
    source = _source("head_dim 64\ndtype f16\nheads q=12 kv=3\nmask custom")
    steps = _cut(source, "struct Step {") + _cut(source, "struct Steps {")
    lib = _library(tmp_path, HOST + "struct Args { const int* block_counts; const int* block_lists; "
                   "long long blist_sb, blist_sh, n_steps; };\n" + steps
                   + 'extern "C" int run(const int* counts, const int* lists, long long sb, long long sh, long long n,\n'
                   "                    int b, int hk, int kb, int group, int len_q, int* out) {\n"
                   "    const Args a{counts, lists, sb, sh, n};\n"
                   "    Steps steps;\n"
                   "    steps.group = group;\n    steps.len_q = len_q;\n"
                   "    steps.b = b;\n    steps.hk = hk;\n    steps.kb = kb;\n"
                   "    Step s;\n    int k = 0;\n"
                   "    for (bool more = steps.first(a, s); more; more = steps.next(a, s), ++k) {\n"
                   "        out[3 * k] = s.g;\n        out[3 * k + 1] = s.i0;\n        out[3 * k + 2] = s.elem;\n"
                   "    }\n    return k;\n}\n")
    rng = np.random.default_rng(11)
    nb, nh, nkb, n = 2, 12, 5, 9  # (mask batch, mask head, key block, steps)
    for trial in range(40):
        counts = rng.integers(0, n + 1, (nb, nh, nkb)).astype(np.int32)
        counts[rng.random(counts.shape) < 0.2] = 0
        lists = rng.integers(-7, 40, (nb, nh, nkb, n)).astype(np.int32)  # (past the counts: anything)
        for at in np.ndindex(counts.shape):
            chosen = np.sort(rng.choice(n, counts[at], replace=False))
            lists[at][:counts[at]] = chosen * 2 + rng.integers(0, 2, counts[at])
        b, hk, kb, group = trial % nb, trial % 3, trial % nkb, 4
        len_q = int(rng.integers(1, n * 64 + 1))
        want = [(g, (e >> 1) * 64, e & 1) for g in range(group)
                for e in lists[b, hk * group + g, kb, :counts[b, hk * group + g, kb]] if (e >> 1) * 64 < len_q]
        out = np.zeros(3 * group * n, np.int32)
        k = lib.run(_ptr(counts), _ptr(lists), nh * nkb, nkb, n, b, hk, kb, group, len_q, _ptr(out))
        assert [tuple(x) for x in out[:3 * k].reshape(-1, 3)] == want, trial


def _spills(source: str) -> dict:
    _, log = nvrtc_compile(source, "sm_90a")
    return {m.group(1): int(m.group(2)) for m in re.finditer(
        r"Function properties for (\w+)\n[^\n]*?(\d+) bytes spill stores", log)}


@pytest.mark.skipif(not nvrtc.available(), reason="NVRTC not installed (pip install -e '.[test]')")
def test_custom_entries_spill_no_more_than_mask_none():
    """ptxas (NVRTC, sm_90a) at head dim 128: the boolean custom mask's dK/dV entry and the additive
    one's (`_bwd_dkdv_add`) spill about as much as mask none's (72 bytes here; both custom entries
    together spilled 134 before lane_words). A margin of 24 bytes for other ptxas versions."""
    none = _spills(_source("head_dim 128\ndtype f16"))["attngen_e_bwd_dkdv"]
    custom = _spills(_source("head_dim 128\ndtype f16\nmask custom"))
    assert set(custom) >= {"attngen_e_bwd_dkdv", "attngen_e_bwd_dkdv_add"}
    assert custom["attngen_e_bwd_dkdv"] <= none + 24 and custom["attngen_e_bwd_dkdv_add"] <= none + 24, (none, custom)
    text = "\n".join(backward.describe_backward(attngen.lower(spec_of("head_dim 64\ndtype f16\nmask custom", name="e"),
                                                             "cuda", "cuda-sm90")))
    assert "attngen_e_bwd_dkdv_add in its place for an additive mask" in text
