"""Every command README.md shows works as printed.

The shell commands of the README's ```sh blocks are collected (`&&` chains split, comments
dropped) and checked by kind:

- `attngen ...` (written `.venv/bin/attngen` in the README): run for real with this
  interpreter (`python -m attngen`, the same entry point) in a temporary directory that holds a
  copy of examples/, exit status 0 expected. `attngen run --target cuda` needs an NVIDIA GPU
  with CuPy: skipped, with the reason, unless one is here. Everything else (WGSL runs, builds
  and checks for both targets) runs on a machine without a GPU.
- `pip install ...`: the extras it names exist in pyproject.toml (tests/docs/test_install.py
  checks that they resolve together); `python3 -m venv` and `apt-get` need no check here.
- `bash scripts/test.sh [--quick]`: the script exists, and takes the option (it runs this suite; it is
  not run from inside it).

A command of any other kind fails the test, so that a new one gets a check. The README's
other code blocks (the spec example, the Python API, the command synopsis, the layout) are
not commands; untagged blocks may not hold command lines (tag them ```sh to have them run).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib

import pytest

from conftest import ROOT, cuda_available

README = os.path.join(ROOT, "README.md")
FENCE = re.compile(r"^```\s*([\w+-]*)\s*$")
COMMAND_PREFIXES = ("attngen ", ".venv/bin/", "python3 ", "pip ", "sudo ", "bash ")


def code_blocks(text: str) -> list[tuple[str, int, list[str]]]:
    """(language tag, first line number, lines) of every fenced block."""
    blocks, current = [], None
    for n, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if current is None and m:
            current = (m.group(1), n + 1, [])
        elif current is not None and line.strip() == "```":
            blocks.append(current)
            current = None
        elif current is not None:
            current[2].append(line)
    assert current is None, "README.md has an unclosed code block"
    return blocks


def readme_commands() -> list[tuple[int, list[str]]]:
    """(line number, argv) of every command of the README's sh blocks."""
    out = []
    for lang, first, lines in code_blocks(open(README, encoding="utf-8").read()):
        if lang not in ("sh", "bash", "shell"):
            continue
        pending, start = "", None
        for n, line in enumerate(lines, first):
            if start is None:
                start = n
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            words = shlex.split(pending + line, comments=True)
            pending = ""
            cmd = []
            for w in words + ["&&"]:
                if w == "&&":
                    if cmd:
                        out.append((start, cmd))
                    cmd = []
                else:
                    assert w not in ("|", ";", "||", ">", "<"), f"README.md:{start}: keep commands simple: {line}"
                    cmd.append(w)
            start = None
    return out


COMMANDS = readme_commands()


def command_id(item):
    n, argv = item
    return f"L{n}:" + " ".join(argv)[:90]


def test_commands_found():
    texts = [" ".join(a) for _, a in COMMANDS]
    assert any(t.startswith(".venv/bin/attngen build examples/llama3_8b.attn --target wgsl") for t in texts)
    assert any(t.startswith(".venv/bin/pip install") for t in texts)
    assert "bash scripts/test.sh" in texts


def test_untagged_blocks_hold_no_commands():
    text = open(README, encoding="utf-8").read()
    for lang, first, lines in code_blocks(text):
        if lang:
            continue
        for n, line in enumerate(lines, first):
            assert not line.startswith(COMMAND_PREFIXES), \
                f"README.md:{n}: a command in an untagged block (tag it ```sh so that it is tested): {line}"


def _extras() -> set[str]:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return set(tomllib.load(f)["project"].get("optional-dependencies", {}))


def check_pip_install(argv):
    args = argv[argv.index("install") + 1:]
    targets = [a for a in args if not a.startswith("-")]
    assert targets, argv
    for t in targets:
        m = re.fullmatch(r"\.(?:\[([\w,-]*)\])?", t)
        if m is None:
            # other packages (PyTorch for the benchmarks, say) are not the README's business here
            assert not t.startswith("attngen"), f"attngen is not on a package index: {argv}"
            continue
        wanted = set(filter(None, (m.group(1) or "").split(",")))
        assert wanted <= _extras(), f"pyproject.toml has no extra {sorted(wanted - _extras())}: {argv}"


def needs_gpu(args) -> bool:
    """attngen commands that launch a CUDA kernel (building and checking need no GPU)."""
    return args[0] == "run" and "cuda" in (args[args.index("--target") + 1] if "--target" in args else "")


@pytest.fixture
def workdir(tmp_path):
    shutil.copytree(os.path.join(ROOT, "examples"), tmp_path / "examples")
    return tmp_path


@pytest.mark.parametrize("item", COMMANDS, ids=[command_id(c) for c in COMMANDS])
def test_readme_command(item, workdir):
    n, argv = item
    where = f"README.md:{n}: {' '.join(argv)}"
    prog = argv[0]
    if prog in ("sudo", "apt-get"):
        assert "apt-get" in argv, where
        pytest.skip("system packages (apt-get): not installed by the tests")
    if prog == "python3" and argv[1:3] == ["-m", "venv"]:
        pytest.skip("makes a virtual environment: the tests run in one already")
    if os.path.basename(prog) == "pip" or argv[1:3] == ["-m", "pip"]:
        check_pip_install(argv)
        return
    if argv[:2] == ["bash", "scripts/test.sh"]:
        script = os.path.join(ROOT, "scripts", "test.sh")
        assert os.path.isfile(script), where
        for flag in argv[2:]:  # the script's own options (anything else would go to pytest)
            assert flag in ("--quick",) and f'"{flag}"' in open(script).read(), where
        return
    assert prog in ("attngen", ".venv/bin/attngen"), f"{where}: the test does not know this command; teach it"
    args = argv[1:]
    if needs_gpu(args) and not cuda_available():
        pytest.skip(f"needs an NVIDIA GPU with CuPy (the cuda target): {where}")
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["ATTNGEN_CACHE_DIR"] = str(workdir / "cache")
    proc = subprocess.run([sys.executable, "-m", "attngen", *args], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{where}\nexit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr
    if "-o" in args:
        out = workdir / args[args.index("-o") + 1]
        assert out.is_file() and out.stat().st_size > 0, where


# -- the examples' table --------------------------------------------------------------------

def examples_table() -> dict[str, tuple[list[str], str, str]]:
    """file name -> (kernels, dtype, runs-on) from the README's table of examples."""
    rows = {}
    for line in open(README, encoding="utf-8"):
        m = re.match(r"\|\s*`examples/([\w.-]+\.attn)`\s*\|(.*)\|(.*)\|(.*)\|\s*$", line)
        if m:
            kernels = re.findall(r"`(\w+)`", m.group(2))
            rows[m.group(1)] = (kernels, m.group(3).strip(), m.group(4).strip())
    return rows


def test_examples_table_matches_the_examples():
    """Every example is in the README's table with its kernels and dtype, and the table says
    truthfully which ones run without a GPU: the bf16 ones (cuda only; WGSL has no bf16)."""
    import attngen
    table = examples_table()
    files = sorted(f for f in os.listdir(os.path.join(ROOT, "examples")) if f.endswith(".attn"))
    assert sorted(table) == files
    for name in files:
        specs = attngen.parse(open(os.path.join(ROOT, "examples", name)).read(), name)
        kernels, dtype, runs_on = table[name]
        assert kernels == [s.name for s in specs], name
        assert {dtype} == {s.dtype for s in specs}, name
        if dtype == "bf16":
            assert runs_on.startswith("cuda only"), name
            for s in specs:  # and the WGSL target says why
                with pytest.raises(attngen.SpecError, match="WGSL has no bf16"):
                    attngen.emit(s, target="wgsl")
        else:
            assert "wgsl" in runs_on and "any machine" in runs_on, name
