"""The house rules of the code's shape (docs/architecture.md, "House rules"), checked on every run.

- No template over 600 lines and no Python module of the package over 800: a file a contributor
  can read. A family of kernels is one template built from shared parts.
- No assignment to a backend module's constants from outside that module (benchmarks, scripts and tests
  included): tile choices are data (`backends/<target>/tiles.py`) and an experiment passes
  overrides explicitly (`Profile.with_overrides`), so that what a kernel is built from is always
  in its plan, and so in its cache key.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import ROOT

MAX_TEMPLATE_LINES = 600
MAX_MODULE_LINES = 800

ROOT_PATH = Path(ROOT)


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_no_template_over_600_lines():
    long = {str(p.relative_to(ROOT_PATH)): _lines(p) for p in sorted((ROOT_PATH / "templates").rglob("*"))
            if p.is_file() and _lines(p) > MAX_TEMPLATE_LINES}
    assert not long, f"templates over {MAX_TEMPLATE_LINES} lines (split them by family or part): {long}"


def test_no_module_over_800_lines():
    long = {str(p.relative_to(ROOT_PATH)): _lines(p) for p in sorted((ROOT_PATH / "attngen").rglob("*.py"))
            if _lines(p) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def _python_files():
    for folder in ("attngen", "tests", "benchmarks", "scripts", "examples"):
        yield from sorted((ROOT_PATH / folder).rglob("*.py"))


def _constant(name) -> bool:
    """A module's public constant: UPPER_CASE (a leading underscore marks private state, such as a
    cache a test empties, which is not configuration)."""
    return isinstance(name, str) and name.isupper() and not name.startswith("_") and any(c.isalpha() for c in name)


def _module_aliases(tree: ast.AST) -> set[str]:
    """Names bound to attngen's backend modules in a file (import attngen.backends.x as m,
    from attngen.backends.x import config)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("attngen.backends") and a.asname:
                    out.add(a.asname)
                elif a.name.startswith("attngen"):
                    out.add(a.name.split(".")[0])  # attngen.backends.x.NAME = ... through the root
        elif isinstance(node, ast.ImportFrom) and ((node.module or "").startswith("attngen.backends")
                                                   or (node.module or "") == "attngen" or node.level > 0):
            for a in node.names:
                out.add(a.asname or a.name)
    return out


def _base_name(node) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def assignments_to_constants(path: Path) -> list[str]:
    """'file:line: what' for every assignment to a backend module's UPPER_CASE name in `path`."""
    tree = ast.parse(path.read_text(), str(path))
    aliases = _module_aliases(tree)
    rel = path.relative_to(ROOT_PATH) if path.is_relative_to(ROOT_PATH) else path.name
    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            flat = []
            for t in targets:
                flat.extend(t.elts if isinstance(t, ast.Tuple) else [t])
            for t in flat:
                if isinstance(t, ast.Attribute) and _constant(t.attr) and _base_name(t) in aliases:
                    found.append(f"{rel}:{node.lineno}: {ast.unparse(t)} = ...")
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            if name == "setattr" and node.args and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[0].value, str) and node.args[0].value.startswith("attngen.backends") \
                    and _constant(node.args[0].value.rsplit(".", 1)[1]):  # monkeypatch.setattr("mod.NAME", v)
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node)[:80]}")
            elif name == "setattr" and len(node.args) >= 2:
                key = node.args[1]
                if isinstance(key, ast.Constant) and _constant(key.value) and _base_name(node.args[0]) in aliases:
                    found.append(f"{rel}:{node.lineno}: {ast.unparse(node)[:80]}")
                elif name == "setattr" and not isinstance(key, ast.Constant) and _base_name(node.args[0]) in aliases:
                    found.append(f"{rel}:{node.lineno}: {ast.unparse(node)[:80]} (a computed name on a module)")
    return found


def test_no_assignment_to_a_backend_modules_constants_from_outside():
    found = [hit for p in _python_files() for hit in assignments_to_constants(p)]
    assert not found, ("assignments to a backend module's constants (pass overrides as data instead: "
                       "Profile.with_overrides, docs/architecture.md):\n" + "\n".join(found))


def test_the_checker_finds_what_it_forbids(tmp_path):
    """The rule above is not vacuous: each forbidden form is found in a planted file."""
    planted = tmp_path / "planted.py"
    planted.write_text(
        "from attngen.backends.cuda import config\n"
        "import attngen.backends.wgsl.config as wcfg\n"
        "config.CLEAN_VALUES = False\n"
        "wcfg.MAX_X, y = 1, 2\n"
        "setattr(config, 'KV_CAP', 1)\n"
        "def t(monkeypatch):\n"
        "    monkeypatch.setattr(config, 'SLACK', 2)\n"
        "    monkeypatch.setattr('attngen.backends.cuda.config.ROWS', 3)\n"
        "config.lower_case = 1\n"
        "from attngen.lang import source\n"
        "monkeypatch.setattr(source, 'MAX_SOURCE_BYTES', 1)\n"
    )
    hits = assignments_to_constants(planted)
    assert [h.split(":")[1] for h in hits] == ["3", "4", "5", "7", "8"], hits


@pytest.mark.parametrize("kind", ["templates", "attngen"])
def test_the_limits_are_measured_on_real_files(kind):
    files = [p for p in (ROOT_PATH / kind).rglob("*") if p.is_file() and p.suffix in (".j2", ".py")]
    assert len(files) > 10
