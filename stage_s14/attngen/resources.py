"""Where the language, templates and target profiles live.

In an installed wheel they sit inside the package (attngen/grammar, attngen/templates,
attngen/targets: pyproject force-includes them); in a source checkout run with
PYTHONPATH=. they sit at the top of the repository, beside the package. The generator
version (part of every cache key and manifest) is a digest of all of them and of the package's
own modules.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

from .version import __version__

_PACKAGE = Path(__file__).resolve().parent
_KINDS = ("grammar", "templates", "targets")
# Files shipped for users, not read by the generator (so not in its digest): the web runtime
# and demo page (examples/web in a checkout, attngen/web in a wheel).
_SHIPPED = {"web": "examples/web"}


@functools.lru_cache(maxsize=None)
def resource_dir(kind: str) -> Path:
    if kind not in _KINDS and kind not in _SHIPPED:
        raise ValueError(f"unknown resource kind {kind!r}")
    for path in (_PACKAGE / kind, _PACKAGE.parent / _SHIPPED.get(kind, kind)):
        if path.is_dir():
            return path
    raise FileNotFoundError(
        f"attngen cannot find its {kind}/ folder (looked in {_PACKAGE} and {_PACKAGE.parent}); "
        "reinstall the package or run from a source checkout with PYTHONPATH set to it"
    )


def resource_path(kind: str, *parts: str) -> Path:
    return resource_dir(kind).joinpath(*parts)


def _files_under(root: Path, prefix: str, suffix: str = "") -> list[tuple[str, Path]]:
    """(prefix/relative posix path, path) of the files under root (ending with `suffix`), sorted
    by name, __pycache__ left out (os.walk: pathlib's rglob costs most of a warm start)."""
    out = []
    base = str(root)
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        rel = os.path.relpath(dirpath, base).replace(os.sep, "/")
        for f in filenames:
            if f.endswith(suffix):
                out.append((f"{prefix}/{f}" if rel == "." else f"{prefix}/{rel}/{f}", Path(dirpath, f)))
    return sorted(out)


def generator_files(package: Path = _PACKAGE, dirs: dict | None = None) -> list[tuple[str, Path]]:
    """Every file the generated text and the compiled objects can depend on: each Python module
    of the package, and the grammar, templates and target profiles, as (stable name, path)."""
    files = _files_under(package, "attngen", ".py")
    for kind in _KINDS:
        files += _files_under((dirs or {}).get(kind) or resource_dir(kind), kind)
    return files


def digest_of(files: list[tuple[str, Path]]) -> str:
    h = hashlib.sha256()
    for name, path in files:
        data = path.read_bytes()
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def generator_version() -> str:
    """The package version plus a digest of every file of generator_files(), so that the disk
    cache never serves a kernel built by a different generator (an edit anywhere counts)."""
    return f"{__version__}+{digest_of(generator_files())[:12]}"
