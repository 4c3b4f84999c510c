"""A workspace's size is one rule (Workspace.nbytes / bytes_formula), and each CUDA workspace is
declared once (backends/cuda/lower.py: the Workspace the launcher allocates is the parameter the
kernels take).

Both runtimes once sized workspaces themselves (4 bytes an element, written in each), beside
the manifests' bytes_formula; these tests evaluate every plan's formula over a grid of launch
sizes and compare it with what each runtime would allocate.
"""

from __future__ import annotations

import itertools

import pytest

from attngen import SpecError
from attngen.api import lower
from attngen.plan.formulas import evaluate
from attngen.runtime.launch import resolve

from conftest import spec_of

BODIES = [
    "head_dim 128\n heads q=32 kv=8\n dtype f16\n schedule split_kv(auto)",
    "head_dim 128\n heads q=32 kv=8\n dtype f16\n schedule two_pass",
    "head_dim 64\n dtype f32\n mask custom\n schedule split_kv(auto)",
    "head_dim 64\n dtype f16\n mask custom\n schedule two_pass",
    "head_dim 64\n dtype f16\n schedule split_kv(4)",
    "head_dim qk=192 v=128\n dtype bf16\n mask causal\n schedule two_pass",
    "head_dim 128\n dtype f16\n mask causal",
    "head_dim 512\n dtype f16",
    "head_dim 64\n dtype f32",
]
PROFILES = [("cuda", "cuda-sm80"), ("cuda", "cuda-sm90"), ("wgsl", "webgpu-core"), ("wgsl", "wgpu-software")]
# launch sizes: (B, Lq, Lk, Hq, Hkv), Lk = 0 included (CUDA keeps one column of ws_s then)
SHAPES = [(1, 1, 0, 8, 8), (1, 1, 1, 8, 2), (2, 3, 300, 8, 2), (3, 17, 4097, 32, 8), (1, 129, 70, 4, 4)]


def _plans():
    out = []
    for body, (target, profile) in itertools.product(BODIES, PROFILES):
        try:
            out.append(lower(spec_of(body), target, profile))
        except SpecError:  # a profile that refuses the spec (dtype, head dim)
            pass
    return out


PLANS = _plans()


def _launch(plan, b, lq, lk, hq, hkv, cores=132):
    hq, hkv = (plan.spec.heads_q, plan.spec.heads_kv) if plan.spec.heads_q else (hq, hkv)
    shapes = {"q": (b, lq, hq, plan.d_qk), "k": (b, lk, hkv, plan.d_qk), "v": (b, lk, hkv, plan.d_v)}
    dt = {n: plan.dtype for n in shapes}
    return resolve(plan, shapes, dt, cores=cores, has_mask=plan.spec.mask.is_custom)


def test_the_grid_has_every_kind_of_workspace():
    names = {w.name for p in PLANS for w in p.workspaces}
    assert {"ws_o", "ws_lse", "ws_l", "ws_s", "tile_counters", "work_counter", "ws_p",
            "o_part", "lse_part", "s_scratch", "stats"} <= names, names


@pytest.mark.parametrize("shape", SHAPES)
def test_nbytes_is_the_manifests_formula(shape):
    """Workspace.nbytes and the manifests' bytes_formula are one rule: equal for every size."""
    for plan in PLANS:
        sizes = _launch(plan, *shape).sizes(plan)
        for w in plan.workspaces:
            assert w.nbytes(sizes) == evaluate(w.bytes_formula, sizes), (plan.profile, w)


@pytest.mark.parametrize("shape", SHAPES)
def test_each_runtime_allocates_the_formulas_bytes(shape):
    """What each runtime allocates for a workspace is its manifest formula's value (the CUDA
    runtime: with Lk at least 1, and the persistent ones in 32-bit words)."""
    from attngen.backends.cuda import args as cuda_args
    from attngen.backends.wgsl import args as wgsl_args

    for plan in PLANS:
        launch = _launch(plan, *shape)
        sizes = launch.sizes(plan)
        if plan.target == "wgsl":
            want = {w.name: evaluate(w.bytes_formula, sizes) for w in plan.workspaces}
            assert wgsl_args.workspace_bytes(plan, launch) == want
            continue
        one_key = {**sizes, "Lk": max(sizes["Lk"], 1)}
        want = {w.name: evaluate(w.bytes_formula, one_key) for w in plan.workspaces if not w.persistent}
        assert cuda_args.workspace_bytes(plan, launch) == want, plan.profile
        words = {w.name: max(1, evaluate(w.bytes_formula, sizes) // 4) for w in plan.workspaces if w.persistent}
        assert cuda_args.persistent_words(plan, launch) == words, plan.profile


def test_cuda_workspaces_are_the_parameters():
    """Every CUDA workspace the launcher allocates is a parameter of the main entry point with its
    name, dtype and shape, and the workspace parameters of every entry point are workspaces."""
    for plan in PLANS:
        if plan.target != "cuda":
            continue
        ws = {w.name: (w.dtype, tuple(w.shape)) for w in plan.workspaces}
        params = {p.name: (p.dtype, tuple(p.shape or ())) for p in plan.params}
        for name, decl in ws.items():
            assert params.get(name) == decl, (plan.profile, name, params.get(name), decl)
        entries = [plan.params] + [e.params for e in plan.entries]
        if plan.details.varlen is not None:
            entries.append(plan.details.varlen.params)
        for ps in entries:
            for p in ps:
                if p.name.startswith("ws_") or p.name.endswith("_counter") or p.name.endswith("_counters"):
                    assert ws.get(p.name) == (p.dtype, tuple(p.shape)), (plan.profile, p.name)
