"""Who may write a cache: the permission bits a process gives what it creates there.

A *private* cache belongs to one user: directories and files get the usual bits (the umask
applies). A *shared* (team) cache is one directory that several Unix users of one group write
to. There every process must create what it writes group-writable, or the next user cannot add
a blob to a directory it made, adopt its partial download or take over its claim. So in shared
mode a process:

* creates directories ``2775`` (group-writable; setgid, so the group is inherited) and files
  ``0664`` (cached objects end ``0444``), setting the bits right after creation, on what it
  owns, because the umask (typically ``022``) strips group write at creation;
* never changes the mode of a directory or file that another user owns (only the owner, or
  root, may; trying made every pull of a second user fail);
* reports, once per directory and process, an existing directory that other users cannot
  write to, with the command that fixes it, and goes on (only writes into that directory fail).

Shared mode is on when asked for (``Client(shared=True)``, ``--shared``,
``RAYFORM_CACHE_SHARED=1``), and otherwise inferred from the cache root: a root that is
group-writable and setgid (``chmod 2775 DIR``, as docs/cache.md asks of a team cache) is
shared. Inference is what makes every writer agree (a puller, a training job's lazy fetch,
cached statistics, ``rayform cache prune``), whichever way it was started.
``RAYFORM_CACHE_SHARED=0`` turns inference off.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
import time
from pathlib import Path

from rayform._env import env_flag
from rayform.files import unique_tmp_name

__all__ = ["SHARED_DIR_MODE", "SHARED_FILE_MODE", "CacheModes", "shared_mode"]

log = logging.getLogger("rayform.cache")

#: Directories of a shared cache: rwxrwsr-x.
SHARED_DIR_MODE = 0o2775
#: Files of a shared cache while they are written (partial downloads, refs, statistics).
SHARED_FILE_MODE = 0o664
_PRIVATE_FILE_MODE = 0o644
_NEEDED = stat.S_ISGID | stat.S_IWGRP | stat.S_IXGRP | stat.S_IRGRP
#: How long another user's new directory may lack the team's bits before it is reported.
_SETTLE_S = 2.0

#: Directories already reported in this process (a forked child inherits the set: reported once).
_REPORTED: set[str] = set()
_REPORTED_LOCK = threading.Lock()


def shared_mode(root: Path, shared: bool | None) -> bool:
    """Whether the cache at ``root`` is shared by a team.

    Args:
        root: the cache directory (it may not exist yet).
        shared: an explicit choice (wins), or ``None`` to read ``RAYFORM_CACHE_SHARED`` and,
            if that is unset or empty, infer it from ``root``'s mode (setgid and group-writable).
    """
    if shared is not None:
        return shared
    if os.environ.get("RAYFORM_CACHE_SHARED", "").strip():
        return env_flag("RAYFORM_CACHE_SHARED")
    try:
        mode = os.stat(root).st_mode
    except OSError:
        return False
    return bool(mode & stat.S_ISGID) and bool(mode & stat.S_IWGRP)


class CacheModes:
    """Creates the directories and sets the modes of the files of one cache.

    Args:
        root: the cache directory.
        shared: whether it is a team cache (see :func:`shared_mode`).
    """

    def __init__(self, root: Path, shared: bool) -> None:
        self.root = root
        self.shared = shared
        #: Existing directories whose mode was checked (shared mode): once each.
        self._known: set[Path] = set()

    @property
    def file_mode(self) -> int:
        """Mode of a file while it is written and of small mutable files (refs, statistics)."""
        return SHARED_FILE_MODE if self.shared else _PRIVATE_FILE_MODE

    def make_dirs(self, path: Path) -> None:
        """Create directory ``path`` and its missing parents, with the cache's modes.

        Raises:
            OSError: a directory could not be created (read-only, no permission, full disk).
        """
        missing = []
        p = path
        while not p.is_dir():  # a stat per call, as a plain mkdir -p would do
            if p == p.parent:
                break
            missing.append(p)
            p = p.parent
        if self.shared and p not in self._known:
            self._check(p)
            self._known.add(p)
        for d in reversed(missing):
            if self.shared:
                self._make_shared(d)
                continue
            try:
                os.mkdir(d, 0o777)
            except FileExistsError:  # another process made it meanwhile
                continue

    def _make_shared(self, d: Path) -> None:
        """Create ``d`` and give it its team mode (the umask dropped group write).

        A plain ``mkdir``: a directory never replaces one another process made, because that
        process may be creating a file in it right now (its ``open`` or ``rename`` would then
        fail with ENOENT, a window of a network round trip on sshfs or NFS). A process killed
        between ``mkdir`` and ``chmod`` leaves an empty directory only its owner can write;
        :meth:`_check` repairs that one.
        """
        try:
            os.mkdir(d, SHARED_DIR_MODE)
        except FileExistsError:
            if not d.is_dir():
                raise
            self._check(d)  # another process made it meanwhile
            return
        os.chmod(d, SHARED_DIR_MODE)

    def own_file(self, fd: int) -> None:
        """Give a file this process just created (open as ``fd``) the cache's file mode."""
        if self.shared:
            os.fchmod(fd, SHARED_FILE_MODE)

    def _check(self, d: Path) -> None:
        """In shared mode: fix a directory of ours that others cannot write; report another's."""
        if d != self.root and self.root not in d.parents:
            return
        st = _lacking(d)
        if st is None:
            return
        if st.st_uid == os.geteuid():
            try:
                os.chmod(d, stat.S_IMODE(st.st_mode) | _NEEDED)
                return
            except OSError:
                pass
        with _REPORTED_LOCK:
            if str(d) in _REPORTED:
                return
        # A teammate may have just made it: its chmod follows its mkdir (a wider window over a
        # network filesystem). Seen by two users on two sshfs nodes (tests/cache/test_claims_nodes.py).
        deadline = time.monotonic() + _SETTLE_S
        while time.monotonic() < deadline:
            time.sleep(0.05)
            st = _lacking(d)
            if st is None:
                return
        if d != self.root and _unwritable(d) and _replace_empty(d):
            return
        with _REPORTED_LOCK:
            if str(d) in _REPORTED:
                return
            _REPORTED.add(str(d))
        log.warning(
            "shared cache directory %s has mode %s (owner uid %d): other users of the team cannot "
            "write to it, so their fetches into it fail. Its owner (or root) fixes it with: "
            "chmod 2775 %s   (or for the whole cache: chmod -R g+w %s && find %s -type d -exec "
            "chmod g+s {} +)",
            d,
            stat.filemode(st.st_mode),
            st.st_uid,
            d,
            self.root,
            self.root,
        )


def _unwritable(d: Path) -> bool:
    """Whether this process truly cannot create an entry in ``d``: asked of the filesystem
    itself, because a network filesystem's ``stat`` may show a mode from before a teammate's
    ``chmod`` (sshfs keeps attributes for 20 s), and such a directory is in use."""
    probe = d / unique_tmp_name("probe")
    try:
        os.mkdir(probe)
    except PermissionError:
        return True
    except OSError:
        return False
    with contextlib.suppress(OSError):
        os.rmdir(probe)
    return False


def _replace_empty(d: Path) -> bool:
    """Replace ``d``, another user's directory that this process cannot write, by a team
    directory, if it is empty: what a process killed between its ``mkdir`` and ``chmod``
    leaves. Its owner's processes fix the mode themselves at once (:meth:`CacheModes._check`),
    so one that stays unwritable this long is abandoned. True if ``d`` is now a team
    directory."""
    tmp = d.parent / unique_tmp_name(d.name)
    try:
        os.mkdir(tmp, SHARED_DIR_MODE)
    except OSError:
        return False
    try:
        os.chmod(tmp, SHARED_DIR_MODE)
        os.rename(tmp, d)  # fails (ENOTEMPTY or EEXIST) if anything is in d
    except OSError:
        with contextlib.suppress(OSError):
            os.rmdir(tmp)
        return _lacking(d) is None
    log.info("replaced the empty shared cache directory %s, which teammates could not write", d)
    return True


def _lacking(d: Path) -> os.stat_result | None:
    """``d``'s stat if it lacks a team bit (group rwx, setgid); None if it has them or is gone."""
    try:
        st = os.stat(d)
    except OSError:
        return None
    return None if st.st_mode & _NEEDED == _NEEDED else st
