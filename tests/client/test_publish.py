"""A selection published as a new slice: a new manifest referencing the parent's blobs (not a
byte of blob data written), the same ID for the same selection, lineage, and the new slice
pulled, trained on with EpisodeDataset, and read offline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import DEMO_SLICE, TOKEN, WRITE_TOKEN, ServerProcess, forbid_network

import rayform
from rayform import AccessDeniedError, InvalidArgumentError
from rayform.cli import main
from rayform_server.labelstore import read_audit


def _blob_bytes(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (root / "blobs").rglob("*") if p.is_file()}


def _labelled(server: ServerProcess, cache: Path) -> tuple[rayform.Slice, list[str]]:
    slice_ = rayform.Client(endpoint=server.url, token=WRITE_TOKEN, cache_dir=cache).slices.get(
        DEMO_SLICE
    )
    ids = [str(i) for i in slice_.segments.ids().to_pylist()]
    slice_.label_all(
        {ids[0]: {"success": True}, ids[1]: {"success": False}, ids[3]: {"success": True}}
    )
    return slice_, ids


def test_publish_writes_no_blob_and_names_the_same_selection_once(
    write_server: ServerProcess, tmp_path: Path
) -> None:
    slice_, ids = _labelled(write_server, tmp_path / "c")
    blobs_before = _blob_bytes(write_server.root)
    view = slice_.select(where="success")
    new = slice_.client.slices.create(view, description="successful episodes")
    assert _blob_bytes(write_server.root) == blobs_before  # not a byte written, copied or moved
    assert new.id != DEMO_SLICE and new.id.startswith("slc_")
    assert [str(i) for i in new.segments.ids().to_pylist()] == [ids[0], ids[3]]
    assert set(new.blobs()) <= set(slice_.blobs())
    assert new.lineage == {
        "parent": DEMO_SLICE,
        "parent_manifest": slice_.manifest_hash,
        "select": f"filter:success;labels:{slice_.labels.hash}",
        "labels": slice_.labels.hash,
    }
    assert f"from={DEMO_SLICE}" in repr(new)
    assert f"published from <b>{DEMO_SLICE}</b>" in new._repr_html_()
    listed = {s["id"]: s for s in slice_.client.slices.list()}
    assert listed[new.id]["description"] == "successful episodes"
    # The same selection again (from another client, spelled with other spaces): the same
    # manifest, the same ID. Another filter keeping the same episodes records another lineage.
    other = rayform.Client(endpoint=write_server.url, token=WRITE_TOKEN, cache_dir=tmp_path / "o")
    again = other.slices.create(other.slices.get(DEMO_SLICE).select(where="  (success) "))
    assert (again.id, again.manifest_hash) == (new.id, new.manifest_hash)
    spelled = other.slices.create(other.slices.get(DEMO_SLICE).select(where="success == true"))
    assert spelled.id != new.id and spelled.segments == new.segments
    creates = [e for e in read_audit(write_server.root) if e["action"] == "create"]
    assert len(creates) == 2 and creates[0]["slice"] == new.id and creates[0]["by"] == "writer"
    # A selection of the new slice publishes in turn, its parent the new slice.
    grand = slice_.client.slices.create(new.select(segments=[ids[3]]))
    assert grand.lineage is not None and grand.lineage["parent"] == new.id and len(grand) == 1
    assert _blob_bytes(write_server.root) == blobs_before


def test_pull_train_and_read_offline_a_published_slice(
    write_server: ServerProcess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from rayform.torch import EpisodeDataset

    slice_, ids = _labelled(write_server, tmp_path / "w")
    site = str(slice_.segments.sites()[0])
    monkeypatch.setenv("RAYFORM_ENDPOINT", write_server.url)
    monkeypatch.setenv("RAYFORM_TOKEN", WRITE_TOKEN)
    assert (
        main(
            [
                "slices",
                "create",
                "--from",
                DEMO_SLICE,
                "--where",
                "success",
                "--sites",
                site,
                "--json",
            ]
        )
        == 0
    )
    made = json.loads(capsys.readouterr().out)
    assert made["segments"] == 1 and made["lineage"]["parent"] == DEMO_SLICE
    new_id = made["id"]
    assert main(["slices", "show", new_id, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["lineage"] == made["lineage"]
    monkeypatch.setenv("RAYFORM_TOKEN", TOKEN)  # a read token pulls it
    assert main(["pull", new_id, "--quiet"]) == 0
    monkeypatch.setenv("RAYFORM_OFFLINE", "1")
    forbid_network(monkeypatch)
    offline = rayform.Client(offline=True).slices.get(new_id)
    assert offline.manifest_hash == made["manifest"] and offline.lineage == made["lineage"]
    ds = EpisodeDataset(
        offline,
        obs=["cam0/rgb", "joints/position"],
        action="joints/position_delta",
        fps=15,
        horizon=4,
    )
    sample = ds[0]
    assert sample["meta"]["slice"] == new_id and sample["meta"]["segment"] == ids[0]
    assert tuple(sample["cam0/rgb"].shape)[0] == 3 and tuple(sample["action"].shape) == (4, 14)
    assert ds.describe()["lineage"] == made["lineage"]
    again = EpisodeDataset.from_uri(str(ds.uri))
    assert len(again) == len(ds)


def test_publishing_is_refused_clearly(write_server: ServerProcess, tmp_path: Path) -> None:
    reader = rayform.Client(endpoint=write_server.url, token=TOKEN, cache_dir=tmp_path / "r")
    slice_ = reader.slices.get(DEMO_SLICE)
    view = slice_.select(sites=[str(slice_.segments.sites()[0])])
    before = sorted(p.name for p in (write_server.root / "slices").iterdir())
    with pytest.raises(AccessDeniedError, match="may not create slice"):
        reader.slices.create(view)
    assert sorted(p.name for p in (write_server.root / "slices").iterdir()) == before
    with pytest.raises(InvalidArgumentError, match="Python where= function"):
        reader.slices.create(slice_.select(where=lambda c: c["version"] >= 1))
    with pytest.raises(InvalidArgumentError, match="publishes a selection"):
        reader.slices.create(slice_)
    writer = rayform.Client(endpoint=write_server.url, token=WRITE_TOKEN, cache_dir=tmp_path / "w")
    with pytest.raises(rayform.errors.ConflictError, match="names another manifest"):
        writer.slices.create(
            writer.slices.get(DEMO_SLICE).select(segments=[str(slice_.segments.ids()[0])]),
            slice_id=DEMO_SLICE,
        )


def test_a_published_slice_mixes_views_and_exports_like_any_slice(
    write_server: ServerProcess, tmp_path: Path
) -> None:
    import httpx

    import rayform.view
    from rayform.torch import EpisodeDataset, EpisodeSampler, MixtureDataset
    from rayform.torch.lerobot import export_lerobot

    slice_, ids = _labelled(write_server, tmp_path / "w")
    child = slice_.client.slices.create(slice_.select(segments=[ids[0], ids[2]]))
    kw: dict[str, object] = {
        "obs": ["joints/position"],
        "action": "joints/position_delta",
        "fps": 15,
        "horizon": 4,
    }

    # A mixture of the published slice and its parent: both sources drawn, each sample from
    # its own slice's episodes.
    mixture = MixtureDataset(
        [(EpisodeDataset(child, **kw), 0.5, "child"), (EpisodeDataset(slice_, **kw), 0.5, "all")]
    )
    order = list(EpisodeSampler(mixture))
    samples = mixture.__getitems__(order)
    by_source = {
        name: {s["meta"]["segment"] for s in samples if s["meta"]["source_name"] == name}
        for name in ("child", "all")
    }
    assert by_source["child"] == {ids[0], ids[2]} and len(by_source["all"]) == len(ids)
    assert {s["meta"]["slice"] for s in samples if s["meta"]["source_name"] == "child"} == {
        child.id
    }

    # The viewer lists the published slice's episodes only.
    server = rayform.view.serve(child)
    try:
        with httpx.Client(base_url=server.url.split("?")[0], timeout=30) as h:
            assert h.get("/", params={"key": server.secret}).status_code == 200
            listed = h.get("/api/episodes").json()
        assert listed["total"] == 2 and [e["id"] for e in listed["episodes"]] == [ids[0], ids[2]]
    finally:
        server.stop()

    # A LeRobot export of it: its two episodes, its frames, and its own slice and manifest.
    out = tmp_path / "lerobot"
    report = export_lerobot(child, out, streams={"joints/position": "observation.state"}, fps=15)
    info = json.loads((out / "meta" / "info.json").read_text())
    assert info["total_episodes"] == 2 and info["total_frames"] == report.frames
    assert report.frames == len(EpisodeDataset(child, obs=["joints/position"], fps=15, action=None))
    assert info["rayform"]["slice"] == child.id
    assert info["rayform"]["manifest"] == child.manifest_hash
