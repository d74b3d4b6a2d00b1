"""Claims on blob downloads that work across the nodes of a cluster, without ``flock``.

``flock`` does not cross nodes on Lustre without ``-o flock``, on NFS without lockd or on
sshfs: there every node downloads every blob again. A *claim* needs only what every network
filesystem has, an atomic exclusive create and an atomic rename:

* ``claims/<hash>.claim`` is created with ``O_CREAT | O_EXCL`` (one creator wins, decided by
  the server) and holds a fixed-length record: host, pid, uid, a random token, a heartbeat
  counter and the bytes downloaded so far. Its holder rewrites the record every
  ``heartbeat_s`` from one thread per process, and removes the claim when the blob is done
  (or its download failed).
* Everyone else waits while the holder is alive by the cache's one liveness rule
  (:mod:`rayform.cache._liveness`): the record keeps changing, judged on the *waiter's* clock
  by re-reading it, never by comparing the holder's time or the file's ``st_mtime`` with ours
  (clocks of nodes differ, and network filesystems cache attributes for seconds, sshfs 20 s,
  while an ``open`` reads current content). The record keeps one length so that a cached file
  size never cuts a read short.
* A record unchanged for ``stale_s`` (more than the heartbeat plus any caching of content)
  belongs to a dead or frozen process: the waiter takes the claim over by renaming it aside
  (one taker wins the rename, even in another user's group-writable directory) and creating
  its own. A claim of a dead process on this host is taken over at once.
* On one host the claim is the only lock: ``O_EXCL`` is as exclusive there as across nodes,
  and a dead holder's PID tells at once.
* A holder that keeps beating but whose byte count has not moved for ``stall_s`` is alive but
  stuck (a stalled store): waiters then download on their own, as with a stalled ``flock``.

Claims only save duplicate downloads: a waiter that gives up, a holder that lost its claim to
a taker, or a filesystem where claims cannot be created all still end with one verified blob,
because every writer uses its own temporary file and an atomic rename.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from rayform._process import PerProcess
from rayform.cache._liveness import HOST, observer, pid_alive, unchanged_s

__all__ = [
    "HEARTBEAT_S",
    "STALE_S",
    "ClaimInfo",
    "Claimed",
    "blob_claim",
    "clean_claims",
    "read_claim",
]

#: Default seconds between two rewrites of a held claim.
HEARTBEAT_S = 2.0
#: Default seconds a claim's record must stay unchanged before others take it over.
STALE_S = 15.0
_RECORD_BYTES = 256  # one length for every record: a stale cached size never cuts a read
#: Seconds between two looks at another process's claim: the first look soon (most downloads
#: a reader waits for are a blob read-ahead started a moment ago, done in tens of ms), then
#: doubling up to ``_POLL_S``, which bounds what a long wait costs a network filesystem.
_FIRST_POLL_S = 0.005
_POLL_S = 0.25
_SUFFIX = ".claim"


class _Partial(Protocol):
    """What a claim reports of the download it guards (a :class:`~rayform.cache._partial.PartialBlob`)."""

    path: Path
    offset: int


@dataclass(frozen=True)
class ClaimInfo:
    """What a claim file says about its holder."""

    host: str
    pid: int
    uid: int
    token: str
    beat: int
    bytes: int
    #: the holder's partial file (``tmp/<part>``): a taker opens it by name, as a directory
    #: listing may be cached for seconds on another node
    part: str = ""


def _encode(info: ClaimInfo) -> bytes:
    doc = {
        "host": info.host[:64],
        "pid": info.pid,
        "uid": info.uid,
        "token": info.token,
        "beat": info.beat,
        "bytes": info.bytes,
        "part": info.part[:120],
        "time": round(time.time(), 1),
    }
    raw = json.dumps(doc, sort_keys=True).encode()
    return raw.ljust(_RECORD_BYTES - 1) + b"\n"


def _parse(raw: bytes | None) -> ClaimInfo | None:
    try:
        doc = json.loads(raw or b"")
        return ClaimInfo(
            str(doc["host"]),
            int(doc["pid"]),
            int(doc["uid"]),
            str(doc["token"]),
            int(doc["beat"]),
            int(doc["bytes"]),
            str(doc.get("part", "")),
        )
    except (ValueError, KeyError, TypeError):
        return None  # being written, or not ours


def read_claim(path: Path) -> bytes | None:
    """The current record of the claim at ``path`` (re-read from the file), or None if absent."""
    try:
        with open(path, "rb") as f:
            return f.read(_RECORD_BYTES * 2)
    except FileNotFoundError:
        return None
    except OSError:
        return b""


def _dead_here(info: ClaimInfo | None) -> bool:
    """True if the holder is a process of this host that is gone."""
    if info is None or info.host != HOST:
        return False
    if info.pid == os.getpid():
        return info.token not in _beats().tokens()
    return not pid_alive(info.pid)


class _Held:
    """A claim this process created: its open descriptor and what the next beat writes."""

    def __init__(self, path: Path, fd: int, heartbeat_s: float) -> None:
        self.path = path
        self.fd = fd
        self.heartbeat_s = heartbeat_s
        self.info = ClaimInfo(HOST, os.getpid(), os.geteuid(), secrets.token_hex(8), 0, 0)
        self.source: _Partial | None = None
        self.lost = False
        self.closed = False
        self.next_beat = time.monotonic() + heartbeat_s
        #: Held by every write and by the close: a beat must never write to a descriptor
        #: number that was closed and reused for another file (a partial blob, say).
        self.lock = threading.Lock()

    def write(self) -> None:
        """Write the next record (the caller holds :attr:`lock` and checked :attr:`closed`)."""
        done, part = (self.source.offset, self.source.path.name) if self.source else (0, "")
        self.info = ClaimInfo(
            self.info.host,
            self.info.pid,
            self.info.uid,
            self.info.token,
            self.info.beat + 1,
            done,
            part,
        )
        os.pwrite(self.fd, _encode(self.info), 0)
        os.fsync(self.fd)  # an NFS client would otherwise keep the beat in its own cache

    def mine(self) -> bool:
        info = _parse(read_claim(self.path))
        return info is not None and info.token == self.info.token

    def beat(self) -> None:
        """Rewrite the record, unless a taker has replaced the claim (then stop beating)."""
        with self.lock:
            if self.lost or self.closed:
                return
            try:
                if not self.mine():
                    self.lost = True  # taken over while we were frozen: the download goes on
                    return
                self.write()
            except OSError:
                pass  # a missed beat; the next one may succeed


class _Beats:
    """The one thread of a process that rewrites every claim it holds."""

    def __init__(self) -> None:
        self._held: dict[str, _Held] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def tokens(self) -> set[str]:
        with self._lock:
            return set(self._held)

    def add(self, held: _Held) -> None:
        with self._lock:
            self._held[held.info.token] = held
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="rayform-claims", daemon=True
                )
                self._thread.start()

    def remove(self, held: _Held) -> None:
        with self._lock:
            self._held.pop(held.info.token, None)

    def _run(self) -> None:
        while True:
            with self._lock:
                held = list(self._held.values())
                if not held:
                    self._thread = None
                    return
            now = time.monotonic()
            for h in held:
                if now >= h.next_beat:
                    h.next_beat = now + h.heartbeat_s
                    h.beat()
            time.sleep(min(0.5, min(h.heartbeat_s for h in held) / 4))


#: A forked child holds none of its parent's claims and has no heartbeat thread.
_BEATS: PerProcess[_Beats] = PerProcess(_Beats)


def _beats() -> _Beats:
    return _BEATS.get()


class Claimed:
    """What :func:`blob_claim` yields.

    Attributes:
        held: True if this process holds the claim (it should download the blob).
        taken_from: the holder whose stale claim was taken over, if any: its partial file
            may be adopted.
    """

    def __init__(self, held: _Held | None, taken_from: ClaimInfo | None) -> None:
        self._held = held
        self.held = held is not None
        self.taken_from = taken_from

    def track(self, source: _Partial) -> None:
        """Report ``source`` (its name, the bytes written so far) in the heartbeats, the
        first at once: a taker finds the file by that name."""
        held = self._held
        if held is not None:
            with held.lock:
                held.source = source
                if not held.closed:
                    with contextlib.suppress(OSError):
                        held.write()


def _create(path: Path, mode: int, heartbeat_s: float) -> _Held | None:
    """Create the claim; None if it exists. Raises OSError if claims cannot be made here."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    except FileExistsError:
        return None
    except PermissionError:
        # SFTP (sshfs) has no "exists" status: a create that loses the race on the server
        # fails as EPERM. It is only a real permission problem if there is no claim.
        if read_claim(path) is not None:
            return None
        raise
    held = _Held(path, fd, heartbeat_s)
    _beats().add(held)  # before anyone can read it: our own threads must see it alive
    with held.lock:
        try:
            os.fchmod(fd, mode)  # ours; the umask applied at creation
            held.write()
        except OSError:
            pass  # an empty record is still a claim; its first beat fills it
    return held


def _take_over(path: Path, seen: bytes) -> bool:
    """Remove the stale claim at ``path`` if it still holds ``seen``; True if it is gone."""
    aside = path.with_name(f"{path.name}.{HOST}.{os.getpid()}.{secrets.token_hex(4)}.stale")
    try:
        os.rename(path, aside)  # atomic: of several takers only one moves it
    except FileNotFoundError:
        return True
    except OSError:
        return False
    if read_claim(aside) != seen:  # a new claim replaced the stale one meanwhile: put it back
        with contextlib.suppress(OSError):
            os.rename(aside, path)
        return False
    with contextlib.suppress(OSError):
        os.unlink(aside)
    return True


def _release(held: _Held) -> None:
    _beats().remove(held)
    with held.lock:
        try:
            if not held.lost and held.mine():
                os.unlink(held.path)
        except OSError:
            pass
        finally:
            held.closed = True
            os.close(held.fd)


@contextlib.contextmanager
def blob_claim(
    path: Path,
    *,
    done: Callable[[], bool],
    mode: int = 0o644,
    heartbeat_s: float = HEARTBEAT_S,
    stale_s: float = STALE_S,
    stall_s: float = 10.0,
    check: Callable[[], None] | None = None,
) -> Iterator[Claimed]:
    """Hold the claim file ``path`` while the body downloads, or wait for its holder.

    Args:
        path: ``claims/<hash>.claim`` (its directory must exist).
        done: True when waiting is pointless (the blob is in the cache).
        mode: permission bits of the claim file (group-writable in a team cache).
        heartbeat_s: seconds between two rewrites of the record while held.
        stale_s: a record unchanged this long (on our clock) is taken over.
        stall_s: stop waiting for a holder that beats but has downloaded nothing this long.
        check: called at each look while waiting for the holder; what it raises ends the wait.

    Yields:
        :class:`Claimed`: ``held`` False means go ahead without a claim (done, stalled
        holder, or claims cannot be created here); correctness does not depend on it.
    """
    taken_from: ClaimInfo | None = None
    held: _Held | None = None
    root, key = path.parent.parent, f"claims/{path.name}"
    last_progress = time.monotonic()
    last_bytes = -1
    poll_s = _FIRST_POLL_S
    while True:
        try:
            held = _create(path, mode, heartbeat_s)
        except OSError:  # read-only cache, full disk, no O_EXCL here...: go on without
            break
        if held is not None or done():
            break
        raw = read_claim(path)
        if raw is None:
            time.sleep(0.01)  # released between our create and our read: try again soon
            continue
        now = time.monotonic()
        info = _parse(raw)
        quiet_s = unchanged_s(root, key, raw)  # the one liveness rule's clock
        if info is not None and info.bytes != last_bytes:
            last_bytes, last_progress = info.bytes, now
        if quiet_s > stale_s or _dead_here(info):
            if _take_over(path, raw):
                taken_from = info
            continue
        if now - last_progress > stall_s and now - quiet_s > last_progress + heartbeat_s:
            break  # alive, beating, downloading nothing: do not wait for a stalled store
        if check is not None:
            check()
        time.sleep(poll_s)
        poll_s = min(2 * poll_s, _POLL_S)
    observer().forget(root, key)  # what we saw of a claim we no longer wait on
    if held is None:
        yield Claimed(None, taken_from)
        return
    try:
        yield Claimed(held, taken_from)
    finally:
        _release(held)


def clean_claims(
    claims_dir: Path, stale_s: float, done: Callable[[str], bool]
) -> tuple[int, list[str]]:
    """Remove the claims nobody needs: on complete blobs (``done(hash)``), of dead processes
    of this host, or whose record (a claim set aside: its content) this host has seen
    unchanged for ``stale_s`` seconds, by the one liveness rule (:mod:`rayform.cache._liveness`,
    which keeps what earlier processes of this host saw, so a one-off command judges too).

    Returns:
        How many files were removed, and the rule's keys of the files kept.
    """
    n, kept = 0, []
    root = claims_dir.parent
    for p in claims_dir.glob(f"*{_SUFFIX}*"):
        raw = read_claim(p)
        if raw is None:
            continue
        key = f"claims/{p.name}"
        old = unchanged_s(root, key, raw) > stale_s
        live = p.name.endswith(_SUFFIX)
        if old or (live and (done(p.name[: -len(_SUFFIX)]) or _dead_here(_parse(raw)))):
            with contextlib.suppress(OSError):
                os.unlink(p)
                n += 1
                continue
        kept.append(key)
    return n, kept
