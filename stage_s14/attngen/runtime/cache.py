"""The on-disk cache of built kernels, safe when several processes build the same one.

Where. $ATTNGEN_CACHE_DIR, else $XDG_CACHE_HOME/attngen, else ~/.cache/attngen (`cache_dir()`).

What. One entry per (key, suffix): `<key><suffix>` (e.g. `<key>.cubin`), where the key is a
hash of (normalised spec, generator version, target, arch or adapter, profile, ...)
(`cache_key()`). Beside every entry lies its digest, `<key><suffix>.sha256`, one line in the
format of `sha256sum` (`<64 hex digits>  <entry's file name>`), so `sha256sum -c` checks an
entry by hand. The entry's bytes are kept as they are (a `.json` or `.wgsl` record stays
readable by other tools), which is why the digest is a separate file and not a header.

Loading. Every load reads the entry and its digest and compares them. An entry that cannot be
used -- its bytes do not match the digest (corrupt), it has no digest or an unreadable one
(unverifiable, e.g. written by an older attngen or cut short by a crash), or it cannot be read
at all (permission denied, a directory in its place, an unreadable cache directory) -- is never
loaded: it is built again, stored again when the cache is writable, and a `CacheWarning`
naming the entry says so. The build result is returned even when it cannot be stored; no OS
error of the cache reaches the caller (an unwritable cache only costs time).

Writing. A builder takes an exclusive lock on the key's lock file (`<key>.lock`), checks again
whether another process finished (or repaired) the entry meanwhile, writes the digest and the
entry to temporary files (`.<key>.*.tmp`) and renames them into place, digest first (atomic on
POSIX), so readers never see a partial entry: a reader that finds an entry it cannot verify
takes the lock and looks again before it rebuilds anything.

Trust. The cache holds data, never code for the host: cubins (loaded onto the GPU), WGSL
source, JSON manifests, tune results and parsed specs (JSON). Whoever can write the directory
still chooses the kernels every reader runs, so a directory that group or others can write, or
that another user owns, is not used at all (`unsafe()`): one CacheWarning per process and
directory says why and how to fix it (`chmod go-w`), and every kernel is built in memory.
attngen makes the directory mode 0700. The digest line names the entry's file, key and suffix
included, so an entry copied under another key fails its digest.

`summary()` and `clear()` serve `attngen cache info` and `attngen cache clear`; they count and
remove only files whose names are of the forms above, and leave anything else alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: fall back to the atomic rename alone
    fcntl = None

DIGEST_SUFFIX = ".sha256"


class CacheWarning(UserWarning):
    """A cache entry could not be used (corrupt, unverifiable or unreadable) and was rebuilt."""


def cache_dir() -> Path:
    env = os.environ.get("ATTNGEN_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "attngen"


def cache_dir_source() -> str:
    """Where cache_dir() came from, in words."""
    if os.environ.get("ATTNGEN_CACHE_DIR"):
        return "$ATTNGEN_CACHE_DIR"
    if os.environ.get("XDG_CACHE_HOME"):
        return "$XDG_CACHE_HOME/attngen"
    return "the default, ~/.cache/attngen"


_UNSAFE_WARNED: set = set()  # directories refused with a warning in this process


def unsafe(root: Path) -> str | None:
    """Why the cache directory `root` must not be used (writable by group or others, or owned
    by another user), or None (fine, or missing: attngen makes it private). POSIX only."""
    if not hasattr(os, "geteuid"):
        return None
    try:
        st = os.stat(root)
    except OSError:
        return None  # missing (made 0700 when first written) or unreadable (handled as such)
    if st.st_uid != os.geteuid():
        return f"is owned by user {st.st_uid}, not by this user ({os.geteuid()})"
    if st.st_mode & 0o022:
        return f"is writable by its group or by others (mode {st.st_mode & 0o7777:o})"
    return None


def _fix(root: Path, why: str) -> str:
    if "owned by" in why:
        return "set ATTNGEN_CACHE_DIR to a directory of your own"
    return f"make it private with 'chmod go-w {root}'"


def _usable(root: Path) -> bool:
    """Whether the cache directory may be read and written; warns once per directory if not."""
    why = unsafe(root)
    if why is None:
        return True
    if str(root) not in _UNSAFE_WARNED:
        _UNSAFE_WARNED.add(str(root))
        warnings.warn(f"attngen cache directory {root} {why}; it is not used (whoever can write it "
                      f"chooses the kernels attngen loads): every kernel is built in memory; {_fix(root, why)}",
                      CacheWarning,
                      stacklevel=4)
    return False


def _make_dir(root: Path) -> None:
    """The cache directory, made private (0700) when attngen makes it."""
    root.parent.mkdir(parents=True, exist_ok=True)
    root.mkdir(mode=0o700, exist_ok=True)


def cache_key(**parts) -> str:
    """A stable hash of the key parts (strings and numbers)."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _digest_path(path: Path) -> Path:
    return path.with_name(path.name + DIGEST_SUFFIX)


def _digest_line(path: Path, data: bytes) -> bytes:
    return f"{hashlib.sha256(data).hexdigest()}  {path.name}\n".encode()


def _reason(e: OSError) -> str:
    return e.strerror or str(e)


def _load(path: Path) -> tuple[bytes | None, str | None]:
    """(data, None) for a verified entry, (None, None) for a missing one, and (None, why) for
    one that cannot be used."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):  # no entry (or no cache directory)
        return None, None
    except OSError as e:
        return None, f"cannot be read ({_reason(e)})"
    digest_path = _digest_path(path)
    try:
        recorded = digest_path.read_bytes()
    except FileNotFoundError:
        return None, f"has no digest (no {digest_path.name}), so it cannot be verified"
    except OSError as e:
        return None, f"has a digest file that cannot be read ({_reason(e)})"
    if recorded != _digest_line(path, data):
        return None, "does not match its sha256 digest: the entry is corrupt"
    return data, None


def _write_temp(root: Path, key: str, data: bytes, made: list) -> str:
    fd, tmp = tempfile.mkstemp(dir=root, prefix=f".{key}.", suffix=".tmp")
    made.append(tmp)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return tmp


def _store(root: Path, key: str, path: Path, data: bytes) -> str | None:
    """Write an entry and its digest atomically; None, or why it could not be stored."""
    made: list = []
    try:
        digest_tmp = _write_temp(root, key, _digest_line(path, data), made)
        entry_tmp = _write_temp(root, key, data, made)
        os.replace(digest_tmp, _digest_path(path))  # the digest first: a reader that sees the
        os.replace(entry_tmp, path)                 # new entry sees its digest too
        return None
    except OSError as e:
        return _reason(e)
    finally:
        for tmp in made:
            try:
                os.unlink(tmp)
            except OSError:
                pass  # renamed into place, or gone with the cache directory


def _warn(path: Path, problem: str, stored: str | None) -> None:
    done = "rebuilt it" + (f", but could not store it ({stored})" if stored else " and stored it again")
    warnings.warn(f"attngen cache entry {path} {problem}; {done}", CacheWarning, stacklevel=3)


def get(key: str, suffix: str) -> bytes | None:
    """The bytes of an entry written by put(), or None (missing, unreadable, failing its digest,
    or in a directory others can write)."""
    root = cache_dir()
    if not _usable(root):
        return None
    data, _ = _load(root / f"{key}{suffix}")
    return data


def put(key: str, suffix: str, data: bytes) -> str | None:
    """Write (or replace) an entry, atomically with its digest; None, or why it could not be."""
    root = cache_dir()
    if not _usable(root):
        return f"the cache directory {unsafe(root)}"
    try:
        _make_dir(root)
    except OSError as e:
        return _reason(e)
    return _store(root, key, root / f"{key}{suffix}", data)


def entries(suffix: str):
    """The bytes of every valid entry with this suffix."""
    if not _usable(cache_dir()):
        return
    listing = _scan(cache_dir()) or []
    for name, kind, _ in listing:
        if kind == "entry" and name.endswith(suffix):
            data = get(name[: -len(suffix)], suffix)
            if data is not None:
                yield data


def cached(key: str, suffix: str, build) -> tuple[bytes, bool]:
    """The cached bytes for `key`, built by `build()` on a miss. Returns (data, was_hit).

    An entry that fails its digest or cannot be read is rebuilt with a CacheWarning (module
    docstring); errors of the cache itself never reach the caller, errors of `build()` do."""
    root = cache_dir()
    if not _usable(root):
        return build(), False
    path = root / f"{key}{suffix}"
    data, problem = _load(path)
    if data is not None:
        return data, True
    try:
        _make_dir(root)
        lock = open(root / f"{key}.lock", "a+b")
    except OSError as e:  # an unwritable cache only costs time
        data = build()
        if problem:
            _warn(path, problem, _reason(e))
        return data, False
    with lock:
        locked = False
        if fcntl is not None:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX)
                locked = True
            except OSError:
                pass  # a file system without locks: the atomic rename still protects readers
        try:
            # Another process may have built or repaired the entry while this one waited.
            data, again = _load(path)
            if data is not None:
                return data, True
            problem = again or problem
            data = build()
            stored = _store(root, key, path, data)
            if problem:
                _warn(path, problem, stored)
            return data, False
        finally:
            if locked:
                fcntl.flock(lock, fcntl.LOCK_UN)


# ---- attngen cache info / clear ----------------------------------------------------------------

_KEY = r"[0-9a-f]{32}"
_ENTRY = re.compile(rf"^({_KEY})\.(\w+)$")
_DIGEST = re.compile(rf"^({_KEY})\.(\w+){re.escape(DIGEST_SUFFIX)}$")
_LOCK = re.compile(rf"^({_KEY})\.lock$")
_TEMP = re.compile(rf"^\.({_KEY})\..*\.tmp$")


def _kind(name: str, is_file: bool) -> str | None:
    """'entry', 'digest', 'lock' or 'temp' for a file attngen writes; None for anything else."""
    if not is_file:
        return None
    if _LOCK.match(name):
        return "lock"
    if _DIGEST.match(name):
        return "digest"
    if _ENTRY.match(name):
        return "entry"
    if _TEMP.match(name):
        return "temp"
    return None


@dataclass
class Summary:
    """What `attngen cache info` prints."""

    directory: Path
    source: str  # where the directory came from
    exists: bool = False
    entries: int = 0
    kinds: dict = field(default_factory=dict)  # suffix without the dot -> (entries, bytes of entries)
    total_bytes: int = 0  # every file attngen wrote: entries, digests, lock and temporary files
    undigested: int = 0  # entries without a digest file (rebuilt when next used)
    other_files: list = field(default_factory=list)  # names attngen did not write (left alone)
    unsafe: str | None = None  # why the directory is not used (unsafe()), or None


def _scan(root: Path):
    """(name, kind, size) of every item of the cache directory, sorted by name (kind None: not
    a file attngen writes); None when the directory is missing; OSError when it cannot be listed."""
    out = []
    try:
        items = list(os.scandir(root))
    except FileNotFoundError:
        return None
    for item in sorted(items, key=lambda i: i.name):
        try:
            is_file = item.is_file(follow_symlinks=False)
            size = item.stat(follow_symlinks=False).st_size if is_file else 0
        except OSError:
            is_file, size = False, 0
        out.append((item.name, _kind(item.name, is_file), size))
    return out


def summary(root: Path | None = None) -> Summary:
    """The cache's directory, entries by kind and sizes; OSError when the directory exists but
    cannot be listed."""
    root = cache_dir() if root is None else Path(root)
    s = Summary(directory=root, source=cache_dir_source(), unsafe=unsafe(root))
    items = _scan(root)
    if items is None:
        return s
    s.exists = True
    names = {name for name, _, _ in items}
    for name, kind, size in items:
        if kind is None:
            s.other_files.append(name)
            continue
        s.total_bytes += size
        if kind == "entry":
            suffix = _ENTRY.match(name).group(2)
            count, nbytes = s.kinds.get(suffix, (0, 0))
            s.kinds[suffix] = (count + 1, nbytes + size)
            s.entries += 1
            if name + DIGEST_SUFFIX not in names:
                s.undigested += 1
    s.kinds = dict(sorted(s.kinds.items()))
    return s


def human_size(n: int) -> str:
    """Bytes in B, KiB, MiB or GiB, three significant digits."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def describe(s: Summary) -> list[str]:
    """The lines of `attngen cache info`."""
    lines = [f"cache directory: {s.directory} (from {s.source})"]
    if s.unsafe:
        lines.append(f"not used: the directory {s.unsafe}; attngen builds every kernel in memory "
                     f"until it is fixed ({_fix(s.directory, s.unsafe)})")
    if not s.exists:
        lines.append("0 entries (the directory does not exist yet)")
        return lines
    lines.append(f"{_plural(s.entries, 'entry', 'entries')}, {human_size(s.total_bytes)} on disk "
                 "(digests and lock files included)")
    if s.entries:
        width = max(len(k) for k in s.kinds)
        for kind, (count, nbytes) in s.kinds.items():
            lines.append(f"  .{kind:<{width}}  {_plural(count, 'entry', 'entries'):>12}  {human_size(nbytes):>9}")
    if s.undigested:
        lines.append(f"  {_plural(s.undigested, 'entry', 'entries')} without a digest (written by an older "
                     "attngen?): rebuilt when next used")
    if s.other_files:
        shown = ", ".join(s.other_files[:5]) + (", ..." if len(s.other_files) > 5 else "")
        lines.append(f"{_plural(len(s.other_files), 'other file', 'other files')} not written by attngen, "
                     f"left alone by 'attngen cache clear': {shown}")
    return lines


@dataclass
class ClearReport:
    """What `attngen cache clear` removed and left."""

    directory: Path
    exists: bool = False
    removed_entries: int = 0
    removed_files: int = 0  # entries, digests, lock and temporary files
    removed_bytes: int = 0
    busy_locks: int = 0  # lock files held by a process building now: left in place
    other_files: list = field(default_factory=list)
    errors: list = field(default_factory=list)  # (file name, reason)


def _lock_busy(path: Path) -> bool:
    if fcntl is None:
        return False
    try:
        with open(path, "a+b") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(f, fcntl.LOCK_UN)
    except OSError:
        pass
    return False


def clear(root: Path | None = None) -> ClearReport:
    """Remove every file attngen wrote to the cache directory (entries, digests, lock and
    temporary files), except the lock of a build in progress; leave other files alone. A
    missing directory is an empty cache. OSError when the directory cannot be listed."""
    root = cache_dir() if root is None else Path(root)
    report = ClearReport(directory=root)
    items = _scan(root)
    if items is None:
        return report
    report.exists = True
    for name, kind, size in items:
        if kind is None:
            report.other_files.append(name)
            continue
        path = root / name
        if kind == "lock" and _lock_busy(path):
            report.busy_locks += 1
            continue
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue  # removed meanwhile (another clear, or a build's temporary file renamed)
        except OSError as e:
            report.errors.append((name, _reason(e)))
            continue
        report.removed_files += 1
        report.removed_bytes += size
        report.removed_entries += kind == "entry"
    return report
