"""Shared test fixtures: which devices are here, random inputs, running a kernel on a target."""

from __future__ import annotations

import functools
import glob
import os
import shutil
import tempfile

import numpy as np
import pytest

import attngen

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The example block of the design's "The language" (README.md shows it too), verbatim.
DESIGN_EXAMPLE = """\
# Llama-3-8B prefill: grouped-query attention, causal, half precision
attention llama3_8b_prefill {
    head_dim   128                      # or: head_dim qk=192 v=128
    heads      q=32 kv=8                # optional; omitted = any head count at run time
    dtype      f16                      # storage of q, k, v, out: f16 | bf16 | f32
    accumulate qk=f32 pv=f32            # matmul accumulators: f32 | f16 (softmax stats are f32)
    mask       causal                   # see below
    softcap    50.0                     # optional: s = c * tanh(s / c)
    scale      auto                     # auto = 1/sqrt(head_dim qk), or a number
    tile       q=128 kv=64              # rows of Q and of K/V per block; d= chunks the head dim
    schedule   fused                    # fused | split_kv(N) | split_kv(auto) | two_pass
    kv_cache   contiguous               # contiguous | paged(page=16)
    target cuda { warps=4 stages=2 }
    target wgsl { workgroup=128 subgroups=auto }
}
"""


# The suite's own disk cache: never the user's ~/.cache/attngen (nor a directory the user set).
# The first pytest process (the controller under pytest-xdist) makes a temporary directory and
# removes it at the end; the xdist workers and every subprocess a test starts inherit it.
_CACHE_OWNER = "_ATTNGEN_TEST_CACHE_OWNER"


def pytest_configure(config):
    if os.environ.get(_CACHE_OWNER) and os.environ.get("ATTNGEN_CACHE_DIR") == os.environ[_CACHE_OWNER]:
        return  # a worker: the controller's directory
    path = tempfile.mkdtemp(prefix="attngen-test-cache-")
    os.environ["ATTNGEN_CACHE_DIR"] = os.environ[_CACHE_OWNER] = path
    config._attngen_test_cache = path


def pytest_unconfigure(config):
    path = getattr(config, "_attngen_test_cache", None)
    if path:
        shutil.rmtree(path, ignore_errors=True)


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite tests/golden/* from the current generator")


@pytest.fixture
def update_golden(request):
    return request.config.getoption("--update-golden")


@functools.lru_cache(maxsize=1)
def cuda_available() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


@functools.lru_cache(maxsize=1)
def wgsl_available() -> bool:
    try:
        from attngen.backends import wgsl
        wgsl.device()
        return True
    except Exception:
        return False


def require(target: str):
    if target == "cuda" and not cuda_available():
        pytest.skip("no CUDA GPU with CuPy here (the GPU machine runs these)")
    if target == "wgsl" and not wgsl_available():
        pytest.skip("no wgpu adapter here")


def example_specs():
    """(file, spec) for every block of every examples/*.attn file."""
    out = []
    for path in sorted(glob.glob(os.path.join(ROOT, "examples", "*.attn"))):
        for spec in attngen.parse(open(path).read(), path):
            out.append((os.path.basename(path), spec))
    return out


def spec_of(body: str, name: str = "t") -> attngen.AttentionSpec:
    return attngen.parse(f"attention {name} {{\n" + body.strip() + "\n}\n")[0]


NP_DTYPE = {"f16": np.float16, "f32": np.float32, "bf16": np.float32}


def random_qkv(spec, batch, len_q, len_k, heads_q=None, heads_kv=None, seed=0, scale=1.0):
    """Random normal q, k, v (never zeros) as float32 numpy arrays; heads from the spec."""
    rng = np.random.default_rng(seed)
    hq = heads_q or spec.heads_q or 4
    hkv = heads_kv or spec.heads_kv or (hq // 2 if hq % 2 == 0 else hq)
    q = rng.standard_normal((batch, len_q, hq, spec.head_dim_qk)).astype(np.float32) * scale
    k = rng.standard_normal((batch, len_k, hkv, spec.head_dim_qk)).astype(np.float32) * scale
    v = rng.standard_normal((batch, len_k, hkv, spec.head_dim_v)).astype(np.float32)
    return q, k, v


def to_device(target, dtype, *arrays):
    """numpy float32 arrays -> what the target's kernel takes in `dtype`."""
    if target == "wgsl":
        return [a.astype(NP_DTYPE[dtype]) for a in arrays]
    if dtype == "bf16":
        import torch
        return [torch.from_numpy(a).cuda().to(torch.bfloat16) for a in arrays]
    import cupy
    return [cupy.asarray(a.astype(NP_DTYPE[dtype])) for a in arrays]


def _to_numpy(x):
    from attngen.reference import to_numpy
    return np.asarray(to_numpy(x), dtype=np.float64)


_KERNELS: dict = {}


def kernel_for(spec, target):
    key = (spec, target)
    if key not in _KERNELS:
        try:
            _KERNELS[key] = attngen.compile(spec, target=target)
        except attngen.SpecError as e:
            skip_if_adapter_refuses(e, target)
            raise
    return _KERNELS[key]


def skip_if_adapter_refuses(error, target):
    """Skip a test whose spec the live adapter cannot run, where that is the adapter's doing: f16
    arithmetic without shader-f16 (the checker refuses it; tests/equivalence/test_f16_packed.py
    checks the refusal), and, on Dawn (ATTNGEN_WGPU=wgpudawn, SwiftShader: 256 invocations per
    workgroup), tiles beyond its limits. Anywhere else a refusal fails the test."""
    if target != "wgsl":
        return
    from attngen.backends.wgsl.devices import DAWN, device_state
    msg = str(error)
    if "needs the shader-f16 feature" in msg and "shader-f16" not in device_state().features:
        pytest.skip("this adapter has no shader-f16: the checker refuses f16 accumulators here")
    if DAWN and " exceeds " in msg:
        pytest.skip(f"beyond this adapter's limits: {msg.splitlines()[0][-90:]}")


def runtime_inputs(spec, target, q, k, v, seed=0):
    """(k, v, call options, reference options) for specs that need run-time inputs (custom
    masks, paged caches: attngen.harness.runner.runtime_inputs); masks go to the GPU for cuda."""
    from attngen.harness.runner import runtime_inputs as host_inputs
    k, v, opts = host_inputs(spec, q, k, v, np.random.default_rng(seed))
    call = dict(opts)
    if "mask" in opts and target == "cuda":
        import cupy
        call["mask"] = cupy.asarray(opts["mask"])
    return k, v, call, opts


def check_against_reference(spec, target, q, k, v, *, return_lse=True, tol=None, seed=0):
    """Run the kernel and the reference on the same inputs; assert the error bounds. Specs
    that need run-time inputs (custom masks, paged caches) get them from runtime_inputs()."""
    from attngen.reference import reference, relative_error, tolerance
    kernel = kernel_for(spec, target)
    k, v, call, ref_kw = runtime_inputs(spec, target, q, k, v, seed)
    dq, dk, dv = to_device(target, spec.dtype, q, k, v)
    out, lse = kernel(dq, dk, dv, return_lse=True, **call)
    out, lse = _to_numpy(out), _to_numpy(lse)
    ref, ref_lse = reference(spec, q, k, v, return_lse=True, **ref_kw)
    assert out.shape == ref.shape
    assert not np.isnan(out).any(), "NaN in the output"
    assert not np.isnan(lse).any(), "NaN in lse"
    bound = tol if tol is not None else tolerance(spec)
    err = relative_error(out, ref)
    assert err <= bound, f"{target} {spec.name}: relative L2 error {err:.3g} > {bound:g}"
    empty = np.isneginf(ref_lse)
    assert np.array_equal(np.isneginf(lse), empty), "lse is -inf exactly where a row sees no key"
    if empty.any():
        rows = np.transpose(empty, (0, 2, 1))  # (B, Lq, Hq)
        assert np.all(out[rows] == 0), "rows that see no key output exactly 0"
    if (~empty).any():
        lerr = np.abs(lse[~empty] - ref_lse[~empty]).max()
        assert lerr <= max(bound, 1e-5) * 10 * max(1.0, np.abs(ref_lse[~empty]).max()), \
            f"lse error {lerr:.3g}"
    return err


# Spec variants that the equivalence suite runs on both targets and the NVRTC tests compile:
# (label, spec body, query heads, KV heads).
VARIANTS = [
    ("f32 d64", "head_dim 64\n dtype f32", 4, 4),
    ("f16 d8 causal", "head_dim 8\n dtype f16\n mask causal", 2, 1),
    ("f16 d40 bottom-right", "head_dim 40\n dtype f16\n mask causal(bottom_right)", 7, 1),
    ("f16 d72 window", "head_dim 72\n dtype f16\n mask window(left=5, right=2)", 8, 2),
    ("f16 d96 window0", "head_dim 96\n dtype f16\n mask window(left=0)", 3, 3),
    ("f16 192/128 softcap", "head_dim qk=192 v=128\n dtype f16\n softcap 30\n mask causal", 4, 1),
    ("f16 d256 scale", "head_dim 256\n dtype f16\n scale 0.3", 2, 2),
    ("f32 d128 causal bottom-right", "head_dim 128\n dtype f32\n mask causal(bottom_right)", 7, 7),
    ("f16 acc f16", "head_dim 64\n dtype f16\n accumulate f16\n mask causal", 4, 2),
    ("f16 acc qk f16", "head_dim 128\n dtype f16\n accumulate qk=f16 pv=f32", 4, 4),
    ("f16 small tiles", "head_dim 32\n dtype f16\n tile q=16 kv=16\n mask window(left=20, right=20)", 4, 4),
    ("bf16 d128 window softcap", "head_dim 128\n dtype bf16\n mask window(left=64)\n softcap 20", 4, 2),
    ("bf16 d256 causal", "head_dim 256\n dtype bf16\n mask causal", 2, 1),
    ("f32 d256 softcap", "head_dim 256\n dtype f32\n softcap 10", 2, 1),
    # Two 16-row fragments per warp on CUDA (FlashAttention-2's 128 rows on 4 warps).
    ("f16 two fragments per warp", "head_dim 64\n dtype f16\n mask causal\n tile q=128 kv=64\n"
     " target cuda { warps=4 }", 4, 2),
    ("f32 two fragments per warp", "head_dim 32\n dtype f32\n tile q=64 kv=16\n target cuda { warps=2 }", 2, 1),
]


# ---- the fuzz campaign (tests/fuzz) -----------------------------------------------------------
# In CI the campaign is bounded (a few minutes on 2 cores). The whole campaign runs on demand:
#     ATTNGEN_FUZZ=full ATTNGEN_FUZZ_REPORT=fuzz-count.jsonl bash scripts/test.sh tests/fuzz
# ATTNGEN_FUZZ=full multiplies every property's number of examples by FUZZ_SCALE; with
# ATTNGEN_FUZZ_REPORT each test process appends its count of cases per property (one JSON line),
# which scripts/fuzz_count.py sums. docs/fuzzing.md keeps the last whole count.
FUZZ_SCALE = 40 if os.environ.get("ATTNGEN_FUZZ") == "full" else 1
_FUZZ_COUNTS: dict = {}


def count(name: str) -> None:
    """One case of fuzz property `name` ran (called from the property's body)."""
    _FUZZ_COUNTS[name] = _FUZZ_COUNTS.get(name, 0) + 1


def pytest_sessionfinish(session):
    path = os.environ.get("ATTNGEN_FUZZ_REPORT")
    if path and _FUZZ_COUNTS:
        import json
        with open(path, "a") as f:
            f.write(json.dumps(_FUZZ_COUNTS) + "\n")
