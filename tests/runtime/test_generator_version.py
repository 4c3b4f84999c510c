"""The generator version (in every cache key and manifest) covers everything the generated text
and the compiled objects depend on: every module of the package, the grammar, the templates and
the target profiles, found on disk rather than listed by hand."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from attngen.resources import digest_of, generator_files, generator_version, resource_dir

from conftest import ROOT

PACKAGE = Path(ROOT) / "attngen"


def test_every_module_and_resource_is_covered():
    names = {name for name, _ in generator_files()}
    modules = {f"attngen/{p.relative_to(PACKAGE).as_posix()}" for p in PACKAGE.rglob("*.py")
               if "__pycache__" not in p.parts}
    assert modules <= names
    for kind, pattern in (("templates", "*.j2"), ("targets", "*.toml"), ("grammar", "*.lark")):
        root = resource_dir(kind)
        found = {f"{kind}/{p.relative_to(root).as_posix()}" for p in root.rglob(pattern)}
        assert found and found <= names, kind
    # modules the hand-written list of the past missed
    assert {"attngen/plan/schedule.py", "attngen/plan/profiles.py", "attngen/backends/wgsl/manifest.py"} <= names
    assert generator_version().split("+")[1] == digest_of(generator_files())[:12]


@pytest.mark.parametrize("edit", ["attngen/plan/schedule.py", "attngen/backends/wgsl/manifest.py",
                                  "attngen/plan/profiles.py", "templates/cuda/mask.j2",
                                  "targets/webgpu-core.toml", "grammar/attn.lark"])
def test_an_edit_anywhere_changes_it(tmp_path, edit):
    copy = tmp_path / "repo"
    shutil.copytree(PACKAGE, copy / "attngen", ignore=shutil.ignore_patterns("__pycache__"))
    dirs = {}
    for kind in ("grammar", "templates", "targets"):
        shutil.copytree(resource_dir(kind), copy / kind)
        dirs[kind] = copy / kind
    before = digest_of(generator_files(copy / "attngen", dirs))
    assert before == digest_of(generator_files())  # the copy is the package
    with open(copy / edit, "a") as f:
        f.write("\n")
    assert digest_of(generator_files(copy / "attngen", dirs)) != before
