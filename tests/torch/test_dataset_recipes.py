"""The DDP, Resume and Mixtures recipes of docs/dataset.md, run as written against the demo slice."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import torchrun

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ("## Distributed training (DDP)", "## Resume", "## Mixtures")
NOT_RUN = "<!-- not-run:"


def blocks() -> list[tuple[str, str, bool]]:
    """``(section, code, marked not-run)`` of every python block in SECTIONS."""
    text = (ROOT / "docs" / "dataset.md").read_text()
    out = []
    for part in re.split(r"(?m)^(?=## )", text):
        title = part.splitlines()[0] if part else ""
        if title not in SECTIONS:
            continue
        for m in re.finditer(r"(?ms)^(<!-- not-run:[^\n]*\n)?```python\n(.*?)^```", part):
            out.append((title, m.group(2), m.group(1) is not None))
    return out


def env() -> dict[str, str]:
    path = [str(ROOT / "sdk"), str(ROOT / "server_stub")]
    return {**os.environ, "PYTHONPATH": ":".join(path), "OMP_NUM_THREADS": "1"}


RUNNABLE = [(t, c) for t, c, skip in blocks() if not skip]


def test_the_sections_have_their_recipes() -> None:
    titles = [t for t, _, _ in blocks()]
    assert titles.count("## Resume") == 3 and titles.count("## Mixtures") == 1
    assert titles.count("## Distributed training (DDP)") == 1


@pytest.mark.parametrize(
    ("title", "code"), RUNNABLE, ids=[f"{t[3:]}-{i}" for i, (t, _) in enumerate(RUNNABLE)]
)
def test_recipe_runs(client_env, tmp_path: Path, title: str, code: str) -> None:
    script = tmp_path / "recipe.py"
    script.write_text(code)
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]


@pytest.mark.slow
def test_torchrun_recipe_stops_and_resumes_on_more_ranks(client_env, tmp_path: Path) -> None:
    (code,) = [c for t, c, skip in blocks() if skip and "torchrun" in c]
    (tmp_path / "train_ddp.py").write_text(code)

    torchrun(2, "train_ddp.py", cwd=tmp_path, env=env(), timeout=300)
    state = json.loads((tmp_path / "ckpt.json").read_text())
    assert state["epoch"] == 0 and state["history"] == [[2, 24]]
    torchrun(3, "train_ddp.py", "ckpt.json", cwd=tmp_path, env=env(), timeout=300)
