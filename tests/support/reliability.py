"""Helpers shared by the fault-matrix tests (tests/test_faults_*.py, test_bad_input, ...)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rayform.format import hash_file
from support import DEMO_SLICE, TOKEN

__all__ = ["assert_cache_consistent", "kill_when_writing", "pull_cmd", "sub_env"]


def assert_cache_consistent(cache: Path) -> list[str]:
    """Every blob and manifest under ``cache`` hashes to its name and is read-only.

    Returns:
        The sorted hashes of the cached blobs.
    """
    names = []
    for kind in ("blobs", "manifests"):
        for p in (cache / kind).rglob("*"):
            if p.is_file():
                assert hash_file(p) == p.name, f"corrupt object under a content name: {p}"
                assert p.stat().st_mode & 0o222 == 0, f"cached object is writable: {p}"
                if kind == "blobs":
                    names.append(p.name)
    return sorted(names)


def kill_when_writing(
    proc: subprocess.Popen, cache: Path, min_bytes: int = 2048, timeout_s: float = 30
) -> dict[str, int]:
    """SIGKILL ``proc`` (a puller) once a ``tmp/*.part`` file in ``cache`` exceeds ``min_bytes``.

    Returns:
        ``{hash: bytes}`` of the partial files it left (a puller killed right after creating
        one leaves it empty).
    """
    tmp = cache / "tmp"
    try:
        parts: list[Path] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not parts:
            if tmp.is_dir():
                parts = [p for p in tmp.glob("*.part") if p.stat().st_size > min_bytes]
            time.sleep(0.02)
        assert parts, "the puller never started writing"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    return {p.name.split(".")[0]: p.stat().st_size for p in tmp.glob("*.part")}


def pull_cmd(
    url: str, cache: Path, *extra: str, slice_id: str = DEMO_SLICE, quiet: bool = True
) -> list[str]:
    """``rayform pull`` as a subprocess command line (``quiet``: without the progress bar)."""
    return [
        sys.executable,
        "-m",
        "rayform",
        "pull",
        slice_id,
        "--endpoint",
        url,
        "--cache-dir",
        str(cache),
        *(["--quiet"] if quiet else []),
        *extra,
    ]


def sub_env(*, drop: tuple[str, ...] = ("RAYFORM_",), **extra: str) -> dict[str, str]:
    """The environment for a subprocess client: none of the variables starting with ``drop``
    from outside (``RAYFORM_*``; add ``"AWS_"`` to keep the object store's keys away from a
    client), our token, then ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    return {**env, "RAYFORM_TOKEN": TOKEN, **extra}
