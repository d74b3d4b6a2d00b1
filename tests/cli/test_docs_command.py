"""`rayform docs`: the guides a message or `--help` names, readable with no checkout.

Run as real subprocesses: from this checkout, and from the built wheel installed into a
prefix of its own, where the pages come from the wheel's data files and not from docs/.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _rayform(
    *args: str, pythonpath: str | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    env.pop("PAGER", None)
    env.pop("MANPAGER", None)
    done = subprocess.run(
        [sys.executable, "-m", "rayform", "docs", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=cwd,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done


def test_docs_lists_the_pages_with_their_titles() -> None:
    listed = _rayform()
    assert listed.returncode == 0, listed.stderr
    rows = dict(line.split(None, 1) for line in listed.stdout.splitlines())
    assert set(rows) == {p.stem for p in (REPO / "docs").glob("*.md")}
    assert rows["cli"] == "The rayform command line" and rows["cache"] == "The Rayform cache"
    assert "rayform docs NAME" in listed.stderr


def test_a_page_prints_whole_in_a_pipe_by_any_of_its_spellings() -> None:
    text = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    for name in ("cli", "cli.md", "docs/cli.md"):
        shown = _rayform(name)
        assert shown.returncode == 0 and shown.stdout.rstrip("\n") == text.rstrip("\n")
    assert _rayform("curation.md#statistics-of-a-selection", "--path").stdout.strip() == str(
        REPO / "docs" / "curation.md"
    )


def test_an_unknown_page_is_a_usage_error_with_the_close_names() -> None:
    typo = _rayform("cahce")
    assert typo.returncode == 1 and "did you mean cache?" in typo.stderr and not typo.stdout
    far = _rayform("no-such-guide")
    assert far.returncode == 1 and "pages: api, architecture," in far.stderr


def test_every_page_the_sdk_names_is_a_page() -> None:
    # Messages, --help and docstrings say "docs/NAME.md": each must be `rayform docs NAME`.
    named = set()
    for path in (REPO / "sdk" / "rayform").rglob("*.py"):
        named |= set(re.findall(r"docs/([a-z0-9-]+)\.md", path.read_text(encoding="utf-8")))
    listed = {line.split(None, 1)[0] for line in _rayform().stdout.splitlines()}
    assert {"cli", "cache", "curation", "view"} <= named and named <= listed, named - listed
    top = subprocess.run(
        [sys.executable, "-m", "rayform", "--help"], capture_output=True, text=True, timeout=60
    )
    assert "`rayform docs cli`" in top.stdout and "docs: docs/cli.md" not in top.stdout


@pytest.mark.slow
def test_the_installed_wheel_reads_its_own_pages(tmp_path: Path) -> None:
    wheels, prefix, elsewhere = tmp_path / "wheels", tmp_path / "prefix", tmp_path / "elsewhere"
    elsewhere.mkdir()
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    build = [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(REPO)]
    subprocess.run(build, check=True, capture_output=True, timeout=300, cwd=tmp_path)
    (wheel,) = wheels.glob("rayform-*.whl")
    # --ignore-installed: without it pip would first uninstall this environment's rayform.
    install = [*pip, "install", "--no-deps", "--no-index", "--ignore-installed", "--prefix"]
    install += [str(prefix), str(wheel)]
    subprocess.run(install, check=True, capture_output=True, timeout=300)
    (site,) = prefix.glob("lib/python*/site-packages")
    # The installed package first on the path; the checkout's dependencies after it.
    path = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    found = _rayform("cli", "--path", pythonpath=path, cwd=elsewhere)
    assert found.returncode == 0, found.stderr
    page = Path(found.stdout.strip())
    assert page == (prefix / "share" / "doc" / "rayform" / "cli.md").resolve()
    assert page.read_bytes() == (REPO / "docs" / "cli.md").read_bytes()
    imported = subprocess.run(
        [sys.executable, "-c", "import rayform; print(rayform.__file__)"],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=elsewhere,
        check=True,
    )
    assert imported.stdout.startswith(str(site))  # the wheel's code answered, not the checkout's
    shown = _rayform("cache", pythonpath=path, cwd=elsewhere)
    assert shown.stdout.startswith("# The Rayform cache")
