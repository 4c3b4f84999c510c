"""The checker's hints name only changes the spec can still make."""

from __future__ import annotations

import pytest

import attngen

from conftest import spec_of


@pytest.mark.parametrize("body, hint", [
    # stages=1 already: the hint suggested stages=1
    ("head_dim 256\n dtype f16\n tile q=256 kv=256\n target cuda { stages=1 }",
     "use a smaller tile kv, or a smaller tile q"),
    ("head_dim 256\n dtype f16\n tile q=128 kv=256\n target cuda { stages=3 }",
     "use a smaller tile kv, or a smaller tile q, or fewer stages (target cuda { stages=2 })"),
])
def test_shared_memory_hint(body, hint):
    with pytest.raises(attngen.SpecError) as info:
        attngen.lower(spec_of(body), "cuda", "cuda-sm80")
    (d,) = info.value.diagnostics
    assert "needs" in d.message and d.hint == hint


@pytest.mark.parametrize("body, target, message, hint", [
    # warps=32 blamed key_warps (never given) and hinted key_warps=1, which it already was
    ("head_dim 64\n dtype f16\n target cuda { warps=32 stages=4 }", "cuda",
     "tile q=512 with warps=32 needs 1024 threads", "use warps=16 or fewer"),
    # workgroup=1 said "1 invocations per row do not divide head dim 16" and hinted fewer than 1
    ("head_dim 16\n dtype f32\n target wgsl { workgroup=1 }", "wgsl",
     "workgroup=1: each invocation owns 16 row(s) of the 16-row tile x 16 output columns = 256 accumulators, "
     "above the 64 webgpu-core allows", "use a smaller tile q or a larger workgroup (fewer rows per invocation)"),
])
def test_thread_count_messages_name_what_the_spec_set(body, target, message, hint):
    with pytest.raises(attngen.SpecError) as info:
        attngen.lower(spec_of(body), target)
    (d,) = info.value.diagnostics
    assert message in d.message and d.hint == hint
