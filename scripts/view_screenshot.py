"""The screenshot of docs/view.md: ``rayform view`` of the full demo slice in headless Chromium.

Usage (the demo root as ``rayform-server demo --root DIR`` builds it)::

    python scripts/view_screenshot.py --root DIR [--out docs/view.png]

Opens episode 4 at 3.2 s by deep link, marks three episodes, filters one site, waits until
every camera holds its frame, and fails if the page logged a JavaScript error.
"""

from __future__ import annotations

import argparse
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from playwright.sync_api import sync_playwright

import rayform
import rayform.view

SLICE = "slc_7c1e04aa"


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--root", type=Path, required=True, help="data root of `rayform-server demo`")
    p.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parents[1] / "docs" / "view.png"
    )
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_hex(16)
    stub = subprocess.Popen(
        [
            "rayform-server",
            "serve",
            "--root",
            str(args.root),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--token",
            token,
        ],
        stderr=subprocess.DEVNULL,
    )
    cache = Path(tempfile.mkdtemp(prefix="view-shot-"))
    errors: list[str] = []
    try:
        endpoint = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                if httpx.get(endpoint + "/v1/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.05)
        slice_ = rayform.Client(endpoint, token, cache_dir=cache).slices.get(SLICE)
        server = rayform.view.serve(slice_)
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=shutil.which("chromium"))
                page = browser.new_page(viewport={"width": 1440, "height": 860})
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                page.goto(server.url + f"&segment={slice_.segments[3].id}&t=3.2")
                page.wait_for_selector("#episode[data-ready='1']")
                for row in (3, 5):
                    page.locator("#episodes .mark").nth(row).check()
                page.get_by_label("lab-zurich", exact=True).check()
                page.wait_for_function(
                    "() => document.querySelectorAll('#episodes tbody tr').length == 10"
                )
                page.locator("#episodes .mark").nth(0).check()
                page.wait_for_function(
                    "() => document.querySelector('#sel-count').textContent.includes('3 marked')"
                )
                page.wait_for_function(
                    "() => [...document.querySelectorAll('#cameras video')]"
                    ".every(v => v.readyState >= 2 && !v.seeking)"
                )
                page.screenshot(path=str(args.out))
                browser.close()
        finally:
            server.stop()
    finally:
        stub.terminate()
        stub.wait()
        shutil.rmtree(cache, ignore_errors=True)
    if errors:
        sys.exit(f"the page logged JavaScript errors: {errors}")
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
