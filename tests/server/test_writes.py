"""Writes in the server stub: write-scoped tokens, bounds, validation, the audit log, atomic
label versions (a writer killed half way leaves the previous one), and their HTTP errors."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support import DEMO_SLICE, TOKEN, ServerProcess
from support.lineage import copy_root

from rayform import InvalidArgumentError
from rayform.format import hash_bytes
from rayform_server.auth import Auth, load_tokens_file
from rayform_server.labelstore import LabelStore, read_audit
from rayform_server.store import Store

WRITER = "writer-token-5e6f7a8b9c"
SCOPED = "scoped-token-1a2b3c4d5e"  # reads every slice, writes slc_7c1e* only
NARROW = "narrow-token-0f1e2d3c4b"  # writes everywhere, reads slc_0000* only


@pytest.fixture(scope="module")
def served(demo_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A copy of the demo root served with a read token, a scoped writer and a writer whose
    write scope reaches beyond its read scope."""
    root = copy_root(demo_root, tmp_path_factory.mktemp("writes") / "root")
    tokens = tmp_path_factory.mktemp("tok") / "tokens.json"
    tokens.write_text(
        json.dumps(
            {
                "tokens": [
                    {"name": "reader", "token": TOKEN, "slices": ["*"]},
                    {"name": "alice", "token": SCOPED, "slices": ["*"], "write": ["slc_7c1e*"]},
                    {"name": "narrow", "token": NARROW, "slices": ["slc_0000*"], "write": ["*"]},
                ]
            }
        )
    )
    server = ServerProcess(root, "--tokens-file", str(tokens), token=None)
    yield server
    server.stop()


def _manifest(server: ServerProcess) -> str:
    return str(Store(server.root).get_slice(DEMO_SLICE)["manifest"])  # type: ignore[index]


def _episodes(server: ServerProcess) -> list[str]:
    store = Store(server.root)
    return [str(s) for s in store.load_manifest(_manifest(server)).segments.ids().to_pylist()]


def _post(
    server: ServerProcess, token: str, body: object, path: str | None = None
) -> httpx.Response:
    path = path or f"/v1/slices/{DEMO_SLICE}/labels/{_manifest(server)}"
    return httpx.post(
        server.url + path, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=30
    )


def test_read_token_cannot_write_and_write_scope_needs_read_scope(served: ServerProcess) -> None:
    ep = _episodes(served)[0]
    body = {"base": None, "set": {ep: {"success": True}}}
    read = _post(served, TOKEN, body)
    assert read.status_code == 403 and read.json()["error"] == "forbidden"
    assert "write token" in read.json()["message"]
    # A token that may write everywhere but read only slc_0000*: the slice does not exist for it.
    narrow = _post(served, NARROW, body)
    assert narrow.status_code == 404
    assert not (served.root / "labels" / DEMO_SLICE).exists()
    ok = _post(served, SCOPED, body)
    assert ok.status_code == 200, ok.text
    head = ok.json()
    assert head["version"] >= 1 and head["changed"] is True
    data = (served.root / "labelsets" / head["hash"][:2] / head["hash"]).read_bytes()
    assert hash_bytes(data) == head["hash"]


def test_bad_writes_are_refused_naming_the_value(served: ServerProcess) -> None:
    ep = _episodes(served)[1]
    cases = [
        ({"base": None, "set": {"seg_00000000deadbeef": {"success": True}}}, "not in manifest"),
        ({"base": None, "set": {ep: {"Bad-Key": 1}}}, "is not allowed"),
        ({"base": None, "set": {ep: {"site": "x"}}}, "reserved"),
        ({"base": None, "set": {ep: {"quality": {"nested": 1}}}}, "a label is a bool"),
        ({"base": None, "set": {ep: {"grade": "x" * 500}}}, "at most 128"),
        ({"set": {ep: {"success": True}}}, "base"),
        ({"base": "0" * 64, "set": {ep: {"success": True}}}, "not a version"),
    ]
    before = read_audit(served.root)
    for body, words in cases:
        resp = _post(served, SCOPED, body)
        assert resp.status_code == 400, (body, resp.text)
        assert resp.json()["error"] == "invalid_argument"
        assert words in resp.json()["message"], (words, resp.json()["message"])
    assert read_audit(served.root) == before  # nothing refused is audited as written


def test_bounds_and_methods(served: ServerProcess) -> None:
    path = f"/v1/slices/{DEMO_SLICE}/labels/{_manifest(served)}"
    auth = {"Authorization": f"Bearer {SCOPED}", "Content-Type": "application/json"}
    big = httpx.post(served.url + path, content=b" " * (16 * 2**20 + 1), headers=auth, timeout=30)
    assert big.status_code == 413 and "at most" in big.json()["message"]

    def chunks() -> Iterator[bytes]:
        yield b"{}"

    chunked = httpx.post(served.url + path, content=chunks(), headers=auth, timeout=30)
    assert chunked.status_code == 411
    other = httpx.put(served.url + path, content=b"{}", headers=auth, timeout=30)
    assert other.status_code == 405 and other.headers["Allow"] == "GET, HEAD"
    blob_post = httpx.post(served.url + f"/v1/slices/{DEMO_SLICE}/manifest", headers=auth)
    assert blob_post.status_code == 405
    not_json = httpx.post(served.url + path, content=b"{nope", headers=auth, timeout=30)
    assert not_json.status_code == 400 and "not JSON" in not_json.json()["message"]


def test_writes_are_audited(served: ServerProcess) -> None:
    ep = _episodes(served)[2]
    head = httpx.get(
        served.url + f"/v1/slices/{DEMO_SLICE}/labels/{_manifest(served)}",
        headers={"Authorization": f"Bearer {TOKEN}"},
    ).json()
    resp = _post(served, SCOPED, {"base": head["hash"], "set": {ep: {"quality": 0.25}}})
    assert resp.status_code == 200, resp.text
    last = read_audit(served.root)[-1]
    assert last["action"] == "labels" and last["by"] == "alice"
    assert last["labels"] == resp.json()["hash"] and last["keys"] == ["quality"]
    assert last["slice"] == DEMO_SLICE and last["at"].endswith("Z")
    # The same write again changes nothing: no new version, no audit line.
    again = _post(served, SCOPED, {"base": resp.json()["hash"], "set": {ep: {"quality": 0.25}}})
    assert again.json()["changed"] is False and again.json()["hash"] == resp.json()["hash"]
    assert read_audit(served.root)[-1] == last


_KILLED_WRITER = r"""
import os, signal, sys
import rayform_server.labelstore as ls
from rayform.manifest import segments_of
from rayform_server.store import Store

real = ls.write_atomic
def dying(dest, data, **kw):
    if str(dest).endswith(".json"):  # the head moves: die first, as a SIGKILL would
        os.kill(os.getpid(), signal.SIGKILL)
    return real(dest, data, **kw)
ls.write_atomic = dying
store = Store(sys.argv[1])
manifest = store.get_slice(sys.argv[2])["manifest"]
segs = segments_of(store.load_manifest(manifest))
labels = ls.LabelStore(store)
base = labels.head(sys.argv[2], manifest)["hash"]
labels.write(sys.argv[2], manifest, segs, {"base": base, "set": {sys.argv[3]: {"killed": True}}}, "k")
"""


def test_a_killed_writer_leaves_the_previous_version(demo_root: Path, tmp_path: Path) -> None:
    root = copy_root(demo_root, tmp_path / "root")
    store = Store(root)
    manifest = str(store.get_slice(DEMO_SLICE)["manifest"])  # type: ignore[index]
    from rayform.manifest import segments_of

    segs = segments_of(store.load_manifest(manifest))
    ep = str(segs.ids().to_pylist()[0])
    labels = LabelStore(store)
    first = labels.write(DEMO_SLICE, manifest, segs, {"base": None, "set": {ep: {"ok": True}}}, "t")
    proc = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(root), DEMO_SLICE, ep])
    assert proc.returncode == -9
    head = labels.head(DEMO_SLICE, manifest)
    assert head["hash"] == first["hash"] and head["version"] == 1
    doc = json.loads(labels.read(DEMO_SLICE, head["hash"]))
    assert doc["episodes"][ep] == {"ok": True}
    # The next write goes on from the intact version.
    after = labels.write(
        DEMO_SLICE, manifest, segs, {"base": head["hash"], "set": {ep: {"n": 1}}}, "t"
    )
    assert after["version"] == 2


def test_tokens_file_write_lists_are_checked(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(
        json.dumps({"tokens": [{"name": "a", "token": "x" * 12, "slices": ["*"], "write": "*"}]})
    )
    with pytest.raises(InvalidArgumentError, match="'write' must be a list"):
        load_tokens_file(path)
    path.write_text(json.dumps({"tokens": [{"name": "a", "token": "x" * 12, "slices": ["*"]}]}))
    (grant,) = load_tokens_file(path)
    assert grant.allows("slc_7c1e04aa") and not grant.may_write("slc_7c1e04aa")
    auth = Auth.from_options(token="r" * 12, write_token="w" * 12)
    assert [g.may_write("slc_7c1e04aa") for g in auth.grants] == [False, True]
    with pytest.raises(InvalidArgumentError, match="same as --token"):
        Auth.from_options(token="r" * 12, write_token="r" * 12)


def test_limits_bound_every_write(
    demo_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rayform.curation import LIMITS
    from rayform.manifest import segments_of

    root = copy_root(demo_root, tmp_path / "root")
    store = Store(root)
    manifest = str(store.get_slice(DEMO_SLICE)["manifest"])  # type: ignore[index]
    segs = segments_of(store.load_manifest(manifest))
    ids = [str(i) for i in segs.ids().to_pylist()]
    labels = LabelStore(store)

    def write(changes: dict[str, dict[str, object]]) -> dict[str, object]:
        base = labels.head(DEMO_SLICE, manifest)["hash"]
        return labels.write(DEMO_SLICE, manifest, segs, {"base": base, "set": changes}, "t")

    monkeypatch.setitem(LIMITS, "write_values", 3)
    with pytest.raises(InvalidArgumentError, match="sets 4 values; one write sets at most 3"):
        write({ids[0]: {"a": 1, "b": 2}, ids[1]: {"a": 1, "b": 2}})
    monkeypatch.setitem(LIMITS, "keys", 2)
    with pytest.raises(InvalidArgumentError, match="at most 2 keys"):
        write({ids[0]: {"a": 1, "b": 2, "c": 3}})
    monkeypatch.setitem(LIMITS, "tags", 2)
    with pytest.raises(InvalidArgumentError, match="at most 2 non-empty strings"):
        write({ids[0]: {"t": ["x", "y", "z"]}})
    first = write({ids[0]: {"a": 1}})
    monkeypatch.setitem(LIMITS, "labelset_bytes", int(first["size"]) + 100)  # type: ignore[call-overload]
    with pytest.raises(InvalidArgumentError, match="a label set may hold"):
        write({ids[1]: {"a": 2}, ids[2]: {"a": 3}, ids[3]: {"a": 4}})
    monkeypatch.setitem(LIMITS, "labelset_bytes", 2**20)
    monkeypatch.setitem(LIMITS, "versions", 2)
    write({ids[1]: {"a": 2}})
    with pytest.raises(InvalidArgumentError, match="2 versions, the most it may hold"):
        write({ids[2]: {"a": 3}})
    assert labels.head(DEMO_SLICE, manifest)["version"] == 2  # nothing refused was stored


def test_hostile_bodies_are_refused(served: ServerProcess) -> None:
    path = f"/v1/slices/{DEMO_SLICE}/labels/{_manifest(served)}"
    auth = {"Authorization": f"Bearer {SCOPED}", "Content-Type": "application/json"}
    for body in (b"[" * 100_000 + b"]" * 100_000, b'{"base": NaN, "set": {}}', b"\xff\xfe"):
        resp = httpx.post(served.url + path, content=body, headers=auth, timeout=30)
        assert resp.status_code == 400, resp.text
    create = httpx.post(served.url + "/v1/slices", content=b'{"parent": "../x"}', headers=auth)
    assert create.status_code == 400 and "parent" in create.json()["message"]
    health = httpx.get(served.url + "/v1/health")
    assert health.status_code == 200  # the server is still up
