"""``rayform-server renditions``: renditions added to a stored slice, as a new manifest of the
same slice ID; the old manifest stays readable by hash; local and S3-backed roots."""

from __future__ import annotations

import os
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

from rayform.manifest import Manifest
from rayform.torch import EpisodeDataset
from rayform_server.cli import main
from rayform_server.demo import build_demo
from rayform_server.store import Store

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
        assert isinstance(slice_.manifest, Manifest) or slice_.manifest.format_version >= 2
    finally:
        server.stop()
