"""Tile skipping from index-only mask expressions on target wgsl (issue 42): mask_expr_tile
(attngen/backends/wgsl/expr.py, i32 intervals) run on the adapter against the Python rules
(attngen.plan.expr_blocks.classify: the same answer, or PARTIAL where the i32 bound drops an
interval, never SKIP or FULL wrongly); the forward and backward kernels that skip SKIP tiles and
take FULL ones without a per-element test against the float64 reference (odd lengths, Lq != Lk,
GQA groups of 3, rows that see no key, kv_lens, packed sequences, split_kv, two_pass, prefetch,
head dims in chunks), and the evidence that they skip, timing-free: the source's calls, the count
of skipped and full tiles at the test's lengths, and kernels whose class is forced (all skipped:
every row sees nothing; all full: mask none's result)."""

from __future__ import annotations

import numpy as np
import pytest

import attngen
from attngen.backends.wgsl.expr import tile_function
from attngen.plan.expr_blocks import FULL, PARTIAL, SKIP, classify
from attngen.reference import reference

from conftest import check_against_reference, kernel_for, random_qkv, require, spec_of

MASKS = {
    "causal": "k <= q",
    "band": "k <= q && q - k < 20",
    "2d neighbourhood": "abs(q // 8 - k // 8) <= 1 && abs(q % 8 - k % 8) <= 1",
    "swin": "q // 9 == k // 9",
    "prefix": "k <= q || k < 7 + b",
    "heads": "where(h % 3 == 0, k <= q, k >= q) || hkv == b",
    "bottom right": "k <= q + Lk - Lq",
    "negative divisor": "(q - k) // -3 >= -2 && k * 2 - q != 7",
    "mod min max clamp": "min(q, 12) - max(k, 2) >= -1 || (q - k) % 5 == 0 || k >= clamp(q - 3, 0, 20)",
    # a constant and products past 2^30: dropped by the i32 intervals (PARTIAL where Python's are exact)
    "large constants": "(k + 1500000000 > q || q * 5000000 > 1100000000) && k <= q",
}


def _expr(text):
    return spec_of(f"head_dim 16\ndtype f32\nmask {text}").mask.expr


def _run_tiles(expr, cases):
    """mask_expr_tile(*case) for each case (b, h0, h1, hkv, q0, q1, k0, k1, Lq, Lk) on the adapter."""
    import wgpu
    from attngen.backends.wgsl.devices import device
    source = (tile_function(expr) + "\n@group(0) @binding(0) var<storage, read_write> out: array<i32>;\n"
              "@group(0) @binding(1) var<storage, read> args: array<i32>;\n"
              "@compute @workgroup_size(64)\nfn main(@builtin(global_invocation_id) id: vec3<u32>) {\n"
              f"    let n = id.x;\n    if (n >= {len(cases)}u) {{\n        return;\n    }}\n"
              "    let a = n * 10u;\n"
              "    out[n] = mask_expr_tile(args[a], args[a + 1u], args[a + 2u], args[a + 3u], args[a + 4u], args[a + 5u],\n"
              "                            args[a + 6u], args[a + 7u], args[a + 8u], args[a + 9u]);\n}\n")
    dev = device()
    module = dev.create_shader_module(code=source)
    out = dev.create_buffer(size=4 * len(cases), usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
    args = dev.create_buffer_with_data(data=np.asarray(cases, np.int32).tobytes(), usage=wgpu.BufferUsage.STORAGE)
    pipeline = dev.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
    group = dev.create_bind_group(layout=pipeline.get_bind_group_layout(0),
                                  entries=[{"binding": 0, "resource": {"buffer": out}},
                                           {"binding": 1, "resource": {"buffer": args}}])
    enc = dev.create_command_encoder()
    p = enc.begin_compute_pass()
    p.set_pipeline(pipeline)
    p.set_bind_group(0, group)
    p.dispatch_workgroups(-(-len(cases) // 64))
    p.end()
    dev.queue.submit([enc.finish()])
    return np.frombuffer(dev.queue.read_buffer(out), np.int32)


def test_mask_expr_tile_on_the_adapter_agrees_with_classify():
    require("wgsl")
    rng = np.random.default_rng(42)
    for name, text in MASKS.items():
        expr = _expr(text)
        cases = []
        for _ in range(300):
            lq, lk = int(rng.integers(1, 300)), int(rng.integers(1, 300))
            q0, k0 = int(rng.integers(0, lq)), int(rng.integers(0, lk))
            q1, k1 = min(lq - 1, q0 + int(rng.integers(0, 40))), min(lk - 1, k0 + int(rng.integers(0, 40)))
            h0 = int(rng.integers(0, 6))
            h1 = h0 + int(rng.integers(0, 3))
            cases.append((int(rng.integers(0, 4)), h0, h1, h0 // 3, q0, q1, k0, k1, lq, lk))
        got = _run_tiles(expr, cases)
        want = np.array([classify(expr, (q0, q1), (k0, k1), lq, lk, b=(b, b), h=(h0, h1), hkv=(hkv, hkv))
                         for b, h0, h1, hkv, q0, q1, k0, k1, lq, lk in cases])
        if name == "large constants":
            # dropped, never guessed: PARTIAL where Python's says FULL, the SKIPs (k > q) kept
            assert ((got == want) | (got == PARTIAL)).all(), name
            assert ((want == FULL) & (got == PARTIAL)).any() and (got == SKIP).any()
        else:
            bad = np.flatnonzero(got != want)  # below the i32 bound: exactly the Python rules
            assert not len(bad), (name, [(cases[i], got[i], want[i]) for i in bad[:5]])
    # an empty range has nothing visible
    assert list(_run_tiles(_expr("k <= q"), [(0, 0, 0, 0, 5, 4, 0, 3, 9, 9), (0, 0, 0, 0, 0, 3, 5, 4, 9, 9)])) == [SKIP, SKIP]


# ---- the kernels --------------------------------------------------------------------------------

SHAPES = [(1, 1, 1), (2, 7, 7), (1, 113, 113), (2, 7, 113), (1, 113, 37)]


def _spec(mask, dtype="f32", heads="q=6 kv=2", score=None, extra=""):
    body = f"head_dim 16\nheads {heads}\ndtype {dtype}\nmask {mask}\ntile q=16 kv=16\n"
    body += f"score {score}\n" if score else ""
    return spec_of(body + extra)


@pytest.mark.parametrize("extra", ["", "schedule split_kv(3)", "schedule two_pass", "target wgsl { prefetch=on }"])
@pytest.mark.parametrize("name", ["band", "2d neighbourhood", "swin", "heads"])
def test_forward_with_skipped_and_full_tiles_matches_the_reference(name, extra):
    require("wgsl")
    spec = _spec(MASKS[name], score="s - 0.125 * abs(q - k)" if name == "band" else None, extra=extra)
    for b, lq, lk in SHAPES:
        q, k, v = random_qkv(spec, b, lq, lk, seed=lq * 17 + lk)
        check_against_reference(spec, "wgsl", q, k, v)


def test_head_dims_in_chunks_with_prefetch():
    """Chunked head dims prefetch the next tile in the last chunk: a skipped tile's successor is
    fetched at the skip instead."""
    require("wgsl")
    for extra in ("target wgsl { prefetch=on }", "target wgsl { prefetch=on }\nschedule two_pass"):
        spec = spec_of("head_dim 512\nheads q=3 kv=1\ndtype f32\nmask k <= q && q - k < 40\ntile q=16 kv=16\n" + extra)
        plan = attngen.lower(spec, target="wgsl")
        assert plan.config.chunked and plan.config.prefetch
        q, k, v = random_qkv(spec, 1, 113, 113, seed=2)
        check_against_reference(spec, "wgsl", q, k, v)


def test_skipped_tiles_are_never_read_and_rows_that_see_no_key_give_zero():
    """Keys of SKIP tiles hold NaN: a kernel that read them into a row would give NaN. Rows
    q < 20 see no key (lse -inf, output 0)."""
    require("wgsl")
    spec = _spec("k <= q - 20 && q - k < 40", heads="q=3 kv=1")
    q, k, v = random_qkv(spec, 2, 113, 90, seed=3)
    ref, ref_lse = reference(spec, q, k, v, return_lse=True)
    out, lse = kernel_for(spec, "wgsl")(q, k, v, return_lse=True)
    np.testing.assert_allclose(np.asarray(out, np.float64), ref, rtol=1e-4, atol=1e-5)
    out, lse = np.asarray(out, np.float64), np.asarray(lse, np.float64)
    assert np.all(out[:, :20] == 0) and np.isneginf(lse[:, :, :20]).all()
    np.testing.assert_allclose(lse[:, :, 20:], ref_lse[:, :, 20:], rtol=1e-5, atol=1e-5)


def _check(spec, q, k, v, kernel=None, **kw):
    """The kernel's out and lse against the reference's (rows that see no key: 0 and -inf)."""
    from attngen.reference import relative_error, tolerance
    ref, ref_lse = reference(spec, q, k, v, return_lse=True, **kw)
    out, lse = (kernel or kernel_for(spec, "wgsl"))(q, k, v, return_lse=True, **kw)
    out, lse = np.asarray(out, np.float64), np.asarray(lse, np.float64)
    assert relative_error(out, ref) <= tolerance(spec)
    empty = np.isneginf(ref_lse)
    assert np.array_equal(np.isneginf(lse), empty) and not np.isnan(lse).any()
    np.testing.assert_allclose(lse[~empty], ref_lse[~empty], rtol=1e-5, atol=1e-5)


def test_kv_lens_and_packed_sequences():
    require("wgsl")
    spec = _spec("k <= q + Lk - Lq && q + Lk - Lq - k < 20", heads="q=3 kv=1")
    q, k, v = random_qkv(spec, 3, 7, 113, seed=4)
    kv_lens = np.array([113, 40, 1], np.int32)
    _check(spec, q, k, v, kv_lens=kv_lens)
    rng = np.random.default_rng(5)
    cu_q, cu_k = np.array([0, 7, 120, 121], np.int32), np.array([0, 30, 143, 144], np.int32)
    q = rng.standard_normal((121, 3, 16)).astype(np.float32)
    k, v = (rng.standard_normal((144, 1, 16)).astype(np.float32) for _ in range(2))
    _check(spec, q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)


# ---- the evidence that tiles are skipped and taken whole (timing-free) --------------------------

def _forced(spec, cls: int):
    """A kernel of `spec` whose mask_expr_tile always answers `cls` (the source edited)."""
    from attngen.backends import get
    from attngen.backends.wgsl import kernel as wgsl_kernel
    backend = get("wgsl")
    real = backend.render

    def render(plan):
        text = real(plan).replace("fn mask_expr_tile(", "fn mask_expr_tile_unused(")
        return text + ("\nfn mask_expr_tile(b: i32, h0: i32, h1: i32, hkv: i32, q0: i32, q1: i32, k0: i32, k1: i32, "
                       f"Lq: i32, Lk: i32) -> i32 {{\n    return {cls}i;\n}}\n")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(backend, "render", render)
        mp.setattr(wgsl_kernel, "_PIPELINES", {})  # (pipelines are cached by spec: neither hit nor kept)
        return wgsl_kernel.compile_kernel(backend, spec)


def test_the_tile_class_decides_what_the_kernel_loads_and_tests():
    """Which tiles a plan skips and takes whole at these lengths (a count from the classification),
    and that the kernel obeys it: with mask_expr_tile forced to 0 every tile is skipped (every row
    sees nothing: 0 and lse -inf), forced to 2 no element is tested (mask none's result)."""
    require("wgsl")
    from attngen.plan.expr_blocks import block_map
    spec = _spec("k <= q && q - k < 40", heads="q=3 kv=1")
    m = block_map(spec.mask.expr, 113, 113, 16, 16)  # the kernel's tiles (tile q=16 kv=16)
    assert [(m == c).sum() for c in (SKIP, PARTIAL, FULL)] == [38, 17, 9]
    src = attngen.emit(spec, target="wgsl").source
    assert "let expr_class = expr_tile(seq, i32(head), i32(head), i32(kv_head), i32(row0), i32(row_end), j0, " in src
    assert "if (expr_class == 0i) {" in src and "let partial = expr_class != 2i ||" in src
    # the skip comes before the tile's loads
    loop = src[src.index("// ---- section: main loop over K/V tiles"):]
    assert loop.index("if (expr_class == 0i)") < loop.index("load_k_tile(")
    q, k, v = random_qkv(spec, 2, 113, 113, seed=8)
    out, lse = _forced(spec, SKIP)(q, k, v, return_lse=True)
    assert not np.asarray(out).any() and np.isneginf(np.asarray(lse)).all()
    none = spec_of("head_dim 16\nheads q=3 kv=1\ndtype f32\ntile q=16 kv=16")
    q, k, v = q[:, :112], k[:, :112], v[:, :112]  # whole tiles (a tile cut at Lk is tested per element)
    want = reference(none, q, k, v)
    got = np.asarray(_forced(spec, FULL)(q, k, v), np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    _check(spec, q, k, v)  # (unforced: the mask's own result)


def test_specs_without_an_index_only_mask_expression_do_not_classify():
    plain = attngen.emit(_spec("causal"), target="wgsl").source
    reads = attngen.emit(spec_of("head_dim 16\ndtype f32\ninput doc[b, q] i32\ninput w[h] f32\n"
                                 "mask k <= q && doc[b, q] == doc[b, k]\nscore s * w[h]"), target="wgsl").source
    for src in (plain, reads):
        assert "mask_expr_tile" not in src and "expr_class" not in src


# ---- the backward -------------------------------------------------------------------------------

BACKWARD = [
    # (mask, B, Lq, Lk, Hq, Hkv): blocks skipped and taken whole in both steps
    ("k <= q && q - k < 40", 2, 113, 113, 6, 2),
    ("abs(q // 8 - k // 8) <= 1 && abs(q % 8 - k % 8) <= 1", 1, 64, 64, 3, 3),
    ("q // 9 == k // 9 || k < 2", 1, 7, 113, 3, 1),
    ("k <= q - 20", 1, 113, 37, 3, 1),  # rows q < 20 see no key
]


@pytest.mark.parametrize("case", BACKWARD, ids=[c[0] for c in BACKWARD])
def test_backward_with_skipped_and_full_blocks_matches_the_reference(case):
    require("wgsl")
    from attngen.reference import reference_backward, relative_error, tolerance
    mask, b, lq, lk, hq, hkv = case
    spec = _spec(mask, heads=f"q={hq} kv={hkv}", score="s - 0.125 * abs(q - k)")
    rng = np.random.default_rng(lq + lk)
    q = rng.standard_normal((b, lq, hq, 16)).astype(np.float32)
    k, v = (rng.standard_normal((b, lk, hkv, 16)).astype(np.float32) for _ in range(2))
    kernel = kernel_for(spec, "wgsl")
    out, lse = kernel(q, k, v, return_lse=True)
    dout = rng.standard_normal(out.shape).astype(np.float32)
    got = kernel.backward(q, k, v, out, lse, dout)
    ref = reference_backward(spec, *(x.astype(np.float64) for x in (q, k, v, dout)))
    for name, g, r in zip(("dq", "dk", "dv"), got, ref):
        assert relative_error(g, r) <= 2 * tolerance(spec), name
    assert np.isfinite(np.asarray(got[0])).all()


def test_backward_source_classifies_its_blocks():
    from attngen.backends.wgsl.emit import backward_source
    plan = attngen.lower(_spec("k <= q && q - k < 40"), target="wgsl")
    src = backward_source(plan)
    assert src.count("let expr_class = expr_tile(seq, i32(head), i32(head), i32(kv_head), i32(r0), ") == 2
    assert src.count("if (expr_class == 0i) {") == 2 and "(full || mask_expr(" in src
    assert src.count("recompute(lid, seq, r0, j0, head, expr_class == 2i);") == 2
