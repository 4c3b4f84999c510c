"""The package's layout is its architecture (docs/architecture.md): imports point one way.

    text -> lang -> plan -> merge -> runtime -> reference -> backends -> harness -> api / cli

A module may import modules of its own layer or of layers below it, never above; no module
imports another in a circle (imports inside functions count too), and no package does either
(runtime/ -> reference.py -> runtime/ is a circle even when no single module closes it); only
attngen/backends/<name>/ knows its target, and no backend imports another; nothing imports
names from the package root.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

PACKAGE = Path(ROOT) / "attngen"

# Layers, bottom up: a module's layer is the first prefix that matches its name.
LAYERS = [
    ("attngen.version", 0), ("attngen.errors", 0), ("attngen.resources", 0), ("attngen.limits", 0),
    ("attngen.lang", 1),
    ("attngen.plan", 2),
    ("attngen.merge", 3),
    ("attngen.runtime", 4),
    # The oracle checks its inputs by the kernels' own rules (runtime.launch.resolve,
    # runtime.blockmask), so it sits above the runtime; what compares kernels with it
    # (harness/: attngen run, attngen tune) sits above both.
    ("attngen.reference", 5), ("attngen.reference_expr", 5),
    ("attngen.backends", 6),
    ("attngen.harness", 7),
    ("attngen.api", 8), ("attngen.cli", 8), ("attngen.__main__", 8), ("attngen", 8),
]
# Words that name a target or its device machinery: none may appear in code outside backends/.
TARGET_WORDS = ("cuda", "wgsl", "nvrtc", "wgpu")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in p.parts}


def layer(name: str) -> int:
    for prefix, rank in LAYERS:
        if name == prefix or name.startswith(prefix + "."):
            return rank
    raise AssertionError(f"module {name} is in no layer of this test: add it to LAYERS")


def imports(name: str, path: Path, known: dict) -> set[str]:
    """Modules of attngen that `name` imports, anywhere in its body."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "attngen"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "attngen":
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if sub in known else target)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) & set(known) for name, path in known.items()}


def test_no_module_imports_from_a_higher_layer():
    bad = [f"{a} (layer {layer(a)}) imports {b} (layer {layer(b)})"
           for a, deps in graph().items() for b in deps if layer(b) > layer(a)]
    assert not bad, "imports against the direction of the pipeline:\n" + "\n".join(bad)


def _circles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of two or more nodes (or one that imports itself):
    Tarjan's algorithm."""
    index, low, stack, on, circles, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in g[v]:
                circles.append(sorted(comp))
    for v in g:
        if v not in index:
            visit(v)
    return circles


def test_no_circles():
    circles = _circles(graph())
    assert not circles, f"modules that import each other in a circle: {circles}"


def unit(name: str, packages: set[str]) -> str:
    """The package a module belongs to, for the package-level graph: its folder (attngen.runtime,
    attngen.backends.cuda, attngen.backends for base/render/the registry); a module directly
    under attngen/ (reference, merge, errors, api, ...) is a unit of its own."""
    if name in packages:
        return name
    parent = name.rsplit(".", 1)[0]
    return name if parent == "attngen" else parent


def package_graph(g: dict[str, set[str]], packages: set[str]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for a, deps in g.items():
        ua = unit(a, packages)
        out.setdefault(ua, set()).update(u for u in (unit(b, packages) for b in deps) if u != ua)
    return out


def test_no_package_circles():
    """No package imports another that imports it back, through any of their modules: a
    package's modules may not reach one another through a module outside it."""
    packages = {name for name, path in modules().items() if path.name == "__init__.py"}
    circles = _circles(package_graph(graph(), packages))
    assert not circles, f"packages that import each other in a circle: {circles}"


def test_the_package_graph_sees_a_circle_no_module_closes():
    """The check itself, on the circle it was written for: runtime.runner imported reference,
    which imported runtime.launch. No module is in a circle; the packages are."""
    g = {"attngen.runtime.runner": {"attngen.reference"}, "attngen.reference": {"attngen.runtime.launch"},
         "attngen.runtime.launch": set(), "attngen.runtime": set()}
    assert not _circles(g)
    assert _circles(package_graph(g, {"attngen.runtime"})) == [["attngen.reference", "attngen.runtime"]]


def test_nothing_imports_the_package_root():
    bad = [a for a, deps in graph().items() if "attngen" in deps and a != "attngen"]
    assert not bad, f"modules importing names from the package root (import from their module instead): {bad}"


def _backend_package(name: str) -> str | None:
    """The target package a module belongs to (attngen.backends.<target>...), or None."""
    parts = name.split(".")
    if len(parts) >= 3 and parts[1] == "backends" and (PACKAGE / "backends" / parts[2]).is_dir():
        return parts[2]
    return None


def test_only_its_backend_knows_a_target():
    """No backend imports another's modules; the neutral backend modules (base, render, the
    registry) import none. (The registry loads the built-in backends by name, at run time.)"""
    bad = [f"{a} imports {b}" for a, deps in graph().items() if a.startswith("attngen.backends")
           for b in deps if _backend_package(b) is not None and _backend_package(b) != _backend_package(a)]
    assert not bad, "\n".join(bad)


# The backends' modules, by job: a job both targets do has the same module name in both (so a
# reader who knows one backend finds the other's), and a module of one target only is named here.
SHARED_JOBS = {
    "__init__": "the Backend subclass: options, profile keys, the protocol's methods",
    "config": "the configuration search",
    "tiles": "the tile table: the configuration's choices as data, with the profile's overrides",
    "lower": "the target's part of the plan",
    "emit": "the source and the manifest",
    "devices": "the device: opening it, its limits, the profile it matches, its name",
    "kernel": "the compiled Kernel subclass and its compile",
    "launch": "a call's launches: what runs on the device, in order",
    "args": "a call's parameters packed for the device",
    "expr": "score and mask expressions as the target's functions (issue 42)",
    "expr_blockmask": "the block-mask builder of a mask expression over inputs, and its cache (issue 42)",
    "expr_grads": "the backward's gradients of `grad` inputs (issue 42; cuda's fast family with atomics, wgsl and "
                  "cuda's deterministic family without: once per pair, or through partial sums)",
}
TARGET_ONLY = {
    "cuda": {"nvrtc", "tensor_maps", "torch_op",
             "choices",  # which kernel family and which of its parts serve a spec (config asks)
             "family",  # what each family's template renders (KernelShape; emit asks)
             "backward",  # the backward pass (issue 41): tiles, source, description, launches
             "backward_mma",  # the backward's mma.sync family (sm_80+): its rules, shared memory, check lines
             "backward_launch",  # the backward's launches: cubin, functions, arguments, run_backward
             "expr_bits",  # index-only mask expressions run on bits: the builder + mask custom (issue 42)
             "kvquant",  # quantized K/V caches (issue 44): the byte tiles' layout and column orders
             "fp8",  # FP8 prefill (issue 44): what it builds and refuses, V^T's layout, its shared memory and plan
             "fp8_call"},  # ... and its calls: FP8 inputs, the descales
    "wgsl": {"blockmask", "manifest", "unroll",
             "decode",  # the decode kernel: which specs it serves, its shape, its template's values
             "matrix"},  # the subgroup-matrix family (issue 43): configs from the profile, its rules and tiles
}


def _target_modules() -> dict[str, set[str]]:
    return {d.name: {p.stem for p in d.glob("*.py")} for d in sorted((PACKAGE / "backends").iterdir())
            if (d / "__init__.py").is_file()}


def test_the_backends_name_their_shared_jobs_alike():
    """Both built-in backends have a module of each shared job, under the same name, and every
    other module of a target package is one listed as that target's own (add a new one to
    TARGET_ONLY, or give it the shared name when the other target does the same job)."""
    found = _target_modules()
    assert set(found) >= {"cuda", "wgsl"}
    for target in ("cuda", "wgsl"):
        missing = set(SHARED_JOBS) - found[target]
        assert not missing, f"backends/{target}/ has no module for {sorted(missing)}"
    for target, names in found.items():
        unknown = names - set(SHARED_JOBS) - TARGET_ONLY.get(target, set())
        assert not unknown, (f"backends/{target}/: modules {sorted(unknown)} are neither a shared job "
                             f"({', '.join(SHARED_JOBS)}) nor listed in TARGET_ONLY")


def test_no_backend_module_shadows_a_public_name_of_its_package():
    """A module named like a name its package exports (wgsl's device(), WgslTensor, ...) would
    replace that name once imported: `attngen.backends.wgsl.device` would become the module.
    (Hence wgsl's devices.py, not device.py.)"""
    for target, names in _target_modules().items():
        tree = ast.parse((PACKAGE / "backends" / target / "__init__.py").read_text())
        public = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        for node in tree.body:  # the names served lazily: _RUNTIME = {"name": "module", ...}
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
                public |= {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
        clash = names & public
        assert not clash, f"backends/{target}/: modules {sorted(clash)} shadow the package's names"


def _code_words(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string constant (docstrings left out) and every identifier of a module."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = getattr(node, "body", [])
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                docstrings.add(id(body[0].value))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            out.append((node.lineno, node.value))
        elif isinstance(node, ast.Name):
            out.append((node.lineno, node.id))
        elif isinstance(node, ast.Attribute):
            out.append((node.lineno, node.attr))
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            out.append((node.lineno, node.name))
        elif isinstance(node, ast.arg):
            out.append((node.lineno, node.arg))
        elif isinstance(node, ast.alias):
            out.append((getattr(node, "lineno", 0), node.name))
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append((node.lineno, node.module))
    return out


def test_no_target_knowledge_outside_backends():
    """Outside attngen/backends/ no code names a target or its machinery (CUDA, NVRTC, WGSL,
    wgpu): no target-name comparisons, no target-specific fields or imports. Prose in
    docstrings and comments may mention them."""
    bad = []
    for name, path in modules().items():
        if name.startswith("attngen.backends"):
            continue
        for line, text in _code_words(path):
            low = text.lower()
            hit = next((w for w in TARGET_WORDS if w in low), None)
            if hit:
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {text[:70]!r}")
    assert not bad, "target knowledge outside attngen/backends/:\n" + "\n".join(bad)


def _imported_after(code: str) -> set[str]:
    probe = (f"import sys\n{code}\n"
             "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    return set(res.stdout.split())


HEAVY = {"cupy", "wgpu", "jinja2", "lark", "torch"}


def test_import_attngen_is_light():
    assert not _imported_after("import attngen") & HEAVY


@pytest.mark.parametrize("code, allowed", [
    ("import attngen; attngen.parse('attention a { head_dim 64\\n dtype f16 }')", {"lark"}),
    ("import attngen; attngen.emit(attngen.parse('attention a { head_dim 64\\n dtype f16 }')[0], 'wgsl')",
     {"lark", "jinja2"}),
    ("import attngen; attngen.emit(attngen.parse('attention a { head_dim 64\\n dtype f16 }')[0], 'cuda')",
     {"lark", "jinja2"}),
])
def test_libraries_load_when_needed(code, allowed):
    assert _imported_after(code) & HEAVY <= allowed


def test_public_functions_are_not_shadowed_by_their_modules():
    """attngen.reference and attngen.merge stay the functions once every module is imported."""
    import importlib
    import attngen
    for name in modules():
        if ".backends.wgsl." in name or ".backends.cuda." in name or name.endswith("__main__"):
            continue  # device libraries may be missing here; __main__ runs the command
        importlib.import_module(name)
    for name in attngen.__all__:
        value = getattr(attngen, name)
        assert not isinstance(value, type(attngen)), f"attngen.{name} is a module"


def test_every_option_the_tune_sweeps_set_is_marked_tiling():
    """`attngen tune` keeps a spec's other target options (harness/tune.py), so every option a
    backend's sweep sets must be marked `tiling` in its schema (tiling may hold more: cuda's
    warps fix tile q, which the sweep sets)."""
    from attngen import backends
    from attngen.lang.options import target_schema
    from conftest import spec_of
    for name in backends.names():
        tiling = {o.name for o in target_schema(name).options if o.tiling}
        swept = {k for c in backends.get(name).tune_space(spec_of("head_dim 64\n dtype f16")) for k in c["options"]}
        assert swept <= tiling, f"{name}: the sweep sets {sorted(swept - tiling)}, not marked tiling"
