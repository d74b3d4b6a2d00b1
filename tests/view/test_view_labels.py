"""Labels in `rayform view`: the list filtered by a text filter on labels, an episode's labels,
labelling from the page (only the page itself may), and the selection as select(where=...)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support import DEMO_SLICE, TOKEN, WRITE_TOKEN, ServerProcess

import rayform
import rayform.view


def _viewer(server: ServerProcess, cache: Path, token: str) -> rayform.view.ViewServer:
    client = rayform.Client(endpoint=server.url, token=token, cache_dir=cache)
    return rayform.view.serve(client.slices.get(DEMO_SLICE))


@contextlib.contextmanager
def _http(viewer: rayform.view.ViewServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=viewer.url.split("?")[0], timeout=30) as h:
        assert h.get("/", params={"key": viewer.secret}).status_code == 200
        yield h


@pytest.fixture
def viewer(write_server: ServerProcess, tmp_path: Path) -> Iterator[rayform.view.ViewServer]:
    server = _viewer(write_server, tmp_path / "c", WRITE_TOKEN)
    yield server
    server.stop()


def test_label_from_the_page_then_filter_the_list(viewer: rayform.view.ViewServer) -> None:
    with _http(viewer) as h:
        ids = [e["id"] for e in h.get("/api/episodes").json()["episodes"]]
        r = h.post(
            "/api/label", json={"segment": ids[1], "values": {"success": True, "quality": 0.8}}
        )
        assert r.status_code == 200, r.text
        assert r.json() == {
            "segment": ids[1],
            "labels": {"success": True, "quality": 0.8},
            "version": 1,
            "spans": {},
        }
        episode = h.get("/api/episode", params={"segment": ids[1]}).json()
        assert (
            episode["labels"] == {"success": True, "quality": 0.8}
            and episode["labels_version"] == 1
        )
        listed = h.get("/api/episodes", params={"where": "success and quality > 0.5"}).json()
        assert [e["id"] for e in listed["episodes"]] == [ids[1]] and listed["total"] == 1
        # Another label moves the list on (results are kept per label version).
        h.post("/api/label", json={"segment": ids[2], "values": {"success": True, "quality": 0.9}})
        again = h.get("/api/episodes", params={"where": "success and quality > 0.5"}).json()
        assert again["total"] == 2
        sel = h.get("/api/selection", params={"where": "success and quality > 0.5"}).json()
        assert sel["code"] == "view = slice_.select(where='success and quality > 0.5')"
        assert sel["count"] == 2 and sel["expression"].startswith("filter:success")
        bad = h.get("/api/episodes", params={"where": "sucess"})
        assert bad.status_code == 400 and "is not a field or label" in bad.json()["error"]
        both = h.get("/api/episodes", params={"where": "success", "prefix": "seg_"})
        assert both.status_code == 400


def test_only_the_page_may_label(viewer: rayform.view.ViewServer) -> None:
    body = {"segment": "seg_00000000", "values": {"success": True}}
    with httpx.Client(base_url=viewer.url.split("?")[0], timeout=30) as h:
        assert h.post("/api/label", json=body).status_code == 403  # no key
    with _http(viewer) as h:
        seg = h.get("/api/episodes").json()["episodes"][0]["id"]
        ok = {"segment": seg, "values": {"success": True}}
        foreign = h.post("/api/label", json=ok, headers={"Origin": "http://evil.example"})
        assert foreign.status_code == 403
        form = h.post("/api/label", content=b"segment=x", headers={"Content-Type": "text/plain"})
        assert form.status_code == 415
        big = h.post("/api/label", json={"segment": seg, "values": {"note": "x" * 70_000}})
        assert big.status_code == 413
        unknown = h.post("/api/label", json={"segment": "seg_00000000deadbeef", "values": {"a": 1}})
        assert unknown.status_code == 400 and "not in manifest" in unknown.json()["error"]
        assert h.post("/api/label", json=ok).status_code == 200


def test_a_read_token_views_labels_but_cannot_write(
    write_server: ServerProcess, tmp_path: Path
) -> None:
    reader = _viewer(write_server, tmp_path / "r", TOKEN)
    try:
        with _http(reader) as h:
            seg = h.get("/api/episodes").json()["episodes"][0]["id"]
            r = h.post("/api/label", json={"segment": seg, "values": {"success": True}})
            assert r.status_code == 403 and "write token" in r.json()["error"]
            assert h.get("/api/episode", params={"segment": seg}).json()["labels"] == {}
    finally:
        reader.stop()


def test_time_ranges_in_seconds_added_and_removed(viewer: rayform.view.ViewServer) -> None:
    with _http(viewer) as h:
        seg = h.get("/api/episodes").json()["episodes"][2]["id"]
        for t0, t1, name in ((0.25, 0.75, "slip"), (1.0, 0.5, "grasp_failed")):
            span = {"key": "events", "t0_s": t0, "t1_s": t1, "name": name}
            r = h.post("/api/label", json={"segment": seg, "span": span})
            assert r.status_code == 200, r.text
        assert r.json()["spans"] == {"events": [[0.25, 0.75, "slip"], [0.5, 1.0, "grasp_failed"]]}
        episode = h.get("/api/episode", params={"segment": seg}).json()
        assert episode["spans"] == r.json()["spans"] and episode["kinds"] == {"events": "spans"}
        r = h.post("/api/label", json={"segment": seg, "unspan": {"key": "events", "index": 0}})
        assert r.json()["spans"] == {"events": [[0.5, 1.0, "grasp_failed"]]}
        bad = h.post("/api/label", json={"segment": seg, "unspan": {"key": "events", "index": 5}})
        assert bad.status_code == 400 and "not one of 1 ranges" in bad.json()["error"]
        note = {"segment": seg, "values": {"note": "x"}, "kinds": {"note": "text"}}
        assert h.post("/api/label", json=note).json()["labels"]["note"] == "x"
