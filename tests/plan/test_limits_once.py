"""attngen/limits.py is the one home of the numeric limits: no other module writes them again.

The reader, the target options, the runtimes' checks, the CUDA launcher and the command's
--shape once each wrote 2^31 - 1, 65535 or 2^30 themselves; a copy that drifted would accept
a value the next layer refuses (or launches wrongly). This test walks every module of the
package and fails on an integer expression whose value is one of the limits, outside limits.py
and the few places where the same number means something else (listed below, with why).
"""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

from attngen import limits

PACKAGE = Path(ROOT) / "attngen"

# The values that are limits (and the neighbours a copy would likely write: 2^31 for "< 2^31").
LIMIT_VALUES = {
    limits.INT32_MAX: "INT32_MAX", limits.INT32_MAX + 1: "INT32_MAX + 1", limits.MAX_GRID_YZ: "MAX_GRID_YZ",
    limits.MAX_SEQ_LEN: "MAX_SEQ_LEN", limits.UINT32_MAX: "UINT32_MAX",
}
# (module, text on the line): the same number, another meaning.
ELSEWHERE = [
    ("backends/wgsl/devices.py", "LLVMPIPE_LOOP_BUDGET = 65535"),  # llvmpipe's loop budget, not a grid limit
    ("backends/wgsl/blockmask.py", "UNSET = 0xFFFFFFFF"),  # a sentinel word of the block-mask lists
    ("backends/wgsl/emit.py", '"fill_word": 0xFFFFFFFF'),  # the same sentinel, in the manifest
    ("runtime/cache.py", '("GiB", 1 << 30)'),  # units of a byte count
    ("harness/runner.py", "GiB"),
]


def _integer_expressions(tree):
    """(line, value) of every largest expression made of integer constants only (2**31 - 1,
    1 << 30, 65535, ...): ast.parse does not fold them, so they are evaluated here."""
    out = []

    def constant(node):
        if isinstance(node, ast.Constant):
            return type(node.value) is int
        if isinstance(node, ast.BinOp):
            return constant(node.left) and constant(node.right)
        if isinstance(node, ast.UnaryOp):
            return constant(node.operand)
        return False

    def walk(node):
        if constant(node):
            out.append((node.lineno, eval(compile(ast.Expression(node), "<limit>", "eval"))))
            return
        for child in ast.iter_child_nodes(node):
            walk(child)

    walk(tree)
    return out


def test_limits_are_written_once():
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == "limits.py" or "__pycache__" in path.parts:
            continue
        lines = path.read_text().splitlines()
        for line, value in _integer_expressions(ast.parse("\n".join(lines), str(path))):
            if value not in LIMIT_VALUES:
                continue
            text = lines[line - 1]
            if any(rel == mod and part in text for mod, part in ELSEWHERE):
                continue
            bad.append(f"attngen/{rel}:{line}: {text.strip()[:90]}  (= {LIMIT_VALUES[value]})")
    assert not bad, "limits written outside attngen/limits.py (import them from there):\n" + "\n".join(bad)


def test_every_limit_says_why():
    """Each limit of limits.py has a comment above it: its reason."""
    lines = (PACKAGE / "limits.py").read_text().splitlines()
    tree = ast.parse("\n".join(lines))
    names = [n.targets[0].id for n in tree.body if isinstance(n, ast.Assign)]
    assert {"INT32_MAX", "MAX_GRID_YZ", "MAX_GRID_X", "MAX_HEADS", "MAX_SEQ_LEN"} <= set(names)
    for node in tree.body:
        if isinstance(node, ast.Assign):
            assert lines[node.lineno - 2].lstrip().startswith("#"), f"{node.targets[0].id}: no reason above it"


def test_the_old_names_are_the_limits():
    """The names other modules (and users) knew keep working, and are the limits themselves."""
    from attngen.backends.cuda import args as cuda_args
    from attngen.lang import options, reader
    from attngen.plan import masks
    from attngen.runtime import launch

    assert reader.MAX_INT == options.MAX_INT == launch.INT32_MAX == limits.INT32_MAX == 2**31 - 1
    assert reader.MAX_HEADS == launch.MAX_GRID_YZ == cuda_args.MAX_GRID_YZ == limits.MAX_GRID_YZ == 65535
    assert masks.MAX_SEQ_LEN == launch.MAX_SEQ_LEN == masks.WINDOW_CAP == limits.MAX_SEQ_LEN == 2**30
    assert options.Option("x", "int").hi == limits.INT32_MAX
