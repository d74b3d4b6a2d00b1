"""A hostile server cannot crash or spoof the client through the label and publish endpoints:
every crafted answer ends in a typed error, one safe line naming the server, and nothing is
cached that a later read would trust (the rules of ``test_hostile_server.py``)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import DEMO_SLICE, TOKEN
from support.hostile import Answer, HostileServer, cache_names_ok, gzip_bomb, has_control

import rayform
from rayform.errors import ManifestError, ProtocolError, RayformError
from rayform.format import canonical_json, hash_bytes
from rayform_server.store import Store

ANSI = "\x1b[2J\x1b[31mpwned\x1b]0;title\x07"


@pytest.fixture
def server(demo_root: Path) -> Iterator[HostileServer]:
    s = HostileServer(demo_root)
    yield s
    s.stop()


def _manifest(root: Path) -> str:
    return str(Store(root).get_slice(DEMO_SLICE)["manifest"])  # type: ignore[index]


def _labelset(root: Path, **changes: Any) -> dict[str, Any]:
    store = Store(root)
    ep = str(store.load_manifest(_manifest(root)).segments.ids()[0])
    doc: dict[str, Any] = {
        "format": "rayform.labels",
        "format_version": 1,
        "slice": DEMO_SLICE,
        "manifest": _manifest(root),
        "version": 1,
        "parent": None,
        "kinds": {"success": "bool"},
        "episodes": {ep: {"success": True}},
        "history": [
            {
                "version": 1,
                "by": "x",
                "at": "2026-01-01T00:00:00Z",
                "episodes": 1,
                "keys": ["success"],
            }
        ],
    }
    doc.update(changes)
    return doc


def _serve_labelset(server: HostileServer, data: bytes, digest: str | None = None) -> None:
    digest = digest or hash_bytes(data)
    manifest = _manifest(server.root)
    server.answers[f"/v1/slices/{DEMO_SLICE}/labels/{manifest}"] = Answer.json(
        {"hash": digest, "version": 1, "size": len(data)}
    )
    server.answers[f"/v1/slices/{DEMO_SLICE}/labelsets/{digest}"] = Answer(
        200, data, {"Content-Type": "application/json"}
    )


def _fails(call: Callable[[], object], error: type[RayformError]) -> str:
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    assert not has_control(message) and "\n" not in message, repr(message[:300])
    assert len(message) < 3000 and TOKEN not in message
    return message


def _bad_set(root: Path, case: str) -> bytes:
    ep = next(iter(_labelset(root)["episodes"]))
    docs = {
        "other slice": _labelset(root, slice="slc_0badc0de"),
        "other manifest": _labelset(root, manifest="ab" * 32),
        "control chars": _labelset(
            root, kinds={"grade": "category"}, episodes={ep: {"grade": ANSI}}
        ),
        "unknown kind": _labelset(root, kinds={"success": "blob"}),
        "value of another kind": _labelset(root, episodes={ep: {"success": "yes"}}),
        "key not in kinds": _labelset(root, episodes={ep: {"other": True}}),
        "history too short": _labelset(root, history=[]),
        "not an episode": _labelset(root, episodes={"../etc": {"success": True}}),
        "tags unsorted": _labelset(
            root, kinds={"tags": "tags"}, episodes={ep: {"tags": ["b", "a"]}}
        ),
        "span backwards": _labelset(
            root, kinds={"ev": "spans"}, episodes={ep: {"ev": [[5, 1, "x"]]}}
        ),
        "span huge time": _labelset(
            root, kinds={"ev": "spans"}, episodes={ep: {"ev": [[0, 10**30, "x"]]}}
        ),
    }
    return canonical_json(docs[case])


@pytest.mark.parametrize(
    "case",
    [
        "other slice",
        "other manifest",
        "control chars",
        "unknown kind",
        "value of another kind",
        "key not in kinds",
        "history too short",
        "not an episode",
        "tags unsorted",
        "span backwards",
        "span huge time",
    ],
)
def test_crafted_label_set(case: str, server: HostileServer, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    data = _bad_set(server.root, case)
    _serve_labelset(server, data)
    slice_ = rayform.Client(server.url, TOKEN, cache_dir=cache).slices.get(DEMO_SLICE)
    message = _fails(lambda: slice_.labels, ManifestError)
    assert "label set" in message and server.url in message
    assert not (cache / "manifests" / hash_bytes(data)[:2] / hash_bytes(data)).exists()
    assert cache_names_ok(cache) == []


def test_label_set_that_does_not_match_its_hash(server: HostileServer, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    good = canonical_json(_labelset(server.root))
    _serve_labelset(server, good, digest="cd" * 32)
    slice_ = rayform.Client(server.url, TOKEN, cache_dir=cache).slices.get(DEMO_SLICE)
    assert "do not match their hash" in _fails(lambda: slice_.labels, ManifestError)
    assert not any((cache / "manifests").rglob("cd" * 32))


@pytest.mark.parametrize(
    "head",
    [
        {"hash": "zz", "version": 1, "size": 10},
        {"hash": "ab" * 32, "version": "1", "size": 10},
        {"hash": "ab" * 32, "version": 1, "size": 2**40},
        {"hash": None, "version": 3},
        [ANSI],
    ],
)
def test_crafted_label_head(head: object, server: HostileServer, tmp_path: Path) -> None:
    manifest = _manifest(server.root)
    server.answers[f"/v1/slices/{DEMO_SLICE}/labels/{manifest}"] = Answer.json(head)
    slice_ = rayform.Client(server.url, TOKEN, cache_dir=tmp_path / "c").slices.get(DEMO_SLICE)
    assert "label-set head" in _fails(lambda: slice_.labels, ProtocolError)
    assert not (tmp_path / "c" / "labels").exists()


def test_compressed_label_set_is_refused(server: HostileServer, tmp_path: Path) -> None:
    data = gzip_bomb(10 * 2**20)
    digest = hash_bytes(data)
    _serve_labelset(server, data, digest)
    server.answers[f"/v1/slices/{DEMO_SLICE}/labelsets/{digest}"] = Answer(
        200, data, {"Content-Encoding": "gzip", "Content-Type": "application/json"}
    )
    slice_ = rayform.Client(server.url, TOKEN, cache_dir=tmp_path / "c").slices.get(DEMO_SLICE)
    _fails(lambda: slice_.labels, ProtocolError)


def test_crafted_write_and_publish_answers(server: HostileServer, tmp_path: Path) -> None:
    manifest = _manifest(server.root)
    slice_ = rayform.Client(server.url, TOKEN, cache_dir=tmp_path / "c").slices.get(DEMO_SLICE)
    ep = str(slice_.segments.ids()[0])
    server.answers[f"POST /v1/slices/{DEMO_SLICE}/labels/{manifest}"] = Answer.json({"hash": ANSI})
    server.answers[f"/v1/slices/{DEMO_SLICE}/labels/{manifest}"] = Answer.json(
        {"hash": None, "version": 0, "size": 0}
    )
    assert "label-set head" in _fails(lambda: slice_.label(ep, success=True), ProtocolError)
    server.answers["POST /v1/slices"] = Answer.json({"id": "../../etc", "manifest": ANSI})
    view = slice_.select(sites=[str(slice_.segments.sites()[0])])
    assert "slc_" in _fails(lambda: slice_.client.slices.create(view), ProtocolError)
    server.answers["POST /v1/slices"] = Answer.json(
        {"error": "conflict", "message": ANSI * 100}, 409
    )
    message = _fails(lambda: slice_.client.slices.create(view), rayform.InvalidArgumentError)
    assert "\\x1b" in message
    assert json.dumps(cache_names_ok(tmp_path / "c")) == "[]"


def test_a_pull_keeps_its_blobs_when_the_labels_answer_is_bad(
    server: HostileServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    manifest = _manifest(server.root)
    server.answers[f"/v1/slices/{DEMO_SLICE}/labels/{manifest}"] = Answer.json({"hash": ANSI})
    client = rayform.Client(server.url, TOKEN, cache_dir=tmp_path / "c")
    with caplog.at_level("WARNING", logger="rayform.client"):
        report = client.pull(DEMO_SLICE, streams=["joints/position"])
    assert report.blobs > 0
    assert "the labels were not cached" in caplog.text and "\x1b" not in caplog.text
    assert not (tmp_path / "c" / "labels").exists()
