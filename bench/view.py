"""Benchmark: ``rayform view`` on a fleet-sized slice and the first video frame in Chromium.

1. **Fleet list.** Builds ``rayform-server demo --small --episodes N --share-blobs`` (or takes
   ``--root``), serves it on loopback, starts ``rayform view`` on it with an empty cache (so
   its start includes fetching the manifest pages), then times the JSON answers the page asks
   for (first page, a site filter, an ID prefix, a time window, a page in the middle, the
   selection), the same list in headless Chromium (page load to first rows; a site click to
   the filtered rows), and the view process's peak RSS (``VmHWM``).
2. **First frame.** On the small demo slice: from a click on an episode to every camera's
   ``<video>`` holding its current frame (``readyState >= 2``, not seeking), uncached (blobs
   fetched on demand from the stub) and cached (a pulled cache, ``--offline``).

Usage::

    python bench/view.py [--segments 1000000] [--root DIR]

Writes ``bench/results/view-<N>.json``. Needs Debian's ``chromium`` and ``playwright``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import Page, sync_playwright

HERE = Path(__file__).resolve().parent
FLEET = "slc_f1ee7000"
DEMO = "slc_7c1e04aa"
SETTLED = (
    "() => { const v = [...document.querySelectorAll('#cameras video')]; "
    "return v.length > 0 && v.every(x => x.readyState >= 2 && !x.seeking); }"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Stub:
    """``rayform-server serve`` on a loopback port."""

    def __init__(self, root: Path, token: str) -> None:
        self.url = f"http://127.0.0.1:{_free_port()}"
        self.proc = subprocess.Popen(
            [
                "rayform-server",
                "serve",
                "--root",
                str(root),
                "--host",
                "127.0.0.1",
                "--port",
                self.url.rsplit(":", 1)[1],
                "--token",
                token,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(600):
            try:
                if httpx.get(self.url + "/v1/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.05)
        raise RuntimeError("the server stub did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()


class _View:
    """``rayform view SLICE`` in a subprocess; ``.url`` once it printed it."""

    def __init__(self, slice_id: str, env: dict[str, str], *args: str) -> None:
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            ["rayform", "view", slice_id, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        self.start_s = time.perf_counter() - t0
        if not self.url.startswith("http"):
            raise RuntimeError("rayform view did not start")

    def peak_rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _fleet(root: Path, segments: int, chromium: str) -> dict[str, Any]:
    token = secrets.token_hex(16)
    stub = _Stub(root, token)
    cache = Path(tempfile.mkdtemp(prefix="view-bench-cache-"))
    env = {
        **os.environ,
        "RAYFORM_ENDPOINT": stub.url,
        "RAYFORM_TOKEN": token,
        "RAYFORM_CACHE_DIR": str(cache),
    }
    out: dict[str, Any] = {"segments": segments}
    view = _View(FLEET, env)
    try:
        out["view_start_s"] = view.start_s
        base, key = view.url.split("/?key=")
        with httpx.Client(base_url=base, params={"key": key}, timeout=120) as h:

            def get(path: str, **params: Any) -> Any:
                r = h.get(path, params={"key": key, **params})
                r.raise_for_status()
                return r.json()

            # The first two are the page's first requests: timed cold, as a user meets them.
            out["slice_info_s"], info = _timed(lambda: get("/api/slice"))
            out["first_page_s"], first = _timed(lambda: get("/api/episodes", limit=50))
            site = info["sites"][0]
            mid = first["episodes"][0]["start_ns"]
            steps = {
                "site_filter": lambda: get("/api/episodes", limit=50, sites=site),
                "site_filter_page_2": lambda: get("/api/episodes", limit=50, offset=50, sites=site),
                "id_prefix": lambda: get("/api/episodes", limit=50, prefix="seg_00ab"),
                "time_window": lambda: get(
                    "/api/episodes", limit=50, start_ns=mid, end_ns=int(mid) + 3_600_000_000_000
                ),
                "page_in_the_middle": lambda: get("/api/episodes", limit=50, offset=segments // 2),
                "selection_site": lambda: get("/api/selection", sites=site),
            }
            for name, fn in steps.items():
                out[name + "_s"], doc = _timed(fn)
                if "total" in doc:
                    out[name + "_total"] = doc["total"]
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium)
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            out["browser_first_rows_s"], _ = _timed(
                lambda: (page.goto(view.url), page.wait_for_selector("#episodes tbody tr"))
            )
            total = page.locator("#page-info").text_content()

            def click_site() -> None:
                page.get_by_label(site, exact=True).check()
                page.wait_for_function(
                    f"() => document.querySelector('#page-info').textContent != {json.dumps(total)}",
                    timeout=120_000,
                )

            out["browser_site_filter_s"], _ = _timed(click_site)
            out["browser_site_filter_info"] = page.locator("#page-info").text_content()
            browser.close()
        out["view_peak_rss_mib"] = view.peak_rss_mib()
    finally:
        view.stop()
        stub.stop()
        shutil.rmtree(cache, ignore_errors=True)
    return out


def _open_episode(page: Page, row: int) -> float:
    tr = page.locator("#episodes tbody tr").nth(row)
    t0 = time.perf_counter()
    tr.click()
    page.wait_for_function(SETTLED, timeout=60_000, polling="raf")
    return time.perf_counter() - t0


def _first_frame(chromium: str) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="view-bench-demo-"))
    token = secrets.token_hex(16)
    subprocess.run(
        ["rayform-server", "demo", "--root", str(work / "root"), "--small"],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    stub = _Stub(work / "root", token)
    env = {
        **os.environ,
        "RAYFORM_ENDPOINT": stub.url,
        "RAYFORM_TOKEN": token,
        "RAYFORM_CACHE_DIR": str(work / "cache"),
    }
    out: dict[str, Any] = {}
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium)
            for label, args in (("uncached", ()), ("cached", ("--offline",))):
                if label == "cached":
                    subprocess.run(["rayform", "pull", DEMO, "-q"], env=env, check=True)
                view = _View(DEMO, env, *args)
                try:
                    page = browser.new_page()
                    page.goto(view.url)
                    page.wait_for_selector("#episodes tbody tr")
                    out[f"first_frame_{label}_s"] = [_open_episode(page, row) for row in range(4)]
                    page.close()
                finally:
                    view.stop()
            browser.close()
    finally:
        stub.stop()
        shutil.rmtree(work, ignore_errors=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--segments", type=int, default=1_000_000)
    p.add_argument("--root", type=Path, help="a data root that already holds the fleet slice")
    args = p.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("bench/view.py needs Debian's chromium (scripts/setup.sh installs it)")
    root = args.root
    tmp = None
    if root is None:
        tmp = Path(tempfile.mkdtemp(prefix="view-bench-fleet-"))
        root = tmp / "root"
        subprocess.run(
            [
                "rayform-server",
                "demo",
                "--root",
                str(root),
                "--small",
                "--slice",
                FLEET,
                "--episodes",
                str(args.segments),
                "--share-blobs",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    try:
        result = {
            "fleet": _fleet(root, args.segments, chromium),
            "demo": _first_frame(chromium),
            "load_average": os.getloadavg(),
        }
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    (HERE / "results").mkdir(exist_ok=True)
    path = HERE / "results" / f"view-{args.segments}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
