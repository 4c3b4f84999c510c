"""Kernels built ahead of time (`attngen precompile`) and found by attngen.compile without
rendering or compiling: the disk-cache key is the plan and the generator, not the source.

The CPU cases need NVRTC (pip install -e '.[test]'); the last one runs on a GPU.
"""

from __future__ import annotations

import io
import os
import re

import numpy as np
import pytest

import attngen
from attngen.api import emit_plan
from attngen.backends import get
from attngen.backends.cuda import nvrtc
from attngen.backends.cuda import kernel as rt
from attngen.backends.cuda.devices import profile_for
from attngen.cli import main
from attngen.plan.lower import lower
from attngen.runtime.kernel import Rendered

from conftest import ROOT, check_against_reference, random_qkv, require, spec_of

needs_nvrtc = pytest.mark.skipif(not nvrtc.available(), reason="NVRTC not installed (pip install -e '.[test]')")
LLAMA = os.path.join(ROOT, "examples", "llama3_8b.attn")
CUDA = get("cuda")


def _never(_plan):
    raise AssertionError("rendered: the kernel was not found in the cache")


@needs_nvrtc
def test_a_precompiled_kernel_is_found_without_rendering():
    spec = spec_of("head_dim 64\n dtype f16\n mask causal", name="pre")
    hit, key = rt.precompile(CUDA, spec, 90)
    assert not hit
    # what compile_kernel does on an H100: the device's profile, then the cache
    plan = lower(spec, CUDA, profile_for(CUDA, 90, 232448))
    assert rt.kernel_key(plan) == key
    cubin, found = rt.build_cubin(plan, _never)
    assert found and cubin[:4] == b"\x7fELF"
    assert rt.precompile(CUDA, spec, 90) == (True, key)


@needs_nvrtc
def test_the_key_follows_the_plan_the_arch_and_the_generator(monkeypatch):
    spec = spec_of("head_dim 64\n dtype f16", name="keys")
    base = lower(spec, CUDA, profile_for(CUDA, 90))
    keys = {rt.kernel_key(base)}
    keys.add(rt.kernel_key(lower(spec, CUDA, profile_for(CUDA, 89))))  # same tiles, other arch
    keys.add(rt.kernel_key(lower(spec_of("head_dim 64\n dtype f16\n tile q=64 kv=64", name="keys"), CUDA,
                                 profile_for(CUDA, 90))))
    keys.add(rt.kernel_key(lower(spec_of("head_dim 64\n dtype f16\n mask causal", name="keys"), CUDA,
                                 profile_for(CUDA, 90))))
    monkeypatch.setattr(rt, "generator_version", lambda: "0.0.0+edited")
    keys.add(rt.kernel_key(base))
    assert len(keys) == 5


def test_devices_plan_with_their_own_shared_memory():
    """A 99 KiB device (sm_86) cannot take the 163 KiB sm_80 tiles of a large head dim: its
    profile (from the compute capability, as precompile and the device both make it) says so."""
    spec = spec_of("head_dim 256\n dtype f16", name="big")
    a100 = lower(spec, CUDA, profile_for(CUDA, 80))
    rtx = lower(spec, CUDA, profile_for(CUDA, 86))
    assert a100.smem_bytes == 135168 and rtx.smem_bytes <= 101376 and rtx.config.tile_kv < a100.config.tile_kv
    assert rtx.details.arch == "sm_86" and a100.details.arch == "sm_80"
    assert profile_for(CUDA, 90).limit("shared_memory_bytes") == 232448
    # a device's own report wins over the table
    assert profile_for(CUDA, 90, 100000).limit("shared_memory_bytes") == 100000


def test_rendered_is_the_emitted_source_and_manifest_on_demand():
    spec = attngen.load(LLAMA)
    plan = attngen.lower(spec, "cuda", "cuda-sm90")
    calls = []
    lazy = Rendered(plan, lambda p: calls.append("source") or CUDA.render(p),
                    lambda p: calls.append("manifest") or CUDA.manifest(p))
    assert calls == []
    emitted = emit_plan(plan)
    assert lazy.source == emitted.source and lazy.manifest == emitted.manifest
    assert lazy.source is lazy.source and calls == ["source", "manifest"]


# ---- the command ----------------------------------------------------------------------------------

def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@needs_nvrtc
def test_precompile_command(capsys, monkeypatch, tmp_path):
    # a cache of its own: on a GPU machine other tests build the same kernel for the live device
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path))
    code, out, err = run(capsys, "precompile", LLAMA, "--target", "cuda", "--device", "sm_90,sm_80")
    assert code == 0, err
    assert "2 kernels built, 0 already cached" in out
    assert re.search(r"\] 1/2 llama3_8b_prefill sm_90: built in \d+\.\d s", err)
    assert "2/2 llama3_8b_prefill sm_80" in err
    code, out, err = run(capsys, "precompile", LLAMA, "--target", "cuda", "--device", "sm_90", "--device", "sm_90")
    assert code == 0 and "0 kernels built, 1 already cached" in out and "already cached" in err
    code, out, err = run(capsys, "precompile", LLAMA, "--target", "cuda", "--device", "sm_90", "-q")
    assert code == 0 and err == ""


@needs_nvrtc
def test_precompile_a_directory_for_one_kernel(capsys):
    code, out, err = run(capsys, "precompile", os.path.join(ROOT, "examples"), "--target", "cuda",
                         "--device", "sm_90", "--kernel", "vit_b16", "-q")
    assert code == 0, err
    # built now, or found: on a GPU machine other tests compile vit_b16 for the same device,
    # and a precompiled kernel and a compiled one share their cache entry
    assert re.match(r"(1 kernel built, 0|0 kernels built, 1) already cached", out), out


@pytest.mark.parametrize("argv, message", [
    (["--device", "sm_75"], "--device sm_75: unknown CUDA device 'sm_75'"),
    (["--device", "volta"], "unknown CUDA device 'volta'"),
    (["--device", ","], "--device is empty"),
    (["--kernel", "nope"], "llama3_8b.attn defines no kernel named 'nope'"),
])
def test_precompile_usage_errors(capsys, argv, message):
    code, out, err = run(capsys, "precompile", LLAMA, "--target", "cuda", *argv)
    assert code == 2 and message in err and "Traceback" not in err


def test_precompile_refuses_a_target_that_builds_at_load_time(capsys):
    code, _, err = run(capsys, "precompile", LLAMA, "--target", "wgsl")
    assert code == 2 and "builds its kernels when they are loaded" in err


def test_precompile_without_nvrtc_says_what_to_install(capsys, monkeypatch):
    monkeypatch.setattr(nvrtc, "available", lambda: False)
    code, _, err = run(capsys, "precompile", LLAMA, "--target", "cuda", "--device", "sm_90")
    assert code == 1 and "needs NVRTC: pip install 'attngen[gpu]'" in err


def test_precompile_reports_refused_specs_and_goes_on(capsys, tmp_path):
    path = tmp_path / "two.attn"
    # tiles of 1024 rows do not fit any GPU's shared memory: the checker refuses them
    path.write_text("attention ok {\n head_dim 64\n dtype f16\n}\n"
                    "attention big {\n head_dim 64\n dtype f16\n tile q=1024 kv=1024\n}\n")
    code, out, err = run(capsys, "precompile", str(path), "--target", "cuda", "--device", "sm_90")
    assert code == 1
    assert "big sm_90: refused:" in err and "1 kernel built" in out and "1 failed" in out


# ---- on the GPU --------------------------------------------------------------------------------

def test_compile_after_precompile_neither_renders_nor_compiles(monkeypatch):
    require("cuda")
    import cupy
    spec = spec_of("head_dim 64\n dtype f16\n mask causal", name="warm")
    cc = int(cupy.cuda.Device().compute_capability)
    assert CUDA.precompile(spec, f"sm_{cc}") in (True, False)

    def no_compile(*a, **k):
        raise AssertionError("NVRTC ran: the precompiled kernel was not found")
    monkeypatch.setattr(nvrtc, "compile_cubin", no_compile)
    rendered = []
    real_render = CUDA.render
    monkeypatch.setattr(CUDA, "render", lambda p: rendered.append(p) or real_render(p))
    kernel = attngen.compile(spec, target="cuda")
    q, k, v = random_qkv(spec, 1, 113, 113, heads_q=2, heads_kv=1)
    check_against_reference(spec, "cuda", q, k, v)  # through kernel_for: the same cache entry
    out = kernel(*(cupy.asarray(x.astype(np.float16)) for x in (q, k, v)))
    assert out.shape == q.shape and rendered == []
    assert "attngen_warm" in kernel.source and rendered  # rendered when asked for
