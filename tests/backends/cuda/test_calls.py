"""Calls without Python work that can be done once, and integer inputs left on the GPU
(docs/cuda-calls.md): a call's checks run once per signature, device kv_lens / cu_seqlens /
block tables are never read on the host (a captured stream would refuse the copy), and what is
wrong in them comes back as a LaunchError from the device's error flag.

The Packed layout test runs anywhere; the rest need a GPU with CuPy (the GPU machine).
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

import attngen
from attngen.backends.cuda.launch import Packed, workspace_layout
from attngen.plan.kernel_plan import Param
from attngen.reference import reference, relative_error, tolerance

from conftest import _to_numpy, cuda_available, kernel_for, random_qkv, spec_of


class _Fn:
    ptr = 1234


class _Driver:
    def __init__(self):
        self.calls = []

    def launchKernel(self, fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra):  # noqa: N802
        self.calls.append((fn, (gx, gy, gz), bx, smem, stream, params, extra))


def test_packed_parameters_follow_the_c_layout():
    """Scalars in place, an i64 after an i32 at the next multiple of 8, tensors as slots."""
    params = (Param("q", "tensor", "f16", ()), Param("n", "scalar", "i32", ()), Param("s", "scalar", "i64", ()),
              Param("lse", "tensor", "f32", (), "write", True), Param("m", "scalar", "i32", ()),
              Param("errors", "tensor", "i32", (), "write", True))
    p = Packed(_Fn(), (3, 2, 1), 128, 4096, params, {"n": 7, "s": -5, "m": 9, "errors": 0xABC}, frozenset({"q", "lse"}))
    assert p.struct.size == 8 + 4 + 4 + 8 + 8 + 4 + 4 + 8  # q, n, pad, s, lse, m, pad, errors
    drv = _Driver()
    p.launch(drv, {"q": 0x1000, "lse": None}, stream=77)
    (fn, grid, threads, smem, stream, params_ptr, extra), = drv.calls
    assert (fn, grid, threads, smem, stream, extra) == (1234, (3, 2, 1), 128, 4096, 77, 0)
    offsets = [int(a) - p.buffer.ctypes.data - p.start for a in p.params]
    assert offsets == [0, 8, 16, 24, 32, 40]
    raw = p.buffer.tobytes()[p.start:]
    assert struct.unpack_from("<Q", raw, 0)[0] == 0x1000 and struct.unpack_from("<i", raw, 8)[0] == 7
    assert struct.unpack_from("<q", raw, 16)[0] == -5 and struct.unpack_from("<Q", raw, 24)[0] == 0
    assert struct.unpack_from("<i", raw, 32)[0] == 9 and struct.unpack_from("<Q", raw, 40)[0] == 0xABC


def test_workspaces_share_one_aligned_buffer():
    layout, total = workspace_layout({"ws_o": 4 * 2 * 3 * 5, "ws_lse": 4 * 2 * 3})
    assert layout == [("ws_o", 0), ("ws_lse", 256)] and total == 512


def test_zeroed_buffers_are_kept_per_stream_and_grown():
    """The fused combine's tile counters (launcher.ZeroedBuffers): one zeroed buffer per (GPU,
    stream), grown when a call needs more, never shared by two streams, and never by a captured
    call (its buffer is its own and kept: a graph may replay at any time). The stream handles are
    made up."""
    from attngen.backends.cuda.launch import ZeroedBuffers

    class _Arr:
        def __init__(self, n):
            self.size, self.data = n, type("D", (), {"ptr": 4096 * (len(made) + 1)})()

    made = []
    zb = ZeroedBuffers()
    zeros = lambda n: made.append(n) or _Arr(n)  # noqa: E731
    a = zb.get("cupy", 0, 11, 10, zeros)
    assert zb.get("cupy", 0, 11, 7, zeros) == a and made == [10]  # big enough: the same buffer
    assert zb.get("cupy", 0, 12, 7, zeros) != a                   # another stream: its own
    b = zb.get("cupy", 0, 11, 15, zeros)                          # grown (at least doubled)
    assert b != a and made == [10, 7, 20]
    c1 = zb.get("cupy", 0, 11, 7, zeros, captured=True)           # a capture: a buffer of its own
    c2 = zb.get("cupy", 0, 11, 7, zeros, captured=True)           # each capture
    assert len({b, c1, c2}) == 3 and made == [10, 7, 20, 7, 7]
    assert [a.data.ptr for a in zb._captured] == [c1, c2]         # kept: a graph may replay any time
    assert zb.get("cupy", 0, 11, 15, zeros) == b                  # the stream's buffer is unchanged


def test_split_kv_merges_in_the_main_kernel_and_two_pass_launches_a_combine():
    """split_kv's combine is fused (one launch, tile_counters); two_pass keeps its combine launch;
    `attngen check` says which (CPU: plans only)."""
    from attngen import backends
    from attngen.api import lower as plan

    get_backend = backends.get
    fused = plan(spec_of("head_dim 128\n heads q=32 kv=8\n dtype f16\n schedule split_kv(auto)"), "cuda", "cuda-sm90")
    assert [e.name for e in fused.entries] == []
    assert [w.name for w in fused.workspaces if w.persistent] == ["tile_counters"]
    assert any(p.name == "tile_counters" for p in fused.params)
    lines = get_backend("cuda").describe(fused)
    assert any(line.startswith("combine: fused, one launch") for line in lines)
    two = plan(spec_of("head_dim 128\n heads q=32 kv=8\n dtype f16\n schedule two_pass"), "cuda", "cuda-sm90")
    assert [e.name for e in two.entries] == ["pv", "combine"]
    assert not any(w.persistent for w in two.workspaces)
    assert "combine: a second launch (two_pass)" in get_backend("cuda").describe(two)


gpu = pytest.mark.skipif(not cuda_available(), reason="no CUDA GPU with CuPy here")


@gpu
def test_fused_combine_leaves_its_counters_at_zero_over_many_calls():
    """Calls of different shapes and split counts on one stream share its tile counters: each
    call's last split blocks reset them, so every call is right and the buffer ends at zero."""
    cupy = _cupy()
    from attngen.backends.cuda.launch import ZEROED
    rng = np.random.default_rng(21)
    for sched in ("split_kv(auto)", "split_kv(3)", "split_kv(7)"):
        spec = spec_of(f"head_dim 64\n heads q=14 kv=2\n dtype f16\n schedule {sched}", name="fused_combine")
        kernel = attngen.compile(spec, target="cuda")
        for b, lq, lk in ((1, 1, 1), (3, 1, 1023), (2, 7, 113), (5, 1, 4099), (1, 2, 64)):
            q, k, v = random_qkv(spec, b, lq, lk, heads_q=14, heads_kv=2, seed=int(rng.integers(1 << 30)))
            out, lse = kernel(*(cupy.asarray(a.astype(np.float16)) for a in (q, k, v)), return_lse=True)
            _check(spec, out, q, k, v)
            ref_lse = reference(spec, q, k, v, return_lse=True)[1]
            np.testing.assert_allclose(_to_numpy(lse), ref_lse, rtol=2e-3, atol=2e-3)
    cupy.cuda.Device().synchronize()
    stream = cupy.cuda.get_current_stream().ptr
    held = [arr for (kind, dev, st), (_, _, arr) in ZEROED._by_stream.items() if st == stream and kind == "cupy"]
    assert held and all(int(abs(a).sum()) == 0 for a in held)


def _cupy():
    import cupy
    return cupy


def _check(spec, out, *args, **kw):
    ref = reference(spec, *args, **kw)
    assert relative_error(_to_numpy(out), ref) <= tolerance(spec)


@gpu
def test_one_signature_is_checked_once_and_every_call_is_right():
    cupy = _cupy()
    spec = spec_of("head_dim 64\n dtype f16\n mask causal")
    kernel = attngen.compile(spec, target="cuda")
    for seed in range(3):  # same shapes, new data (and new addresses) each time
        q, k, v = random_qkv(spec, 2, 113, 113, heads_q=6, heads_kv=2, seed=seed)
        out = kernel(*(cupy.asarray(a.astype(np.float16)) for a in (q, k, v)))
        _check(spec, out, q, k, v)
    assert len(kernel._recipes) == 1
    q, k, v = random_qkv(spec, 1, 7, 7, heads_q=6, heads_kv=2, seed=9)  # a new signature
    _check(spec, kernel(*(cupy.asarray(a.astype(np.float16)) for a in (q, k, v))), q, k, v)
    assert len(kernel._recipes) == 2


@gpu
def test_a_given_out_that_overlaps_an_input_is_refused_on_the_fast_path_too():
    cupy = _cupy()
    spec = spec_of("head_dim 64\n dtype f16")
    kernel = attngen.compile(spec, target="cuda")
    q, k, v = (cupy.asarray(a.astype(np.float16)) for a in random_qkv(spec, 1, 16, 16, heads_q=2, heads_kv=2))
    kernel(q, k, v, out=cupy.empty_like(q))
    with pytest.raises(attngen.LaunchError, match="out overlaps q"):
        kernel(q, k, v, out=q)


def _decode_case(paged: bool, seed=0):
    spec = spec_of("head_dim 64\n dtype f16\n schedule split_kv(auto)"
                   + ("\n kv_cache paged(page=16)" if paged else ""))
    rng = np.random.default_rng(seed)
    b, hq, hkv, cap = 3, 6, 2, 96
    lens = np.array([5, 96, 41], np.int32)
    q = rng.standard_normal((b, 1, hq, 64)).astype(np.float32)
    if paged:
        pages = 3 * (cap // 16)
        k = rng.standard_normal((pages, 16, hkv, 64)).astype(np.float32)
        v = rng.standard_normal((pages, 16, hkv, 64)).astype(np.float32)
        table = rng.permutation(pages).astype(np.int32).reshape(b, cap // 16)
        return spec, q, k, v, lens, table
    k = rng.standard_normal((b, cap, hkv, 64)).astype(np.float32)
    v = rng.standard_normal((b, cap, hkv, 64)).astype(np.float32)
    return spec, q, k, v, lens, None


@gpu
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_device_integer_inputs_are_not_read_on_the_host(paged):
    """The call is captured into a CUDA graph: a device-to-host copy or a synchronisation in it
    would fail the capture. The replay gives the reference's answer."""
    cupy = _cupy()
    spec, q, k, v, lens, table = _decode_case(paged)
    kernel = attngen.compile(spec, target="cuda")
    dq, dk, dv = (cupy.asarray(a.astype(np.float16)) for a in (q, k, v))
    opts = {"kv_lens": cupy.asarray(lens)}
    if paged:
        opts["block_table"] = cupy.asarray(table)
    kernel(dq, dk, dv, **opts)  # the first call of a signature loads the module and plans the launch
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        out = kernel(dq, dk, dv, **opts)
        graph = stream.end_capture()
    graph.launch(stream)
    stream.synchronize()
    kw = {"kv_lens": lens} | ({"block_table": table} if paged else {})
    _check(spec, out, q, k, v, **kw)
    with stream:  # an eager call on the stream that was captured (the fused combine's counters)
        eager = kernel(dq, dk, dv, **opts)
    stream.synchronize()
    _check(spec, eager, q, k, v, **kw)
    graph.launch(stream)  # and the graph again, after it
    stream.synchronize()
    _check(spec, out, q, k, v, **kw)


@gpu
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_a_captured_call_keeps_its_buffers_from_later_allocations(paged):
    """A graph's replays write the captured call's workspace and count in its tile counters long
    after the call returned, so neither may go back to the memory pool. They did (CuPy): the next
    allocation on the stream (the stream's own counter buffer, made by the eager call after the
    capture) was carved from the workspace, each replay wrote partial results over it, and the
    next capture on a stream of the same handle counted from that garbage and merged nothing
    (benchmarks/NOTES.md, 2026-11-27, fourth session; one replay in five wrong in
    benchmarks/tools/stress_graph_replay.py).
    Here: new streams round after round (their handles are reused), every step checked, and
    arrays filled on the stream after each capture that no replay may touch."""
    cupy = _cupy()
    for seed in range(40):
        spec, q, k, v, lens, table = _decode_case(paged, seed)
        kernel = attngen.compile(spec, target="cuda")
        dq, dk, dv = (cupy.asarray(a.astype(np.float16)) for a in (q, k, v))
        opts = {"kv_lens": cupy.asarray(lens)} | ({"block_table": cupy.asarray(table)} if paged else {})
        kw = {"kv_lens": lens} | ({"block_table": table} if paged else {})
        first = kernel(dq, dk, dv, **opts)
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            stream.begin_capture()
            out = kernel(dq, dk, dv, **opts)
            graph = stream.end_capture()
            sentinels = [cupy.full(n, 7.0, cupy.float32) for n in (64, 1024, 4096, 16384)]
        graph.launch(stream)
        stream.synchronize()
        _check(spec, first, q, k, v, **kw)
        _check(spec, out, q, k, v, **kw)
        with stream:
            eager = kernel(dq, dk, dv, **opts)
        graph.launch(stream)
        stream.synchronize()
        _check(spec, eager, q, k, v, **kw)
        _check(spec, out, q, k, v, **kw)
        assert all(bool((s == 7.0).all()) for s in sentinels), f"round {seed}: a replay wrote outside its buffers"
        del graph, stream


@gpu
def test_a_host_integer_array_in_a_captured_call_is_a_clear_error():
    """A host kv_lens must be copied up, and a capture cannot hold that copy (CuPy said only
    "the current stream is capturing, so H2D transfers are disallowed"); the capture stays
    usable."""
    cupy = _cupy()
    spec, q, k, v, lens, table = _decode_case(True)
    kernel = attngen.compile(spec, target="cuda")
    dq, dk, dv = (cupy.asarray(a.astype(np.float16)) for a in (q, k, v))
    dlens, dtable = cupy.asarray(lens), cupy.asarray(table)
    kernel(dq, dk, dv, kv_lens=dlens, block_table=dtable)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        try:
            with pytest.raises(attngen.LaunchError, match=r"kv_lens is a host array.*captured into a CUDA graph"):
                kernel(dq, dk, dv, kv_lens=lens, block_table=dtable)
            out = kernel(dq, dk, dv, kv_lens=dlens, block_table=dtable)
        finally:
            graph = stream.end_capture()
    graph.launch(stream)
    stream.synchronize()
    _check(spec, out, q, k, v, kv_lens=lens, block_table=table)


@gpu
def test_strided_integer_inputs_are_copied_and_the_copy_outlives_the_launch():
    """A strided kv_lens / block_table is copied to a contiguous array; the copy must live until
    the launch is queued (freed before, its memory could become the call's own out, lse or
    workspace while the kernels read it) and, in a captured call, for as long as the graph."""
    cupy = _cupy()
    spec, q, k, v, lens, table = _decode_case(True)
    kernel = attngen.compile(spec, target="cuda")
    dq, dk, dv = (cupy.asarray(a.astype(np.float16)) for a in (q, k, v))
    wide = cupy.zeros((len(lens), 2), cupy.int32)
    wide[:, 0] = cupy.asarray(lens)
    dlens = wide[:, 0]  # a strided view
    wide_t = cupy.zeros((table.shape[0], 2 * table.shape[1]), cupy.int32)
    wide_t[:, ::2] = cupy.asarray(table)
    dtable = wide_t[:, ::2]  # a strided table
    kw = {"kv_lens": lens, "block_table": table}
    for _ in range(20):
        out, lse = kernel(dq, dk, dv, kv_lens=dlens, block_table=dtable, return_lse=True)
        _check(spec, out, q, k, v, **kw)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        out = kernel(dq, dk, dv, kv_lens=dlens, block_table=dtable)
        graph = stream.end_capture()
        junk = [cupy.full(n, 7, cupy.int32) for n in (8, 64, 512, 4096)]
    for _ in range(3):
        graph.launch(stream)
        stream.synchronize()
        _check(spec, out, q, k, v, **kw)
    assert all(bool((j == 7).all()) for j in junk)


@gpu
def test_a_mask_that_is_not_a_block_mask_in_a_captured_call_is_a_clear_error():
    """Building a BlockMask reads the mask on the host, which a capture cannot hold."""
    cupy = _cupy()
    spec = spec_of("head_dim 64\n dtype f16\n mask custom")
    kernel = attngen.compile(spec, target="cuda")
    q, k, v = random_qkv(spec, 1, 64, 64, heads_q=2, heads_kv=2, seed=3)
    dq, dk, dv = (cupy.asarray(a.astype(np.float16)) for a in (q, k, v))
    host = np.tril(np.ones((1, 1, 64, 64), bool))
    dense = cupy.asarray(host)
    bm = kernel.block_mask(dense)
    kernel(dq, dk, dv, mask=bm)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        try:
            with pytest.raises(attngen.LaunchError, match=r"mask is not a BlockMask.*captured into a CUDA graph"):
                kernel(dq, dk, dv, mask=dense)
            out = kernel(dq, dk, dv, mask=bm)
        finally:
            graph = stream.end_capture()
    graph.launch(stream)
    stream.synchronize()
    _check(spec, out, q, k, v, mask=host)


BAD_DEVICE = [
    ("kv_lens past the cache", False, {"kv_lens": [5, 97, 41]}, r"kv_lens\[1\]"),
    ("negative kv_lens", False, {"kv_lens": [5, 3, -1]}, r"kv_lens\[2\]"),
    ("page outside", True, {"table_entry": (2, 1, 999)}, "block_table row 2"),
    ("negative page", True, {"table_entry": (0, 0, -3)}, "block_table row 0"),
]


@gpu
@pytest.mark.parametrize("case", BAD_DEVICE, ids=lambda c: c[0])
def test_bad_device_integers_are_reported(case):
    cupy = _cupy()
    _, paged, change, message = case
    spec, q, k, v, lens, table = _decode_case(paged)
    kernel = attngen.compile(spec, target="cuda")
    dq, dk, dv = (cupy.asarray(a.astype(np.float16)) for a in (q, k, v))
    lens = np.array(change.get("kv_lens", lens), np.int32)
    opts = {"kv_lens": cupy.asarray(lens)}
    if paged:
        table = table.copy()
        if "table_entry" in change:
            b, j, page = change["table_entry"]
            table[b, j] = page
        opts["block_table"] = cupy.asarray(table)
    with pytest.raises(attngen.LaunchError, match=message):
        kernel(dq, dk, dv, check=True, **opts)
    # without check=True the next attngen call raises it
    kernel(dq, dk, dv, **opts)
    cupy.cuda.Device().synchronize()
    with pytest.raises(attngen.LaunchError, match="earlier attngen call.*" + message):
        kernel(dq, dk, dv, **opts)
    cupy.cuda.Device().synchronize()
    with pytest.raises(attngen.LaunchError):
        kernel(dq, dk, dv, check=True, **opts)  # (the last call's report)
    good = {"kv_lens": cupy.asarray(_decode_case(paged)[4])}
    if paged:
        good["block_table"] = cupy.asarray(_decode_case(paged)[5])
    out = kernel(dq, dk, dv, check=True, **good)  # a good call after the errors: nothing pending
    # and a right one: the calls with bad inputs left the fused combine's counters at zero
    _check(spec, out, q, k, v, kv_lens=_decode_case(paged)[4], **({"block_table": _decode_case(paged)[5]} if paged else {}))


@gpu
@pytest.mark.parametrize("cu, message", [
    ([0, 6, 4, 10], r"cu_seqlens_q\[1\]"),
    ([0, 4, 11], r"cu_seqlens_q\[1\]"),
    ([-2, 4, 10], r"cu_seqlens_q\[0\]"),
], ids=["decreasing", "past the end", "negative"])
def test_bad_device_cu_seqlens_are_reported(cu, message):
    """(The _varlen entry of this spec is the producer kernel with persistent blocks: a sequence
    that fails the check is an empty work item, and the launch leaves the work counter at zero, so
    the next call is right.)"""
    cupy = _cupy()
    spec = spec_of("head_dim 32\n dtype f16")
    kernel = attngen.compile(spec, target="cuda")
    assert kernel.plan.config.varlen.persistent
    rng = np.random.default_rng(0)
    host = [rng.standard_normal((10, 2, 32)).astype(np.float32) for _ in range(3)]
    q, k, v = (cupy.asarray(a.astype(np.float16)) for a in host)
    with pytest.raises(attngen.LaunchError, match=message):
        kernel(q, k, v, cu_seqlens_q=cupy.asarray(np.array(cu, np.int32)), check=True)
    good = np.array([0, 4, 10], np.int32)
    out = kernel(q, k, v, cu_seqlens_q=cupy.asarray(good), check=True)
    _check(spec, out, *host, cu_seqlens_q=good)


@gpu
def test_max_seqlen_bounds_the_grid_and_a_longer_sequence_is_reported():
    cupy = _cupy()
    spec = spec_of("head_dim 32\n dtype f16\n mask causal")
    kernel = attngen.compile(spec, target="cuda")
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((40, 2, 32)).astype(np.float32) for _ in range(3))
    cu = np.array([0, 7, 30, 40], np.int32)
    dq, dk, dv = (cupy.asarray(a.astype(np.float16)) for a in (q, k, v))
    out = kernel(dq, dk, dv, cu_seqlens_q=cupy.asarray(cu), max_seqlen_q=23, max_seqlen_k=23, check=True)
    _check(spec, out, q, k, v, cu_seqlens_q=cu)
    out = kernel(dq, dk, dv, cu_seqlens_q=cupy.asarray(cu), check=True)  # bound: the 40 rows
    _check(spec, out, q, k, v, cu_seqlens_q=cu)
    with pytest.raises(attngen.LaunchError, match=r"cu_seqlens_q\[1\]"):
        kernel(dq, dk, dv, cu_seqlens_q=cupy.asarray(cu), max_seqlen_q=20, max_seqlen_k=20, check=True)
    with pytest.raises(attngen.LaunchError, match="max_seqlen_q=20, but cu_seqlens holds a sequence of 23"):
        kernel(dq, dk, dv, cu_seqlens_q=cu, max_seqlen_q=20)  # host arrays are checked at once


@gpu
def test_device_integers_must_be_int32():
    cupy = _cupy()
    spec, q, k, v, lens, _ = _decode_case(False)
    kernel = attngen.compile(spec, target="cuda")
    dq, dk, dv = (cupy.asarray(a.astype(np.float16)) for a in (q, k, v))
    with pytest.raises(attngen.LaunchError, match="kv_lens is a device tensor of int64"):
        kernel(dq, dk, dv, kv_lens=cupy.asarray(lens.astype(np.int64)))


@gpu
def test_plain_torch_calls_take_the_short_path_and_every_check_still_holds():
    """A call with q, k and v alone as torch tensors (CudaKernel.__call__'s short path, keyed by
    _qkv_signature): new data and addresses each call stay right; another layout, a misaligned
    view, the wrong dtype or shape after the path is warm are each checked as on the first call."""
    torch = pytest.importorskip("torch")
    spec = spec_of("head_dim 64\n dtype f16\n mask causal")
    kernel = attngen.compile(spec, target="cuda")

    def t(a):
        return torch.from_numpy(np.ascontiguousarray(a)).cuda().half()

    for seed in range(4):  # same signature, new data and addresses: the third call on is the short path
        q, k, v = random_qkv(spec, 2, 113, 113, heads_q=6, heads_kv=2, seed=seed)
        out = kernel(t(q), t(k), t(v))
        assert out.dtype == torch.float16 and out.shape == (2, 113, 6, 64) and out.is_contiguous()
        _check(spec, out.float().cpu().numpy(), q, k, v)
    assert len(kernel._recipes) == 2  # _call's key and the short path's, for one recipe
    q, k, v = random_qkv(spec, 2, 113, 113, heads_q=6, heads_kv=2, seed=7)
    # other strides, same shapes: k as a view of a (B, Hkv, L, D) tensor
    kt = t(np.ascontiguousarray(k.transpose(0, 2, 1, 3))).transpose(1, 2)
    _check(spec, kernel(t(q), kt, t(v)).float().cpu().numpy(), q, k, v)
    # q of other strides than out's: out is still row-major
    qv = t(np.ascontiguousarray(q.transpose(0, 2, 1, 3))).transpose(1, 2)
    for _ in range(3):
        out = kernel(qv, t(k), t(v))
        assert out.is_contiguous()
        _check(spec, out.float().cpu().numpy(), q, k, v)
    # a view one element into its storage: not 16-byte aligned (copied, never cached)
    flat = torch.empty(q.size + 1, dtype=torch.float16, device="cuda")
    qm = flat[1:].view(q.shape)
    qm.copy_(t(q))
    for _ in range(3):
        _check(spec, kernel(qm, t(k), t(v)).float().cpu().numpy(), q, k, v)
    with pytest.raises(attngen.LaunchError):
        kernel(t(q).float(), t(k).float(), t(v).float())
    with pytest.raises(attngen.LaunchError):
        kernel(t(q)[:, :, :5], t(k), t(v))  # 5 query heads over 2 KV heads
    assert kernel(t(q), t(k), t(v)).shape == (2, 113, 6, 64)
