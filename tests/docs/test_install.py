"""Installing attngen: what pyproject.toml asks for, the hints printed when a device library is
missing, and the license that ships.

- One `pip install .` gives a machine without a GPU everything: lark, jinja2, numpy and wgpu
  are the base; CuPy is the optional `gpu` extra.
- Every combination of the extras resolves (checked here on the version ranges; with
  ATTNGEN_TEST_INSTALL=1, also by `pip install --dry-run` against the package index).
- The hints name commands that work: packages that exist on PyPI, or extras of this checkout
  (attngen itself is not on a package index).
- LICENSE holds the Apache License 2.0 that pyproject.toml names, and the wheel and the sdist
  carry it.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from conftest import ROOT

import attngen

with open(os.path.join(ROOT, "pyproject.toml"), "rb") as _f:
    PYPROJECT = tomllib.load(_f)
PROJECT = PYPROJECT["project"]
BASE = [Requirement(r) for r in PROJECT["dependencies"]]
EXTRAS = {name: [Requirement(r) for r in reqs] for name, reqs in PROJECT["optional-dependencies"].items()}
# What the README tells a user to install, alone or one after the other into one .venv.
DOCUMENTED = [".", ".[gpu]", ".[test]", ".[gpu,test]"]


def names(reqs) -> dict[str, Requirement]:
    return {canonicalize_name(r.name): r for r in reqs}


# -- dependencies ------------------------------------------------------------------------------

def test_base_is_everything_a_machine_without_gpu_needs():
    base = names(BASE)
    assert set(base) == {"lark", "jinja2", "numpy", "wgpu"}
    assert base["wgpu"].specifier.contains("0.32.0") and not base["wgpu"].specifier.contains("0.33.0")


def test_cupy_is_an_extra_of_its_own():
    assert not any(n.startswith("cupy") for n in names(BASE))
    gpu = names(EXTRAS["gpu"])
    assert {"cupy-cuda13x", "cuda-bindings", "nvidia-cuda-nvrtc"} <= set(gpu)
    assert gpu["cuda-bindings"].specifier.contains("13.5.0")
    assert gpu["nvidia-cuda-nvrtc"].specifier.contains("13.5.37")


def test_test_extra_compiles_cuda_without_gpu():
    """CI (scripts/test.sh installs .[test]) compiles every CUDA kernel with NVRTC 13."""
    test = names(EXTRAS["test"])
    assert {"pytest", "pytest-xdist", "hypothesis", "cuda-bindings", "nvidia-cuda-nvrtc"} <= set(test)
    assert not any(n.startswith("cupy") for n in test)
    assert test["cuda-bindings"].specifier.contains("13.5.0")
    assert test["nvidia-cuda-nvrtc"].specifier.contains("13.5.37")
    script = open(os.path.join(ROOT, "scripts", "test.sh")).read()
    assert "'.[test]'" in script


def _probe_versions(specifiers) -> list[Version]:
    """Versions at and around every bound the specifiers name: enough to find a common one."""
    out = set()
    for spec in specifiers:
        for s in spec:
            v = Version(s.version.replace(".*", ""))
            major, minor = v.release[0], (v.release[1] if len(v.release) > 1 else 0)
            out |= {v, Version(f"{major}.{minor}.999"), Version(f"{major}.999"),
                    Version(f"{major + 1}.0")}
            if major:
                out.add(Version(f"{major - 1}.999"))
            if minor:
                out.add(Version(f"{major}.{minor - 1}.999"))
    return sorted(out) or [Version("1.0")]


def compatible(reqs) -> list[str]:
    """Packages that no single version satisfies for all of `reqs`."""
    by_name = {}
    for r in reqs:
        by_name.setdefault(canonicalize_name(r.name), []).append(r.specifier)
    return [n for n, specs in by_name.items()
            if not any(all(s.contains(v, prereleases=True) for s in specs) for v in _probe_versions(specs))]


@pytest.mark.parametrize("combo", [c for k in (1, 2, 3) for c in itertools.combinations(sorted(EXTRAS), k)],
                         ids="+".join)
def test_extras_resolve_together(combo):
    reqs = BASE + [r for extra in combo for r in EXTRAS[extra]]
    assert compatible(reqs) == [], f"attngen[{','.join(combo)}] cannot resolve"


def test_conflict_detection_works():
    assert compatible([Requirement("cuda-bindings>=13,<14"), Requirement("cuda-bindings>=12,<13")]) \
        == ["cuda-bindings"]
    assert compatible([Requirement("cuda-bindings>=13,<14"), Requirement("cuda-bindings>=13")]) == []


@pytest.mark.skipif(os.environ.get("ATTNGEN_TEST_INSTALL") != "1",
                    reason="asks the package index: set ATTNGEN_TEST_INSTALL=1")
@pytest.mark.parametrize("target", DOCUMENTED)
def test_documented_installs_resolve(target, tmp_path):
    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
                           "--quiet", "--report", str(report), target], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    installed = {canonicalize_name(i["metadata"]["name"]) for i in json.loads(report.read_text())["install"]}
    assert {"attngen", "wgpu", "lark", "jinja2", "numpy"} <= installed


# -- the hints for a missing device library -----------------------------------------------------

def hint_of_missing_wgpu(monkeypatch):
    from attngen.backends.wgsl import devices
    monkeypatch.setattr(devices, "wgpu", None)
    monkeypatch.setattr(devices, "_STATE", None)
    with pytest.raises(attngen.LaunchError) as e:
        devices.device_state()
    return str(e.value)


def hint_of_missing_cupy(monkeypatch):
    from attngen.backends.cuda import devices
    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(attngen.LaunchError) as e:
        devices.cupy_module()
    return str(e.value)


def hint_of_missing_nvrtc(monkeypatch):
    from attngen.backends.cuda import nvrtc
    for mod in ("cuda.bindings", "cuda.bindings.nvrtc", "cupy_backends", "cupy_backends.cuda.libs"):
        monkeypatch.setitem(sys.modules, mod, None)
    with pytest.raises(attngen.CompileError) as e:
        nvrtc.compile_cubin('extern "C" __global__ void k() {}', "sm_80")
    return str(e.value)


# `pip install` and its arguments: quoted words, or bare words without shell punctuation
PIP = re.compile(r"pip install ((?:'[^']*'|[\w.\[\]<>=!~-]+)(?: (?:'[^']*'|[\w.\[\]<>=!~-]+))*)")


def check_hint(message: str):
    commands = PIP.findall(message)
    assert commands, f"no pip command in the hint: {message}"
    known = names(BASE + [r for reqs in EXTRAS.values() for r in reqs])
    for command in commands:
        for arg in shlex.split(command):
            m = re.fullmatch(r"\.\[([\w,-]+)\]", arg)
            if m:  # an extra of this checkout
                assert set(m.group(1).split(",")) <= set(EXTRAS), f"no such extra in {arg}: {message}"
                continue
            req = Requirement(arg)
            name = canonicalize_name(req.name)
            assert name != "attngen", f"attngen is not on a package index: {message}"
            assert name in known, f"{req.name} is not what pyproject.toml installs: {message}"
            if req.specifier:
                assert req.specifier == known[name].specifier, f"{arg} differs from pyproject.toml: {message}"


@pytest.mark.parametrize("hint", [hint_of_missing_wgpu, hint_of_missing_cupy, hint_of_missing_nvrtc],
                         ids=lambda f: f.__name__)
def test_hints_name_commands_that_work(hint, monkeypatch):
    check_hint(hint(monkeypatch))


def test_hint_checker_refuses_the_old_hints():
    with pytest.raises(AssertionError):
        check_hint("the WGSL runtime needs wgpu-py: pip install 'attngen[wgpu]' (wgpu>=0.32,<0.33)")
    with pytest.raises(AssertionError):
        check_hint("pip install '.[cuda11]'")
    check_hint("pip install 'wgpu>=0.32,<0.33', or pip install '.[gpu]'")


# -- the license --------------------------------------------------------------------------------

def test_license_is_apache_2():
    assert PROJECT["license"] == "Apache-2.0"
    text = open(os.path.join(ROOT, "LICENSE"), encoding="utf-8").read()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert "Copyright 2026 attngen authors" in text


def test_wheel_and_sdist_carry_the_license():
    assert "LICENSE" in PROJECT.get("license-files", [])
    sdist = PYPROJECT["tool"]["hatch"]["build"]["targets"]["sdist"]["include"]
    assert "LICENSE" in sdist
