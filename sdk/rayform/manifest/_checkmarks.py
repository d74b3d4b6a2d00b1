"""Marks of manifests already checked, so that a warm open does not check its pages again.

A manifest's pages are checked in full the first time they are opened
(:mod:`rayform.manifest._pagecheck`, and the whole-manifest checks of segment IDs), which for a
fleet slice of a million segments is most of a warm open's time. Their bytes cannot change under their name
without their file changing: a page enters the cache only after its BLAKE3 hash is checked
(:meth:`~rayform.cache.Cache.put_manifest`), read-only, and is never hashed again on open
(hashing a fleet manifest's pages would take longer than the checks). So once a manifest's pages pass, this process
records *which files* passed: per page, the identity of the file it mapped (device, inode,
size, modification and status-change times in ns). The next open maps the pages, compares
each file's identity with the mark, and checks only what differs.

What makes a mark safe to trust:

* a file replaced (renamed over, or deleted and written again) has a new inode or status-change
  time, and a file written in place needs its read-only bits changed first, which sets its
  status-change time: either way its identity differs and it is checked again; a user cannot
  set a status-change time back;
* a mark is trusted only if this user wrote it: it lives in a directory per user id
  (``checked/u<uid>/``, mode ``0700``), and is read only when the file is owned by this user
  and writable by no one else, so a teammate sharing the cache cannot mark a page of theirs
  as checked for us (they can still make us check it again, which costs time, not safety);
* the mark names the version of the checks (:data:`CHECKS`): new checks check every page again.

What a mark does not cover: bytes changed on disk without any change to the file's metadata
(a failing disk). A cold open or ``rayform cache verify`` hashes the bytes again; the checks
themselves never hashed them.

A mark that cannot be read or written (a read-only cache, a full disk) is ignored: the pages
are checked as they were before marks existed.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from rayform.files import write_atomic

__all__ = ["CHECKS", "CheckMarks", "Identity", "file_identity"]

#: The version of the page and manifest checks; marks of another version are not trusted.
CHECKS = 1
#: Largest mark read (a root lists at most 100,000 pages, ~60 bytes each as JSON).
_MAX_MARK_BYTES = 16 * 1024 * 1024

#: ``(st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns)`` of an open file.
Identity = tuple[int, int, int, int, int]


def file_identity(st: os.stat_result) -> Identity:
    """The identity of a file from its ``stat``: what changes when its bytes may have."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class CheckMarks:
    """This user's marks of checked manifests, under ``directory`` (made on first write).

    Args:
        directory: the folder that holds every user's marks (``<cache>/checked``); this
            user's live in ``directory/u<uid>``.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._mine = self.directory / f"u{os.geteuid()}"

    def __reduce__(self) -> tuple[object, ...]:
        return (CheckMarks, (str(self.directory),))

    def load(self, digest: str) -> dict[str, Identity]:
        """``{page hash: identity}`` of the pages of manifest ``digest`` that passed the checks,
        as recorded by this user; empty when there is no trusted mark."""
        try:
            fd = os.open(self._mine / digest, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return {}
        try:
            st = os.fstat(fd)
            if (
                not stat.S_ISREG(st.st_mode)
                or st.st_uid != os.geteuid()
                or st.st_mode & 0o022
                or st.st_size > _MAX_MARK_BYTES
            ):
                return {}
            data = os.read(fd, st.st_size + 1)
        except OSError:
            return {}
        finally:
            os.close(fd)
        try:
            doc = json.loads(data)
            if doc.get("checks") != CHECKS:
                return {}
            return {str(h): _identity(v) for h, v in doc["pages"].items()}
        except (ValueError, TypeError, KeyError, AttributeError):
            return {}

    def save(self, digest: str, pages: dict[str, Identity]) -> None:
        """Record that the pages of manifest ``digest``, as the files ``pages`` identifies,
        passed every check (best effort: a failure to write is ignored)."""
        doc = {"checks": CHECKS, "pages": {h: list(v) for h, v in pages.items()}}
        try:
            self._mine.mkdir(mode=0o700, parents=True, exist_ok=True)
            st = os.lstat(self._mine)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                return
            if st.st_mode & 0o077:
                os.chmod(self._mine, 0o700)  # a team cache's setgid or umask bits
            write_atomic(self._mine / digest, json.dumps(doc).encode(), mode=0o600)
        except OSError:
            return


def _identity(value: object) -> Identity:
    if not isinstance(value, list) or len(value) != 5 or not all(type(x) is int for x in value):
        raise TypeError("not an identity")
    return (value[0], value[1], value[2], value[3], value[4])
