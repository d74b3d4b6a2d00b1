"""The server stub on S3-compatible object storage (a real SeaweedFS on loopback).

Blob requests answer ``307`` to presigned SigV4 URLs; the SDK follows them without the
``Authorization`` header, resumes with ``Range``, verifies BLAKE3 and asks again when a URL
expires. A recording proxy (``support.s3proxy.S3Proxy``) sits in front of SeaweedFS and sees
everything that reaches the object store.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support import DEMO_SLICE, TOKEN, ServerProcess, forbid_network, make_client
from support.manifests import served_manifest
from support.proxy import CountingProxy
from support.reliability import assert_cache_consistent, kill_when_writing, pull_cmd, sub_env
from support.s3proxy import S3Proxy
from support.seaweed import BUCKET, SeaweedS3

import rayform
from rayform.errors import IntegrityError
from rayform.format import hash_file
from rayform_server.blobstore import CONFIG_NAME, configure_root

PREFIX = "demo"


# -- fixtures -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    s3 = SeaweedS3(tmp_path_factory.mktemp("weed"))
    yield s3
    s3.stop()


def _demo_into_s3(root: Path, s3: SeaweedS3, prefix: str) -> None:
    """`rayform-server demo --blobs s3://...` in a real process (its workers too)."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rayform_server",
            "demo",
            "--root",
            str(root),
            "--small",
            "--jobs",
            "1",
            "--blobs",
            f"s3://{BUCKET}/{prefix}",
            "--s3-endpoint",
            s3.endpoint,
        ],
        env={**os.environ, **s3.env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def s3_root(seaweed: SeaweedS3, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("s3-root")
    _demo_into_s3(root, seaweed, PREFIX)
    return root


@pytest.fixture(scope="module")
def s3proxy(seaweed: SeaweedS3) -> Iterator[S3Proxy]:
    with S3Proxy(seaweed.endpoint) as p:
        yield p


@pytest.fixture(scope="module")
def s3_server(s3_root: Path, s3proxy: S3Proxy, seaweed: SeaweedS3) -> Iterator[ServerProcess]:
    """The stub on the S3 backend, presigning against the recording proxy."""
    server = ServerProcess(s3_root, "--s3-endpoint", s3proxy.url, env=seaweed.env)
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def _reset_proxy(request: pytest.FixtureRequest) -> None:
    if "s3proxy" in request.fixturenames:
        proxy = request.getfixturevalue("s3proxy")
        proxy.delay_s, proxy.hold_s, proxy.hold_next = 0.0, 0.0, 0


#: A client subprocess gets neither RAYFORM_* nor the object store's AWS_* keys from outside.
_NO_KEYS = ("RAYFORM_", "AWS_")

# -- helpers --------------------------------------------------------------------------------


def _secrets(proxy: S3Proxy) -> list[str]:
    """The token and every presigned signature handed out so far."""
    sigs = {
        m[1]
        for s in proxy.presigned()
        for m in [re.search(r"X-Amz-Signature=([0-9a-f]+)", s.query)]
        if m
    }
    assert sigs, "no presigned URL was used"
    return [TOKEN, *sigs]


def _assert_no_secret(text: str, proxy: S3Proxy) -> None:
    for secret in _secrets(proxy):
        assert secret not in text, f"secret {secret[:6]}... leaked"


def _expected(url: str, cache: Path) -> dict[str, rayform.manifest.BlobRef]:
    return make_client(url, cache).slices.get(DEMO_SLICE).manifest.blobs()


# -- the stub's side ------------------------------------------------------------------------
def test_blob_requests_redirect_to_presigned_urls_after_the_checks(
    s3_server: ServerProcess, s3proxy: S3Proxy
) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    doc = httpx.get(f"{s3_server.url}/v1/slices/{DEMO_SLICE}", headers=auth).json()
    manifest = httpx.get(f"{s3_server.url}/v1/slices/{DEMO_SLICE}/manifest", headers=auth)
    assert manifest.status_code == 200  # metadata stays on the stub
    digest = next(
        iter(
            served_manifest(
                s3_server.url, DEMO_SLICE, auth, manifest.content, doc["manifest"]
            ).blobs()
        )
    )
    blob = f"{s3_server.url}/v1/slices/{DEMO_SLICE}/blobs/{digest}"
    for method in ("GET", "HEAD"):
        resp = httpx.request(method, blob, headers=auth)
        assert resp.status_code == 307, resp.text
        location = httpx.URL(resp.headers["location"])
        assert (location.host, location.port) == ("127.0.0.1", httpx.URL(s3proxy.url).port)
        assert location.path == f"/{BUCKET}/{PREFIX}/{digest[:2]}/{digest}"
        assert b"X-Amz-Algorithm=AWS4-HMAC-SHA256" in location.query
        assert b"X-Amz-Expires=300" in location.query
    # the checks come first: no token, a wrong token, a blob of no slice -> no URL handed out
    assert httpx.get(blob).status_code == 401
    assert httpx.get(blob, headers={"Authorization": "Bearer nope"}).status_code == 401
    other = f"{s3_server.url}/v1/slices/{DEMO_SLICE}/blobs/{'0' * 64}"
    assert httpx.get(other, headers=auth).status_code == 404
    assert (
        httpx.get(
            f"{s3_server.url}/v1/slices/slc_0000000f/blobs/{digest}", headers=auth
        ).status_code
        == 404
    )
    # the presigned URL works without any Authorization, with Range -> 206
    ranged = httpx.get(resp.headers["location"], headers={"Range": "bytes=2-9"})
    assert ranged.status_code == 206 and len(ranged.content) == 8


def test_root_records_its_blob_store(s3_root: Path, seaweed: SeaweedS3, tmp_path: Path) -> None:
    doc = json.loads((s3_root / CONFIG_NAME).read_text())
    assert doc["blobs"] == f"s3://{BUCKET}/{PREFIX}"
    assert not (s3_root / "blobs").exists() or not any((s3_root / "blobs").rglob("*"))
    with pytest.raises(ValueError, match=f"keeps its blobs in s3://{BUCKET}/{PREFIX}"):
        configure_root(s3_root, "s3://another-bucket/x")
    local = tmp_path / "local"
    (local / "blobs" / "ab").mkdir(parents=True)
    (local / "blobs" / "ab" / "abc").write_bytes(b"x")
    with pytest.raises(ValueError, match="already holds blobs"):
        configure_root(local, "s3://b/p")
    with pytest.raises(ValueError, match="add --blobs"):
        configure_root(tmp_path / "fresh", None, "http://127.0.0.1:9")
    bad = subprocess.run(  # wrong credentials: one clear line, the secret never shown
        [sys.executable, "-m", "rayform_server", "serve", "--root", str(s3_root), "--port", "0"],
        env={**os.environ, **seaweed.env, "AWS_SECRET_ACCESS_KEY": "wrong-secret-5e4d3c"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "refused access to bucket" in bad.stderr, bad.stderr
    assert "wrong-secret-5e4d3c" not in bad.stderr and "Traceback" not in bad.stderr
    help_text = subprocess.run(
        [sys.executable, "-m", "rayform_server", "ingest", "mcap", "--help"],
        capture_output=True,
        text=True,
    ).stdout
    assert "--blobs" in help_text and "--s3-endpoint" in help_text


# -- the client on the S3 backend -----------------------------------------------------------
def test_pull_from_s3_each_blob_once_then_nothing(
    s3_server: ServerProcess, s3proxy: S3Proxy, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    cache = tmp_path / "cache"
    mark = s3proxy.mark()
    client = make_client(s3_server.url, cache)
    report = client.pull(DEMO_SLICE, jobs=4)
    expected = client.slices.get(DEMO_SLICE).manifest.blobs()
    assert report.blobs == report.fetched_blobs == len(expected) == 28
    assert report.fetched_bytes == sum(r.size for r in expected.values())
    assert s3proxy.object_gets(mark) == {h: 1 for h in expected}
    assert assert_cache_consistent(cache) == sorted(expected)
    again_mark = s3proxy.mark()
    again = make_client(s3_server.url, cache).pull(DEMO_SLICE)
    assert again.fetched_blobs == 0 and again.cached_blobs == 28
    assert s3proxy.seen[again_mark:] == []
    # The client's Authorization never reaches the object store; nor does the token in any form.
    # (The stub's own HEADs, checking an object exists, are signed with its AWS credentials.)
    reached = s3proxy.seen[mark:]
    ours = [s for s in reached if s.headers.get("user-agent") == "rayform-sdk"]
    assert len(ours) == 28 and all(s.method == "GET" and s.presigned for s in ours)
    for seen in reached:
        assert not any(TOKEN in v or "Bearer" in v for v in seen.headers.values()), seen
        if seen.presigned:
            assert "authorization" not in seen.headers, seen
        else:
            assert seen.method == "HEAD" and seen.headers["authorization"].startswith(
                "AWS4-HMAC-SHA256 "
            )
    # One request for the URLs of every blob, not a 307 per blob: the stub saw no blob GET.
    stub_blobs = f"{s3_server.url}/v1/slices/{DEMO_SLICE}/blobs/"
    assert f"POST {s3_server.url}/v1/slices/{DEMO_SLICE}/blob-urls" in caplog.text
    assert stub_blobs not in caplog.text
    assert "X-Amz-Signature=<hidden>" in caplog.text  # httpx logged the presigned GETs ...
    _assert_no_secret(caplog.text, s3proxy)  # ... without the token or a signature


def test_four_processes_pull_one_cache_from_s3(
    s3_server: ServerProcess, s3proxy: S3Proxy, tmp_path: Path
) -> None:
    s3proxy.delay_s = 0.002  # the four pullers overlap
    cache = tmp_path / "shared-cache"
    mark = s3proxy.mark()
    procs = [
        subprocess.Popen(
            pull_cmd(s3_server.url, cache, "--jobs", "4"),
            env=sub_env(drop=_NO_KEYS),
            stderr=subprocess.PIPE,
        )
        for _ in range(4)
    ]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
    expected = _expected(s3_server.url, cache)
    assert assert_cache_consistent(cache) == sorted(expected)
    assert list((cache / "tmp").iterdir()) == []
    assert s3proxy.object_gets(mark) == {h: 1 for h in expected}, "each blob transferred once"


def test_sigkill_mid_transfer_then_resume_from_s3(
    s3_server: ServerProcess, s3proxy: S3Proxy, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    s3proxy.delay_s = 0.05  # 1 KiB every 50 ms
    proc = subprocess.Popen(
        pull_cmd(s3_server.url, cache, "--jobs", "2"),
        env=sub_env(drop=_NO_KEYS),
        stderr=subprocess.DEVNULL,
    )
    partial = {
        h: size for h, size in kill_when_writing(proc, cache).items() if size > 0
    }  # (one may just have begun)
    assert partial
    assert not set(partial) & set(assert_cache_consistent(cache))
    s3proxy.delay_s = 0.0
    mark = s3proxy.mark()
    result = subprocess.run(
        pull_cmd(s3_server.url, cache, quiet=False),
        env=sub_env(drop=_NO_KEYS),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert assert_cache_consistent(cache) == sorted(_expected(s3_server.url, cache))
    assert list((cache / "tmp").iterdir()) == []
    resumed = [s for s in s3proxy.presigned(mark) if "range" in s.headers]
    assert {s.key_hash for s in resumed} == set(partial), "every partial file was continued"
    for seen in resumed:
        assert seen.headers["range"] == f"bytes={partial[seen.key_hash]}-" and seen.status == 206
    _assert_no_secret(result.stderr + result.stdout, s3proxy)  # progress bar and summary


def test_corrupt_object_in_store_raises_integrity_error(
    s3_server: ServerProcess, s3proxy: S3Proxy, seaweed: SeaweedS3, tmp_path: Path
) -> None:
    client = make_client(s3_server.url, tmp_path / "cache")
    ref = client.slices.get(DEMO_SLICE).segments[1].streams["joints/position"].blob
    s3 = seaweed.s3_client()
    key = f"{PREFIX}/{ref.hash[:2]}/{ref.hash}"
    good = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    s3.put_object(Bucket=BUCKET, Key=key, Body=bytes([good[0] ^ 0xFF]) + good[1:])  # bit rot
    try:
        with pytest.raises(IntegrityError, match="failed verification") as info:
            client.ensure_blob(DEMO_SLICE, ref)
        assert not client.cache.blob_path(ref.hash).exists()
        assert list((tmp_path / "cache" / "tmp").iterdir()) == []
        with pytest.raises(IntegrityError):
            client.pull(DEMO_SLICE, streams=["joints/position"])
        assert ref.hash not in assert_cache_consistent(tmp_path / "cache")
        _assert_no_secret(str(info.value), s3proxy)
    finally:
        s3.put_object(Bucket=BUCKET, Key=key, Body=good)
    assert hash_file(client.ensure_blob(DEMO_SLICE, ref)) == ref.hash  # repaired store: fine again


def test_expired_presigned_url_is_refreshed(
    s3_root: Path,
    s3proxy: S3Proxy,
    seaweed: SeaweedS3,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    server = ServerProcess(
        s3_root, "--s3-endpoint", s3proxy.url, "--presign-expiry", "1", env=seaweed.env
    )
    try:
        with CountingProxy(server.url) as stub:
            client = make_client(stub.url, tmp_path / "cache")
            ref = client.slices.get(DEMO_SLICE).segments[0].streams["cam0/rgb"].blob
            mark = s3proxy.mark()
            s3proxy.hold_s, s3proxy.hold_next = 2.5, 1  # the first URL expires in flight
            assert hash_file(client.ensure_blob(DEMO_SLICE, ref)) == ref.hash
            assert stub.blob_gets()[ref.hash] == 2, "the stub was asked again for a fresh URL"
        tries = [s for s in s3proxy.presigned(mark) if s.key_hash == ref.hash]
        assert [s.status for s in tries] == [403, 200]
        assert tries[0].query != tries[1].query
    finally:
        server.stop()
    _assert_no_secret(caplog.text, s3proxy)


def test_an_expired_url_from_a_batch_goes_back_to_the_blob_path(
    s3_root: Path, s3proxy: S3Proxy, seaweed: SeaweedS3, tmp_path: Path
) -> None:
    server = ServerProcess(
        s3_root, "--s3-endpoint", s3proxy.url, "--presign-expiry", "2", env=seaweed.env
    )
    try:
        with CountingProxy(server.url) as stub:
            client = make_client(stub.url, tmp_path / "cache")
            wanted = client.slices.get(DEMO_SLICE).manifest.blobs(["ee/pose"])
            mark = s3proxy.mark()
            s3proxy.hold_s, s3proxy.hold_next = 3.0, 1  # one batch URL expires in flight
            report = client.pull(DEMO_SLICE, streams=["ee/pose"], jobs=4)
            assert report.fetched_blobs == len(wanted) == 4
            refused = [s.key_hash for s in s3proxy.presigned(mark) if s.status == 403]
            assert len(refused) == 1
            assert stub.blob_gets() == {refused[0]: 1}, "only the refused blob asked the stub"
        tries = [s.status for s in s3proxy.presigned(mark) if s.key_hash == refused[0]]
        assert tries == [403, 200]
        assert assert_cache_consistent(tmp_path / "cache") == sorted(wanted)
    finally:
        server.stop()


def test_an_object_gone_from_the_store_is_named_by_the_blob_path(
    s3_server: ServerProcess, seaweed: SeaweedS3, tmp_path: Path
) -> None:
    client = make_client(s3_server.url, tmp_path / "cache")
    refs = client.slices.get(DEMO_SLICE).manifest.blobs(["ee/pose"])
    gone = sorted(refs)[0]
    s3 = seaweed.s3_client()
    key = f"{PREFIX}/{gone[:2]}/{gone}"
    data = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    s3.delete_object(Bucket=BUCKET, Key=key)
    try:
        # The batch URL is signed without a look; the store's 404 sends the download to the
        # blob path, whose check says what is missing and whom to tell.
        with pytest.raises(rayform.errors.NotFoundError, match="missing from the server's object"):
            client.pull(DEMO_SLICE, streams=["ee/pose"], jobs=2)
        assert gone not in assert_cache_consistent(tmp_path / "cache")
    finally:
        s3.put_object(Bucket=BUCKET, Key=key, Body=data)


def test_read_ahead_asks_for_urls_in_batches(
    s3_server: ServerProcess, s3proxy: S3Proxy, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from torch.utils.data import DataLoader

    from rayform.torch import EpisodeDataset, EpisodeSampler, collate

    caplog.set_level(logging.INFO, logger="httpx")
    client = make_client(s3_server.url, tmp_path / "cache")
    ds = EpisodeDataset(
        client.slices.get(DEMO_SLICE),
        obs=["cam0/rgb", "joints/position"],
        action="joints/position_delta",
        fps=10,
        horizon=4,
    )
    mark = s3proxy.mark()
    loader = DataLoader(ds, sampler=EpisodeSampler(ds), batch_size=8, collate_fn=collate)
    assert sum(len(b["t_ns"]) for b in loader) == len(ds)
    fetched = s3proxy.object_gets(mark)
    posts = caplog.text.count(f"POST {s3_server.url}/v1/slices/{DEMO_SLICE}/blob-urls")
    stub_gets = caplog.text.count(f"GET {s3_server.url}/v1/slices/{DEMO_SLICE}/blobs/")
    assert set(fetched.values()) == {1} and len(fetched) == 16  # 4 episodes x 4 streams
    # The first batch's blobs are fetched on demand (the blob path); read-ahead's come with
    # their URLs, several per request.
    assert stub_gets + posts < len(fetched), (stub_gets, posts)
    assert posts >= 1


def test_server_log_holds_no_presigned_url(
    s3_root: Path, s3proxy: S3Proxy, seaweed: SeaweedS3, tmp_path: Path
) -> None:
    server = ServerProcess(s3_root, "--s3-endpoint", s3proxy.url, env=seaweed.env)
    try:
        mark = s3proxy.mark()
        make_client(server.url, tmp_path / "cache").pull(DEMO_SLICE, streams=["ee/pose"])
        assert len(s3proxy.presigned(mark)) == 4
    finally:
        assert server.proc is not None and server.proc.stderr is not None
        server.proc.terminate()
        server.proc.wait(10)
        log = server.proc.stderr.read().decode()
        server.stop()
    assert f"s3://{BUCKET}/{PREFIX}" in log  # the banner names the store ...
    _assert_no_secret(log, s3proxy)  # ... but no URL, signature or token


# -- a replicated multi-process SeaweedFS ---------------------------------------------------
def test_cluster_loses_a_volume_server_pull_completes_then_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = SeaweedS3(tmp_path / "cluster", cluster=True)
    server: ServerProcess | None = None
    try:
        root = tmp_path / "root"
        _demo_into_s3(root, cluster, "cl")
        server = ServerProcess(root, env=cluster.env)  # the root remembers its store
        cluster.kill("v2")
        client = make_client(server.url, tmp_path / "cache")
        report = client.pull(DEMO_SLICE, streams=["cam0/rgb", "joints/position"], jobs=4)
        wanted = client.slices.get(DEMO_SLICE).manifest.blobs(["cam0/rgb", "joints/position"])
        assert report.fetched_blobs == len(wanted) == 12
        assert assert_cache_consistent(tmp_path / "cache") == sorted(wanted)
    finally:
        if server is not None:
            server.stop()
        for name, proc in cluster.procs.items():  # the whole store goes away at once (and a
            if proc.poll() is None:  # SIGTERMed filer takes 10 s to quit)
                cluster.kill(name)
        cluster.stop()

    forbid_network(monkeypatch)
    monkeypatch.setenv("RAYFORM_OFFLINE", "1")
    offline = make_client(server.url, tmp_path / "cache")
    seg = offline.slices.get(DEMO_SLICE).segments[2]
    assert (
        hash_file(offline.ensure_blob(DEMO_SLICE, seg.streams["cam0/rgb"].blob))
        == seg.streams["cam0/rgb"].blob.hash
    )
    assert offline.pull(DEMO_SLICE, streams=["joints/position"]).fetched_blobs == 0


def test_a_task_filter_publishes_from_blobs_in_s3(
    seaweed: SeaweedS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server reads a task filter's text blobs from the object store (checked against
    their hashes) and publishes what the client's view keeps."""
    import numpy as np
    from support import WRITE_TOKEN

    from rayform_server.builder import SliceBuilder, TableData, TextData
    from rayform_server.store import Store

    for key, value in seaweed.env.items():
        monkeypatch.setenv(key, value)
    root = tmp_path / "lang-root"
    store = Store(root, configure_root(root, f"s3://{BUCKET}/lang", seaweed.endpoint))
    b = SliceBuilder(store)
    for e, task in enumerate(["wipe", "stack", "wipe"]):
        t = 10**12 * (e + 1) + np.arange(10, dtype=np.int64) * 100_000_000
        streams = [
            TableData("joints/position", t, np.zeros((10, 2), np.float32), 10),
            TextData("task", t[:1], [{"content": task}], 10),
        ]
        b.add_segment(f"seg_{e:08x}", site="lab", streams=streams)
    b.commit("slc_7e470a03")
    assert not list(root.rglob("blobs/*/*"))  # every blob is in the object store
    server = ServerProcess(root, "--s3-endpoint", seaweed.endpoint, "--write-token", WRITE_TOKEN)
    try:
        client = rayform.Client(endpoint=server.url, token=WRITE_TOKEN, cache_dir=tmp_path / "c")
        slice_ = client.slices.get("slc_7e470a03")
        child = client.slices.create(slice_.select(where="task == 'wipe'"))
        assert [str(i) for i in child.segments.ids().to_pylist()] == [
            "seg_00000000",
            "seg_00000002",
        ]
    finally:
        server.stop()
