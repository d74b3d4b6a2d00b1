"""Helpers shared by the fault-matrix tests (tests/test_faults_*.py, test_bad_input, ...)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from conftest import DEMO_SLICE, TOKEN

from rayform._hashing import hash_file

__all__ = ["assert_cache_consistent", "pull_cmd", "sub_env"]


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


def pull_cmd(url: str, cache: Path, *extra: str, slice_id: str = DEMO_SLICE) -> list[str]:
    """``rayform pull`` as a subprocess command line."""
    return [sys.executable, "-m", "rayform", "pull", slice_id, "--endpoint", url,
            "--cache-dir", str(cache), "--quiet", *extra]


def sub_env(**extra: str) -> dict[str, str]:
    """The environment for a subprocess client: no RAYFORM_* from outside, our token."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAYFORM_")}
    return {**env, "RAYFORM_TOKEN": TOKEN, **extra}
