"""rayform.files: the one atomic write used by the cache, the statistics and the server store."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from rayform.files import publish, unique_tmp_name, write_atomic


def test_write_atomic_writes_whole_file_with_its_mode(tmp_path: Path) -> None:
    dest = write_atomic(tmp_path / "a.json", b"{}", mode=0o444)
    assert dest == tmp_path / "a.json" and dest.read_bytes() == b"{}"
    assert stat.S_IMODE(dest.stat().st_mode) == 0o444
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]  # no temporary left


def test_write_atomic_replaces_and_uses_tmp_dir(tmp_path: Path) -> None:
    staging = tmp_path / "tmp"
    staging.mkdir()
    (tmp_path / "ref").write_bytes(b"old")
    write_atomic(tmp_path / "ref", b"new", tmp_dir=staging, tmp_name="ref.1.part")
    assert (tmp_path / "ref").read_bytes() == b"new"
    assert stat.S_IMODE((tmp_path / "ref").stat().st_mode) == 0o644
    assert list(staging.iterdir()) == []


def test_a_failed_rename_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "ref").write_bytes(b"old")

    def interrupted(src: object, dst: object) -> None:
        raise KeyboardInterrupt  # killed between the write and the rename

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(tmp_path / "ref", b"new")
    assert (tmp_path / "ref").read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ref"]


def test_an_existing_temporary_name_is_never_overwritten(tmp_path: Path) -> None:
    (tmp_path / "taken").write_bytes(b"someone else's")
    with pytest.raises(FileExistsError):
        write_atomic(tmp_path / "dest", b"x", tmp_name="taken")
    assert (tmp_path / "taken").read_bytes() == b"someone else's"
    assert not (tmp_path / "dest").exists()


def test_tmp_names_are_unique_and_name_the_process(tmp_path: Path) -> None:
    names = {unique_tmp_name("blob") for _ in range(100)}
    assert len(names) == 100
    assert all(
        n.startswith(".blob.") and f".{os.getpid()}." in n and n.endswith(".tmp") for n in names
    )
    src = tmp_path / "src"
    src.write_bytes(b"data")
    publish(src, tmp_path / "dest", mode=0o400)
    assert not src.exists() and stat.S_IMODE((tmp_path / "dest").stat().st_mode) == 0o400
