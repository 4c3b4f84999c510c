"""A third target without an edit to the core: a toy backend that renders a plain-text dump of
the plan, registered from this file, runs through the language, the checker, the lowering
driver, the public API and the command line like the built-in ones."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

import attngen
from attngen import backends
from attngen.backends.base import Backend
from attngen.cli import main
from attngen.lang.options import Option, TargetSchema
from attngen.plan.kernel_plan import Lowered, Param, Problem, Workspace
from attngen.plan.profiles import Profile
from attngen.plan.schedule import main_grid

TEXT = """\
attention toy_kernel {
    head_dim   64
    heads      q=8 kv=2
    dtype      f16
    mask       causal
    schedule   split_kv(4)
    target toy { lanes=8 }
}
"""


@dataclass(frozen=True)
class ToyConfig:
    tile_q: int
    tile_kv: int
    lanes: int
    buffers: tuple = ()
    smem_bytes: int = 0

    def summary(self) -> str:
        return f"tile q={self.tile_q} kv={self.tile_kv}, {self.lanes} lanes"


class ToyBackend(Backend):
    name = "toy"
    schema = TargetSchema("toy", (Option("lanes", "int", 1, 64),), language="plain text")
    default_profile = "toy-default"
    required_limits = ("lanes",)
    required_defaults = ("tile_q", "tile_kv")

    def extra_profiles(self):
        return (Profile(name="toy-default", target="toy", description="a dump of the plan",
                        limits={"lanes": 32}, storage_dtypes=("f16", "f32"), features={},
                        defaults=({"max_head_dim": 1024, "tile_q": 32, "tile_kv": 16},)),)

    def configure(self, spec, profile):
        row = profile.default_row(max(spec.head_dim_qk, spec.head_dim_v))
        lanes = spec.options("toy").get("lanes") or 4
        if lanes > profile.limit("lanes"):
            raise Problem(f"lanes={lanes} exceeds {profile.name}'s {profile.limit('lanes')}", key="target.toy",
                          hint="use fewer lanes")
        return ToyConfig(spec.tile.q or row["tile_q"], spec.tile.kv or row["tile_kv"], lanes)

    def lower(self, spec, profile, config, entry):
        return Lowered(threads=config.lanes, grid=main_grid(spec, config.tile_q),
                       params=(Param("q", "tensor", spec.dtype, ("B", "Lq", "Hq", "Dqk")),
                               Param("out", "tensor", spec.dtype, ("B", "Lq", "Hq", "Dv"), "write")),
                       smem_bytes=0,
                       workspaces=(Workspace("partial", "f32", ("S", "B * Hq * Lq", "Dv")),)
                       if spec.schedule.is_split else ())

    def render(self, plan):
        lines = [f"# {plan.entry} for {plan.target} ({plan.profile})", plan.spec_text.rstrip(),
                 f"plan: {plan.summary()}", f"grid: {', '.join(plan.grid)}"]
        lines += [f"workspace {w.name}: {w.bytes_formula} bytes" for w in plan.workspaces]
        return "\n".join(lines) + "\n"

    def manifest(self, plan):
        return {"entry_point": plan.entry, "grid": list(plan.grid), "threads": plan.threads,
                "parameters": [p.name for p in plan.params]}


@pytest.fixture
def toy():
    backend = backends.register(ToyBackend())
    try:
        yield backend
    finally:
        backends.unregister("toy")  # other tests print normalised specs: leave no trace


def test_the_language_takes_its_options(toy):
    (spec,) = attngen.parse(TEXT, "toy.attn")
    assert spec.options("toy") == {"lanes": 8}
    assert "target     toy { lanes=8 }" in attngen.format_spec(spec)
    assert attngen.parse(attngen.format_spec(spec)) == [spec]
    with pytest.raises(attngen.SpecError) as err:
        attngen.parse(TEXT.replace("lanes=8", "lane=8"), "toy.attn")
    assert "unknown option 'lane' for 'target'" in str(err.value)
    assert "did you mean 'lanes'?" in str(err.value)
    with pytest.raises(attngen.SpecError, match="'target.lanes' = 99 is too large"):
        attngen.parse(TEXT.replace("lanes=8", "lanes=99"))


def test_it_plans_emits_and_checks_through_the_core(toy):
    (spec,) = attngen.parse(TEXT, "toy.attn")
    assert "toy" in attngen.targets()
    plan = attngen.lower(spec, "toy")
    assert (plan.target, plan.profile, plan.threads) == ("toy", "toy-default", 8)
    assert plan.grid == ("ceil(Lq * G / 32) * S", "Hkv", "B")  # split_kv packs GQA groups: the core's rule
    em = attngen.emit(spec, target="toy")
    assert em.source.startswith("# attngen_toy_kernel for toy (toy-default)")
    assert "workspace partial: 4 * S * B * Hq * Lq * Dv bytes" in em.source
    assert em.source == attngen.emit(spec, target="toy").source  # deterministic
    assert em.manifest["parameters"] == ["q", "out"]
    # a Problem of its configuration is a diagnostic at the position of its target block
    wide = attngen.parse(TEXT.replace("lanes=8", "lanes=40"), "toy.attn")[0]
    (d,) = attngen.check(wide, "toy")
    assert d.message == "target toy (profile toy-default): lanes=40 exceeds toy-default's 32"
    assert (d.span.line, d.hint) == (7, "use fewer lanes")
    # the built-in targets still print and plan as before
    assert attngen.emit(spec, "wgsl").source.count("attention toy_kernel {") == 1


def test_the_command_line_offers_it(toy, tmp_path, capsys):
    path = tmp_path / "toy.attn"
    path.write_text(TEXT)
    assert main(["build", str(path), "--target", "toy"]) == 0
    assert "plan: tile q=32 kv=16, 8 lanes" in capsys.readouterr().out
    assert main(["check", str(path), "--target", "toy"]) == 0
    out = capsys.readouterr().out
    assert "toy (toy-default): ok" in out and "grid: (ceil(Lq * G / 32) * S, Hkv, B) x 8 threads" in out


def test_unregistered_it_is_gone(toy):
    backends.unregister("toy")
    assert "toy" not in attngen.targets()
    with pytest.raises(attngen.SpecError, match="unknown target 'toy'"):
        attngen.parse(TEXT)
    backends.register(toy)  # for the fixture's teardown
