"""``rayform-server renditions``: renditions added to a stored slice, as a new manifest of the
same slice ID; the old manifest stays readable by hash; local and S3-backed roots."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import av
import pytest
import torch
from support import DEMO_SLICE, ServerProcess, make_client
from support.lineage import ACTION, OBS
from support.seaweed import BUCKET, SeaweedS3

from rayform.errors import IntegrityError
from rayform.manifest import Manifest
from rayform.torch import EpisodeDataset
from rayform_server._addrenditions import add_renditions
from rayform_server._renditions import MAX_RENDITIONS
from rayform_server.blobstore import LocalBlobBackend
from rayform_server.builder import commit_segments
from rayform_server.cli import main
from rayform_server.demo import build_demo
from rayform_server.store import SliceMovedError, Store

CAMS = ["cam0/rgb", "wrist/rgb"]


def _cams(manifest: object) -> list:
    return [st for seg in manifest.segments for st in seg.streams.values() if st.kind == "video"]  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("addrend") / "root"
    build_demo(path, DEMO_SLICE, small=True)
    return path


def test_renditions_are_added_as_a_new_manifest_and_the_old_stays(
    root: Path, tmp_path: Path, capsys
) -> None:
    store = Store(root)
    old = store.get_slice(DEMO_SLICE)["manifest"]  # type: ignore[index]
    assert not any(st.renditions for st in _cams(store.load_manifest(old)))
    assert (
        main(
            [
                "renditions",
                "--root",
                str(root),
                "--slice",
                DEMO_SLICE,
                "--renditions",
                "48,200",
                "--jobs",
                "2",
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert "no 200-pixel rendition" in err and "[8/8]" in err and "still readable by hash" in err
    new = store.get_slice(DEMO_SLICE)["manifest"]  # type: ignore[index]
    assert new != old and store.manifest_history(DEMO_SLICE) == sorted([old, new])
    m = store.load_manifest(new)
    before = store.load_manifest(old)
    assert [s.id for s in m.segments] == [s.id for s in before.segments]
    assert m.blobs() == before.blobs()  # the originals, untouched
    for st in _cams(m):
        assert [(r.height, r.width) for r in st.renditions] == [(48, 64)]
        with av.open(str(store.blob_path(st.renditions[0].blob.hash))) as c:
            assert c.streams.video[0].frames == st.count
    # Again: nothing to do, nothing changes.
    assert (
        main(["renditions", "--root", str(root), "--slice", DEMO_SLICE, "--renditions", "48"]) == 0
    )
    assert "unchanged" in capsys.readouterr().err and store.get_slice(DEMO_SLICE)["manifest"] == new  # type: ignore[index]
    # A second height: only that one is rendered, the first is kept.
    assert (
        main(
            [
                "renditions",
                "--root",
                str(root),
                "--slice",
                DEMO_SLICE,
                "--renditions",
                "24,48",
                "--quiet",
                "--jobs",
                "1",
            ]
        )
        == 0
    )
    third = store.get_slice(DEMO_SLICE)["manifest"]  # type: ignore[index]
    for st, was in zip(_cams(store.load_manifest(third)), _cams(m), strict=True):
        assert [r.height for r in st.renditions] == [24, 48] and st.renditions[1] == was.renditions[
            0
        ]
    assert store.manifest_history(DEMO_SLICE) == sorted([old, new, third])

    # Served: a dataset at 32x32 reads renditions; a run logged at the first manifest rebuilds.
    server = ServerProcess(root)
    try:
        client = make_client(server.url, tmp_path / "cache")
        pinned = client.slices.get(DEMO_SLICE, manifest_hash=old)
        logged = EpisodeDataset(pinned, obs=OBS, action=ACTION, fps=15, horizon=4, shard=None)
        again = EpisodeDataset.from_uri(logged.uri, client=client)
        assert again.slice.manifest_hash == old
        assert torch.equal(again[3]["cam0/rgb"], logged[3]["cam0/rgb"])
        ds = EpisodeDataset(
            client.slices.get(DEMO_SLICE),
            obs=OBS,
            action=ACTION,
            fps=15,
            shard=None,
            image_size=(32, 32),
        )
        assert ds.describe()["renditions"] == {"cam0/rgb": "24x32", "wrist/rgb": "24x32"}
        assert ds[0]["cam0/rgb"].shape == (3, 32, 32)
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--slice", "slc_0000dead", "--renditions", "48"], "no slice slc_0000dead"),
        (["--slice", "nope", "--renditions", "48"], "malformed slice ID"),
    ],
)
def test_clear_errors(root: Path, argv: list[str], message: str, capsys) -> None:
    assert main(["renditions", "--root", str(root), *argv]) == 2
    assert message in capsys.readouterr().err


def test_not_a_root(tmp_path: Path, capsys) -> None:
    assert (
        main(["renditions", "--root", str(tmp_path), "--slice", DEMO_SLICE, "--renditions", "48"])
        == 2
    )
    assert "not a Rayform data root" in capsys.readouterr().err


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    s3 = SeaweedS3(tmp_path_factory.mktemp("weed"))
    yield s3
    s3.stop()


def test_renditions_on_an_s3_backed_root(seaweed: SeaweedS3, tmp_path: Path) -> None:
    root = tmp_path / "root"
    env = {**os.environ, **seaweed.env}
    run = [sys.executable, "-m", "rayform_server"]
    subprocess.run(
        [
            *run,
            "demo",
            "--root",
            str(root),
            "--small",
            "--jobs",
            "1",
            "--blobs",
            f"s3://{BUCKET}/rend",
            "--s3-endpoint",
            seaweed.endpoint,
        ],
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    result = subprocess.run(
        [*run, "renditions", "--root", str(root), "--slice", DEMO_SLICE, "--renditions", "48"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert not list((root / "tmp").iterdir())  # downloaded originals and renders cleaned up
    server = ServerProcess(root, env=seaweed.env)
    try:
        client = make_client(server.url, tmp_path / "cache")
        slice_ = client.slices.get(DEMO_SLICE)
        assert all(st.renditions for st in _cams(slice_.manifest))
        report = client.pull(DEMO_SLICE, streams=CAMS, image_size=(32, 32))
        assert report.blobs > 0
        hashes = {st.renditions[0].blob.hash for st in _cams(slice_.manifest)}
        assert all(client.cache.has_blob(h) for h in hashes)
        assert slice_.manifest.format_version == 3
    finally:
        server.stop()


# -- refusals and failures: nothing committed, nothing left in tmp/ ------------------------------
def _objects(root: Path) -> list[str]:
    """Every manifest, page and blob file of the root."""
    return sorted(
        p.name for sub in ("manifests", "blobs") for p in (root / sub).rglob("*") if p.is_file()
    )


def _manifest_files(root: Path) -> list[str]:
    """Every manifest (and page) file of the root."""
    return sorted(p.name for p in (root / "manifests").rglob("*") if p.is_file())


def _cli(*argv: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rayform_server", *map(str, argv)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_more_renditions_than_a_stream_may_list_are_refused_before_rendering(
    tmp_path: Path, capsys
) -> None:
    root = tmp_path / "root"
    build_demo(root, DEMO_SLICE, small=True)
    store = Store(root)
    cmd = ["renditions", "--root", str(root), "--slice", DEMO_SLICE, "--jobs", "1", "--quiet"]
    assert main([*cmd, "--renditions", "2"]) == 0
    before, objects = store.get_slice(DEMO_SLICE), _objects(root)
    capsys.readouterr()
    # One stored + MAX_RENDITIONS new heights: one too many for every camera.
    heights = ",".join(str(h) for h in range(4, 4 + 2 * MAX_RENDITIONS, 2))
    assert main([*cmd, "--renditions", heights]) == 2
    err = capsys.readouterr().err
    assert f"has 1 rendition(s) and would have {MAX_RENDITIONS + 1}" in err
    assert store.get_slice(DEMO_SLICE) == before and _objects(root) == objects
    assert not list((root / "tmp").iterdir())
    # More new heights than a stream may list: refused by the parser, the root untouched.
    too_many = ",".join(str(h) for h in range(2, 4 + 2 * MAX_RENDITIONS, 2))
    for argv in (
        [*cmd, "--renditions", too_many],
        ["demo", "--root", str(tmp_path / "demo"), "--small", "--renditions", too_many],
    ):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        assert f"a stream lists at most {MAX_RENDITIONS} renditions" in capsys.readouterr().err
    assert store.get_slice(DEMO_SLICE) == before and not (tmp_path / "demo").exists()


def test_a_commit_of_the_slice_while_rendering_is_not_reverted(tmp_path: Path) -> None:
    root = tmp_path / "root"
    build_demo(root, DEMO_SLICE, small=True)
    store = Store(root)
    planned = store.get_slice(DEMO_SLICE)["manifest"]  # type: ignore[index]
    other: list[str] = []

    manifests: list[list[str]] = []

    def commit_meanwhile(line: str) -> None:
        # After the first video is rendered, another ingest of the same slice is committed.
        if line.startswith("[1/"):
            segments = list(store.load_manifest(planned).segments)[:2]
            other.append(commit_segments(store, segments, "re-ingested"))
            store.set_slice(DEMO_SLICE, other[0], "re-ingested")
            manifests.append(_manifest_files(root))

    with pytest.raises(SliceMovedError) as exc:
        add_renditions(store, DEMO_SLICE, [48], jobs=1, progress=commit_meanwhile)
    assert f"moved from manifest {planned} to {other[0]}" in str(exc.value)
    assert "run again" in str(exc.value)
    assert store.get_slice(DEMO_SLICE) == {
        "id": DEMO_SLICE,
        "manifest": other[0],
        "description": "re-ingested",
    }
    assert store.manifest_history(DEMO_SLICE) == sorted([planned, other[0]])
    assert not list((root / "tmp").iterdir())
    # The refused run committed no manifest (nor page) that no slice names.
    assert _manifest_files(root) == manifests[0]
    # Run again: planned from the slice as it is now, it commits.
    report = add_renditions(store, DEMO_SLICE, [48], jobs=1)
    assert (
        report.previous == other[0] and store.get_slice(DEMO_SLICE)["manifest"] == report.manifest
    )  # type: ignore[index]
    assert len(store.load_manifest(report.manifest).segments) == 2


def test_set_slice_with_expect_moves_only_from_the_expected_manifest(tmp_path: Path) -> None:
    store = Store(tmp_path / "root")
    a, b, c = (store.put_manifest(Manifest(segments=(), description=d)) for d in "abc")
    store.set_slice(DEMO_SLICE, a)
    with pytest.raises(SliceMovedError, match=f"moved from manifest {b} to {a}"):
        store.set_slice(DEMO_SLICE, c, expect=b)
    assert store.get_slice(DEMO_SLICE)["manifest"] == a  # type: ignore[index]
    store.set_slice(DEMO_SLICE, c, expect=a)
    assert store.get_slice(DEMO_SLICE)["manifest"] == c  # type: ignore[index]
    with pytest.raises(SliceMovedError, match="no manifest"):
        store.set_slice("slc_0000beef", a, expect=c)
    assert store.get_slice("slc_0000beef") is None


def test_a_failed_run_stores_none_of_its_renders(tmp_path: Path) -> None:
    # The last original is damaged: the renders finished before it were stored as blobs that
    # no manifest names.
    root = tmp_path / "root"
    build_demo(root, DEMO_SLICE, small=True)
    store = Store(root)
    before = store.get_slice(DEMO_SLICE)
    last = _cams(store.load_manifest(before["manifest"]))[-1]  # type: ignore[index]
    path = store.blob_path(last.blob.hash)
    path.chmod(0o644)
    path.write_bytes(path.read_bytes()[: last.blob.size // 2])
    objects = _objects(root)
    with pytest.raises(IntegrityError, match=last.blob.hash):
        add_renditions(store, DEMO_SLICE, [24], jobs=1)
    assert store.get_slice(DEMO_SLICE) == before and _objects(root) == objects
    assert not list((root / "tmp").iterdir())


@pytest.mark.parametrize("damage", ["deleted", "truncated"])
def test_a_missing_or_corrupt_original_is_a_clear_error(tmp_path: Path, damage: str) -> None:
    root = tmp_path / "root"
    build_demo(root, DEMO_SLICE, small=True)
    store = Store(root)
    before, objects = store.get_slice(DEMO_SLICE), _objects(root)
    manifest = store.load_manifest(before["manifest"])  # type: ignore[index]
    seg = manifest.segments[0]
    stream = next(st for st in seg.streams.values() if st.kind == "video")  # rendered first
    path = store.blob_path(stream.blob.hash)
    if damage == "deleted":
        path.unlink()
    else:
        path.chmod(0o644)
        path.write_bytes(path.read_bytes()[: stream.blob.size // 2])
    objects = _objects(root)
    # Two processes: the others' renders finish or are cancelled; none may stay in tmp/.
    result = _cli(
        "renditions", "--root", root, "--slice", DEMO_SLICE, "--renditions", "24,48", "--jobs", "2"
    )
    assert result.returncode == 2, result.stderr
    assert (
        f"error: blob {stream.blob.hash} of {seg.id} {stream.name} is missing or unreadable "
        f"in {root.resolve()}: "
    ) in result.stderr
    assert "Traceback" not in result.stderr
    assert store.get_slice(DEMO_SLICE) == before and _objects(root) == objects
    assert not list((root / "tmp").iterdir())


def test_the_s3_endpoint_given_overrides_the_recorded_one_in_every_process(
    seaweed: SeaweedS3, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    env = {**os.environ, **seaweed.env}
    blobs = f"s3://{BUCKET}/endpoint"
    made = _cli(
        "demo", "--root", root, "--small", "--blobs", blobs, "--s3-endpoint", seaweed.endpoint,
        env=env,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    # The store moves: the endpoint the root recorded now refuses connections.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    config = root / "blobstore.json"
    config.write_text(json.dumps({"blobs": blobs, "s3_endpoint": dead}))
    for argv in (
        ["renditions", "--slice", DEMO_SLICE, "--renditions", "48", "--jobs", "2"],
        ["demo", "--small", "--seed", "1", "--slice", "slc_0000beef", "--jobs", "2"],
    ):
        result = _cli(*argv, "--root", root, "--s3-endpoint", seaweed.endpoint, env=env)
        assert result.returncode == 0, result.stderr
    assert json.loads(config.read_text())["s3_endpoint"] == dead  # given for these runs only
    metadata = Store(root, blobs=LocalBlobBackend(tmp_path / "unused"))
    manifest = metadata.load_manifest(metadata.get_slice(DEMO_SLICE)["manifest"])  # type: ignore[index]
    assert all(st.renditions for st in _cams(manifest))
    assert metadata.get_slice("slc_0000beef") is not None
    assert not list((root / "tmp").iterdir())
