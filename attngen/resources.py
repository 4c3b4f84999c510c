"""Where the language, templates and target profiles live.

In an installed wheel they sit inside the package (attngen/grammar, attngen/templates,
attngen/targets: pyproject force-includes them); in a source checkout run with
PYTHONPATH=. they sit at the top of the repository, beside the package.
"""

from __future__ import annotations

import functools
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
_KINDS = ("grammar", "templates", "targets")


@functools.lru_cache(maxsize=None)
def resource_dir(kind: str) -> Path:
    if kind not in _KINDS:
        raise ValueError(f"unknown resource kind {kind!r}")
    for base in (_PACKAGE, _PACKAGE.parent):
        if (base / kind).is_dir():
            return base / kind
    raise FileNotFoundError(
        f"attngen cannot find its {kind}/ folder (looked in {_PACKAGE} and {_PACKAGE.parent}); "
        "reinstall the package or run from a source checkout with PYTHONPATH set to it"
    )


def resource_path(kind: str, *parts: str) -> Path:
    return resource_dir(kind).joinpath(*parts)
