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
