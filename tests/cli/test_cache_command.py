"""`attngen cache info` and `attngen cache clear`."""

from __future__ import annotations

import os

from attngen.cli import main
from attngen.runtime import cache

KEY = "0123456789abcdef0123456789abcdef"


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def test_info_and_clear(capsys, tmp_path, monkeypatch):
    root = tmp_path / "c"
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(root))
    code, out, err = run(capsys, "cache", "info")
    assert code == 0 and str(root) in out and "0 entries" in out and "ATTNGEN_CACHE_DIR" in out
    code, out, _ = run(capsys, "cache", "clear")
    assert code == 0 and "nothing to remove" in out
    cache.cached(KEY, ".cubin", lambda: b"x" * 2048)
    cache.cached(KEY, ".json", lambda: b"{}")
    code, out, _ = run(capsys, "cache", "info")
    assert code == 0 and "2 entries" in out and ".cubin" in out and "2 KiB" in out and ".json" in out
    code, out, _ = run(capsys, "cache", "clear")
    assert code == 0 and "removed 2 entries" in out and str(root) in out
    assert os.listdir(root) == []
    code, out, _ = run(capsys, "cache", "info")
    assert code == 0 and "0 entries" in out


def test_info_honours_xdg_cache_home(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("ATTNGEN_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    code, out, _ = run(capsys, "cache", "info")
    assert code == 0 and str(tmp_path / "attngen") in out and "XDG_CACHE_HOME" in out
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path / "mine"))
    code, out, _ = run(capsys, "cache", "clear")
    assert code == 0 and str(tmp_path / "mine") in out


def test_clear_leaves_other_files(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path))
    (tmp_path / "mine.txt").write_text("keep me")
    cache.cached(KEY, ".wgsl", lambda: b"fn main() {}")
    code, out, _ = run(capsys, "cache", "clear")
    assert code == 0 and "removed 1 entry" in out and "mine.txt" in out
    assert os.listdir(tmp_path) == ["mine.txt"]


def test_cache_without_an_action_is_a_usage_error(capsys):
    code, _, err = run(capsys, "cache")
    assert code == 2 and "info" in err and "clear" in err


def test_a_cache_directory_that_is_a_file(capsys, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(blocker))
    for action in ("info", "clear"):
        code, _, err = run(capsys, "cache", action)
        assert code == 1 and err.startswith(f"error: cannot read the cache directory {blocker}: ")


def test_info_says_a_directory_others_can_write_is_not_used(capsys, tmp_path, monkeypatch):
    """(issue 40) A cache directory others can write is not used; `cache info` says so and how to fix it."""
    root = tmp_path / "shared"
    root.mkdir()
    os.chmod(root, 0o777)
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(root))
    code, out, _ = run(capsys, "cache", "info")
    assert code == 0 and "not used: the directory is writable by its group or by others (mode 777)" in out
    assert f"chmod go-w {root}" in out
    os.chmod(root, 0o700)
    code, out, _ = run(capsys, "cache", "info")
    assert code == 0 and "not used" not in out
