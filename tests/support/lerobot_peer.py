"""Running LeRobot itself (the peer venv ``make peer`` builds) from a test.

``peer_python()`` builds ``.peer-venv`` once (``scripts/peer_lerobot.sh``, about a minute) and
returns its python; ``run_peer(script, *args)`` runs a script there, offline, and returns its
last stdout line parsed as JSON. The scripts LeRobot runs live in ``support/scripts/lerobot_*.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

__all__ = ["REPO", "lerobot_033", "peer061_python", "peer_python", "run_peer"]

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"


@cache
def peer_python() -> str:
    """Path of the LeRobot 0.4.4 peer venv's python (built on first use)."""
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "peer_lerobot.sh")],
        check=True,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return proc.stdout.strip().splitlines()[-1]


def peer061_python() -> str | None:
    """A LeRobot 0.6.1 python if one is here, else ``None`` (never built by a test: it needs
    Python 3.12 and a CUDA build of torch, about 5 GB). ``RAYFORM_LEROBOT061_PYTHON``, else
    ``.peer-venv-061`` (``scripts/peer_lerobot061.sh``)."""
    path = os.environ.get("RAYFORM_LEROBOT061_PYTHON") or str(
        REPO / ".peer-venv-061" / "bin" / "python"
    )
    return path if Path(path).is_file() else None


@cache
def lerobot_033() -> str:
    """A directory that, first on ``PYTHONPATH`` of the peer venv, makes it LeRobot 0.3.3 (the
    last release that reads v2.1 natively) with the ``datasets`` 3.6 it pins: both installed
    there without dependencies (a few seconds; the peer's torch and the rest are shared)."""
    target = Path(peer_python()).parents[1] / "lerobot-0.3.3"
    if not (target / "lerobot" / "__init__.py").is_file() or not (target / "datasets").is_dir():
        subprocess.run(
            [
                peer_python(),
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "--upgrade",
                "--target",
                str(target),
                "lerobot==0.3.3",
                "datasets==3.6.0",
            ],
            check=True,
            capture_output=True,
            timeout=600,
        )
    return str(target)


def run_peer(
    script: str,
    *args: str,
    timeout: float = 600,
    rayform: bool = False,
    pythonpath: str | None = None,
    python: str | None = None,
) -> Any:
    """Run ``support/scripts/SCRIPT`` in the peer venv; its last stdout line, as JSON.

    Args:
        script: file name under ``support/scripts``.
        args: its arguments.
        timeout: seconds.
        rayform: put this checkout's SDK on the peer's path (``PYTHONPATH=sdk``).
        pythonpath: a directory first on the peer's path (e.g. :func:`lerobot_033`).
        python: another LeRobot environment's python (e.g. :func:`peer061_python`).
    """
    env = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    env["HOME"] = os.environ.get("HOME", "/tmp")
    # LeRobot's datasets keeps an Arrow cache under HF_HOME: keep it out of the user's home,
    # next to the test's own cache directory (conftest's isolated_env sets one per test).
    cache = os.environ.get("RAYFORM_CACHE_DIR")
    env["HF_HOME"] = str(Path(cache).parent / "hf-home" if cache else Path(tempfile.mkdtemp()))
    if rayform:
        env["PYTHONPATH"] = str(REPO / "sdk")
        for name in ("RAYFORM_ENDPOINT", "RAYFORM_TOKEN", "RAYFORM_CACHE_DIR"):
            if name in os.environ:
                env[name] = os.environ[name]
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [pythonpath, env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [python or peer_python(), str(SCRIPTS / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
