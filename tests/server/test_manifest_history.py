"""A slice's manifests by hash: the server remembers every manifest a slice named and serves
it (and its blobs) through the slice; ``client.slices.get(..., manifest_hash=)`` binds it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from support import DEMO_SLICE, TOKEN, ServerProcess, forbid_network, make_client
from support.lineage import copy_root, rebuild_slice_without_first_segment
from support.proxy import CountingProxy

from rayform import InvalidArgumentError, ManifestError, NotFoundError, OfflineError
from rayform.cli import main
from rayform.format import hash_bytes
from rayform_server.builder import SliceBuilder, TableData
from rayform_server.store import Store

OTHER = "slc_99990001"
ALICE, BOB = "alice-token-0123", "bob-token-4567"


@pytest.fixture(scope="module")
def rebuilt(
    demo_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, str, str, str]]:
    """A copy of the demo root whose slice was rebuilt (old and new manifest), plus another
    slice; served with scoped tokens (alice: the demo slice, bob: the other)."""
    root = copy_root(demo_root, tmp_path_factory.mktemp("hist") / "root")
    store = Store(root)
    old = store.get_slice(DEMO_SLICE)["manifest"]  # type: ignore[index]
    new = rebuild_slice_without_first_segment(root, DEMO_SLICE)
    b = SliceBuilder(store, description="other")
    t = np.arange(20, dtype=np.int64) * 5_000_000
    b.add_segment(
        "seg_0000beef",
        site="x",
        streams=[TableData("joints/position", t, np.zeros((20, 2)), 200.0)],
    )
    other = b.commit(OTHER).hash
    tokens = tmp_path_factory.mktemp("tokens") / "tokens.json"
    tokens.write_text(
        json.dumps(
            {
                "tokens": [
                    {"name": "all", "token": TOKEN, "slices": ["*"]},
                    {"name": "alice", "token": ALICE, "slices": ["slc_7c1e*"]},
                    {"name": "bob", "token": BOB, "slices": ["slc_9999*"]},
                ]
            }
        )
    )
    server = ServerProcess(root, "--tokens-file", str(tokens), token=None)
    yield server, old, new, other
    server.stop()


def _get(server: ServerProcess, path: str, token: str | None = TOKEN) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.get(f"{server.url}/v1/slices/{path}", headers=headers)


def test_the_store_remembers_every_manifest_a_slice_named(
    rebuilt: tuple[ServerProcess, str, str, str],
) -> None:
    server, old, new, other = rebuilt
    store = Store(server.root)
    assert store.manifest_history(DEMO_SLICE) == sorted([old, new])
    assert store.has_named(DEMO_SLICE, old) and store.has_named(DEMO_SLICE, new)
    assert not store.has_named(DEMO_SLICE, other) and store.manifest_history(OTHER) == [other]


def test_old_and_current_manifests_are_served_by_hash(
    rebuilt: tuple[ServerProcess, str, str, str],
) -> None:
    server, old, new, _ = rebuilt
    for digest in (old, new):
        r = _get(server, f"{DEMO_SLICE}/manifests/{digest}")
        assert r.status_code == 200 and hash_bytes(r.content) == digest
        assert r.headers["etag"] == f'"{digest}"' and "immutable" in r.headers["cache-control"]
        again = httpx.get(
            f"{server.url}/v1/slices/{DEMO_SLICE}/manifests/{digest}",
            headers={"Authorization": f"Bearer {TOKEN}", "If-None-Match": f'"{digest}"'},
        )
        assert again.status_code == 304
    assert _get(server, DEMO_SLICE).json()["manifest"] == new  # the reference is unchanged


def test_manifests_by_hash_are_scoped_like_every_slice_route(
    rebuilt: tuple[ServerProcess, str, str, str],
) -> None:
    server, old, _, other = rebuilt
    # A hash this slice never named (another slice's manifest): 404, even though it exists.
    r = _get(server, f"{DEMO_SLICE}/manifests/{other}")
    assert (
        r.status_code == 404
        and r.json()["error"] == "not_found"
        and "never named" in r.json()["message"]
    )
    assert _get(server, f"{DEMO_SLICE}/manifests/{'ab' * 32}").status_code == 404
    assert _get(server, f"{DEMO_SLICE}/manifests/ABC").status_code == 400
    assert _get(server, f"{DEMO_SLICE}/manifests/{old}", token=None).status_code == 401
    assert _get(server, f"{DEMO_SLICE}/manifests/{old}", token=ALICE).status_code == 200
    # Bob may not see the demo slice: exactly the answer for an unknown slice.
    assert _get(server, f"{DEMO_SLICE}/manifests/{old}", token=BOB).status_code == 404
    assert _get(server, f"{OTHER}/manifests/{other}", token=BOB).status_code == 200
    assert _get(server, f"{OTHER}/manifests/{old}", token=BOB).status_code == 404


def test_blobs_and_pages_of_an_old_version_stay_readable_through_the_slice(
    rebuilt: tuple[ServerProcess, str, str, str],
) -> None:
    server, old, new, other = rebuilt
    store = Store(server.root)
    old_m, new_m = store.load_manifest(old), store.load_manifest(new)
    only_old = set(old_m.blobs()) - set(new_m.blobs())
    assert only_old
    blob = sorted(only_old)[0]
    assert _get(server, f"{DEMO_SLICE}/blobs/{blob}").status_code == 200
    for page in store.page_hashes(old):
        assert _get(server, f"{DEMO_SLICE}/pages/{page}").status_code == 200
    # ...but never through another slice, and never another slice's blobs.
    assert _get(server, f"{OTHER}/blobs/{blob}", token=BOB).status_code == 404
    assert (
        _get(
            server, f"{DEMO_SLICE}/blobs/{sorted(store.load_manifest(other).blobs())[0]}"
        ).status_code
        == 404
    )


def test_client_binds_a_slice_at_a_manifest_hash(
    rebuilt: tuple[ServerProcess, str, str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, old, new, other = rebuilt
    client = make_client(server.url, tmp_path / "cache")
    pinned = client.slices.get(DEMO_SLICE, manifest_hash=old)
    assert pinned.id == DEMO_SLICE and pinned.manifest_hash == old
    assert len(pinned.segments) == len(client.slices.get(DEMO_SLICE).segments) + 1
    assert client.cache.get_manifest(old) is not None  # cached, verified
    # The blobs of the old version's first segment come through the slice.
    first = pinned.segments[0]
    assert client.ensure_blob(DEMO_SLICE, first.streams["joints/position"].blob).is_file()
    assert client.slices.get(DEMO_SLICE).manifest_hash == new  # resolving is unchanged
    with pytest.raises(NotFoundError, match="does not name manifest"):
        client.slices.get(DEMO_SLICE, manifest_hash=other)
    with pytest.raises(InvalidArgumentError, match="malformed content hash"):
        client.slices.get(DEMO_SLICE, manifest_hash="abc")

    offline = make_client(server.url, tmp_path / "cache", offline=True)
    forbid_network(monkeypatch)
    assert offline.slices.get(DEMO_SLICE, manifest_hash=old).manifest_hash == old
    assert offline.slices.get(DEMO_SLICE).manifest_hash == new
    with pytest.raises(OfflineError, match=f"rayform pull {DEMO_SLICE} --manifest {other}"):
        offline.slices.get(DEMO_SLICE, manifest_hash=other)


def test_a_manifest_by_hash_in_the_cache_is_not_downloaded_again(
    rebuilt: tuple[ServerProcess, str, str, str], tmp_path: Path
) -> None:
    server, old, _, other = rebuilt
    path = f"/v1/slices/{DEMO_SLICE}/manifests/{old}"
    with CountingProxy(server.url) as proxy:
        first = make_client(proxy.url, tmp_path / "cache")
        assert first.slices.get(DEMO_SLICE, manifest_hash=old).manifest_hash == old
        again = make_client(proxy.url, tmp_path / "cache")  # a new process, the same cache
        assert len(again.slices.get(DEMO_SLICE, manifest_hash=old).segments) > 0
        assert len(first.slices.get(DEMO_SLICE, manifest_hash=old).segments) > 0
        answers = [(status, size) for p, status, size in proxy.answers if p == path]
        # Downloaded once; then asked about (the server still decides), with no body.
        assert answers[0][0] == 200 and answers[0][1] > 1000 and answers[1:] == [(304, 0)] * 2
        # A manifest of another slice, cached here, is still refused through this slice.
        bob = make_client(proxy.url, tmp_path / "cache")
        bob.cache.put_manifest(Store(server.root).read_manifest_bytes(other), other)
        with pytest.raises(NotFoundError, match="does not name manifest"):
            bob.slices.get(DEMO_SLICE, manifest_hash=other)


def test_offline_a_missing_blob_of_a_bound_manifest_names_the_pull_that_fetches_it(
    rebuilt: tuple[ServerProcess, str, str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, old, new, _ = rebuilt
    cache = tmp_path / "cache"
    online = make_client(server.url, cache)
    assert online.slices.get(DEMO_SLICE).manifest_hash == new  # remembered: a plain pull's
    online.slices.get(DEMO_SLICE, manifest_hash=old)
    offline = make_client(server.url, cache, offline=True)
    current = offline.slices.get(DEMO_SLICE)
    pinned = offline.slices.get(DEMO_SLICE, manifest_hash=old)
    only_old = pinned.segments[0].streams["joints/position"].blob  # not in the new manifest
    for fails in (
        lambda: pinned.blob_path(only_old),
        lambda: offline.pull(pinned, streams=["joints/position"]),
    ):
        with pytest.raises(OfflineError) as exc:
            fails()
        assert f"`rayform pull {DEMO_SLICE} --manifest {old} --streams joints/position`" in str(
            exc.value
        )
    # A blob the current manifest holds too: the plain pull fetches it.
    both = current.segments[0].streams["ee/pose"].blob
    with pytest.raises(OfflineError, match=f"`rayform pull {DEMO_SLICE} --streams ee/pose`"):
        pinned.blob_path(both)
    # A page of the bound manifest missing: the same.
    page = str(json.loads(offline.cache.get_manifest(old) or b"")["pages"][0]["hash"])
    offline.cache.manifest_path(page).unlink()
    with pytest.raises(OfflineError, match=f"`rayform pull {DEMO_SLICE} --manifest {old}`"):
        make_client(server.url, cache, offline=True).slices.get(DEMO_SLICE, manifest_hash=old)
    # The command as printed fetches what was missing.
    with pytest.raises(OfflineError) as exc:
        pinned.blob_path(only_old)
    command = str(exc.value).split("`")[1].split()
    for key, value in {
        "RAYFORM_ENDPOINT": server.url,
        "RAYFORM_TOKEN": TOKEN,
        "RAYFORM_CACHE_DIR": str(cache),
    }.items():
        monkeypatch.setenv(key, value)
    assert command[:2] == ["rayform", "pull"] and main([*command[1:], "--quiet"]) == 0
    assert pinned.blob_path(only_old).is_file()


def test_a_tampered_old_manifest_is_refused(
    rebuilt: tuple[ServerProcess, str, str, str], tmp_path: Path
) -> None:
    server, old, _, _ = rebuilt
    root = copy_root(server.root, tmp_path / "root")
    path = Store(root).manifest_path(old)
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    copy = ServerProcess(root)
    try:
        client = make_client(copy.url, tmp_path / "cache")
        with pytest.raises(ManifestError, match="unusable manifest"):
            client.slices.get(DEMO_SLICE, manifest_hash=old)
        assert client.cache.get_manifest(old) is None
    finally:
        copy.stop()


def test_cli_pull_of_an_old_version(
    rebuilt: tuple[ServerProcess, str, str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, old, _, _ = rebuilt
    for key, value in {
        "RAYFORM_ENDPOINT": server.url,
        "RAYFORM_TOKEN": TOKEN,
        "RAYFORM_CACHE_DIR": str(tmp_path / "c"),
    }.items():
        monkeypatch.setenv(key, value)
    assert main(["pull", DEMO_SLICE, "--manifest", old, "--quiet"]) == 0
    client = make_client(server.url, tmp_path / "c", offline=True)
    pinned = client.slices.get(DEMO_SLICE, manifest_hash=old)
    assert all(client.cache.has_blob(h) for h in pinned.blobs())
