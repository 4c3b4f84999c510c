"""The on-disk kernel cache: keys, hits, two processes building the same entry at once, digests
(a corrupt, unverifiable or unreadable entry is rebuilt with a warning), the functions behind
`attngen cache info` / `clear`, and the suite's own temporary cache directory."""

from __future__ import annotations

import builtins
import errno
import hashlib
import io
import multiprocessing as mp
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

import attngen
from attngen.runtime import cache

from conftest import ROOT


def _build_in_process(args):
    """Run in a child: build the same key concurrently; record each build in a log file."""
    root, key, log = args
    os.environ["ATTNGEN_CACHE_DIR"] = root

    def build():
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(0.3)  # long enough that the other process arrives while this one builds
        return b"cubin bytes " * 1000

    data, hit = cache.cached(key, ".bin", build)
    return data, hit


def test_two_processes_build_once_and_read_the_same_bytes(tmp_path):
    root, log = str(tmp_path / "cache"), str(tmp_path / "builds.log")
    key = cache.cache_key(spec="attention x {}", generator="test", target="cuda", arch="sm_90")
    ctx = mp.get_context("spawn")
    with ctx.Pool(4) as pool:
        results = pool.map(_build_in_process, [(root, key, log)] * 4)
    assert len({data for data, _ in results}) == 1 and results[0][0] == b"cubin bytes " * 1000
    assert open(log).read().count("\n") == 1, "the lock lets one process build, the others read"
    assert sorted(hit for _, hit in results) == [False, True, True, True]
    leftovers = [n for n in os.listdir(root) if n.endswith(".tmp")]
    assert leftovers == [], "no temporary files remain"


def test_keys_depend_on_every_part(tmp_path, monkeypatch):
    base = dict(spec="s", generator="g", target="cuda", arch="sm_80", profile="cuda-sm80")
    keys = {cache.cache_key(**base)}
    for part in base:
        keys.add(cache.cache_key(**{**base, part: base[part] + "'"}))
    assert len(keys) == len(base) + 1
    assert cache.cache_key(**base) == cache.cache_key(**dict(reversed(list(base.items()))))


def test_hit_after_miss_and_failed_builds_leave_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path))
    assert cache.cache_dir() == tmp_path
    assert cache.cached("k1", ".bin", lambda: b"abc") == (b"abc", False)
    assert cache.cached("k1", ".bin", lambda: b"other") == (b"abc", True)

    def fail():
        raise RuntimeError("compiler crashed")
    try:
        cache.cached("k2", ".bin", fail)
    except RuntimeError:
        pass
    assert not (tmp_path / "k2.bin").exists()
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


def test_unwritable_cache_only_costs_time(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(blocker / "cache"))
    assert cache.cached("k", ".bin", lambda: b"x") == (b"x", False)


# ---- digests: a corrupt or unverifiable entry is rebuilt, never loaded ---------------------------

KEY = "0123456789abcdef0123456789abcdef"  # the shape of cache_key()'s keys


def _use(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path))
    return tmp_path


def _no_warnings(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return fn(*args)


def test_entries_carry_a_sha256_digest(tmp_path, monkeypatch):
    root = _use(tmp_path, monkeypatch)
    assert _no_warnings(cache.cached, KEY, ".cubin", lambda: b"kernel") == (b"kernel", False)
    digest = (root / f"{KEY}.cubin.sha256").read_text()
    # the format of sha256sum, so `sha256sum -c` checks an entry by hand
    assert digest == f"{hashlib.sha256(b'kernel').hexdigest()}  {KEY}.cubin\n"
    assert _no_warnings(cache.cached, KEY, ".cubin", lambda: b"other") == (b"kernel", True)


def test_a_corrupt_entry_is_rebuilt_with_a_warning(tmp_path, monkeypatch):
    root = _use(tmp_path, monkeypatch)
    cache.cached(KEY, ".cubin", lambda: b"good kernel")
    (root / f"{KEY}.cubin").write_bytes(b"good kernel, flipped bits")
    with pytest.warns(cache.CacheWarning, match=f"{KEY}.cubin.*corrupt"):
        assert cache.cached(KEY, ".cubin", lambda: b"good kernel") == (b"good kernel", False)
    # rewritten: the next load verifies, without a warning
    assert _no_warnings(cache.cached, KEY, ".cubin", lambda: b"unused") == (b"good kernel", True)
    assert not [n for n in os.listdir(root) if n.endswith(".tmp")]


def test_an_entry_without_a_digest_is_rebuilt(tmp_path, monkeypatch):
    root = _use(tmp_path, monkeypatch)
    (root / f"{KEY}.cubin").write_bytes(b"from an older attngen, or truncated")
    with pytest.warns(cache.CacheWarning, match=f"{KEY}.cubin.*no digest"):
        assert cache.cached(KEY, ".cubin", lambda: b"fresh") == (b"fresh", False)
    assert _no_warnings(cache.cached, KEY, ".cubin", lambda: b"unused") == (b"fresh", True)


def test_a_bad_digest_file_is_rebuilt(tmp_path, monkeypatch):
    root = _use(tmp_path, monkeypatch)
    cache.cached(KEY, ".json", lambda: b"{}")
    (root / f"{KEY}.json.sha256").write_bytes(b"\xff\xfe not a digest")
    with pytest.warns(cache.CacheWarning, match=f"{KEY}.json"):
        assert cache.cached(KEY, ".json", lambda: b"{}") == (b"{}", False)
    assert _no_warnings(cache.cached, KEY, ".json", lambda: b"unused") == (b"{}", True)


# ---- unreadable entries: rebuilt with a warning, never a raw OS error -----------------------------

def _deny(monkeypatch, target: Path, inside: bool):
    """Fail every open (and, for a directory, every stat) of `target` (inside=False) or of
    anything inside it (inside=True) with EACCES: what mode 000 does to anyone but root, which
    ignores modes (the suite may run as root)."""
    target = os.fspath(target)

    def hit(p) -> bool:
        if not isinstance(p, (str, bytes, os.PathLike)):
            return False
        p = os.fsdecode(os.fspath(p))
        return p.startswith(target + os.sep) if inside else p == target

    def guard(fn):
        def wrapper(p, *args, **kwargs):
            if hit(p):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(p))
            return fn(p, *args, **kwargs)
        return wrapper
    names = [(io, "open"), (builtins, "open"), (os, "open")]
    if inside:
        names += [(os, "stat"), (os, "lstat"), (os, "listdir"), (os, "scandir")]
    for mod, name in names:
        monkeypatch.setattr(mod, name, guard(getattr(mod, name)))


def test_an_unreadable_entry_is_rebuilt_and_rewritten(tmp_path, monkeypatch):
    root = _use(tmp_path, monkeypatch)
    cache.cached(KEY, ".cubin", lambda: b"kernel")
    with monkeypatch.context() as m:
        _deny(m, root / f"{KEY}.cubin", inside=False)
        with pytest.warns(cache.CacheWarning, match=f"{KEY}.cubin.*(P|p)ermission denied"):
            assert cache.cached(KEY, ".cubin", lambda: b"kernel") == (b"kernel", False)
    assert _no_warnings(cache.cached, KEY, ".cubin", lambda: b"unused") == (b"kernel", True)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads mode-000 files")
def test_a_mode_000_entry_is_rebuilt(tmp_path, monkeypatch):
    root = _use(tmp_path, monkeypatch)
    cache.cached(KEY, ".cubin", lambda: b"kernel")
    os.chmod(root / f"{KEY}.cubin", 0)
    with pytest.warns(cache.CacheWarning, match=f"{KEY}.cubin"):
        assert cache.cached(KEY, ".cubin", lambda: b"kernel") == (b"kernel", False)


def test_a_directory_in_place_of_an_entry(tmp_path, monkeypatch):
    root = _use(tmp_path, monkeypatch)
    (root / f"{KEY}.cubin").mkdir()
    with pytest.warns(cache.CacheWarning, match=f"{KEY}.cubin"):
        assert cache.cached(KEY, ".cubin", lambda: b"kernel") == (b"kernel", False)
    assert (root / f"{KEY}.cubin").is_dir(), "what attngen did not write is left alone"
    assert not [n for n in os.listdir(root) if n.endswith(".tmp")]


def test_an_unreadable_cache_directory(tmp_path, monkeypatch):
    root = _use(tmp_path / "cache", monkeypatch)
    root.mkdir()
    cache.cached(KEY, ".cubin", lambda: b"kernel")
    with monkeypatch.context() as m:
        _deny(m, root, inside=True)
        with pytest.warns(cache.CacheWarning, match=f"{KEY}.cubin"):
            assert cache.cached(KEY, ".cubin", lambda: b"kernel") == (b"kernel", False)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads mode-000 directories")
def test_a_mode_000_cache_directory(tmp_path, monkeypatch):
    root = _use(tmp_path / "cache", monkeypatch)
    root.mkdir()
    cache.cached(KEY, ".cubin", lambda: b"kernel")
    os.chmod(root, 0)
    try:
        with pytest.warns(cache.CacheWarning, match=f"{KEY}.cubin"):
            assert cache.cached(KEY, ".cubin", lambda: b"kernel") == (b"kernel", False)
    finally:
        os.chmod(root, 0o700)


def _repair_in_process(args):
    """Run in a child: find the same corrupt entry as the others, rebuild it under the lock."""
    root, log = args
    os.environ["ATTNGEN_CACHE_DIR"] = root

    def build():
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(0.3)
        return b"repaired " * 1000
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        data, hit = cache.cached(KEY, ".cubin", build)
    return data, hit, len(seen)


def test_processes_finding_the_same_corrupt_entry_rebuild_it_once(tmp_path):
    root, log = tmp_path / "cache", str(tmp_path / "builds.log")
    root.mkdir()
    (root / f"{KEY}.cubin").write_bytes(b"corrupt")
    (root / f"{KEY}.cubin.sha256").write_text(f"{hashlib.sha256(b'other').hexdigest()}  {KEY}.cubin\n")
    with mp.get_context("spawn").Pool(4) as pool:
        results = pool.map(_repair_in_process, [(str(root), log)] * 4)
    assert {data for data, _, _ in results} == {b"repaired " * 1000}
    assert open(log).read().count("\n") == 1
    assert sorted((hit, warned) for _, hit, warned in results) == [(False, 1), (True, 0), (True, 0), (True, 0)]


# ---- attngen cache info / clear: the functions ----------------------------------------------------

def test_summary_and_clear(tmp_path, monkeypatch):
    root = _use(tmp_path / "cache", monkeypatch)
    s = cache.summary()
    assert s.directory == root and not s.exists and s.entries == 0
    assert cache.clear().removed_entries == 0  # a missing cache is fine
    k2 = "f" * 32
    cache.cached(KEY, ".cubin", lambda: b"x" * 1000)
    cache.cached(KEY, ".json", lambda: b"{}")
    cache.cached(k2, ".json", lambda: b"[]")
    (root / "notes.txt").write_text("not attngen's")
    s = cache.summary()
    assert s.exists and s.entries == 3
    assert s.kinds == {"cubin": (1, 1000), "json": (2, 4)}
    assert s.total_bytes > 1004  # digests and lock files count too
    assert s.other_files == ["notes.txt"]
    text = "\n".join(cache.describe(s))
    assert str(root) in text and "cubin" in text and "json" in text and "3 entries" in text
    report = cache.clear()
    assert report.removed_entries == 3 and report.errors == []
    assert sorted(os.listdir(root)) == ["notes.txt"], "only files attngen writes are removed"
    assert cache.summary().entries == 0


def test_the_summary_honours_xdg_cache_home(tmp_path, monkeypatch):
    monkeypatch.delenv("ATTNGEN_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache.summary().directory == tmp_path / "attngen"


# ---- the suite itself never writes to the user's cache --------------------------------------------

def test_the_suite_uses_a_temporary_cache():
    home_cache = Path(os.path.expanduser("~")).resolve() / ".cache"
    where = cache.cache_dir().resolve()
    assert os.environ.get("ATTNGEN_CACHE_DIR"), "tests/conftest.py sets it for every process"
    assert home_cache not in where.parents and where != home_cache
    assert not where.is_relative_to(Path(os.path.expanduser("~")).resolve())
    # and child processes (the command-line tests run some) inherit it
    r = subprocess.run([sys.executable, "-c", "from attngen.runtime.cache import cache_dir; print(cache_dir())"],
                       capture_output=True, text=True, check=True)
    assert Path(r.stdout.strip()).resolve() == where


# ---- parsed spec text (api.parse; docs/architecture.md "Start-up and per-call cost") -----------

def test_parsed_text_is_cached_and_a_fresh_process_loads_no_parser(tmp_path, monkeypatch):
    """The second parse of the same text (another process) comes from the disk cache: equal
    specs, lark never imported, and the plan's validation does not re-read the spec."""
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path))
    path = os.path.join(ROOT, "examples", "llama3_8b.attn")
    child = ("import sys, attngen\n"
             f"s = attngen.load({path!r})\n"
             "p = attngen.lower(s, 'cuda', 'cuda-sm90')\n"
             "print(repr(s) == repr(attngen.parse(open(sys.argv[1]).read(), sys.argv[1])[0]), 'lark' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    first = subprocess.run([sys.executable, "-c", child, path], capture_output=True, text=True, env=env, check=True)
    second = subprocess.run([sys.executable, "-c", child, path], capture_output=True, text=True, env=env, check=True)
    assert first.stdout.split() == ["True", "True"]  # parsed: lark loaded
    assert second.stdout.split() == ["True", "False"], second.stdout + second.stderr  # from the cache
    assert any(name.endswith(".spec") for name in os.listdir(tmp_path))


def test_a_changed_text_is_parsed_again(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path))
    a = attngen.parse("attention a {\n head_dim 64\n dtype f16\n}")[0]
    b = attngen.parse("attention a {\n head_dim 64\n dtype f16\n mask causal\n}")[0]
    assert a.mask.kind == "none" and b.mask.kind == "causal"
    assert attngen.parse("attention a {\n head_dim 64\n dtype f16\n}")[0] == a


# ---- issue 40 (hostile input): each failed before its fix ---------------------------------------

def test_the_parse_cache_holds_data_not_code(tmp_path, monkeypatch):
    """The parsed-spec entry was a pickle: whoever could write the cache directory ran code in
    every attngen process that parsed that text. It is JSON now, and a pickle planted under the
    key (with a valid digest) is never unpickled: the text is parsed again."""
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path))
    text, name = "attention a {\n head_dim 64\n dtype f16\n mask causal\n}\n", "a.attn"
    from attngen.api import _parse_key
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (marker,))

    import pickle
    cache.put(_parse_key(text, name), ".spec", pickle.dumps([Payload()]))
    spec = attngen.parse(text, name)[0]
    assert not marker.exists() and spec.mask.kind == "causal"
    import json
    stored = json.loads(cache.get(_parse_key(text, name), ".spec"))  # written again, as data
    assert stored and not marker.exists()


def test_specs_from_the_parse_cache_keep_their_source_positions(tmp_path, monkeypatch):
    """A spec read back from the cache equals the parsed one, spans included (the diagnostics of
    `check` point at its lines), for a spec with every kind of field."""
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path))
    text = ("attention a {\n head_dim qk=192 v=128\n heads q=16 kv=4\n dtype bf16\n mask window(left=7, right=0)\n"
            " softcap 30.5\n scale 0.125\n tile q=64 kv=32 d=64\n schedule split_kv(4)\n kv_cache paged(page=16)\n"
            " target cuda { warps=4 stages=2 }\n}\nattention b {\n head_dim 64\n dtype f16\n}\n")
    first = attngen.parse(text, "x.attn")
    again = attngen.parse(text, "x.attn")
    assert again == first and [repr(s) for s in again] == [repr(s) for s in first]

    def spans(specs):
        return [{k: (v.source.name, v.source.text, v.line, v.column, v.end_line, v.end_column)
                 for k, v in s.spans.items()} for s in specs]
    assert spans(again) == spans(first) and spans(again)[0]


def test_an_entry_copied_under_another_key_is_refused(tmp_path, monkeypatch):
    """An entry and its digest copied to another key's names fail the digest, which names the
    entry's own file (key and suffix): a cubin of one kernel is never loaded as another's."""
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path))
    a, b = "a" * 32, "b" * 32
    cache.cached(a, ".cubin", lambda: b"kernel a")
    for suffix in ("", ".sha256"):
        (tmp_path / f"{b}.cubin{suffix}").write_bytes((tmp_path / f"{a}.cubin{suffix}").read_bytes())
    with pytest.warns(cache.CacheWarning, match="does not match its sha256 digest"):
        assert cache.cached(b, ".cubin", lambda: b"kernel b") == (b"kernel b", False)
    assert cache.get(b, ".cubin") == b"kernel b"


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
@pytest.mark.parametrize("mode", [0o775, 0o777, 0o1777])
def test_a_cache_directory_others_can_write_is_not_used(tmp_path, monkeypatch, mode):
    """Whoever can write the cache directory chooses the cubins every reader loads (and, with
    the old pickled specs, ran code): a directory writable by group or others is not used --
    one CacheWarning per process and directory, then every kernel is built, nothing is read
    or written there."""
    root = tmp_path / "shared"
    root.mkdir()
    os.chmod(root, mode)
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(root))
    (root / ("c" * 32 + ".cubin")).write_bytes(b"planted")
    (root / ("c" * 32 + ".cubin.sha256")).write_bytes(cache._digest_line(root / ("c" * 32 + ".cubin"), b"planted"))
    with pytest.warns(cache.CacheWarning, match=r"writable by its group or by others.*not used.*chmod go-w"):
        assert cache.cached("c" * 32, ".cubin", lambda: b"built") == (b"built", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per directory
        assert cache.cached("d" * 32, ".cubin", lambda: b"built") == (b"built", False)
        assert cache.get("c" * 32, ".cubin") is None
        assert cache.put("d" * 32, ".cubin", b"x") is not None
        assert list(cache.entries(".cubin")) == []
    assert sorted(os.listdir(root)) == ["c" * 32 + ".cubin", "c" * 32 + ".cubin.sha256"]
    assert "not used" in "\n".join(cache.describe(cache.summary()))


@pytest.mark.skipif(os.name != "posix", reason="POSIX owners")
def test_a_cache_directory_of_another_user_is_not_used(tmp_path, monkeypatch):
    root = tmp_path / "theirs"
    root.mkdir(mode=0o700)
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(root))
    me = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: me + 1)  # as if another user owned it
    with pytest.warns(cache.CacheWarning, match=f"owned by user {me}, not by this user"):
        assert cache.cached("e" * 32, ".cubin", lambda: b"built") == (b"built", False)
    assert os.listdir(root) == []


def test_a_new_cache_directory_is_private(tmp_path, monkeypatch):
    """The directory attngen makes is the user's alone (0700, whatever the umask)."""
    root = tmp_path / "new" / "attngen"
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(root))
    old = os.umask(0o002)
    try:
        cache.cached("f" * 32, ".cubin", lambda: b"built")
    finally:
        os.umask(old)
    if os.name == "posix":
        assert root.stat().st_mode & 0o777 == 0o700
    assert cache.get("f" * 32, ".cubin") == b"built"
