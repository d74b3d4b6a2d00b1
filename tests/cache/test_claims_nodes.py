"""Two real "nodes" share one cache over sshfs: one download per blob, a dead node taken over.

Each node is its own sshfs mount of one directory (``support/sshnodes.py``), with its own host name
and kernel caches, and ``flock`` does not cross the mounts (checked below), as on Lustre
without ``-o flock`` or NFS without lockd. Real ``rayform pull`` processes, two per node,
fetch a 140-blob demo slice through a counting proxy (``support/faultproxy.py``):

* duplicate whole-blob GETs (a GET without ``Range`` of a blob already fetched) stay at most
  5 % of the blobs (81 % before claims; the "before" run is ``stress``-marked and measures it
  with claims switched off in the pullers);
* SIGKILLing a node's pullers mid-download: the other node takes their claims over within
  the stale time (15 s, plus generous slack on a loaded machine), copies their partial files
  and resumes them with ``Range``, and nothing is corrupt (``stress``: 25 s each).

Each runs as root on both nodes, and as two users of one group (``rfalice`` on node A,
``rfbob`` on node B, their SFTP logins too) in a ``2775`` team cache owned by root, where every
claim and partial file of one node is another user's file for the other.

``docs/benchmarks.md`` ("Two nodes, one cache") records the numbers. Skipped, with the
reason, without root, ``/dev/fuse``, sshfs or sshd (``scripts/setup.sh`` installs them).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import DEMO_SLICE, SCRIPTS, TOKEN, ServerProcess
from support.faultproxy import FaultProxy
from support.reliability import assert_cache_consistent
from support.sshnodes import SshNodes, missing
from support.team import GROUP, USERS, ensure_users, reachable

from rayform.cache._claims import STALE_S, read_claim

CHECKOUT = Path(__file__).resolve().parents[2]
BLOBS = 140  # 20 small demo episodes of 7 streams

pytestmark = pytest.mark.skipif(missing() is not None, reason=f"two sshfs nodes: {missing()}")

# The pullers of the "before" run: no claims, so no deduplication at all (the claim is the
# cache's only lock per blob).
#: `rayform` in a subprocess; with ``--no-claims`` every download claim is granted at once.
_PULL = SCRIPTS / "rayform_cli.py"


@pytest.fixture(scope="module")
def nodes() -> Iterator[SshNodes]:
    with SshNodes() as n:
        yield n


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    from rayform_server.demo import build_demo

    root = tmp_path_factory.mktemp("demo140")
    build_demo(root, slice_id=DEMO_SLICE, small=True, episodes=BLOBS // 7)
    server = ServerProcess(root)
    yield server
    server.stop()


@pytest.fixture
def proxy(server: ServerProcess) -> Iterator[FaultProxy]:
    with FaultProxy(server.url) as p:
        yield p


def _env(cache: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": "/tmp",
        "PYTHONPATH": os.pathsep.join(str(CHECKOUT / d) for d in ("sdk", "server_stub", "tests")),
        "RAYFORM_CACHE_DIR": str(cache),
        "RAYFORM_TOKEN": TOKEN,
        "OMP_NUM_THREADS": "1",
    }


def _pullers(
    nodes: SshNodes,
    mount: Path,
    node: str,
    url: str,
    *,
    n: int = 2,
    claims: bool = True,
    user: str | None = None,
) -> list[subprocess.Popen[str]]:
    cmd = [
        sys.executable,
        str(_PULL),
        *([] if claims else ["--no-claims"]),
        "pull",
        DEMO_SLICE,
        "--endpoint",
        url,
        "--quiet",
        "--jobs",
        "4",
    ]
    return [
        nodes.run_on(
            node,
            cmd,
            user=user,
            env=_env(mount / "cache"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(n)
    ]


def _wait(procs: list[subprocess.Popen[str]], timeout: float = 300) -> None:
    for p in procs:
        _, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, err[-3000:]


def _duplicates(proxy: FaultProxy) -> int:
    return sum(n - 1 for n in proxy.stats.whole.values() if n > 1)


@dataclass(frozen=True)
class Nodes:
    """Two fresh mounts (cold kernel caches) of one export, and who runs on each."""

    a: Path
    b: Path
    user_a: str | None = None
    user_b: str | None = None


@pytest.fixture(params=["root", "two-users"])
def two_mounts(nodes: SshNodes, request: pytest.FixtureRequest) -> Nodes:
    """Node A and node B; the test's cache is ``MOUNT/cache``. With ``two-users``, node A
    runs as rfalice and node B as rfbob (their SFTP logins too) in a ``2775`` team cache
    that root owns, so every claim and partial of one is another user's file for the other."""
    cache = nodes.export / "cache"
    if cache.exists():  # the previous test's
        shutil.rmtree(cache)
    name = f"{request.node.originalname[-16:]}-{request.param}"
    if request.param == "root":
        return Nodes(nodes.mount(f"{name}-a"), nodes.mount(f"{name}-b"))
    ensure_users()
    for path in (
        Path(sys.executable).parent,
        Path(os.path.realpath(sys.executable)).parent,
        CHECKOUT,
    ):
        reachable(path)
    cache.mkdir()
    shutil.chown(cache, group=GROUP)
    os.chmod(cache, 0o2775)  # docs/cache.md's team recipe
    alice, bob = USERS
    return Nodes(
        nodes.mount(f"{name}-a", login=alice), nodes.mount(f"{name}-b", login=bob), alice, bob
    )


@pytest.mark.parametrize("two_mounts", ["root"], indirect=True)
def test_flock_does_not_cross_the_two_nodes(two_mounts: Nodes) -> None:
    a, b = two_mounts.a, two_mounts.b
    (a / "probe.lock").write_bytes(b"")
    with (
        open(a / "probe.lock", "rb") as held,
        open(a / "probe.lock", "rb") as same_node,
        open(b / "probe.lock", "rb") as other_node,
    ):
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(BlockingIOError):  # within a node it works
            fcntl.flock(same_node, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(other_node, fcntl.LOCK_EX | fcntl.LOCK_NB)  # across nodes it "succeeds"
    # O_EXCL, what claims rely on, is decided by the server: it does cross.
    os.close(os.open(a / "probe.claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    with pytest.raises(FileExistsError):
        os.open(b / "probe.claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY)


def _run_two_nodes(nodes: SshNodes, two: Nodes, proxy: FaultProxy, *, claims: bool) -> float:
    proxy.throttle_s = 0.002  # a few ms per KiB: transfers overlap across processes
    procs = [
        *_pullers(nodes, two.a, "node-a", proxy.url, claims=claims, user=two.user_a),
        *_pullers(nodes, two.b, "node-b", proxy.url, claims=claims, user=two.user_b),
    ]
    _wait(procs)
    assert len(assert_cache_consistent(nodes.export / "cache")) == BLOBS
    assert set(proxy.stats.whole) == set(proxy.stats.transfers), "no resumes expected"
    ratio = _duplicates(proxy) / BLOBS
    print(
        f"\ntwo nodes x two pullers ({two.user_a or 'root'}, {two.user_b or 'root'}), "
        f"claims {'on' if claims else 'off'}: "
        f"{_duplicates(proxy)} duplicate whole-blob GETs for {BLOBS} blobs ({ratio:.1%})"
    )
    return ratio


def test_two_nodes_download_each_blob_once(
    nodes: SshNodes, two_mounts: Nodes, proxy: FaultProxy
) -> None:
    ratio = _run_two_nodes(nodes, two_mounts, proxy, claims=True)
    assert ratio <= 0.05
    assert list((nodes.export / "cache" / "claims").iterdir()) == []
    assert list((nodes.export / "cache" / "tmp").iterdir()) == []


@pytest.mark.stress
@pytest.mark.parametrize("two_mounts", ["root"], indirect=True)
def test_two_nodes_without_claims_download_most_blobs_twice(
    nodes: SshNodes, two_mounts: Nodes, proxy: FaultProxy
) -> None:
    """The "before" number of docs/benchmarks.md: flock alone, which stays on each node."""
    _run_two_nodes(nodes, two_mounts, proxy, claims=False)


def _orphans(cache: Path, host: str) -> set[str]:
    """Claims of ``host`` on blobs that are not complete (watched on the server's side)."""
    out = set()
    for p in (cache / "claims").glob("*.claim"):
        raw = read_claim(p)
        digest = p.name.split(".")[0]
        if (
            raw
            # the host name, then the PID namespace (rayform.cache._partial.HOST)
            and re.search(rf'"host": "{re.escape(host)}(-pid[0-9a-f]+)?"'.encode(), raw)
            and not (cache / "blobs" / digest[:2] / digest).exists()
        ):
            out.add(p.name)
    return out


@pytest.mark.stress  # about 25 s each, most of it the 15 s stale time
def test_a_node_killed_mid_download_is_taken_over_within_the_stale_time(
    nodes: SshNodes, two_mounts: Nodes, proxy: FaultProxy
) -> None:
    two = two_mounts
    cache = nodes.export / "cache"
    proxy.throttle_s = 0.05  # ~2.5 s per blob: node A is mid-download when it dies
    node_a = _pullers(nodes, two.a, "node-a", proxy.url, user=two.user_a)
    try:
        deadline = time.monotonic() + 60
        while len(_orphans(cache, "node-a")) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        node_b = _pullers(nodes, two.b, "node-b", proxy.url, user=two.user_b)
        time.sleep(3.0)  # node B has started (imports, resolves the slice) and waits on them
    finally:  # the node dies: all its processes at once
        for p in node_a:
            p.send_signal(signal.SIGKILL)
        for p in node_a:
            p.communicate()
    killed_at = time.monotonic()
    orphaned = _orphans(cache, "node-a")
    assert orphaned, "node A held claims on incomplete blobs when it died"
    first = None
    while _orphans(cache, "node-a") & orphaned and time.monotonic() - killed_at < 120:
        if first is None and len(_orphans(cache, "node-a") & orphaned) < len(orphaned):
            first = time.monotonic() - killed_at
        time.sleep(0.05)
    last = time.monotonic() - killed_at
    first = first or last
    proxy.throttle_s = 0.0
    _wait(node_b)
    print(
        f"\nnode A ({two.user_a or 'root'}) killed holding {len(orphaned)} claims on incomplete "
        f"blobs; node B ({two.user_b or 'root'}) took the first over after {first:.1f} s, the "
        f"last after {last:.1f} s (stale time {STALE_S:.0f} s); "
        f"{sum(proxy.stats.transfers.values()) - sum(proxy.stats.whole.values())} "
        "downloads resumed with Range"
    )
    assert first > STALE_S - 3, "not before the record went stale"
    assert last < STALE_S + 20, "taken over within the stale time (and a loaded machine's slack)"
    assert len(assert_cache_consistent(cache)) == BLOBS
    assert list((cache / "claims").iterdir()) == [], "node A's leftover claims are gone"
    assert list((cache / "tmp").iterdir()) == [], "node A's partials are gone"
