"""Every file the documentation cites exists in the repository.

README.md, docs/*.md, benchmarks/*.md and benchmarks/*/*.md are read. A relative link
`[text](path)` must resolve from the page's own folder, as a Markdown viewer resolves it. A repository path written in the
text or in `backticks` must name an existing file or folder of this repository: relative to
the page's folder or to the root, or (for the package-relative names of docs/architecture.md,
such as `lang/reader.py`) as the tail of a repository path. `*` globs and `<placeholders>` match
anything; a path that starts with a placeholder (`<out>/results.json`) names a file the reader
makes and is not checked; a path followed by `at <commit>` (`benchmarks/probe_x.py` at 1a2b3c4: a
script deleted since, cited where its result is recorded) names a file of that commit and is not
checked; URLs are ignored. In fenced code blocks (commands and their outputs:
tests/docs/test_readme.py runs the README's) only words that plainly are repository paths
(`examples/llama3_8b.attn`, `./x`, `../x`) are checked. Nothing outside the repository counts: it must be
understandable on its own.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import re
from functools import lru_cache

import pytest

from conftest import ROOT

PAGES = sorted(
    [os.path.join(ROOT, "README.md")]
    + glob.glob(os.path.join(ROOT, "docs", "*.md"))
    + glob.glob(os.path.join(ROOT, "benchmarks", "*.md"))
    + glob.glob(os.path.join(ROOT, "benchmarks", "*", "*.md"))  # probes/README.md
)

# File name endings that make a word a path even without a folder in front of it.
EXTENSIONS = ("md", "py", "sh", "toml", "lark", "attn", "j2", "json", "wgsl", "cu", "txt", "cfg",
              "yml", "yaml", "lock")
SKIP_DIRS = {".git", ".venv", "__pycache__", ".pytest_cache", ".hypothesis", "build", "dist",
             ".whl", ".gl", "node_modules"}

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+|\bmailto:\S+|\bwww\.\S+")
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"`([^`]+)`")
WORD = re.compile(r"[\w.<>*/{},-]+")
# `path` at <commit>: a file of that commit (a probe deleted since), not of the checkout.
AT_COMMIT = re.compile(r"`?[\w./-]+`? at [0-9a-f]{7,40}\b")
# Dated records keep the script paths of their day: benchmarks/X.py before the scripts were
# sorted into suite/, tools/ and probes/ (NOTES.md says so at its top). There such a path
# resolves at its new place.
HISTORICAL = (os.path.join("benchmarks", "NOTES.md"), os.path.join("benchmarks", "RESULTS.md"))
RENAMED = {"probe_varlen.py": "benchmarks/suite/varlen.py", "wgsl_probe_cases.py": "benchmarks/probes/common.py",
           # issue 39: body.j2 was split by kernel family; the plain loop kept its file's history
           "templates/cuda/body.j2": "templates/cuda/family_plain.j2", "body.j2": "templates/cuda/family_plain.j2"}


@lru_cache(maxsize=1)
def repository_paths() -> tuple[str, ...]:
    """Every file and folder of the checkout, relative to ROOT, with '/' separators."""
    out = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        rel = os.path.relpath(dirpath, ROOT).replace(os.sep, "/")
        prefix = "" if rel == "." else rel + "/"
        out += [prefix + d for d in dirnames] + [prefix + f for f in filenames]
    return tuple(out)


@lru_cache(maxsize=1)
def top_level() -> frozenset[str]:
    return frozenset(p for p in repository_paths() if "/" not in p)


def lines(text: str) -> list[tuple[int, str, bool]]:
    """(line number, line, inside a fenced code block) of a page."""
    out, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        out.append((n, line, fenced))
    return out


def looks_like_path(word: str, in_code: bool) -> bool:
    if word.startswith(("./", "../")):
        return True
    if word.startswith("attngen.") and "/" not in word:  # a module name: attngen.backends.wgsl
        return False
    if re.fullmatch(r"\*?\.(%s)" % "|".join(EXTENSIONS), word):  # an extension: "every `.py` file"
        return False
    if "/" in word:
        first = word.split("/", 1)[0]
        if first in top_level():
            return True
        if in_code and word.endswith("/") and re.fullmatch(r"[\w<>*.-]+(/[\w<>*.-]+)*/", word):
            return True  # `cuda/`, `backends/<target>/`
    return bool(re.search(r"\.(%s)$" % "|".join(EXTENSIONS), word)) and not re.fullmatch(r"[\d.]+", word)


def candidates(text: str) -> list[tuple[int, str, str]]:
    """(line, kind, path) for every link and every path-like word of a page."""
    out = []
    for n, line, fenced in lines(text):
        line = AT_COMMIT.sub(" ", line)
        if fenced:  # commands and outputs: only words that are plainly repository paths
            for word in WORD.findall(URL.sub(" ", line)):
                word = word.rstrip(".,;:")
                if word.startswith(("./", "../")) or word.split("/", 1)[0] in top_level() and "/" in word:
                    out.append((n, "path", word))
            continue
        for m in LINK.finditer(line):
            out.append((n, "link", m.group(1)))
        line = LINK.sub(lambda m: m.group(0).split("](", 1)[0], line)  # keep link texts only
        line = URL.sub(" ", line)
        spans = [(m.group(1), True) for m in INLINE_CODE.finditer(line)]
        spans.append((INLINE_CODE.sub(" ", line), False))
        for span, in_code in spans:
            for word in WORD.findall(span):
                word = word.lstrip(",;:").rstrip(".,;:")
                for part in expand_braces(word):
                    if part and looks_like_path(part, in_code):
                        out.append((n, "path", part))
    return out


def expand_braces(word: str) -> list[str]:
    """`tests/{lang,plan}` -> both paths; `a,b` -> both words; `grammar/templates/targets`
    (top-level folders joined by '/') -> the three folders: prose, not one path."""
    m = re.search(r"\{([^{}]*)\}", word)
    if not m:
        parts = [w for w in word.split(",") if w]
        out = []
        for w in parts:
            names = w.split("/")
            out += names if len(names) > 1 and all(n in top_level() for n in names) else [w]
        return out
    return [x for alt in m.group(1).split(",") for x in expand_braces(word[:m.start()] + alt + word[m.end():])]


def inside_root(path: str) -> bool:
    return os.path.realpath(path).startswith(os.path.realpath(ROOT) + os.sep) or \
        os.path.realpath(path) == os.path.realpath(ROOT)


def resolves(page: str, kind: str, path: str) -> bool:
    path = path.split("#", 1)[0]
    if not path:
        return True  # an anchor on the same page
    pattern = re.sub(r"<[^<>]*>", "*", path).rstrip("/")
    here = os.path.dirname(page)
    bases = [here] if kind == "link" or path.startswith(("./", "../")) else [here, ROOT]
    for base in bases:
        hits = glob.glob(os.path.join(base, pattern))
        if any(inside_root(h) for h in hits):
            return True
    if kind == "link" or path.startswith(("./", "../")):
        return False
    # Package-relative names (`lang/reader.py`, `cuda/__init__.py`) and bare file names
    # (`math_mma.j2`): the tail of some repository path.
    return any(fnmatch.fnmatchcase(p, pattern) or fnmatch.fnmatchcase(p, "*/" + pattern)
               for p in repository_paths())


def moved(path: str) -> list[str]:
    """Where a script a dated record names by its old path (benchmarks/X.py, or a renamed X.py) is now."""
    name = path[len("benchmarks/"):] if path.startswith("benchmarks/") else path
    if name in RENAMED:
        return [RENAMED[name]]
    if path.startswith("benchmarks/") and "/" not in name:
        return [f"benchmarks/{folder}/{name}" for folder in ("suite", "tools", "probes")]
    return []


def test_pages_found():
    names = {os.path.relpath(p, ROOT) for p in PAGES}
    assert {"README.md", os.path.join("docs", "architecture.md"), os.path.join("benchmarks", "README.md")} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: os.path.relpath(p, ROOT))
def test_cited_paths_exist(page):
    text = open(page, encoding="utf-8").read()
    found = candidates(text)
    historical = os.path.relpath(page, ROOT) in HISTORICAL
    missing = [f"{os.path.relpath(page, ROOT)}:{n}: {kind} {path!r}" for n, kind, path in found
               if not path.startswith("<") and not resolves(page, kind, path)
               and not (historical and any(resolves(page, kind, p) for p in moved(path)))]
    assert not missing, "cited but not in the repository:\n" + "\n".join(missing)


# -- the checker itself ------------------------------------------------------------------------

def test_checker_finds_what_it_should(tmp_path):
    page = os.path.join(ROOT, "docs", "x.md")
    text = "\n".join([
        "See [the design](../DESIGN.md) and [language](language.md), `../shared/ANCHORS.md`,",
        "benchmarks/head_dims.py, `examples/*.attn`, `backends/<t>/lower.py`, `lang/reader.py`,",
        "https://example.com/a/b.md, `attngen.backends.wgsl`, f16/bf16, K/V, `<out>/results.json`,",
        "`templates/{cuda,wgsl}/mask.j2`, templates/nothing.j2, `benchmarks/gone.py` at 1a2b3c4,",
        "benchmarks/gone_too.py at 1a2b3c4d (a deleted probe's commit)",
        "```",
        "attngen build missing/in/a/fence.attn -o out.wgsl && cat ../outside/x.md",
        "```",
    ])
    found = candidates(text)
    paths = [p for _, _, p in found]
    assert "benchmarks/head_dims.py" in paths and "../shared/ANCHORS.md" in paths
    assert not any("example.com" in p or p.startswith("attngen.") or p in ("f16/bf16", "K/V")
                   for p in paths)
    assert not any("fence" in p or "out.wgsl" in p for p in paths)
    assert not any("gone" in p for p in paths)
    bad = sorted(p for _, kind, p in found if not p.startswith("<") and not resolves(page, kind, p))
    assert bad == ["../DESIGN.md", "../outside/x.md", "../shared/ANCHORS.md", "benchmarks/head_dims.py",
                   "templates/nothing.j2"]
