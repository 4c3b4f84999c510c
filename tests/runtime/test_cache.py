"""The on-disk kernel cache: keys, hits, and two processes building the same entry at once."""

from __future__ import annotations

import multiprocessing as mp
import os
import time

from attngen.runtime import cache


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
