"""`grad` inputs that many pairs read, on the WGSL backward (issue 42; docs/backward.md: partial
sums per dK/dV workgroup, summed in a fixed order by the grads entry point): a relative table with
a clamped distance (63 entries, so the clamp is reached), ALiBi with learnable slopes, a T5-style
bucketed table with `log` (log-spaced over 8..120 rather than T5's 8..128: T5's own puts distances
16 and 32 exactly on a bucket boundary, where WGSL's `log`, allowed an error of a few ULP, falls on
either side by the adapter: CI's lavapipe put them one bucket lower), a bias without b, and a bias
read at hkv with GQA 3; against the float64
reference_backward within twice the forward's tolerance on the live adapter (lavapipe in CI), odd
lengths, Lq != Lk both ways, kv_lens, causal masks with rows that see no key; the same bits on a
second run."""

from __future__ import annotations

import numpy as np
import pytest

import attngen
from attngen.backends.wgsl.emit import backward_manifest
from attngen.reference import reference_backward, relative_error, tolerance

from conftest import kernel_for, require, spec_of

T5 = ("input t[h, 32] f32 grad\n score s + t[h, where(k > q, 16, 0) + where(abs(k - q) < 8, abs(k - q), "
      "min(8 + floor(log(abs(k - q) / 8) / log(15) * 8), 15))]")  # nearest boundary: 0.0015 of a bucket
CASES = [
    # (id, spec body, B, Lq, Lk, Hq, Hkv, kv_lens, input shapes {name: shape})
    ("table-113x7-g3", "input t[h, 63] f32 grad\n score s + t[h, clamp(k - q, -31, 31) + 31]",
     2, 113, 7, 6, 2, None, {"t": ("h", 63)}),
    ("table-7x113-causal", "input t[h, 63] f32 grad\n score s + t[h, clamp(k - q, -31, 31) + 31]\n mask k < q",
     1, 7, 113, 3, 3, None, {"t": ("h", 63)}),
    ("alibi-slopes-causal-kvlens", "input slopes[h] f32 grad\n score s - slopes[h] * abs(q - k)\n mask causal",
     2, 13, 29, 6, 2, (29, 5), {"slopes": ("h",)}),
    ("t5-log", T5, 1, 41, 37, 3, 1, None, {"t": ("h", 32)}),
    ("bias-without-b", "input bias[h, q, k] f32 grad\n score s + bias[h, q, k]", 2, 9, 11, 3, 1, (11, 4),
     {"bias": ("h", "q", "k")}),
    ("hkv-g3", "input bias[b, hkv, q, k] f32 grad\n score s + bias[b, hkv, q, k]\n mask k < q", 2, 7, 5, 6, 2,
     None, {"bias": ("b", "hkv", "q", "k")}),
    ("mixed-direct-and-partials", "input slopes[h] f32 grad\n input bias[b, h, q, k] f32 grad\n input t[h, 63] f32 grad\n"
     " score s - slopes[h] * abs(q - k) + bias[b, h, q, k] + t[h, clamp(k - q, -31, 31) + 31]", 2, 7, 19, 6, 2,
     (19, 12), {"slopes": ("h",), "bias": ("b", "h", "q", "k"), "t": ("h", 63)}),
    ("table-1x1", "input t[h, 63] f32 grad\n score s + t[h, clamp(k - q, -31, 31) + 31]", 1, 1, 1, 3, 1, None,
     {"t": ("h", 63)}),
]


def _run(case, twice=False):
    name, body, b, lq, lk, hq, hkv, lens, shapes = case
    spec = spec_of(f"head_dim 16\n dtype f32\n {body}")
    rng = np.random.default_rng(lq * 7 + lk)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((b, lq, hq, 16), (b, lk, hkv, 16), (b, lk, hkv, 16)))
    ext = {"b": b, "h": hq, "hkv": hkv, "q": lq, "k": lk}
    named = {n: (0.3 * rng.standard_normal([ext.get(a, a) for a in s])).astype(np.float32) for n, s in shapes.items()}
    extra = {} if lens is None else {"kv_lens": np.array(lens, np.int32)}
    kernel = kernel_for(spec, "wgsl")
    out, lse = kernel(q, k, v, return_lse=True, **named, **extra)
    dout = rng.standard_normal(out.shape).astype(np.float32)
    got = kernel.backward(q, k, v, out, lse, dout, **named, **extra)
    ref = reference_backward(spec, *(x.astype(np.float64) for x in (q, k, v, dout)), **named, **extra)
    tol = 2 * tolerance(spec)
    for n in shapes:
        assert got[3][n].shape == named[n].shape
        err = relative_error(got[3][n], ref[3][n])
        assert err <= tol, f"{n}: {err} above {tol}"
    errors = [relative_error(x, r) for x, r in zip(got[:3], ref[:3])]
    assert all(e <= tol for e in errors), errors
    if twice:  # deterministic: no atomics, every sum in a fixed order
        again = kernel.backward(q, k, v, out, lse, dout, **named, **extra)
        assert all(np.array_equal(again[3][n], got[3][n]) for n in shapes)
    return got[3], ref[3]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_gradient_summed_over_pairs_matches_reference(case):
    require("wgsl")
    got, ref = _run(case, twice=case[0] in ("table-113x7-g3", "hkv-g3"))
    if case[0] == "hkv-g3":
        assert not got["bias"][:, :, 0].any()  # row 0 sees no key
    if case[0] == "bias-without-b":
        assert got["bias"][:, :, 4:].any()  # keys past batch 1's kv_lens still get batch 0's pairs


def test_manifest_and_check_describe_the_partials():
    spec = spec_of("head_dim 16\n dtype f32\n input t[h, 63] f32 grad\n score s + t[h, clamp(k - q, -31, 31) + 31]")
    m = backward_manifest(attngen.lower(spec, target="wgsl"))
    assert m["available"] and [e["role"] for e in m["entry_points"]] == ["preprocess", "dkdv", "dq", "grads"]
    assert "ceil(Lk / " in m["rows"]["bytes"] and "G * 63" in m["rows"]["bytes"]
    assert m["partials"][0]["name"] == "t" and m["partials"][0]["slice"] == ["G", "63"]


def test_partial_sums_past_the_binding_limit_are_refused():
    """A table of 2047 entries per head at 20000 keys: ceil(20000 / 16) * 16 slices of 2047 words, past
    lavapipe's 128 MiB storage binding: a LaunchError naming the partial sums, before any dispatch."""
    require("wgsl")
    from attngen.errors import LaunchError
    spec = spec_of("head_dim 16\n heads q=16 kv=16\n dtype f32\n input t[h, 2047] f32 grad\n"
                   " score s + t[h, clamp(k - q, -1023, 1023) + 1023]")
    kernel = kernel_for(spec, "wgsl")
    if kernel.binding_limit() > 1 << 27:
        pytest.skip("this adapter binds more than 128 MiB")
    q, kv = np.zeros((1, 1, 16, 16), np.float32), np.zeros((1, 20000, 16, 16), np.float32)
    with pytest.raises(LaunchError, match=r"partial sums of the `grad` inputs \(one slice per dK/dV workgroup"):
        kernel.backward(q, kv, kv, q, np.zeros((1, 16, 1), np.float32), q, t=np.zeros((16, 2047), np.float32))
