"""The backends' tile tables (attngen/backends/cuda/tiles.py, attngen/backends/wgsl/tiles.py): a
profile's overrides reach the plan and the source (and so the disk cache's key, a digest of the
plan), an unknown or mistyped override is refused by name, and the one head-dim padding rule
(tiles.COLUMN_STEP) is the one the layout pads by and the source asserts, for every kind of math."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import attngen
from attngen.api import emit_plan, get_profile
from attngen.backends.cuda import tiles as cuda_tiles
from attngen.backends.cuda.kernel import kernel_key
from attngen.backends.wgsl import tiles as wgsl_tiles
from attngen.plan.profiles import ProfileError

from conftest import spec_of

ROOT = Path(__file__).resolve().parents[3]


def _cuda(body, profile):
    plan = attngen.lower(spec_of(body, name="tiles"), "cuda", profile)
    return plan, emit_plan(plan).source


def test_profiles_of_targets_take_the_default_tables():
    for name in ("cuda-sm80", "cuda-sm90"):
        assert cuda_tiles.tiles_for(get_profile(name, "cuda")) is cuda_tiles.DEFAULT
    assert wgsl_tiles.tiles_for(get_profile("webgpu-core", "wgsl")) is wgsl_tiles.DEFAULT


@pytest.mark.parametrize("body, overrides, before, after", [
    # the persistent causal items' L2 group bound (family_producer.j2, work items)
    ("head_dim 128\n dtype f16\n mask causal\n heads q=14 kv=2", {"causal_order_bytes": 600_000},
     "kOrderBytes = 16777216LL;", "kOrderBytes = 600000LL;"),
    # no cleaning of V's non-finite values at all (a probe's switch)
    ("head_dim 128\n dtype f16\n mask causal", {"clean_values": False}, None, None),
    # the plain loop cleans only partial tiles
    ("head_dim 128\n dtype f16", {"clean_every_tile": False}, None, None),
    # the lazy rescale's slack
    ("head_dim 128\n dtype f16", {"rescale_slack": 4.0}, None, None),
])
def test_an_override_reaches_the_source_and_the_plan_digest(body, overrides, before, after):
    profile = "cuda-sm90" if "clean_every_tile" not in overrides else "cuda-sm80"
    base = get_profile(profile, "cuda")
    plan_a, src_a = _cuda(body, base)
    plan_b, src_b = _cuda(body, base.with_overrides(**overrides))
    assert src_a != src_b
    assert kernel_key(plan_a) != kernel_key(plan_b)  # the disk cache's key: a digest of the whole plan
    if before is not None:
        assert before in src_a and after in src_b
    for name, value in overrides.items():
        if hasattr(plan_b.config, name):
            assert getattr(plan_b.config, name) == value


def test_an_override_of_the_tiles_reaches_the_plan():
    """A choice of the search (not printed by itself): the split schedules' tile kv."""
    body = "head_dim 128\n dtype f16\n heads q=32 kv=8\n schedule split_kv(4)"
    base = get_profile("cuda-sm80", "cuda")
    a, _ = _cuda(body, base)
    b, _ = _cuda(body, base.with_overrides(split_tile_kv=64))
    assert a.config.tile_kv != b.config.tile_kv and kernel_key(a) != kernel_key(b)


def test_overrides_accumulate_and_leave_the_profile_alone():
    base = get_profile("cuda-sm90", "cuda")
    p = base.with_overrides(clean_values=False).with_overrides(rescale_slack=2.0)
    assert p.overrides == {"clean_values": False, "rescale_slack": 2.0} and base.overrides == {}
    assert p.name == base.name and p.narrowed(limits={"shared_memory_bytes": 1}).overrides == p.overrides


@pytest.mark.parametrize("target, profile, overrides, words", [
    ("cuda", "cuda-sm90", {"causal_order_byts": 1}, "causal_order_byts"),
    ("cuda", "cuda-sm90", {"CUDA_CLEAN_VALUES": False}, "CUDA_CLEAN_VALUES"),
    ("cuda", "cuda-sm90", {"clean_values": 0}, "clean_values=0"),
    ("cuda", "cuda-sm90", {"causal_order_bytes": "16M"}, "causal_order_bytes='16M'"),
    ("wgsl", "webgpu-core", {"max_score": 16}, "max_score"),
    ("wgsl", "webgpu-core", {"row_pad": 2.0}, "row_pad=2.0"),
])
def test_an_unknown_or_mistyped_override_is_refused(target, profile, overrides, words):
    spec = spec_of("head_dim 64\n dtype f16", name="tiles")
    bad = get_profile(profile, target).with_overrides(**overrides)
    for call in (lambda: attngen.lower(spec, target, bad), lambda: attngen.check(spec, target, bad)):
        with pytest.raises(ProfileError, match=re.escape(words)):
            call()


def test_a_wgsl_override_reaches_the_plan():
    spec = spec_of("head_dim 64\n dtype f32", name="tiles")
    base = get_profile("webgpu-core", "wgsl")
    a = attngen.lower(spec, "wgsl", base)
    b = attngen.lower(spec, "wgsl", base.with_overrides(row_pad=0))
    assert a.config.pad == 4 and b.config.pad == 0
    assert emit_plan(a).source != emit_plan(b).source


def test_the_producer_register_split_fits_the_launch():
    t = cuda_tiles.DEFAULT
    assert 128 * t.producer_regs + 256 * t.consumer_regs <= 384 * 168
    with pytest.raises(ProfileError, match="producer_regs"):
        cuda_tiles.CudaTiles(producer_regs=128, consumer_regs=232)


# ---- padding once ---------------------------------------------------------------------------------

@pytest.mark.parametrize("body, profile, math", [
    ("head_dim 72\n dtype f16", "cuda-sm90", "wgmma"),
    ("head_dim qk=200 v=72\n dtype bf16\n mask causal", "cuda-sm90", "wgmma"),
    ("head_dim 72\n dtype f16", "cuda-sm80", "mma"),
    ("head_dim qk=40 v=24\n dtype f16\n schedule split_kv(2)", "cuda-sm80", "mma"),
    ("head_dim 72\n dtype f32", "cuda-sm80", "fma"),
    ("head_dim qk=40 v=24\n dtype f32", "cuda-sm90", "fma"),
])
def test_the_pad_the_source_asserts_is_the_layouts(body, profile, math):
    """The head dims are padded to COLUMN_STEP[math] (the layout's columns of sQ / sK), and the
    source asserts the same step: one rule, whichever copy would drift."""
    plan, src = _cuda(body, get_profile(profile, "cuda"))
    c = plan.config
    step = cuda_tiles.COLUMN_STEP[math]
    assert c.math == math and c.column_step == step
    assert c.d_qk_pad == cuda_tiles.padded_head_dim(c.d_qk, math)
    if math != "wgmma" or not c.stored_p:
        assert c.d_qk_pad % step == 0 and c.d_qk_pad - c.d_qk < step
    assert f"kHeadDimQKPad % {step} == 0 && kHeadDimVPad % {step} == 0" in src
    cols = {b.name: b.cols for b in c.buffers}
    skew = 0 if math == "wgmma" else 16 // (4 if c.math == "fma" else 2)
    assert cols["sQ"] == c.d_qk_pad + skew  # the layout's padded columns (rows skewed off the wgmma path)


@pytest.mark.parametrize("body, profile, math", [
    ("head_dim 128\n dtype f16\n tile d=32", "cuda-sm80", "mma"),
    ("head_dim 64\n dtype f32\n tile d=8", "cuda-sm90", "fma"),
    ("head_dim 1024\n dtype f16\n mask causal", "cuda-sm80", "mma"),
])
def test_the_chunk_step_the_source_asserts_is_the_checks(body, profile, math):
    plan, src = _cuda(body, get_profile(profile, "cuda"))
    c = plan.config
    step = cuda_tiles.COLUMN_STEP[math]
    assert c.chunked and c.math == math and c.chunk % step == 0
    assert f"static_assert(kChunk % {step} == 0" in src


def test_a_tile_d_off_the_step_is_refused_with_the_step():
    spec = spec_of("head_dim 128\n dtype f16\n tile d=24", name="tiles")
    with pytest.raises(attngen.SpecError, match="not a multiple of 16"):
        attngen.lower(spec, "cuda", "cuda-sm80")


# ---- no module constants to patch ------------------------------------------------------------------

def test_no_cuda_constants_outside_the_table():
    """The tile choices are the table's fields: no CUDA_ module constant is defined anywhere (the
    old names live on only in benchmarks/NOTES.md). Assignments to a backend module's constants
    from outside it are tests/plan/test_house_rules.py's rule."""
    assign = re.compile(r"^CUDA_[A-Z_]* *=", re.M)
    for path in (ROOT / "attngen").rglob("*.py"):
        assert not assign.search(path.read_text(encoding="utf-8")), f"{path}: a CUDA_ module constant"
