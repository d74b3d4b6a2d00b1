"""A team cache shared by real Unix users of one group (docs/cache.md, "Shared caches").

The cache root belongs to a third user (root), ``chgrp team DIR && chmod 2775 DIR`` as the docs
say; two users of the team pull, prune, verify and train in it with ``runuser``. Shared mode is
not asked for on any command line: it is inferred from the root's setgid group-writable mode,
which is what makes every writer (a lazy fetch, cached statistics, ``cache prune``) agree.

Needs root (to add users and run as them). The users and group are created once per machine
if missing and left in place, so that concurrent or later runs find them.
"""

from __future__ import annotations

import grp
import json
import logging
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import DEMO_SLICE, SCRIPTS, TOKEN, ServerProcess
from support.team import GROUP, USERS, ensure_users, reachable

from rayform.cache._sharing import CacheModes

CHECKOUT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("runuser"),
    reason="needs root with useradd and runuser to run as two real users of one group",
)


@pytest.fixture(scope="module")
def team() -> Iterator[Path]:
    """A directory for the test, reachable by the team's users; removed afterwards."""
    ensure_users()
    reachable(Path(sys.executable).parent)
    reachable(Path(os.path.realpath(sys.executable)).parent)
    reachable(CHECKOUT)
    base = Path(tempfile.mkdtemp(prefix="rayform-team-", dir="/tmp"))
    os.chmod(base, 0o755)
    for user in USERS:
        home = base / f"home-{user}"
        home.mkdir()
        pw = pwd.getpwnam(user)
        os.chown(home, pw.pw_uid, pw.pw_gid)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _as(
    user: str,
    base: Path,
    cache: Path,
    *args: str,
    server: ServerProcess | None = None,
    offline: bool = False,
) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(base / f"home-{user}"),
        "PYTHONPATH": os.pathsep.join(str(CHECKOUT / d) for d in ("sdk", "server_stub", "tests")),
        "RAYFORM_CACHE_DIR": str(cache),
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "error::UserWarning",
    }
    if server is not None:
        env.update(RAYFORM_ENDPOINT=server.url, RAYFORM_TOKEN=TOKEN)
    if offline:
        env["RAYFORM_OFFLINE"] = "1"
    # umask 022, as on most systems: shared mode must not depend on a team-friendly umask.
    cmd = [
        "runuser",
        "-u",
        user,
        "--",
        "sh",
        "-c",
        'umask 022; exec "$@"',
        "sh",
        "env",
        "-i",
        *(f"{k}={v}" for k, v in env.items()),
        sys.executable,
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240)


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ermission" not in done.stderr and "not writable" not in done.stderr, done.stderr
    return done.stdout


_TRAIN = str(SCRIPTS / "team_train.py")  # one shuffled epoch; prints the samples and stats


def test_two_users_pull_prune_train_and_verify_one_team_cache(
    team: Path, demo_server: ServerProcess
) -> None:
    cache = team / "cache"
    cache.mkdir()
    shutil.chown(cache, group=GROUP)
    os.chmod(cache, 0o2775)  # the docs' recipe: `chgrp team DIR && chmod 2775 DIR`, as root
    cli = ["-m", "rayform"]

    # Alice pulls part of the slice, Bob the rest, then Bob prunes what Alice fetched.
    _ok(
        _as(
            "rfalice",
            team,
            cache,
            *cli,
            "pull",
            DEMO_SLICE,
            "--streams",
            "joints/position",
            "-q",
            server=demo_server,
        )
    )
    _ok(_as("rfbob", team, cache, *cli, "pull", DEMO_SLICE, "-q", server=demo_server))
    _ok(
        _as("rfbob", team, cache, *cli, "cache", "prune", "--max-size", "100KB", server=demo_server)
    )
    _ok(_as("rfbob", team, cache, *cli, "cache", "verify"))

    # Alice pulls again (into directories Bob made), trains offline, computes statistics, verifies.
    _ok(_as("rfalice", team, cache, *cli, "pull", DEMO_SLICE, "-q", server=demo_server))
    out = _ok(_as("rfalice", team, cache, _TRAIN, DEMO_SLICE, offline=True))
    assert "samples" in out
    verify = _ok(_as("rfalice", team, cache, *cli, "cache", "verify", "--json"))
    assert '"removed": []' in verify
    # Bob trains online with a lazy fetch after another prune, and reads Alice's statistics.
    _ok(_as("rfbob", team, cache, *cli, "cache", "prune", "--max-size", "0"))
    _ok(_as("rfbob", team, cache, _TRAIN, DEMO_SLICE, server=demo_server))

    gid = grp.getgrnam(GROUP).gr_gid
    owners = {pwd.getpwnam(u).pw_uid for u in USERS} | {0}
    n_blobs = n_marks = 0
    for p in [cache, *cache.rglob("*")]:
        st = p.lstat()
        assert st.st_gid == gid, f"{p} has group {st.st_gid}, not the team's"
        assert st.st_uid in owners, p
        mode = stat.S_IMODE(st.st_mode)
        if p.parent.name == "checked" or p.parent.parent.name == "checked":
            # Each user's marks of checked manifest pages are theirs alone (a teammate must
            # not mark a page as checked for them); the ``checked`` folder itself is the team's.
            assert mode & 0o077 == 0, f"{p}: {oct(mode)}"
            n_marks += p.is_dir()
        elif p.is_dir():
            assert mode == 0o2775, f"{p}: {oct(mode)}"
        elif p.parent.parent.name in ("blobs", "manifests"):
            n_blobs += 1
            assert mode == 0o444, f"{p}: {oct(mode)}"
        else:  # refs, statistics, claims, the ledger: the team may replace or rewrite them
            assert mode & 0o060 == 0o060, f"{p}: {oct(mode)}"
    assert n_blobs > 0
    assert n_marks == 2  # both users could record their checks in the team's folder


def _claim_of(user: str, claim: Path, beat: int) -> None:
    """Write a claim record of ``user``'s download (another process), left ``0644``."""
    doc = {"host": "node-a", "pid": 7, "uid": pwd.getpwnam(user).pw_uid, "token": "a11ce000"}
    doc.update(beat=beat, bytes=beat, part="", time=0)
    claim.write_bytes(json.dumps(doc).encode().ljust(255) + b"\n")
    shutil.chown(claim, user=user, group=GROUP)
    os.chmod(claim, 0o644)


def _team_cache(team: Path, name: str) -> Path:
    cache = team / name
    (cache / "claims").mkdir(parents=True)
    for d in (cache, cache / "claims"):
        shutil.chown(d, group=GROUP)
        os.chmod(d, 0o2775)
    return cache


def test_another_users_unwritable_claim_still_dedupes_and_is_taken_over_when_stale(
    team: Path,
) -> None:
    """A claim Alice left 0644 (made outside shared mode): while it beats Bob waits for her
    download instead of fetching twice; once it is stale Bob takes it over (renamed aside in
    the team's ``2775`` folder, which needs no write access to the file itself)."""
    script = str(SCRIPTS / "team_claim.py")  # prints the bytes Bob downloaded
    from support.scripts.team_claim import DATA, REF

    cache = _team_cache(team, "claims-beating")
    claim = cache / "claims" / f"{REF.hash}.claim"
    _claim_of("rfalice", claim, 1)
    stop = threading.Event()

    def alice() -> None:  # beats until Bob is waiting, then finishes the blob and releases
        beat, bob_since = 1, None
        while not stop.wait(0.1):
            beat += 1
            _claim_of("rfalice", claim, beat)
            if bob_since is None and (cache / "tmp").exists():  # Bob's fetch has begun
                bob_since = beat
            if bob_since is not None and beat - bob_since > 5:
                break
        else:
            return
        blob = cache / "blobs" / REF.hash[:2] / REF.hash
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(DATA)
        claim.unlink()

    thread = threading.Thread(target=alice, daemon=True)
    thread.start()
    try:
        assert _ok(_as("rfbob", team, cache, script, str(cache))).strip() == "0"
    finally:
        stop.set()
        thread.join()

    cache = _team_cache(team, "claims-stale")
    claim = cache / "claims" / f"{REF.hash}.claim"
    _claim_of("rfalice", claim, 1)  # and never again: Alice's process is gone
    assert _ok(_as("rfbob", team, cache, script, str(cache))).strip() == str(len(DATA))
    assert not claim.exists(), "taken over, then released by Bob"


def test_filelock_cannot_take_another_users_unwritable_lock_file(team: Path) -> None:
    """Why the cache takes no host-local lock from filelock (docs/architecture.md,
    "Libraries"): its ``mode=`` gives a new lock file the team's bits, but on a lock file Alice
    left 0644 filelock 4 raises ``PermissionError`` for Bob ("a native lock still needs write
    access"), though ``flock`` itself needs none: deduplication would be off for all but the
    owner. The cache's one lock per blob, the claim, works there (the test above)."""
    pytest.importorskip("filelock")
    locks = team / "locks-filelock"
    locks.mkdir()
    shutil.chown(locks, group=GROUP)
    os.chmod(locks, 0o2775)
    script = str(SCRIPTS / "team_filelock.py")
    # A new lock file: filelock's mode= sets the team's bits under umask 022.
    assert _ok(_as("rfbob", team, team, script, str(locks / "new.lock"))).strip() == "held 664"
    lock = locks / "x.lock"
    lock.write_bytes(b"")
    shutil.chown(lock, user="rfalice", group=GROUP)
    os.chmod(lock, 0o644)
    done = _as("rfbob", team, team, script, str(lock))
    assert done.returncode == 0 and done.stdout.strip() == "refused PermissionError", done
    assert lock.read_bytes() == b"" and lock.stat().st_uid == pwd.getpwnam("rfalice").pw_uid
    # flock itself needs no write access: Bob can lock the file opened read-only.
    code = (
        "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); "
        "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); print('held')"
    )
    assert _ok(_as("rfbob", team, team, "-c", code, str(lock))).strip() == "held"


def test_existing_directory_of_another_user_is_reported_once_not_changed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "cache"
    root.mkdir()
    os.chmod(root, 0o2775)
    foreign = root / "blobs"
    foreign.mkdir(mode=0o755)
    (foreign / "readme").write_bytes(b"")  # not empty: in use, so not replaced (next test)
    alice = pwd.getpwnam("rfalice") if _has_user("rfalice") else None
    uid = alice.pw_uid if alice else 4242
    os.chown(foreign, uid, -1)
    os.chmod(foreign, 0o755)
    modes = CacheModes(root, shared=True)
    with caplog.at_level(logging.WARNING, logger="rayform.cache"):
        modes.make_dirs(foreign / "ab")
        modes.make_dirs(foreign / "cd")
        CacheModes(root, shared=True).make_dirs(foreign / "ef")
    reports = [r.getMessage() for r in caplog.records if str(foreign) in r.getMessage()]
    assert len(reports) == 1, reports
    assert f"chmod 2775 {foreign}" in reports[0]
    assert stat.S_IMODE(foreign.stat().st_mode) == 0o755  # another user's: left as it is
    for sub in ("ab", "cd", "ef"):  # ours: group-writable and setgid whatever the umask
        assert stat.S_IMODE((foreign / sub).stat().st_mode) == 0o2775


def test_directory_another_process_just_made_is_used_not_replaced(tmp_path: Path) -> None:
    """Two processes create one directory at once: the loser uses the winner's. Replacing it,
    even empty, made the winner's next create or rename in it fail with ENOENT (one pull in
    ten on two sshfs nodes, in tests/cache/test_claims_nodes.py)."""
    root = tmp_path / "cache"
    root.mkdir()
    os.chmod(root, 0o2775)
    made = root / "tmp"
    made.mkdir()
    os.chmod(made, 0o2775)
    held = os.open(made, os.O_RDONLY)  # the winner, about to create a file in it
    try:
        CacheModes(root, shared=True)._make_shared(made)  # the loser saw no directory there
        assert os.stat(made).st_ino == os.fstat(held).st_ino
        fd = os.open("new", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=held)
        os.close(fd)
    finally:
        os.close(held)
    assert (made / "new").is_file()


def test_abandoned_empty_directory_of_a_teammate_is_repaired(team: Path) -> None:
    """Alice's process was killed between its mkdir and its chmod: the directory it left is
    empty and only Alice can write it. Bob's fetch replaces it with a team directory and
    writes into it; nothing to report."""
    root = team / "cache-killed"
    root.mkdir()
    shutil.chown(root, group=GROUP)
    os.chmod(root, 0o2775)
    left = root / "blobs"
    done = subprocess.run(
        ["runuser", "-u", "rfalice", "--", "sh", "-c", f"umask 022; mkdir {left}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(left.stat().st_mode) & 0o020 == 0  # Alice's umask took group write
    code = (
        "import sys; from pathlib import Path; from rayform.cache._sharing import CacheModes; "
        "root = Path(sys.argv[1]); CacheModes(root, shared=True).make_dirs(root / 'blobs' / 'ab'); "
        "(root / 'blobs' / 'ab' / 'x').write_bytes(b'bob')"
    )
    _ok(_as("rfbob", team, root, "-c", code, str(root)))
    assert (left / "ab" / "x").read_bytes() == b"bob"
    assert stat.S_IMODE(left.stat().st_mode) == 0o2775
    assert left.stat().st_uid == pwd.getpwnam("rfbob").pw_uid


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True
