"""``rayform-server migrate`` and ``rayform cache migrate`` on the committed fixtures of the older
manifest formats (``tests/fixtures/old-formats``, made by the writers of the time): refused
before, readable after with the same samples bit for bit, labels kept, blobs untouched, a
second run a no-op, a SIGKILLed run leaving a readable root."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from support import SCRIPTS, TESTS, TOKEN, ServerProcess, make_client
from support.old_formats import FIXTURE_SLICES, sample_digests, write_old_manifest

from rayform.errors import ManifestError
from rayform.format import hash_bytes, sharded_path
from rayform.manifest import Manifest, manifest_hash
from rayform_server.migrate import migrate_root
from rayform_server.store import Store

FIXTURES = TESTS / "fixtures" / "old-formats"
SAMPLES = json.loads((FIXTURES / "samples.json").read_text())
SERVER = [sys.executable, "-m", "rayform_server"]


def _copy(tmp_path: Path, name: str) -> Path:
    dest = tmp_path / name
    shutil.copytree(FIXTURES / name, dest)
    return dest


def _files(root: Path, sub: str = "") -> dict[str, tuple[int, int, int]]:
    """Every file under ``root/sub``: (size, mtime ns, inode) by relative path."""
    out = {}
    for p in sorted((root / sub).rglob("*")):
        if p.is_file():
            st = p.stat()
            out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns, st.st_ino)
    return out


def _migrate(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SERVER, "migrate", str(root), *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("version", [1, 2])
def test_migrate_rewrites_an_old_root_and_keeps_samples_labels_and_blobs(
    tmp_path: Path, version: int
) -> None:
    root = _copy(tmp_path, f"root-v{version}")
    slice_id = FIXTURE_SLICES[version]
    store = Store(root)
    old = store.get_slice(slice_id)["manifest"]  # type: ignore[index]
    old_history = store.manifest_history(slice_id)
    with pytest.raises(
        ManifestError, match=f"format_version {version} is an older.*rayform-server migrate ROOT"
    ):
        store.load_manifest(old)
    listed = subprocess.run(
        [*SERVER, "slices", "--root", str(root)], capture_output=True, text=True, timeout=60
    )
    assert listed.returncode == 2 and "rayform-server migrate ROOT" in listed.stderr
    blobs = _files(root, "blobs")
    dry = _migrate(root, "--dry-run")
    assert dry.returncode == 0 and "would rewrite 2 manifest(s)" in dry.stdout
    assert "nothing was written" in dry.stdout and store.get_slice(slice_id)["manifest"] == old  # type: ignore[index]

    done = _migrate(root)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"{slice_id}: rewrote 2 manifest(s): {old_history[0][:12]}") or (
        lines[0].startswith(f"{slice_id}: rewrote 2 manifest(s)") and old[:12] in lines[0]
    )
    assert f"(v{version})" in lines[0] and "2 label set version(s) carried over" in lines[0]
    assert lines[-1].endswith("0 blob bytes") and lines[-1].startswith("migrated 1 of 1 slice(s)")
    assert _files(root, "blobs") == blobs  # not one blob written, moved or touched

    # The slice names the rewritten manifest; its history holds the rewritten versions only.
    new = store.get_slice(slice_id)["manifest"]  # type: ignore[index]
    manifest = store.load_manifest(new)
    assert new != old and manifest.format_version == 3 and len(manifest.segments) == 4
    assert manifest_hash(Manifest(tuple(manifest.segments), manifest.description)) == new
    history = store.manifest_history(slice_id)
    assert len(history) == 2 and not set(history) & set(old_history)
    assert {store.migrated_to(h) for h in old_history} == set(history)
    first = next(h for h in history if h != new)
    assert len(store.load_manifest(first).segments) == 3

    server = ServerProcess(root)
    try:
        client = make_client(server.url, tmp_path / "cache")
        slice_ = client.slices.get(slice_id)
        assert slice_.manifest_hash == new and len(slice_.segments) == 4
        assert sample_digests(slice_) == SAMPLES[slice_id]  # bit for bit as before migration
        labels = slice_.labels
        ids = [s.id for s in slice_.segments]
        assert labels.version == 2 and labels.manifest_hash == new
        assert labels[ids[0]]["success"] is True and labels[ids[1]]["success"] is False
        assert labels[ids[2]]["quality"] == 0.5
        assert [h["by"] for h in labels.history()] == ["fixture", "fixture"]
        headers = {"Authorization": f"Bearer {TOKEN}"}
        base = f"{server.url}/v1/slices/{slice_id}/manifests"
        assert httpx.get(f"{base}/{first}", headers=headers).status_code == 200
        asked = httpx.get(f"{base}/{old}", headers=headers)
        assert asked.status_code == 404 and f"as manifest {new}" in asked.json()["message"]
    finally:
        server.stop()

    before = _files(root)
    again = _migrate(root)
    assert again.returncode == 0 and "nothing to migrate" in again.stdout
    assert f"{slice_id}: already in the current format, nothing to do" in again.stdout
    assert _files(root) == before  # a second run changes nothing


def test_the_rewrite_is_a_fresh_commit_of_the_same_segments(tmp_path: Path) -> None:
    for version in (1, 2):
        root = _copy(tmp_path, f"root-v{version}")
        migrate_root(root)
        store = Store(root)
        new = store.load_manifest(store.get_slice(FIXTURE_SLICES[version])["manifest"])  # type: ignore[index]
        # Written again as the old format by hand and migrated again: the same hash.
        other = Store(tmp_path / f"again-v{version}")
        digest = write_old_manifest(other, list(new.segments), new.description, version)
        other.set_slice(FIXTURE_SLICES[version], digest, new.description)
        migrate_root(other.root)
        assert other.get_slice(FIXTURE_SLICES[version])["manifest"] == new.hash  # type: ignore[index]


@pytest.mark.parametrize("when", ["before-the-reference-moves", "after-the-reference-moves"])
def test_a_killed_migrate_leaves_a_readable_root_and_the_next_run_finishes(
    tmp_path: Path, when: str
) -> None:
    root = _copy(tmp_path, "root-v2")
    slice_id = FIXTURE_SLICES[2]
    store = Store(root)
    old = store.get_slice(slice_id)["manifest"]  # type: ignore[index]
    old_bytes = store.read_manifest_bytes(old)
    killed = subprocess.run(
        [sys.executable, str(SCRIPTS / "kill_migrate.py"), str(root), when],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    now = store.get_slice(slice_id)["manifest"]  # type: ignore[index]
    if when == "before-the-reference-moves":
        assert now == old and hash_bytes(store.read_manifest_bytes(old)) == old
        assert store.read_manifest_bytes(old) == old_bytes  # the old version intact
    else:
        assert now != old and len(store.load_manifest(now).segments) == 4  # readable now
    finished = _migrate(root)
    assert finished.returncode == 0 and "0 blob bytes" in finished.stdout
    clean = _copy(tmp_path / "clean", "root-v2")
    migrate_root(clean)
    assert store.get_slice(slice_id) == Store(clean).get_slice(slice_id)
    assert store.manifest_history(slice_id) == Store(clean).manifest_history(slice_id)
    assert not list((root / "tmp").iterdir()) if (root / "tmp").exists() else True


def test_migrate_help_says_what_it_does() -> None:
    shown = subprocess.run([*SERVER, "migrate", "--help"], capture_output=True, text=True)
    assert shown.returncode == 0
    text = " ".join(shown.stdout.split())
    for words in (
        "--dry-run",
        "label sets",
        "blobs are not touched",
        "run it again",
        "rayform cache migrate",
    ):
        assert words in text, words
    missing = subprocess.run([*SERVER, "migrate", "/nonexistent"], capture_output=True, text=True)
    assert missing.returncode == 2 and "not a Rayform data root" in missing.stderr


def _cache_env(cache: Path, slice_id: str) -> dict[str, str]:
    ref = json.loads(next((cache / "refs").glob(f"*/{slice_id}")).read_bytes())
    return {
        **os.environ,
        "RAYFORM_CACHE_DIR": str(cache),
        "RAYFORM_ENDPOINT": str(ref["endpoint"]),  # the fixture's server: not running now
        "RAYFORM_TOKEN": "fixture-token",
        "RAYFORM_OFFLINE": "1",
    }


def test_cache_migrate_keeps_an_offline_cache_working(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = _copy(tmp_path, "cache")
    rayform = [sys.executable, str(SCRIPTS / "rayform_cli.py")]
    for slice_id in FIXTURE_SLICES.values():
        refused = subprocess.run(
            [*rayform, "slices", "show", slice_id],
            env=_cache_env(cache, slice_id),
            capture_output=True,
            text=True,
        )
        assert refused.returncode == 1 and "rayform cache migrate" in refused.stderr
    blobs = _files(cache, "blobs")
    env = _cache_env(cache, FIXTURE_SLICES[1])
    done = subprocess.run([*rayform, "cache", "migrate"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("rewrote manifest") == 2 and "0 blob bytes" in done.stdout
    assert _files(cache, "blobs") == blobs
    again = subprocess.run([*rayform, "cache", "migrate"], env=env, capture_output=True, text=True)
    assert again.returncode == 0 and "nothing to migrate" in again.stdout

    for version, slice_id in FIXTURE_SLICES.items():
        for key, value in _cache_env(cache, slice_id).items():
            monkeypatch.setenv(key, value)
        import rayform as sdk

        slice_ = sdk.Client().slices.get(slice_id)
        assert len(slice_.segments) == 4
        assert sample_digests(slice_) == SAMPLES[slice_id]  # offline, bit for bit
        # The same manifest the server's migrate makes from the same old one.
        root = _copy(tmp_path, f"root-v{version}")
        migrate_root(root)
        assert Store(root).get_slice(slice_id)["manifest"] == slice_.manifest_hash  # type: ignore[index]


def test_a_cache_missing_pages_names_what_to_run(tmp_path: Path) -> None:
    cache = _copy(tmp_path, "cache")
    env = _cache_env(cache, FIXTURE_SLICES[2])
    ref = json.loads(next((cache / "refs").glob(f"*/{FIXTURE_SLICES[2]}")).read_bytes())
    root = json.loads(sharded_path(cache / "manifests", ref["manifest"]).read_bytes())
    for page in root["pages"]:
        sharded_path(cache / "manifests", page["hash"]).unlink()
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "rayform_cli.py"), "cache", "migrate"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1
    assert f"run `rayform pull {FIXTURE_SLICES[2]}` online" in done.stdout
    assert (
        "1 of its pages are not cached" in done.stdout
        and "1 slice(s) need the server" in done.stdout
    )
