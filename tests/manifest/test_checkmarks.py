"""A manifest's pages are checked once per file, not on every open (``_checkmarks``)."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
from support import DEMO_SLICE, ServerProcess

import rayform
from rayform.errors import ManifestError
from rayform.manifest import _columnar
from rayform.manifest._checkmarks import CHECKS, CheckMarks


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The pages checked, in order (``check_page`` counted, still run)."""
    seen: list[str] = []
    real = _columnar.check_page

    def counting(table: object, span: tuple[int, int]) -> None:
        seen.append("page")
        real(table, span)  # type: ignore[arg-type]

    monkeypatch.setattr(_columnar, "check_page", counting)
    return seen


def _open() -> rayform.Slice:
    return rayform.Client(offline=True).slices.get(DEMO_SLICE)


def _mark(cache: Path, digest: str) -> Path:
    return cache / "checked" / f"u{os.geteuid()}" / digest


def test_a_warm_open_checks_no_page_again(
    client_env: ServerProcess, isolated_env: Path, checks: list[str]
) -> None:
    first = rayform.Client().slices.get(DEMO_SLICE)
    pages = len(first.manifest.doc["pages"])
    assert len(checks) == pages
    mark = _mark(isolated_env, first.manifest_hash)
    assert mark.stat().st_mode & 0o777 == 0o600 and mark.parent.stat().st_mode & 0o777 == 0o700
    again = _open()
    assert len(checks) == pages  # nothing checked again
    # A manifest sent to a spawned DataLoader worker opens there with the same marks.
    pickle.loads(pickle.dumps(again.manifest))
    assert len(checks) == pages
    assert list(again.segments.ids().to_pylist()) == list(first.segments.ids().to_pylist())


def test_a_page_file_changed_after_its_check_is_checked_again(
    client_env: ServerProcess, isolated_env: Path, checks: list[str]
) -> None:
    s = rayform.Client().slices.get(DEMO_SLICE)
    digest = s.manifest.doc["pages"][0]["hash"]
    page = isolated_env / "manifests" / digest[:2] / digest
    data = page.read_bytes()
    # Replaced by another file (a new inode): checked again, and again marked.
    os.chmod(page, 0o644)
    os.unlink(page)
    page.write_bytes(data)
    os.chmod(page, 0o444)
    n = len(checks)
    _open()
    assert len(checks) == n + 1
    _open()
    assert len(checks) == n + 1
    # Written in place with bytes that break the checks (a dictionary index past its
    # dictionary): the status-change time moved, so it is checked, and refused.
    os.chmod(page, 0o644)
    with open(page, "r+b") as f:
        f.write(_break_an_index(data))
    os.chmod(page, 0o444)
    with pytest.raises(ManifestError):
        _open()


def _break_an_index(data: bytes) -> bytes:
    """The page with its site dictionary indices set past the dictionary."""
    import pyarrow as pa

    buf = pa.py_buffer(data)
    table = pa.ipc.open_file(pa.BufferReader(buf)).read_all()  # zero-copy: views of buf
    indices = table.column("site").chunks[0].indices
    at = indices.buffers()[1].address - buf.address + 4 * indices.offset
    bad = (0x7FFFFFF0).to_bytes(4, "little") * len(indices)
    return data[:at] + bad + data[at + len(bad) :]


@pytest.mark.parametrize(
    "spoil", ["group-writable", "another-owner", "garbage", "other-checks", "a-directory"]
)
def test_an_untrusted_mark_is_ignored(
    client_env: ServerProcess, isolated_env: Path, checks: list[str], spoil: str
) -> None:
    s = rayform.Client().slices.get(DEMO_SLICE)
    pages = len(s.manifest.doc["pages"])
    mark = _mark(isolated_env, s.manifest_hash)
    if spoil == "group-writable":  # a teammate could have written it
        os.chmod(mark, 0o660)
    elif spoil == "another-owner":  # a teammate's file put in our place
        os.chown(mark, os.geteuid() + 1, -1)
    elif spoil == "garbage":
        os.chmod(mark, 0o600)
        mark.write_text("{not json")
    elif spoil == "other-checks":
        doc = json.loads(mark.read_text())
        mark.write_text(json.dumps({**doc, "checks": CHECKS + 1}))
    else:
        mark.unlink()
        mark.mkdir()
    _open()
    assert len(checks) == 2 * pages


def test_a_mark_that_cannot_be_written_is_skipped(
    client_env: ServerProcess, isolated_env: Path, checks: list[str]
) -> None:
    # A file where the marks' directory would go: the open works, checking every time.
    rayform.Client().slices.get(DEMO_SLICE)
    shutil.rmtree(isolated_env / "checked")
    (isolated_env / "checked").write_text("")
    n = len(checks)
    _open()
    _open()
    assert len(checks) == 3 * n


def test_marks_round_trip_and_are_per_user(tmp_path: Path) -> None:
    marks = CheckMarks(tmp_path / "checked")
    assert marks.load("ab" * 32) == {}
    marks.save("ab" * 32, {"cd" * 32: (1, 2, 3, 4, 5)})
    assert marks.load("ab" * 32) == {"cd" * 32: (1, 2, 3, 4, 5)}
    assert (tmp_path / "checked" / f"u{os.geteuid()}" / ("ab" * 32)).is_file()
