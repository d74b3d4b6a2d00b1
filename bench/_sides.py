"""This checkout against another: the command line and the environment of each side's process."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["run_side", "side_env", "sides_parser"]


def sides_parser(doc: str, segments: int, rounds: int, work: str) -> argparse.ArgumentParser:
    """``--baseline`` (required), ``--segments``, ``--rounds`` and ``--work`` with these
    defaults; the description is the first line of ``doc``."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--baseline", required=True, help="another checkout's sdk/ directory")
    ap.add_argument("--segments", type=int, default=segments)
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--work", type=Path, default=Path(work))
    return ap


def side_env(sdk: str | None) -> dict[str, str]:
    """The environment of one side's process: ``sdk`` first on ``PYTHONPATH`` (``None``: this
    checkout's), one OpenMP thread."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if sdk is not None:
        env["PYTHONPATH"] = os.pathsep.join([sdk, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def run_side(code: str, args: list[str], sdk: str | None, timeout: float) -> dict[str, Any]:
    """Run ``code`` with ``args`` in a fresh interpreter on ``sdk``'s side (:func:`side_env`);
    the JSON object its last line of output prints (its stderr's end in the error otherwise)."""
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=side_env(sdk),
        timeout=timeout,
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))
