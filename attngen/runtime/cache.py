"""The on-disk cache of built kernels, safe when several processes build the same one.

Entries live under $ATTNGEN_CACHE_DIR, else $XDG_CACHE_HOME/attngen, else ~/.cache/attngen,
keyed by a hash of (normalised spec, generator version, target, arch or adapter, profile).
A builder takes an exclusive lock on the key's lock file, checks again whether another
process finished the entry meanwhile, writes to a temporary file and renames it into place
(atomic on POSIX), so readers never see a partial entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: fall back to the atomic rename alone
    fcntl = None


def cache_dir() -> Path:
    env = os.environ.get("ATTNGEN_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "attngen"


def cache_key(**parts) -> str:
    """A stable hash of the key parts (strings and numbers)."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def cached(key: str, suffix: str, build) -> tuple[bytes, bool]:
    """The cached bytes for `key`, built by `build()` on a miss. Returns (data, was_hit)."""
    root = cache_dir()
    path = root / f"{key}{suffix}"
    if path.exists():
        return path.read_bytes(), True
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = open(root / f"{key}.lock", "a+b")
    except OSError:
        return build(), False  # an unwritable cache only costs time
    with lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if path.exists():
                return path.read_bytes(), True
            data = build()
            try:
                fd, tmp = tempfile.mkstemp(dir=root, prefix=f".{key}.", suffix=".tmp")
            except OSError:
                return data, False
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, path)
            except OSError:
                pass  # a full or read-only disk only costs time
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            return data, False
        finally:
            if fcntl is not None:
                fcntl.flock(lock, fcntl.LOCK_UN)
