"""`rayform view`'s server over real HTTP on loopback: who may ask, what may be asked, how bytes
come back; the CLI in a real subprocess; the page's assets in the built wheel. The page itself
runs in a real browser in test_view_page.py."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from support import DEMO_SLICE, TOKEN, ServerProcess, make_client

import rayform.cache
import rayform.view
from rayform.format import decode_table
from rayform.view._index import EpisodeFilter, EpisodeIndex

REPO = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    """This process's environment with the checkout first on PYTHONPATH (the code under test)."""
    path = [str(REPO / "sdk"), str(REPO / "server_stub"), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}


@pytest.fixture
def viewer(demo_server: ServerProcess, tmp_path: Path) -> Iterator[rayform.view.ViewServer]:
    """A viewer of the demo slice, online, in this process."""
    slice_ = make_client(demo_server.url, tmp_path / "cache").slices.get(DEMO_SLICE)
    server = rayform.view.serve(slice_)
    yield server
    server.stop()


@contextlib.contextmanager
def _http(server: rayform.view.ViewServer, key: bool = True) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url.split("?")[0], timeout=30) as h:
        if key:  # as a browser does: the first page load trades the URL's key for a cookie
            assert h.get("/", params={"key": server.secret}).status_code == 200
        yield h


def _first_segment(h: httpx.Client) -> str:
    return str(h.get("/api/episodes").json()["episodes"][0]["id"])


def test_every_request_needs_the_key_and_a_host_that_is_not_a_dns_name(
    viewer: rayform.view.ViewServer,
) -> None:
    assert viewer.url.startswith("http://127.0.0.1:") and f"key={viewer.secret}" in viewer.url
    with _http(viewer, key=False) as h:
        for path in (
            "/",
            "/api/slice",
            "/static/app.js",
            "/media?segment=seg_00000000&stream=cam0/rgb",
        ):
            r = h.get(path)
            assert r.status_code == 403 and "key" in r.json()["error"], path
        assert h.get("/api/slice", params={"key": "x" * 32}).status_code == 403
        assert h.get("/api/slice", headers={"Cookie": f"{viewer.cookie}=wrong"}).status_code == 403
        # The first load with the key sets the cookie that every later request carries.
        first = h.get("/", params={"key": viewer.secret})
        assert first.status_code == 200 and "HttpOnly" in first.headers["set-cookie"]
        assert h.get("/api/slice").status_code == 200  # the cookie now
        port = viewer.port
        for host in (f"evil.example:{port}", f"rebind.attacker.test:{port}", "127.0.0.1:1", ""):
            r = h.get("/api/slice", headers={"Host": host})
            assert r.status_code == 403 and "Host" in r.json()["error"], host
        assert h.get("/api/slice", headers={"Host": f"localhost:{port}"}).status_code == 200
    # The secret never leaves in a Referer; the page may load only its own scripts.
    assert first.headers["referrer-policy"] == "no-referrer"
    assert "script-src 'self'" in first.headers["content-security-policy"]


def test_ids_and_paths_are_validated_and_errors_are_json(viewer: rayform.view.ViewServer) -> None:
    with _http(viewer) as h:
        seg = _first_segment(h)
        cases = {
            "/static/../../../etc/passwd": 404,
            "/static/%2e%2e%2fapp.js": 404,
            "/etc/passwd": 404,
            "/api/episode?segment=../../etc/passwd": 400,
            "/api/episode?segment=seg_00000000": 404,
            f"/media?segment={seg}&stream=../../blobs": 400,
            f"/media?segment={seg}&stream=nope/none": 404,
            f"/media?segment={seg}&stream=joints/position": 400,  # a table is not a video
            f"/api/table?segment={seg}&stream=cam0/rgb": 400,
            f"/frame?segment={seg}&stream=cam0/rgb&i=100000": 400,
            f"/frame?segment={seg}&stream=cam0/rgb&i=x": 400,
            "/api/episodes?limit=100000": 400,
            "/api/episodes?sites=a%00b": 400,
            "/api/episodes?prefix=../": 400,
            "/api/selection?segments=../../x": 400,
            "/api/selection?segments=seg_00000000": 400,
        }
        for path, status in cases.items():
            r = h.get(path)
            assert r.status_code == status, (path, r.text)
            assert r.headers["content-type"] == "application/json" and r.json()["error"], path
            assert "Traceback" not in r.text and TOKEN not in r.text
        # The page writes only labels (POST /api/label, test_view_labels.py); http.server's
        # own refusals are JSON too.
        r = h.post("/api/slice", json={})
        assert r.status_code == 404 and "no such write" in r.json()["error"]
        for method in ("PUT", "DELETE"):
            r = h.request(method, "/api/slice")
            assert r.status_code == 501 and r.json()["error"], method


def test_video_is_served_with_ranges_and_frames_as_jpeg(viewer: rayform.view.ViewServer) -> None:
    slice_ = viewer.api.slice
    with _http(viewer) as h:
        seg = _first_segment(h)
        stream = slice_.segment(seg).streams["cam0/rgb"]
        whole = slice_.blob_path(stream.blob).read_bytes()
        params = {"segment": seg, "stream": "cam0/rgb"}
        full = h.get("/media", params=params)
        assert (
            full.status_code == 200
            and full.content == whole
            and full.headers["accept-ranges"] == "bytes"
        )
        part = h.get("/media", params=params, headers={"Range": "bytes=100-299"})
        assert part.status_code == 206 and part.content == whole[100:300]
        assert part.headers["content-range"] == f"bytes 100-299/{len(whole)}"
        tail = h.get("/media", params=params, headers={"Range": "bytes=-50"})
        assert tail.status_code == 206 and tail.content == whole[-50:]
        assert (
            h.get("/media", params=params, headers={"Range": f"bytes={len(whole)}-"}).status_code
            == 416
        )
        # Thousands of digits (int() refuses them: an internal error before).
        huge = "9" * 5000
        for spec, status in ((f"bytes={huge}-", 416), (f"bytes=0-{huge}", 206)):
            r = h.get("/media", params=params, headers={"Range": spec})
            assert r.status_code == status, spec[:20]
        assert r.content == whole
        r = h.get("/media", params=params, headers={"Range": f"bytes=-{huge}"})
        assert r.status_code == 206 and r.content == whole
        r = h.get("/api/slice", headers={"Host": f"127.0.0.1:{huge}"})
        assert r.status_code == 403 and "Host" in r.json()["error"]
        jpeg = h.get("/frame", params={**params, "i": 10})
        assert jpeg.status_code == 200 and jpeg.headers["content-type"] == "image/jpeg"
        assert jpeg.content[:3] == b"\xff\xd8\xff" and len(jpeg.content) > 500
        table = h.get("/api/table", params={"segment": seg, "stream": "joints/position"}).json()
        t_ns, values = decode_table(
            slice_.blob_path(slice_.segment(seg).streams["joints/position"].blob).read_bytes()
        )
        assert len(table["times"]) == len(t_ns) and len(table["values"][0]) == values.shape[1]
        assert abs(table["values"][3][2] - float(values[3, 2])) < 1e-5
        assert table["dims"] == [f"[{d}]" for d in range(values.shape[1])]  # no names in it
        pose = h.get("/api/table", params={"segment": seg, "stream": "ee/pose"}).json()
        assert pose["dims"] == ["x", "y", "z", "qx", "qy", "qz", "qw"]  # its quantity: pose


def test_the_list_is_paged_and_filtered_on_the_server(viewer: rayform.view.ViewServer) -> None:
    segs = list(viewer.api.slice.segments)
    with _http(viewer) as h:
        page = h.get("/api/episodes", params={"offset": 1, "limit": 2}).json()
        assert page["total"] == len(segs) and [e["id"] for e in page["episodes"]] == [
            s.id for s in segs[1:3]
        ]
        site = segs[0].site
        by_site = h.get("/api/episodes", params={"sites": site}).json()
        assert {e["site"] for e in by_site["episodes"]} == {site} and 0 < by_site["total"] < len(
            segs
        )
        late = h.get("/api/episodes", params={"start_ns": segs[-1].start_ns}).json()
        assert [e["id"] for e in late["episodes"]] == [segs[-1].id]
        prefix = segs[2].id[:9]
        assert segs[2].id in [
            e["id"] for e in h.get("/api/episodes", params={"prefix": prefix}).json()["episodes"]
        ]
        sel = h.get("/api/selection", params={"sites": site, "segments": segs[0].id}).json()
        assert sel["count"] == 1 and sel["expression"] == f"segments:{segs[0].id};sites:{site}"


@contextlib.contextmanager
def _view_cli(*args: str) -> Iterator[tuple[subprocess.Popen[str], dict[str, str]]]:
    """``rayform view`` as a real subprocess; the caller reads its first line, then the block
    sends Ctrl-C (SIGINT) and collects ``{"out", "err"}``; killed if anything went wrong."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "rayform", "view", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    result: dict[str, str] = {}
    try:
        assert proc.stdout is not None
        yield proc, result
        proc.send_signal(signal.SIGINT)
        result["out"], result["err"] = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_cli_prints_the_url_serves_and_stops_on_ctrl_c(client_env: ServerProcess) -> None:
    with _view_cli(DEMO_SLICE) as (proc, result):
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        parts = urlsplit(url)
        assert parts.hostname == "127.0.0.1" and parts.port and parts.query.startswith("key=")
        info = httpx.get(url.replace("/?", "/api/slice?"), timeout=30).json()
        assert info["id"] == DEMO_SLICE and info["segments"] == 4
    out, err = result["out"], result["err"]
    assert proc.returncode == 0 and "stopped" in err and "Traceback" not in err
    assert TOKEN not in url + out + err


def test_cli_warns_when_listening_beyond_loopback(client_env: ServerProcess) -> None:
    with _view_cli(DEMO_SLICE, "--host", "0.0.0.0", "--json") as (proc, result):
        assert proc.stdout is not None
        doc = json.loads(proc.stdout.readline())
        url = doc["url"]
        assert doc["slice"] == DEMO_SLICE and doc["episodes"] == 4
    err = result["err"]
    assert url.startswith("http://127.0.0.1:") and "warning: listening on 0.0.0.0" in err
    assert rayform.view.is_loopback("127.0.0.1") and rayform.view.is_loopback("::1")
    assert not rayform.view.is_loopback("0.0.0.0")


def test_cli_that_cannot_listen_says_why_and_ipv6_loopback_works(client_env: ServerProcess) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        for args, why in [(["--port", port], "in use"), (["--port", "99999"], "0-65535")]:
            done = subprocess.run(
                [sys.executable, "-m", "rayform", "view", DEMO_SLICE, *args],
                capture_output=True,
                text=True,
                timeout=60,
                env=_env(),
            )
            assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
            assert done.stderr.startswith("rayform: error: rayform view cannot listen on")
            assert why in done.stderr
    with _view_cli(DEMO_SLICE, "--host", "::1") as (proc, result):
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert urlsplit(url).hostname == "::1"
        assert httpx.get(url.replace("/?", "/api/slice?"), timeout=30).json()["id"] == DEMO_SLICE
    assert "warning" not in result["err"]


def test_cli_offline_without_the_slice_names_the_pull() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rayform", "view", DEMO_SLICE, "--offline"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
    )
    assert done.returncode == 1 and "rayform pull" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
def test_the_wheel_ships_the_page(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        check=True,
        capture_output=True,
        timeout=300,
        cwd=tmp_path,
    )
    (wheel,) = tmp_path.glob("rayform-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for asset in ("index.html", "app.js", "app.css", "favicon.svg"):
        assert f"rayform/view/static/{asset}" in names
    assert "rayform/view/_server.py" in names


def test_show_returns_a_link_jupyter_displays(viewer: rayform.view.ViewServer) -> None:
    view = viewer.api.slice.select(sites=[viewer.api.slice.segments[0].site])
    link = view.show()
    try:
        assert link.url.startswith("http://127.0.0.1:") and "key=" in link.url
        assert f'href="{link.url}"' in link._repr_html_() and view.id in repr(link)
        info = httpx.get(link.url.replace("/?", "/api/slice?"), timeout=30).json()
        assert info["segments"] == len(view) < len(viewer.api.slice)  # the view's episodes only
        # With no filter set, the selection is the view's own.
        sel = httpx.get(link.url.replace("/?", "/api/selection?"), timeout=30).json()
        assert sel["expression"] == f"sites:{view.segments[0].site}" and sel["count"] == len(view)
    finally:
        link.stop()


def test_the_list_filters_agree_on_both_manifest_versions(viewer: rayform.view.ViewServer) -> None:
    segs = viewer.api.slice.segments  # version 2 (the stub writes v2): Arrow columns
    v2, v1 = (
        EpisodeIndex(segs),
        EpisodeIndex(rayform.Segments(tuple(segs))),
    )  # v1: segments made columns
    mid = segs[1].start_ns
    for f in (
        EpisodeFilter(),
        EpisodeFilter(sites=(segs[0].site,)),
        EpisodeFilter(prefix=segs[3].id[:10]),
        EpisodeFilter(start_ns=mid),
        EpisodeFilter(end_ns=mid + 1),
        EpisodeFilter(sites=("nowhere",)),
    ):
        assert v1.positions(f).tolist() == v2.positions(f).tolist(), f
        # The same rule as Slice.select: overlap with [start_ns, end_ns).
        if f.start_ns is not None or f.end_ns is not None:
            view = viewer.api.slice.select(start_ns=f.start_ns, end_ns=f.end_ns)
            assert [segs[i].id for i in v2.positions(f)] == [s.id for s in view.segments]
    assert v1.site_list() == v2.site_list() and v1.time_range() == v2.time_range()


def test_the_token_never_reaches_the_page(viewer: rayform.view.ViewServer) -> None:
    with _http(viewer) as h:
        seg = _first_segment(h)
        answers = [
            h.get(p)
            for p in (
                "/",
                "/static/app.js",
                "/api/slice",
                "/api/episodes",
                f"/api/episode?segment={seg}",
                f"/api/table?segment={seg}&stream=ee/pose",
                f"/api/selection?segments={seg}",
            )
        ]
    for r in answers:
        assert r.status_code == 200 and TOKEN not in r.text and TOKEN not in str(r.headers)


def test_the_notebook_repr_shows_cached_first_frames_and_never_fetches(
    client_env: ServerProcess, isolated_env: Path
) -> None:
    slice_ = rayform.Client().slices.get(DEMO_SLICE)
    cache = rayform.cache.Cache(isolated_env)
    before = cache.du()["blobs"]
    assert "<img" not in slice_._repr_html_() and cache.du()["blobs"] == before  # nothing fetched
    slice_.pull(streams=["cam0/rgb"])
    html = slice_._repr_html_()
    assert html.count('<img src="data:image/jpeg;base64,') == 1 and "cam0/rgb" in html
    slice_.pull(streams=["wrist/rgb"])
    assert slice_._repr_html_().count("<img") == 2


def test_the_viewer_sends_small_answers_at_once(viewer: rayform.view.ViewServer) -> None:
    """Every connection the viewer serves has TCP_NODELAY: its answers are written as headers,
    then body, and without it a small body on a kept-alive connection waits for the browser's
    delayed ACK (about 40 ms a request on Linux)."""
    with _http(viewer) as h:
        assert h.get("/api/episodes").status_code == 200
        conns = list(viewer._conns)  # the kept-alive connection this client still holds
        assert conns, "the viewer tracks the open connection"
        assert all(c.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for c in conns)
