"""The WGSL manifest of a spec whose mask reads inputs describes its two-part call (issue 42;
manifest.mask_inputs, docs/manifest-wgsl.schema.json): a host that follows only the manifest
(its formulas, bindings, fill words and dispatch order) and the two sources it names (attngen
build --emit block-mask / mask-custom) reproduces kernel(...) on the adapter, and the reference:
GQA group 3, odd lengths, Lq != Lk, the mask batch-dependent."""

from __future__ import annotations

import json

import numpy as np
import pytest

import attngen
from attngen.backends import get as get_backend
from attngen.plan.formulas import evaluate
from attngen.reference import reference

from conftest import kernel_for, require, spec_of

SPEC = "head_dim 16\nheads q=6 kv=2\ndtype f32\ninput doc[b, q] i32\nmask k <= q && doc[b, q] == doc[b, k]"
TYPES = {"uniform": "uniform", "read-only-storage": "read_only_storage", "storage": "storage"}


def _symbols(att, B, Lq, Lk, Hq, Hkv, D, mask_symbols):
    """What a host knows of its call, named as the manifest's grid and launch symbols."""
    sym = {"B": B, "Lq": Lq, "Lk": Lk, "Hq": Hq, "Hkv": Hkv, "G": Hq // Hkv, "Dqk": D, "Dv": D, "S": 1,
           "layout": 0, "has_kv_lens": 0, "cap": Lk, "Tq": B * Lq, "Lnew": 0, "Pmax": 0, "write_lse": 1,
           "meta_cu_q": 0, "meta_cu_k": 0, "meta_kv_lens": 0, "meta_table": 0}
    for name in ("Bm", "Hm", "Lqm", "Lkm", "mask_additive"):
        sym[name] = evaluate(mask_symbols[name], sym)
    assert att["schedule"]["kind"] == "fused"
    return sym


def _uniform(dev, wgpu, binding, sym):
    words = np.array([evaluate(f["value"], sym) for f in binding["fields"]], np.uint32)
    assert words.nbytes == binding["size_bytes"]
    return dev.create_buffer_with_data(data=words.tobytes(), usage=wgpu.BufferUsage.UNIFORM)


def _dispatch(dev, wgpu, enc, module, entry, layout, group, grid, sym):
    pipeline = dev.create_compute_pipeline(layout=dev.create_pipeline_layout(bind_group_layouts=[layout]),
                                           compute={"module": module, "entry_point": entry})
    cp = enc.begin_compute_pass()
    cp.set_pipeline(pipeline)
    cp.set_bind_group(0, group)
    cp.dispatch_workgroups(*(evaluate(g, sym) for g in grid))
    cp.end()


def _layout(dev, wgpu, kinds: dict):
    return dev.create_bind_group_layout(entries=[
        {"binding": n, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": getattr(wgpu.BufferBindingType, TYPES[t])}}
        for n, t in sorted(kinds.items())])


def _run_from_manifest(manifest, sources, q, k, v, doc):
    """out, lse of the two-part call, as a host without attngen runs it."""
    import wgpu
    from attngen.backends.wgsl.devices import device
    dev = device()
    two = manifest["mask_inputs"]
    att = two["attention"]["manifest"]
    B, Lq, Hq, D = q.shape
    Lk, Hkv = k.shape[1], k.shape[2]
    sym = _symbols(att, B, Lq, Lk, Hq, Hkv, D, two["symbols"])
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST

    # -- the builder: its four bindings, one bind group, its entry points in `order`
    b = two["builder"]
    buffers, kinds = {}, {}
    for binding in b["bindings"]:
        n, kinds[binding["binding"]] = binding["binding"], binding["type"]
        if binding["type"] == "uniform":
            buffers[n] = _uniform(dev, wgpu, binding, sym)
        elif binding["name"] == "mask":
            words = np.zeros(evaluate(binding["words"], sym), np.uint32)
            data_at = evaluate(next(f["value"] for f in b["bindings"][0]["fields"] if f["name"] == "data"), sym)
            words[:data_at] = binding["fill_word"]
            buffers[n] = mask_buffer = dev.create_buffer_with_data(data=words.tobytes(), usage=usage)
        else:  # inputs: the flag, then each input at its offset (i32: its bits)
            words = np.zeros(evaluate(binding["words"], sym), np.uint32)
            (inp,) = binding["inputs"]
            assert inp["name"] == "doc" and inp["dtype"] == "i32"
            at = evaluate(inp["offset"], sym)
            words[at:at + evaluate(inp["words"], sym)] = doc.reshape(-1).view(np.uint32)
            buffers[n] = flag_buffer = dev.create_buffer_with_data(data=words.tobytes(), usage=usage)
    layout = _layout(dev, wgpu, kinds)
    group = dev.create_bind_group(layout=layout, entries=[{"binding": n, "resource": {"buffer": buf}}
                                                          for n, buf in sorted(buffers.items())])
    builder = dev.create_shader_module(code=sources["block-mask"])
    grids = {e["entry_point"]: e["dispatch"] for e in b["entry_points"]}
    enc = dev.create_command_encoder()
    order = two["order"]
    assert [o["module"] for o in order] == ["builder"] * len(grids) + ["attention"] * len(att["entry_points"])
    for o in order[:len(grids)]:
        _dispatch(dev, wgpu, enc, builder, o["entry_point"], layout, group, grids[o["entry_point"]], sym)

    # -- the attention kernel: its bindings, the builder's mask buffer as its `mask`
    assert two["feeds"]["to"].endswith("(mask)")
    module = dev.create_shader_module(code=sources["mask-custom"])
    arrays = {"q": q, "k": k, "v": v, "out": np.zeros((B, Lq, Hq, D), np.float32),
              "lse": np.zeros((B, Hq, Lq), np.float32)}
    buffers, kinds = {}, {}
    for binding in att["bindings"]:
        n, name, kinds[binding["binding"]] = binding["binding"], binding["name"], binding["type"]
        if binding["type"] == "uniform":
            buffers[n] = _uniform(dev, wgpu, binding, sym)
        elif name == "mask":
            buffers[n] = mask_buffer
        elif name in arrays:
            buffers[n] = dev.create_buffer_with_data(data=np.ascontiguousarray(arrays[name]).tobytes(), usage=usage)
        else:  # optional bindings this call does not use (seq_meta, kv_new): any 16 bytes
            assert "optional" in binding, name
            buffers[n] = dev.create_buffer(size=16, usage=usage)
    by_name = {binding["name"]: binding["binding"] for binding in att["bindings"]}
    for e in att["entry_points"]:
        assert e["entry_point"] == order[len(grids) + att["entry_points"].index(e)]["entry_point"]
        layout = _layout(dev, wgpu, {n: kinds[n] for n in e["bindings"]})
        group = dev.create_bind_group(layout=layout, entries=[{"binding": n, "resource": {"buffer": buffers[n]}}
                                                              for n in e["bindings"]])
        _dispatch(dev, wgpu, enc, module, e["entry_point"], layout, group, e["dispatch"], sym)
    dev.queue.submit([enc.finish()])
    assert np.frombuffer(dev.queue.read_buffer(flag_buffer, size=4), np.uint32)[0] == 0  # no read out of bounds
    out = np.frombuffer(dev.queue.read_buffer(buffers[by_name["out"]]), np.float32).reshape(B, Lq, Hq, D)
    lse = np.frombuffer(dev.queue.read_buffer(buffers[by_name["lse"]]), np.float32).reshape(B, Hq, Lq)
    return out, lse


@pytest.mark.parametrize("profile", ["webgpu-core", "wgpu-software"])
def test_the_manifest_describes_the_two_part_call_and_validates(profile):
    import copy
    import os

    jsonschema = pytest.importorskip("jsonschema")
    from conftest import ROOT
    with open(os.path.join(ROOT, "docs", "manifest-wgsl.schema.json")) as f:
        validator = jsonschema.Draft202012Validator(json.load(f))
    m = json.loads(json.dumps(attngen.emit(spec_of(SPEC), target="wgsl", profile=profile).manifest))
    assert validator.is_valid(m), [e.message for e in validator.iter_errors(m)][:3]
    two = m["mask_inputs"]
    att = two["attention"]["manifest"]
    text = two["attention"]["spec"]
    assert attngen.parse(text)[0].mask.kind == "custom" and "input" not in text
    assert [o["entry_point"] for o in two["order"]] == ["block_mask_fill", "block_mask_classify", "block_mask_compact",
                                                        att["entry_point"]]
    assert two["symbols"]["Bm"] == "B" and two["symbols"]["Hm"] == "1"  # the mask names b, no head
    (inputs,) = [b for b in two["builder"]["bindings"] if b.get("name") == "inputs"]
    assert [i["name"] for i in inputs["inputs"]] == ["doc"]
    assert any(b["name"] == "mask" for b in att["bindings"])
    for broken in ("order", "builder"):
        bad = copy.deepcopy(m)
        del bad["mask_inputs"][broken]
        assert not validator.is_valid(bad)
    bad = copy.deepcopy(m)
    del bad["mask_inputs"]["attention"]["manifest"]["bindings"]  # the nested manifest is checked as a manifest
    assert not validator.is_valid(bad)
    # a spec whose mask reads no input, or whose score reads one too (9 buffers of 8), has no two-part call
    for body in ("head_dim 16\ndtype f32\nmask k <= q",
                 "head_dim 16\ndtype f32\ninput doc[b, q] i32\ninput w[h] f32\nmask doc[b, q] == doc[b, k]\nscore s * w[h]"):
        assert "mask_inputs" not in attngen.emit(spec_of(body), target="wgsl", profile=profile).manifest


@pytest.mark.parametrize("shape", [(2, 37, 37), (1, 113, 7), (3, 1, 1)])
def test_a_host_following_the_manifest_reproduces_the_kernel(shape):
    require("wgsl")
    spec = spec_of(SPEC)
    kernel = kernel_for(spec, "wgsl")
    plan = attngen.lower(spec, "wgsl", kernel.profile)  # the adapter's profile, as the kernel's
    backend = get_backend("wgsl")
    manifest = json.loads(json.dumps(backend.manifest(plan)))
    sources = backend.helper_sources(plan)  # attngen build --emit block-mask / --emit mask-custom
    B, Lq, Lk = shape
    rng = np.random.default_rng(Lq)
    q = rng.standard_normal((B, Lq, 6, 16)).astype(np.float32)
    k, v = (rng.standard_normal((B, Lk, 2, 16)).astype(np.float32) for _ in range(2))
    doc = np.sort(rng.integers(0, 4, (B, Lq)), axis=1).astype(np.int32)  # documents of each batch row
    out, lse = _run_from_manifest(manifest, sources, q, k, v, doc)
    want, want_lse = kernel(q, k, v, doc=doc, return_lse=True)
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(want_lse))
    seen = ~np.isneginf(want_lse)
    np.testing.assert_allclose(lse[seen], want_lse[seen], rtol=1e-6, atol=1e-6)
    ref = reference(spec, q, k, v, doc=doc)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)
