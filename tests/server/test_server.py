"""The server stub over real HTTP on loopback: protocol, ranges, access control, hostile input."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from support import DEMO_SLICE, TOKEN, ServerProcess
from support.manifests import served_manifest

from rayform.format import hash_bytes
from rayform.manifest import Manifest
from rayform_server.builder import SliceBuilder, TableData
from rayform_server.demo import build_demo
from rayform_server.store import Store

OTHER_SLICE = "slc_99990000"
ALICE, BOB = "alice-token-5b8e1f0c2d", "bob-token-9a7c3e6f41"


def _auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def raw_request(
    port: int,
    target: str,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    body: bytes = b"",
) -> tuple[int, dict[str, str], bytes]:
    """Send exactly ``target`` (no client-side normalisation); returns status, headers, body."""
    lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, payload = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    hdrs = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    return int(status_line.split()[1]), hdrs, payload


@pytest.fixture(scope="module")
def manifest(demo_server: ServerProcess) -> Manifest:
    r = httpx.get(f"{demo_server.url}/v1/slices/{DEMO_SLICE}/manifest", headers=_auth())
    assert r.status_code == 200
    return served_manifest(demo_server.url, DEMO_SLICE, _auth(), r.content)


@pytest.fixture(scope="module")
def video_blob(manifest: Manifest) -> str:
    return manifest.segments[0].streams["cam0/rgb"].blob.hash


@pytest.fixture(scope="module")
def scoped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, str]]:
    """A root with two slices, served with a tokens file: alice sees slc_7c1e*, bob slc_9999*."""
    root = tmp_path_factory.mktemp("scoped-root")
    build_demo(root, slice_id=DEMO_SLICE, small=True)
    b = SliceBuilder(Store(root), description="bob's slice")
    t = np.arange(50, dtype=np.int64) * 5_000_000
    b.add_segment(
        "seg_0000beef",
        site="lab-x",
        streams=[
            TableData(
                "joints/position",
                t,
                np.random.default_rng(1).normal(size=(50, 14)),
                200.0,
                units="rad",
            )
        ],
    )
    other = b.commit(OTHER_SLICE)
    tokens = tmp_path_factory.mktemp("tokens") / "tokens.json"
    tokens.write_text(
        json.dumps(
            {
                "tokens": [
                    {"name": "alice", "token": ALICE, "slices": ["slc_7c1e*"]},
                    {"name": "bob", "token": BOB, "slices": ["slc_9999*"]},
                ]
            }
        )
    )
    server = ServerProcess(root, "--tokens-file", str(tokens), token=None)
    yield server, next(iter(other.blobs()))
    server.stop()


def test_health_needs_no_token(demo_server: ServerProcess) -> None:
    r = httpx.get(demo_server.url + "/v1/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"


def test_slice_resolves_to_manifest_whose_hashes_match(demo_server: ServerProcess) -> None:
    base = f"{demo_server.url}/v1/slices/{DEMO_SLICE}"
    ref = httpx.get(base, headers=_auth()).json()
    assert ref["id"] == DEMO_SLICE
    r = httpx.get(base + "/manifest", headers=_auth())
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    assert hash_bytes(r.content) == ref["manifest"] and len(r.content) == ref["manifest_size"]
    assert r.headers["etag"] == f'"{ref["manifest"]}"'
    m = served_manifest(demo_server.url, DEMO_SLICE, _auth(), r.content, ref["manifest"])
    listed = httpx.get(demo_server.url + "/v1/slices", headers=_auth()).json()["slices"]
    assert {s["id"]: s["manifest"] for s in listed}[DEMO_SLICE] == ref["manifest"]
    with httpx.Client(headers=_auth()) as client:
        for blob in (
            m.segments[0].streams["cam0/rgb"].blobs() + m.segments[-1].streams["ee/pose"].blobs()
        ):
            br = client.get(f"{base}/blobs/{blob.hash}")
            assert br.status_code == 200
            assert hash_bytes(br.content) == blob.hash and len(br.content) == blob.size
            assert br.headers["etag"] == f'"{blob.hash}"' and br.headers["accept-ranges"] == "bytes"
            assert int(br.headers["content-length"]) == blob.size


def test_range_requests_return_exact_bytes(
    demo_server: ServerProcess, manifest: Manifest, video_blob: str
) -> None:
    url = f"{demo_server.url}/v1/slices/{DEMO_SLICE}/blobs/{video_blob}"
    full = httpx.get(url, headers=_auth()).content
    size = len(full)
    cases = {
        "bytes=10-99": (10, 99),
        "bytes=100-": (100, size - 1),
        "bytes=-50": (size - 50, size - 1),
        "bytes=0-0": (0, 0),
        f"bytes=5-{size + 1000}": (5, size - 1),  # past the end: clamped
        f"bytes=-{size * 2}": (0, size - 1),  # suffix longer than the blob: all of it
    }
    for spec, (a, b) in cases.items():
        r = httpx.get(url, headers={**_auth(), "Range": spec})
        assert r.status_code == 206, spec
        assert r.content == full[a : b + 1], spec
        assert r.headers["content-range"] == f"bytes {a}-{b}/{size}", spec
        assert int(r.headers["content-length"]) == b - a + 1
        assert r.headers["etag"] == f'"{video_blob}"'


def test_unsatisfiable_and_bad_ranges(demo_server: ServerProcess, video_blob: str) -> None:
    url = f"{demo_server.url}/v1/slices/{DEMO_SLICE}/blobs/{video_blob}"
    size = len(httpx.get(url, headers=_auth()).content)
    for spec in (
        f"bytes={size}-",
        f"bytes={size + 5}-{size + 9}",
        "bytes=-0",
        f"bytes={size}-,-0,{size + 1}-{size + 2}",  # several ranges, none selecting a byte
    ):
        r = httpx.get(url, headers={**_auth(), "Range": spec})
        assert r.status_code == 416, spec
        assert r.headers["content-range"] == f"bytes */{size}"
        assert r.json()["error"] == "range_not_satisfiable"
    for spec in ("bytes=9-3", "items=0-5", "bytes=-", "bytes=a-b"):
        r = httpx.get(url, headers={**_auth(), "Range": spec})
        assert r.status_code == 400 and r.json()["error"] == "invalid_argument", spec


def test_several_ranges_are_one_multipart_answer_of_the_bytes_they_select(
    demo_server: ServerProcess, video_blob: str
) -> None:
    # RFC 9110 14.6: several ranges get one 206 of media type multipart/byteranges, a part per
    # range; a range that selects no byte is left out.
    url = f"{demo_server.url}/v1/slices/{DEMO_SLICE}/blobs/{video_blob}"
    full = httpx.get(url, headers=_auth()).content
    size = len(full)
    cases = {
        "bytes=0-1,5-9": [(0, 1), (5, 9)],
        f"bytes=-4, 10-19, {size}-": [(10, 19), (size - 4, size - 1)],
    }
    for spec, parts in cases.items():
        r = httpx.get(url, headers={**_auth(), "Range": spec})
        assert r.status_code == 206, spec
        media, _, boundary = r.headers["content-type"].partition("; boundary=")
        assert media == "multipart/byteranges" and boundary, spec
        assert int(r.headers["content-length"]) == len(r.content)
        assert r.content.endswith(f"--{boundary}--".encode())
        got = []
        for part in r.content.split(f"--{boundary}\r\n".encode())[1:]:
            head, _, body = part.partition(b"\r\n\r\n")
            (content_range,) = [h for h in head.split(b"\r\n") if h.startswith(b"Content-Range")]
            first, last = map(int, content_range.split(b" ")[-1].split(b"/")[0].split(b"-"))
            assert content_range.endswith(f"/{size}".encode())
            assert (
                body.removesuffix(f"--{boundary}--".encode()).removesuffix(b"\r\n")
                == (full[first : last + 1])
            )
            got.append((first, last))
        assert got == parts, spec
    # Ranges that overlap into one are one range.
    r = httpx.get(url, headers={**_auth(), "Range": "bytes=0-9,5-14"})
    assert r.status_code == 206 and r.headers["content-range"] == f"bytes 0-14/{size}"
    assert r.content == full[:15]


def test_ranges_of_thousands_of_digits_are_answered_not_a_500(
    demo_server: ServerProcess, video_blob: str
) -> None:
    # int() refuses more than 4,300 digits: such a position was a 500 (and its message
    # quoted the whole header).
    url = f"{demo_server.url}/v1/slices/{DEMO_SLICE}/blobs/{video_blob}"
    full = httpx.get(url, headers=_auth()).content
    size, huge = len(full), "9" * 5000
    for spec in (f"bytes={huge}-", f"bytes={huge}-{huge}"):
        r = httpx.get(url, headers={**_auth(), "Range": spec})
        assert r.status_code == 416 and r.json()["error"] == "range_not_satisfiable"
        assert r.headers["content-range"] == f"bytes */{size}" and len(r.content) < 1000
    cases = {
        f"bytes=0-{huge}": (0, size - 1),  # past the end: clamped
        f"bytes=-{huge}": (0, size - 1),  # a suffix longer than the blob: all of it
        f"bytes={'0' * 5000}5-{'0' * 5000}9": (5, 9),  # leading zeros are still small numbers
    }
    for spec, (a, b) in cases.items():
        r = httpx.get(url, headers={**_auth(), "Range": spec})
        assert r.status_code == 206 and r.content == full[a : b + 1], spec[:20]
        assert r.headers["content-range"] == f"bytes {a}-{b}/{size}"
    r = httpx.get(url, headers={**_auth(), "Range": f"bytes={huge}-1"})
    assert r.status_code == 400 and r.json()["error"] == "invalid_argument"


def test_head_and_conditional_requests(demo_server: ServerProcess, video_blob: str) -> None:
    url = f"{demo_server.url}/v1/slices/{DEMO_SLICE}/blobs/{video_blob}"
    full = httpx.get(url, headers=_auth()).content
    h = httpx.head(url, headers=_auth())
    assert h.status_code == 200 and h.content == b""
    assert int(h.headers["content-length"]) == len(full) and h.headers["etag"] == f'"{video_blob}"'
    h = httpx.head(url, headers={**_auth(), "Range": "bytes=0-9"})
    assert h.status_code == 206 and h.headers["content-length"] == "10"
    r = httpx.get(url, headers={**_auth(), "If-None-Match": f'"{video_blob}"'})
    assert r.status_code == 304 and r.content == b""
    # If-Range with another ETag: the range is ignored and the whole blob comes back.
    r = httpx.get(url, headers={**_auth(), "Range": "bytes=0-9", "If-Range": '"' + "0" * 64 + '"'})
    assert r.status_code == 200 and r.content == full
    # If-Range is one strong validator (RFC 9110 13.1.5): this blob's ETag keeps the range;
    # a weak tag, "*" or a list is no match, and the Range is not even read.
    r = httpx.get(url, headers={**_auth(), "Range": "bytes=0-9", "If-Range": f'"{video_blob}"'})
    assert r.status_code == 206 and r.content == full[:10]
    for other in (f'W/"{video_blob}"', "*", f'"{video_blob}", "{"0" * 64}"'):
        r = httpx.get(url, headers={**_auth(), "Range": "bytes=0-x", "If-Range": other})
        assert r.status_code == 200 and r.content == full, other
    # If-None-Match is answered before Range (RFC 9110 13.2.2).
    r = httpx.get(
        url, headers={**_auth(), "Range": "bytes=0-9", "If-None-Match": f'"{video_blob}"'}
    )
    assert r.status_code == 304 and r.content == b""


def test_missing_or_wrong_token_is_401(demo_server: ServerProcess, video_blob: str) -> None:
    for path in (
        "/v1/slices",
        f"/v1/slices/{DEMO_SLICE}",
        f"/v1/slices/{DEMO_SLICE}/manifest",
        f"/v1/slices/{DEMO_SLICE}/blobs/{video_blob}",
    ):
        for headers in (
            {},
            _auth("wrong-token-000000"),
            {"Authorization": TOKEN},
            {"Authorization": f"Basic {TOKEN}"},
            _auth(TOKEN + "x"),
        ):
            r = httpx.get(demo_server.url + path, headers=headers)
            assert r.status_code == 401, (path, headers)
            assert r.json()["error"] == "unauthorized"
            assert r.headers["www-authenticate"] == 'Bearer realm="rayform"'
            assert TOKEN not in r.text


def test_scoped_token_cannot_see_other_slices_or_their_blobs(
    scoped: tuple[ServerProcess, str],
) -> None:
    server, bobs_blob = scoped
    url = server.url + "/v1/slices"
    assert [s["id"] for s in httpx.get(url, headers=_auth(ALICE)).json()["slices"]] == [DEMO_SLICE]
    assert [s["id"] for s in httpx.get(url, headers=_auth(BOB)).json()["slices"]] == [OTHER_SLICE]
    assert (
        httpx.get(f"{url}/{OTHER_SLICE}/blobs/{bobs_blob}", headers=_auth(BOB)).status_code == 200
    )
    unknown = httpx.get(f"{url}/slc_0123456789", headers=_auth(ALICE))
    for path in (
        f"/{OTHER_SLICE}",
        f"/{OTHER_SLICE}/manifest",
        f"/{OTHER_SLICE}/blobs/{bobs_blob}",
    ):
        r = httpx.get(url + path, headers=_auth(ALICE))
        assert r.status_code == 404 and r.json()["error"] == "not_found", path
    r = httpx.get(f"{url}/{OTHER_SLICE}", headers=_auth(ALICE))
    # Out of scope reads exactly like unknown (same status and code, no hint the slice exists).
    assert r.status_code == unknown.status_code and r.json()["error"] == unknown.json()["error"]
    # A valid hash from bob's slice, asked through alice's own slice: not in that slice.
    r = httpx.get(f"{url}/{DEMO_SLICE}/blobs/{bobs_blob}", headers=_auth(ALICE))
    assert r.status_code == 404
    assert httpx.get(f"{url}/{DEMO_SLICE}", headers=_auth(BOB)).status_code == 404


def test_blob_not_in_slice_is_404(
    demo_server: ServerProcess, scoped: tuple[ServerProcess, str], video_blob: str
) -> None:
    server, _ = scoped
    assert (server.root / "blobs" / video_blob[:2] / video_blob).is_file()  # on disk, other slice
    r = httpx.get(f"{server.url}/v1/slices/{OTHER_SLICE}/blobs/{video_blob}", headers=_auth(BOB))
    assert r.status_code == 404 and r.json()["error"] == "not_found"
    assert "not part of slice" in r.json()["message"]
    ref = httpx.get(f"{demo_server.url}/v1/slices/{DEMO_SLICE}", headers=_auth()).json()
    for digest in (hash_bytes(b"not a blob of this slice"), ref["manifest"]):
        r = httpx.get(f"{demo_server.url}/v1/slices/{DEMO_SLICE}/blobs/{digest}", headers=_auth())
        assert r.status_code == 404 and r.json()["error"] == "not_found"
    r = httpx.get(f"{demo_server.url}/v1/slices/slc_0123456789abcdef/manifest", headers=_auth())
    assert r.status_code == 404


def test_blob_urls_checks_every_hash_and_a_local_store_gives_none(
    demo_server: ServerProcess, scoped: tuple[ServerProcess, str], manifest: Manifest
) -> None:
    """``POST /v1/slices/{id}/blob-urls``: the checks of a blob request, for each hash named."""
    url = f"{demo_server.url}/v1/slices/{DEMO_SLICE}/blob-urls"
    hashes = sorted(manifest.blobs())[:5]
    r = httpx.post(url, json={"hashes": hashes}, headers=_auth())
    # Blobs on the server's own disk: it sends the bytes itself, so no URLs (clients stop asking).
    assert r.status_code == 200 and r.json() == {"urls": {}, "expires_in": 0}
    assert httpx.post(url, json={"hashes": hashes}).status_code == 401
    for body in (
        {"hashes": []},
        {"hashes": "abc"},
        {"hashes": [hashes[0].upper()]},
        {"hashes": [1]},
        {"hashes": hashes * 300},  # 1,500: over the 1,024 of one request
        [hashes[0]],
    ):
        r = httpx.post(url, json=body, headers=_auth())
        assert r.status_code == 400 and r.json()["error"] == "invalid_argument", body
    r = httpx.post(url, content=b"{not json", headers=_auth())
    assert r.status_code == 400
    stranger = hash_bytes(b"not a blob of this slice")
    r = httpx.post(url, json={"hashes": [*hashes, stranger]}, headers=_auth())
    assert r.status_code == 404 and "not part of slice" in r.json()["message"]
    server, bobs_blob = scoped  # a token out of the slice's scope learns nothing
    r = httpx.post(
        f"{server.url}/v1/slices/{OTHER_SLICE}/blob-urls",
        json={"hashes": [bobs_blob]},
        headers=_auth(ALICE),
    )
    assert r.status_code == 404 and r.json()["error"] == "not_found"
    status, _, body = raw_request(
        demo_server.port,
        f"/v1/slices/{DEMO_SLICE}/blob-urls",
        "POST",
        headers={**_auth(), "Transfer-Encoding": "chunked"},
    )
    assert status == 411


def test_malformed_ids_and_hashes_are_400(demo_server: ServerProcess, video_blob: str) -> None:
    bad_slices = ["slc_7C1E04AA", "slc_123", "7c1e04aa", "slc_7c1e04ag", "slc_" + "a" * 65]
    for sid in bad_slices:
        for suffix in ("", "/manifest", f"/blobs/{video_blob}"):
            r = httpx.get(f"{demo_server.url}/v1/slices/{sid}{suffix}", headers=_auth())
            assert r.status_code == 400 and r.json()["error"] == "invalid_argument", (sid, suffix)
    for digest in ("abc", video_blob.upper(), video_blob[:-1], video_blob + "0", "z" * 64):
        r = httpx.get(f"{demo_server.url}/v1/slices/{DEMO_SLICE}/blobs/{digest}", headers=_auth())
        assert r.status_code == 400 and r.json()["error"] == "invalid_argument", digest


def test_traversal_attempts_never_serve_files(demo_server: ServerProcess) -> None:
    slice_json = (demo_server.root / "slices" / f"{DEMO_SLICE}.json").read_bytes()
    targets = [
        "/v1/slices/..%2F..%2Fetc/manifest",
        f"/v1/slices/{DEMO_SLICE}/blobs/..%2f..%2fslices%2f{DEMO_SLICE}.json",
        f"/v1/slices/{DEMO_SLICE}/blobs/../../slices/{DEMO_SLICE}.json",
        "/v1/slices/../../../../etc/passwd",
        f"/v1/slices/{DEMO_SLICE}/blobs/%2e%2e%2f%2e%2e%2fslices%2f{DEMO_SLICE}.json",
        "/v1/slices/slc_7c1e04aa%00/manifest",
        "/v1/slices/..%5c..%5cetc%5cpasswd/manifest",
        f"/v1/slices/{DEMO_SLICE}/./manifest",
        "/v1/slices/%2e%2e/manifest",
    ]
    for target in targets:
        status, _, body = raw_request(demo_server.port, target, headers=_auth())
        assert 400 <= status < 500, target
        assert slice_json not in body and b"root:" not in body, target
        assert json.loads(body)["error"] in ("invalid_argument", "not_found"), target


def test_method_body_and_target_limits(demo_server: ServerProcess) -> None:
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        r = httpx.request(method, f"{demo_server.url}/v1/slices/{DEMO_SLICE}", headers=_auth())
        assert r.status_code == 405 and r.json()["error"] == "method_not_allowed", method
        assert set(r.headers["allow"].replace(" ", "").split(",")) == {"GET", "HEAD"}
    status, _, body = raw_request(
        demo_server.port,
        f"/v1/slices/{DEMO_SLICE}",
        headers={**_auth(), "Content-Length": "11"},
        body=b"hello world",
    )
    assert status == 413 and json.loads(body)["error"] == "payload_too_large"
    r = httpx.get(f"{demo_server.url}/v1/slices/{'a' * 3000}", headers=_auth())
    assert r.status_code == 414 and r.json()["error"] == "uri_too_long"
    r = httpx.get(f"{demo_server.url}/v1/health?{'q' * 2100}")
    assert r.status_code == 414
    r = httpx.get(f"{demo_server.url}/v1/nothing-here", headers=_auth())
    assert r.status_code == 404 and r.json()["error"] == "not_found"


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rayform_server", "serve", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_serve_refuses_unsafe_or_bad_configuration(demo_root: Path, tmp_path: Path) -> None:
    r = _serve("--root", str(demo_root), "--port", "0")
    assert r.returncode == 2 and "--allow-anonymous" in r.stderr
    bad = tmp_path / "tokens.json"
    for doc, needle in (
        ({"tokens": [{"name": "a", "token": "short", "slices": ["*"]}]}, "at least 8"),
        ({"tokens": [{"name": "a", "token": ALICE, "slices": []}]}, "slices"),
        (
            {
                "tokens": [
                    {"name": "a", "token": ALICE, "slices": ["*"]},
                    {"name": "b", "token": ALICE, "slices": ["*"]},
                ]
            },
            "twice",
        ),
        ({"people": []}, "tokens"),
    ):
        bad.write_text(json.dumps(doc))
        r = _serve("--root", str(demo_root), "--port", "0", "--tokens-file", str(bad))
        assert r.returncode == 2 and needle in r.stderr, (doc, r.stderr)
        assert ALICE not in r.stderr
    r = _serve("--root", str(tmp_path / "nope"), "--port", "0", "--token", TOKEN)
    assert r.returncode == 2 and "rayform-server demo" in r.stderr


def test_serve_port_zero_prints_port_and_never_logs_tokens(demo_root: Path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rayform_server",
            "serve",
            "--root",
            str(demo_root),
            "--port",
            "0",
            "--token",
            TOKEN,
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stderr.readline()
        assert line.startswith("serving ") and "http://127.0.0.1:" in line
        port = int(line.rsplit(":", 1)[1])
        assert port > 0
        assert httpx.get(f"http://127.0.0.1:{port}/v1/slices", headers=_auth()).status_code == 200
        assert (
            httpx.get(f"http://127.0.0.1:{port}/v1/slices", headers=_auth("x" * 20)).status_code
            == 401
        )
    finally:
        proc.terminate()
        _, rest = proc.communicate(timeout=15)
    assert TOKEN not in line + rest and "x" * 20 not in rest


def _nodelay_of_accepted(sock: socket.socket) -> list[int]:
    """TCP_NODELAY of the connection that asyncio (as uvicorn runs it) accepts on ``sock``."""
    import asyncio

    seen: list[int] = []

    async def main() -> None:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted = writer.get_extra_info("socket")
            seen.append(accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(handle, sock=sock)
        reader, writer = await asyncio.open_connection(*sock.getsockname()[:2])
        await reader.read()  # the server closes it once it has looked
        writer.close()
        server.close()
        await server.wait_closed()

    asyncio.run(main())
    return seen


def test_every_connection_to_the_server_sends_small_answers_at_once() -> None:
    """`serve` listens on a socket that asyncio turns TCP_NODELAY on for: without it, a small
    answer on a kept-alive connection waits for the client's delayed ACK (about 40 ms each on
    Linux, most of a cold epoch's time for a slice of many small blobs)."""
    from rayform_server.cli import listen_socket

    assert _nodelay_of_accepted(listen_socket("127.0.0.1", 0)) == [1]
    # The control: a socket whose protocol is left at 0 gets no TCP_NODELAY from asyncio.
    plain = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    plain.bind(("127.0.0.1", 0))
    assert _nodelay_of_accepted(plain) == [0]
