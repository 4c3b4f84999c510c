"""examples/expressions/ (issue 42): each example encodes its model's attention.

Every example parses, prints back to itself, and `attngen check` either plans it or refuses it
with the target's clear message (file:line:col, a caret, a hint; no traceback) for the targets
that do not compile it yet. Each example's attngen.reference output, on small random inputs built
as the model builds them (BLOOM's ALiBi slopes, T5's bucket table, Swin's window order, ...),
matches an independent numpy implementation of that model's attention written here from the
model's own code (HF transformers, the Swin and NATTEN reference code): that proves the spec is
the model. The examples that a target compiles today run there against the reference too (the
WGSL forward compiles expressions of indices and s only; on lavapipe here).
"""

from __future__ import annotations

import dataclasses
import glob
import math
import os
import re

import numpy as np
import pytest

import attngen
from attngen.cli import main
from attngen import format_spec
from attngen.reference import reference

from conftest import ROOT, check_against_reference, random_qkv, require

FILES = sorted(glob.glob(os.path.join(ROOT, "examples", "expressions", "*.attn")))
SPECS = {s.name: s for p in FILES for s in attngen.parse(open(p, encoding="utf-8").read(), p)}


def _rounded(spec, batch, length, seed, heads_q=None, heads_kv=None):
    """Random q, k, v of Lq = Lk = length, already exact in the spec's dtype, so that the
    reference (which rounds them) and the numpy models see the same values."""
    q, k, v = random_qkv(spec, batch, length, length, heads_q=heads_q, heads_kv=heads_kv, seed=seed)
    dt = np.float16 if spec.dtype == "f16" else np.float32
    return [x.astype(dt).astype(np.float64) for x in (q, k, v)]


def _softmax_attention(logits, visible, v):
    """out (B, Lq, Hq, Dv) of logits (B, Hq, Lq, Lk) where `visible` (broadcast to them), v
    (B, Lk, Hkv, Dv) repeated over the query heads of each KV head (HF's repeat_kv)."""
    hq, hkv = logits.shape[1], v.shape[2]
    v = np.repeat(v, hq // hkv, axis=2)
    logits = np.where(visible, logits, -np.inf)
    m = logits.max(axis=-1, keepdims=True)
    p = np.exp(logits - np.where(np.isfinite(m), m, 0))
    p = p / np.where(p.sum(-1, keepdims=True) > 0, p.sum(-1, keepdims=True), 1)
    return np.einsum("bhqk,bkhd->bqhd", p, v)


def _qk(q, k):
    """q . k (B, Hq, Lq, Lk) with k repeated over each KV head's query heads."""
    k = np.repeat(k, q.shape[2] // k.shape[2], axis=2)
    return np.einsum("bqhd,bkhd->bhqk", q, k)


def _close(out, expected):
    assert out.shape == expected.shape
    np.testing.assert_allclose(out, expected, rtol=1e-9, atol=1e-12)


# -- parsing and `attngen check` ----------------------------------------------------------------

def test_the_examples_are_there():
    assert {os.path.basename(p) for p in FILES} == {
        "alibi.attn", "t5_relative_bias.attn", "swin_window.attn", "prefix_lm.attn", "document_ids.attn",
        "neighbourhood_2d.attn", "softcap_tanh.attn"}
    for path in FILES:  # each says where its numbers come from
        head = open(path, encoding="utf-8").read().split("\nattention ")[0]
        assert re.search(r"\(.*20\d\d", head) and ("config" in head or "code" in head), path


@pytest.mark.parametrize("path", FILES, ids=os.path.basename)
def test_examples_round_trip(path):
    for s in attngen.parse(open(path, encoding="utf-8").read(), path):
        assert attngen.parse(format_spec(s)) == [s]


@pytest.mark.parametrize("target", ["cuda", "wgsl"])
@pytest.mark.parametrize("path", FILES, ids=os.path.basename)
def test_check_plans_or_refuses_clearly(path, target, capsys):
    """Each kernel is planned (`ok`) or refused with the target's message under its expression
    (issue 42: a target that does not compile an expression yet)."""
    code = main(["check", path, "--target", target])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    refused = 0
    for s in attngen.parse(open(path, encoding="utf-8").read(), path):
        block = out.split(f"{s.name}\n", 1)[1]
        status = block.split("\n", 1)[0].split(": ", 1)[1]
        assert status in ("ok", "error (see above)"), status
        refused += status != "ok"
    assert code == (1 if refused else 0), err
    if refused:
        errors = [line for line in err.splitlines() if ": error: " in line]
        assert errors and all(line.startswith(f"{path}:") for line in errors), err
        assert all(f"error: target {target} (profile " in line and line.endswith("(issue 42)") for line in errors), err
        assert err.count("  hint: ") == len(errors) and "^^^" in err, err


# -- each model against the reference -----------------------------------------------------------

def bloom_slopes(heads: int) -> np.ndarray:
    """The slopes of BLOOM's build_alibi_tensor (HF transformers, modeling_bloom.py), f32."""
    closest = 2 ** math.floor(math.log2(heads))
    base = 2.0 ** (-(2.0 ** -(math.log2(closest) - 3)))
    slopes = base ** np.arange(1, closest + 1)
    if closest != heads:
        extra_base = 2.0 ** (-(2.0 ** -(math.log2(2 * closest) - 3)))
        extra = extra_base ** np.arange(1, 1 + 2 * min(closest, heads - closest), 2)
        slopes = np.concatenate([slopes, extra])
    return slopes.astype(np.float32)


def test_alibi_is_bloom():
    spec = SPECS["bloom_7b1_alibi"]
    slopes = bloom_slopes(32)
    assert np.allclose(slopes, 2.0 ** (-8 * np.arange(1, 33) / 32))  # MPT's gen_slopes: 2^(-8 i / n)
    assert len(bloom_slopes(12)) == 12  # (BLOOM's rule for other head counts)
    for i, (b, n) in enumerate([(1, 1), (2, 7), (1, 113)]):
        q, k, v = _rounded(spec, b, n, seed=i)
        # build_alibi_tensor without padding: slope * key position (in float64 here); BLOOM's
        # attention: baddbmm(alibi, q, k^T, beta=1, alpha=1/sqrt(d)), then the causal mask
        alibi = slopes.astype(np.float64)[:, None] * np.arange(n)[None, :]
        logits = alibi[None, :, None, :] + _qk(q, k) / math.sqrt(128)
        causal = np.tril(np.ones((n, n), bool))
        _close(reference(spec, q, k, v, slopes=slopes), _softmax_attention(logits, causal, v))


def t5_bucket(relative_position, bidirectional, num_buckets=32, max_distance=128):
    """HF transformers' T5Attention._relative_position_bucket in numpy (float32 as torch's)."""
    buckets = np.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative_position > 0).astype(np.int64) * num_buckets
        relative_position = np.abs(relative_position)
    else:
        relative_position = -np.minimum(relative_position, 0)
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    with np.errstate(divide="ignore", invalid="ignore"):  # log(0), unused
        large = max_exact + (np.log(relative_position.astype(np.float32) / max_exact)
                             / np.float32(math.log(max_distance / max_exact))
                             * (num_buckets - max_exact)).astype(np.int64)
    large = np.minimum(large, num_buckets - 1)
    return buckets + np.where(is_small, relative_position, large)


@pytest.mark.parametrize("name, bidirectional", [("t5_base_encoder", True), ("t5_base_decoder", False)])
def test_t5_relative_bias_is_t5(name, bidirectional):
    spec = SPECS[name]
    rng = np.random.default_rng(5)
    table = rng.standard_normal((12, 32)).astype(np.float32)  # T5's relative_attention_bias weight, transposed
    buckets = t5_bucket(np.arange(300)[None, :] - np.arange(300)[:, None], bidirectional)
    # lengths of 300 reach every bucket, the clamped ones too (bidirectional: not 16, which would
    # be a key after the query at distance 0)
    assert len(np.unique(buckets)) == (31 if bidirectional else 32)
    for i, (b, n) in enumerate([(1, 1), (2, 7), (1, 113), (1, 300)]):
        q, k, v = _rounded(spec, b, n, seed=10 + i)
        # T5Attention.compute_bias: relative_position = memory_position - context_position
        bias = table.T[t5_bucket(np.arange(n)[None, :] - np.arange(n)[:, None], bidirectional)]  # (q, k, h)
        logits = _qk(q, k) + np.transpose(bias, (2, 0, 1))[None]  # no 1/sqrt(d) in T5
        visible = np.ones((n, n), bool) if bidirectional else np.tril(np.ones((n, n), bool))
        _close(reference(spec, q, k, v, table=table), _softmax_attention(logits, visible, v))


def swin_relative_position_index(window: int) -> np.ndarray:
    """The Swin Transformer's relative_position_index (WindowAttention.__init__), in numpy."""
    coords = np.stack(np.meshgrid(np.arange(window), np.arange(window), indexing="ij"))  # 2, M, M
    flat = coords.reshape(2, -1)
    rel = (flat[:, :, None] - flat[:, None, :]).transpose(1, 2, 0).copy()  # M^2, M^2, 2
    rel[:, :, 0] += window - 1
    rel[:, :, 1] += window - 1
    rel[:, :, 0] *= 2 * window - 1
    return rel.sum(-1)


def test_swin_window_is_swin():
    spec = SPECS["swin_t_stage1_window"]
    rng = np.random.default_rng(6)
    table = (rng.standard_normal((169, 3)) * 0.5).astype(np.float32)  # relative_position_bias_table
    index = swin_relative_position_index(7)
    for i, (b, windows) in enumerate([(2, 1), (1, 3)]):
        n = 49 * windows
        q, k, v = _rounded(spec, b, n, seed=20 + i)
        expected = np.empty_like(q)
        for w in range(windows):  # WindowAttention.forward on each window of window_partition's order
            t = slice(49 * w, 49 * (w + 1))
            bias = table[index.reshape(-1)].reshape(49, 49, 3).transpose(2, 0, 1)
            logits = _qk(q[:, t], k[:, t]) * 32 ** -0.5 + bias[None]
            expected[:, t] = _softmax_attention(logits, True, v[:, t])
        _close(reference(spec, q, k, v, table=np.ascontiguousarray(table.T)), expected)


def test_prefix_lm_is_paligemma():
    """HF PaliGemma's causal mask: causal, then every key whose token_type_ids is 0 (image and
    prompt tokens) unmasked for every query."""
    spec = SPECS["paligemma_3b_prefix_lm"]
    for i, (n, prefixes) in enumerate([(1, [0]), (7, [3, 0]), (113, [64, 113, 1])]):
        q, k, v = _rounded(spec, len(prefixes), n, seed=30 + i)
        token_type_ids = (np.arange(n)[None, :] >= np.array(prefixes)[:, None]).astype(np.int64)
        visible = np.tril(np.ones((n, n), bool))[None] | (token_type_ids[:, None, :] == 0)
        logits = _qk(q, k) * 256 ** -0.5
        expected = _softmax_attention(logits, visible[:, None], v)
        _close(reference(spec, q, k, v, prefix=np.array(prefixes, np.int32)), expected)


def test_document_ids_are_per_document_causal_attention():
    """Packed documents as the varlen kernels compute them: each document's own causal attention,
    independently (cu_seqlens from the document lengths), the outputs concatenated."""
    spec = SPECS["llama3_8b_document_ids"]
    rng = np.random.default_rng(7)
    for i, (b, n) in enumerate([(1, 1), (2, 7), (2, 113)]):
        q, k, v = _rounded(spec, b, n, seed=40 + i)
        lengths = [np.diff(np.r_[0, np.sort(rng.choice(np.arange(1, n), size=min(n - 1, 6), replace=False)), n])
                   for _ in range(b)] if n > 1 else [np.array([1])] * b
        doc = np.stack([np.repeat(np.arange(len(x)), x) for x in lengths]).astype(np.int32)
        expected = np.empty_like(q)
        for row in range(b):
            cu = np.r_[0, np.cumsum(lengths[row])]
            for s, e in zip(cu[:-1], cu[1:]):
                sl = slice(s, e)
                logits = _qk(q[row:row + 1, sl], k[row:row + 1, sl]) * 128 ** -0.5
                expected[row:row + 1, sl] = _softmax_attention(logits, np.tril(np.ones((e - s, e - s), bool)),
                                                                v[row:row + 1, sl])
        _close(reference(spec, q, k, v, doc=doc), expected)


def natten_window_start(index: int, length: int, kernel: int) -> int:
    """NATTEN's get_window_start (dilation 1)."""
    r = kernel // 2
    if index < r:
        return 0
    if index + r >= length:
        return length - kernel
    return index - r


def natten_pb_start(index: int, length: int, kernel: int) -> int:
    """NATTEN's get_pb_start (dilation 1): where the query's bias window starts in rpb."""
    r = kernel // 2
    if index < r:
        return kernel - 1 - index
    if index + r >= length:
        return length - 1 - index
    return r


def test_nat_is_neighborhood_attention():
    """NATTEN's naive 2D neighbourhood attention with relative position bias, query by query."""
    spec = SPECS["nat_mini_level3"]
    side, kernel, heads = 14, 7, 8
    rng = np.random.default_rng(8)
    rpb = rng.standard_normal((heads, 2 * kernel - 1, 2 * kernel - 1)).astype(np.float32)
    q, k, v = _rounded(spec, 2, side * side, seed=50)
    img = lambda x: x.reshape(x.shape[0], side, side, heads, -1)  # noqa: E731 (tokens row by row)
    qi, ki, vi = img(q), img(k), img(v)
    expected = np.empty_like(qi)
    for i in range(side):
        for j in range(side):
            ni, nj = natten_window_start(i, side, kernel), natten_window_start(j, side, kernel)
            pi, pj = natten_pb_start(i, side, kernel), natten_pb_start(j, side, kernel)
            keys = ki[:, ni:ni + kernel, nj:nj + kernel].reshape(2, kernel * kernel, heads, -1)
            vals = vi[:, ni:ni + kernel, nj:nj + kernel].reshape(2, kernel * kernel, heads, -1)
            bias = rpb[:, pi:pi + kernel, pj:pj + kernel].reshape(heads, kernel * kernel)
            logits = _qk(qi[:, i:i + 1, j], keys) * 32 ** -0.5 + bias[None, :, None]
            expected[:, i:i + 1, j] = _softmax_attention(logits, True, vals)
    _close(reference(spec, q, k, v, rpb=rpb), expected.reshape(q.shape))


def test_plain_neighbourhood_is_the_2d_window():
    spec = SPECS["neighbourhood_2d_w64_r7"]
    for i, rows in enumerate([1, 3]):
        n = 64 * rows
        q, k, v = _rounded(spec, 1, n, seed=60 + i)
        row, col = np.divmod(np.arange(n), 64)
        visible = (np.abs(row[:, None] - row[None]) <= 7) & (np.abs(col[:, None] - col[None]) <= 7)
        _close(reference(spec, q, k, v), _softmax_attention(_qk(q, k) * 128 ** -0.5, visible, v))


def test_softcap_expression_is_gemma2():
    """HF Gemma2's eager attention: q k^T * query_pre_attn_scalar^-0.5, / 50, tanh, * 50, causal;
    and the same as the named `softcap 50.0`."""
    spec = SPECS["gemma2_9b_global_tanh_expr"]
    named = attngen.load(os.path.join(ROOT, "examples", "gemma2_9b.attn"), name="gemma2_9b_global")
    named = dataclasses.replace(named, dtype="f16")  # (that example is bf16)
    for i, (b, n) in enumerate([(1, 1), (2, 7), (1, 113)]):
        q, k, v = _rounded(spec, b, n, seed=70 + i, heads_q=16, heads_kv=8)
        q, k = q * 8, k * 8  # scores of tens: the cap matters
        logits = np.tanh(_qk(q, k) * 256 ** -0.5 / 50) * 50
        out = reference(spec, q, k, v)
        _close(out, _softmax_attention(logits, np.tril(np.ones((n, n), bool)), v))
        _close(out, reference(named, q, k, v))


# -- what a target compiles today runs there ----------------------------------------------------

@pytest.mark.parametrize("name", sorted(n for n, s in SPECS.items() if not s.inputs))
def test_index_only_examples_on_wgsl(name):
    """The examples that read no input compile for wgsl's forward today: against the reference."""
    require("wgsl")
    spec = SPECS[name]
    for i, (b, n) in enumerate([(1, 7), (1, 64 * 2 + 1)]):
        q, k, v = random_qkv(spec, b, n, n, seed=80 + i)
        check_against_reference(spec, "wgsl", q, k, v)
