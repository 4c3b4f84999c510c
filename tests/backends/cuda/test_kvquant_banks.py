"""The shared-memory loads of a quantized cache's byte tiles (templates/cuda/math_mma_kvq.j2) against
the 32 banks, lane by lane: for head dims that are multiples of 128 the tiles are whole 128-byte rows
whose 16-byte chunks are permuted (kvquant.chunk_key, the source's kv_chunk_key), elsewhere rows
padded to a residue (kvquant.row_bytes). Each load of Q K^T (a lane's 4J bytes of key row g from
column c0 + 4J t) and of P V (T bytes from column c0 + T g of keys 2t, 2t + 1, 2t + 8, 2t + 9) is
split into the phases the hardware serves together (16-byte accesses: 8 lanes at a time, 8-byte: 16,
smaller: the warp) and no two lanes of a phase may touch the same bank in different words."""

from __future__ import annotations

import re

import pytest

from attngen.api import emit_plan, lower
from attngen.backends.cuda import kvquant

from conftest import spec_of


def _phases(width: int) -> list[range]:
    lanes = {16: 8, 8: 16}.get(width, 32)
    return [range(i, i + lanes) for i in range(0, 32, lanes)]


def _conflicts(addresses: dict[int, int], width: int) -> list:
    """(phase, bank) pairs where two lanes read different words of one bank."""
    bad = []
    for phase in _phases(width):
        words_of_bank: dict[int, set] = {}
        for lane in phase:
            for w in range(max(1, width // 4)):
                word = addresses[lane] // 4 + w
                words_of_bank.setdefault(word % 32, set()).add(word)
        bad += [(phase.start, b) for b, ws in words_of_bank.items() if len(ws) > 1]
    return bad


def _at(row: int, col: int, stride: int, swizzled: bool) -> int:
    return row * stride + ((col ^ (kvquant.chunk_key(row) * 16)) if swizzled else col)


def _loads(kv: str, d: int, swizzled: bool):
    """Every load instruction of both products over one 16-key step: (what, width, {lane: byte address})."""
    k_stride, v_stride = (d, d) if swizzled else kvquant.row_bytes(kv, d, d)
    out = []
    for c0, j in kvquant.k_groups(kv, d):
        for n in range(2):  # two 8-key tiles: rows n * 8 + g
            out.append((f"K c0={c0} n={n}", 4 * j, {4 * g + t: _at(n * 8 + g, c0 + 4 * j * t, k_stride, swizzled)
                                                   for g in range(8) for t in range(4)}))
    for c0, tiles in kvquant.v_groups(d):
        for extra in (0, 1, 8, 9):  # keys 2t + extra of the k16 step
            out.append((f"V c0={c0} key 2t+{extra}", tiles,
                        {4 * g + t: _at(2 * t + extra, c0 + tiles * g, v_stride, swizzled)
                         for g in range(8) for t in range(4)}))
    return out


@pytest.mark.parametrize("kv", ["e4m3", "i8"])
@pytest.mark.parametrize("d", [128, 256])
@pytest.mark.parametrize("swizzled", [True, False], ids=["128-byte-rows", "padded"])
def test_every_load_phase_hits_32_different_banks(kv, d, swizzled):
    for what, width, addresses in _loads(kv, d, swizzled):
        assert not _conflicts(addresses, width), f"{kv} d{d}: {what} ({width} bytes a lane)"


def test_the_model_sees_a_conflict():
    """Unpadded, unpermuted 128-byte rows: rows 0 and 1 of Q K^T's first phase share their banks."""
    _, width, addresses = _loads("e4m3", 128, False)[0]
    unpadded = {lane: (lane // 4) * 128 + 16 * (lane % 4) for lane in range(32)}
    assert _conflicts(unpadded, width) and not _conflicts(addresses, width)


def test_the_source_permutes_as_the_model():
    """The generated kernel's kv_chunk_key is kvquant.chunk_key, row by row; the tiles are 128-byte rows
    (the plan's layout) where the head dims are multiples of 128, padded rows elsewhere."""
    spec = spec_of("head_dim 128\n heads q=8 kv=2\n dtype f16\n schedule split_kv(auto)\n kv_dtype e4m3")
    plan = lower(spec, "cuda", "cuda-sm90")
    assert plan.config.swizzle_kv
    assert {b.name: b.cols for b in plan.config.buffers}["sK"] == 128
    source = emit_plan(plan).source
    body = re.search(r"int kv_chunk_key\(int r\) \{\s*return (.*?);\s*\}", source).group(1)
    assert all(eval(body, {"r": r}) == kvquant.chunk_key(r) for r in range(64))  # noqa: S307 (our own source)
    padded = lower(spec_of("head_dim 96\n dtype f16\n schedule split_kv(auto)\n kv_dtype e4m3"), "cuda", "cuda-sm90")
    assert not padded.config.swizzle_kv and "kv_chunk_key" not in emit_plan(padded).source
