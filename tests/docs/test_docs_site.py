"""`make docs`: the site builds with --strict from docs/ and the docstrings, and its API page
really renders (a screenshot in headless Chromium)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(config),
            "--site-dir",
            str(site),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=config.parent,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    result = _build(REPO / "mkdocs.yml", out)
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def test_api_page_is_generated_from_the_docstrings(site: Path) -> None:
    from rayform.client import Client
    from rayform.errors import OfflineError
    from rayform.torch import EpisodeDataset

    html = (site / "api.html").read_text()
    for obj in (EpisodeDataset, Client, OfflineError):
        first_line = (obj.__doc__ or "").strip().splitlines()[0]
        assert first_line.replace("``", "") in html.replace("<code>", "").replace("</code>", ""), (
            first_line
        )
    for page in ("index", "recipes", "dataset", "cli", "contributing-docs"):
        assert (site / f"{page}.html").is_file(), page


def test_a_broken_link_or_a_stale_name_fails_the_build(tmp_path: Path) -> None:
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    docs = tmp_path / "docs"
    docs.mkdir()
    config.update(docs_dir="docs", nav=["index.md"])
    config["plugins"][1]["mkdocstrings"]["handlers"]["python"]["paths"] = [str(REPO / "sdk")]
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    (docs / "index.md").write_text("# Home\n\nSee [the cache](cache.md).\n")
    broken = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert broken.returncode != 0 and "cache.md" in broken.stderr
    (docs / "index.md").write_text("# Home\n\n::: rayform.torch.NoSuchDataset\n")
    stale = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert stale.returncode != 0 and "NoSuchDataset" in stale.stderr


def test_api_page_renders_in_headless_chromium(site: Path, tmp_path: Path) -> None:
    import av

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "install Debian's chromium (scripts/setup.sh does, as root)"
    shot = tmp_path / "api.png"
    subprocess.run(
        [
            chromium,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={tmp_path / 'profile'}",
            "--window-size=1280,1600",
            f"--screenshot={shot}",
            (site / "api.html").as_uri(),
        ],
        capture_output=True,
        timeout=120,
        check=True,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    assert shot.stat().st_size > 30_000  # a blank or error page compresses to a few kB
    with av.open(str(shot)) as container:
        rgb = next(container.decode(video=0)).to_ndarray(format="rgb24")
    assert rgb.shape == (1600, 1280, 3)
    colours = np.unique(rgb.reshape(-1, 3), axis=0)
    assert len(colours) > 100  # text, anti-aliasing, the theme's header: a real render
    header = rgb[:40, :, :].reshape(-1, 3).astype(int)
    indigo = (header[:, 2] > header[:, 0] + 60).mean()  # Material's indigo header bar
    assert indigo > 0.5
    ink = (rgb.sum(axis=2) < 600).mean()  # non-white pixels: text and code
    assert 0.02 < ink < 0.9
