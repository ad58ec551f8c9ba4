"""The safe writer (store/safewrite.py): whole or nothing, never through a planted link, 0640."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from store.safewrite import PRIVATE_MODE, atomic_open, copy_file, effective_mode, write_text


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_planted_link_at_any_temporary_name_is_never_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = tmp_path / "r.html"
    # the names a predictable writer would use, each a link to the victim
    for name in ("r.html.tmp", ".r.html.tmp", "r.html~"):
        (tmp_path / name).symlink_to(victim)
    write_text(out, "<p>report</p>\n")
    assert victim.read_text() == "precious\n"
    assert out.read_text() == "<p>report</p>\n" and not out.is_symlink()
    leftovers = {p.name for p in tmp_path.iterdir()} - {"victim.txt", "r.html"}
    assert leftovers == {"r.html.tmp", ".r.html.tmp", "r.html~"}  # only the planted links


def test_a_link_at_the_target_is_replaced_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = tmp_path / "r.json"
    out.symlink_to(victim)
    write_text(out, "{}\n")
    assert victim.read_text() == "precious\n"
    assert not out.is_symlink() and out.read_text() == "{}\n"


def test_telemetry_files_are_0640_or_stricter_under_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        assert _mode(write_text(tmp_path / "a.md", "a")) == PRIVATE_MODE
        os.umask(0o077)
        assert effective_mode() == 0o600
        assert _mode(write_text(tmp_path / "b.md", "b")) == 0o600
        # an existing, world-readable file is replaced by a private one, not chmod-ed in place
        wide = tmp_path / "c.md"
        wide.write_text("old")
        wide.chmod(0o666)
        os.umask(0o022)
        assert _mode(write_text(wide, "new")) == PRIVATE_MODE
    finally:
        os.umask(old)


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    out = tmp_path / "deep" / "er" / "seg.parquet"
    copy_file(_source(tmp_path, b"v1" * 1000), out)
    with pytest.raises(RuntimeError), atomic_open(out) as handle:
        handle.write(b"half")
        raise RuntimeError("disk full")
    assert out.read_bytes() == b"v1" * 1000
    assert [p.name for p in out.parent.iterdir()] == ["seg.parquet"]


def _source(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "source.bin"
    path.write_bytes(data)
    return path


def test_a_new_store_is_0640_under_the_umask(tmp_path: Path) -> None:
    """The agent's store holds other users' command lines: created 0640, not 0644."""
    from agent.store import Store

    old = os.umask(0o022)
    try:
        store = Store(tmp_path / "node.duckdb")
        store.check_writable()
        store.close()
    finally:
        os.umask(old)
    assert _mode(tmp_path / "node.duckdb") == PRIVATE_MODE
