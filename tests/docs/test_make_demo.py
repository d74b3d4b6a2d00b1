"""`make demo`'s script (scripts/demo.py) end to end on the small demo, in a real subprocess,
and the next steps it prints: each runs as printed, offline, once the demo's server is gone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import DEMO_SLICE, TOKEN

REPO = Path(__file__).resolve().parents[2]


def _next_commands(out: str) -> list[str]:
    """The commands under the demo's ``next:`` heading (indented by two spaces; their
    explanations by six)."""
    tail = out[out.index("\nnext:\n") :].splitlines()[2:]
    return [line[2:] for line in tail if line.startswith("  ") and not line.startswith("   ")]


@pytest.mark.slow
def test_the_demo_trains_offline_and_its_next_steps_run_as_printed(tmp_path: Path) -> None:
    demo = tmp_path / ".demo"
    # No RAYFORM_* from outside: the demo sets what it needs, and the next steps must need
    # nothing but what they print (an endpoint nobody listens on proves they stay offline).
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAYFORM_")}
    env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run(
        [sys.executable, "scripts/demo.py", "--demo-dir", str(demo), "--small"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert TOKEN not in done.stdout
    assert "epoch 1: 120 samples" in done.stdout  # the small demo: 4 episodes, 120 samples
    assert f'client.slices.get("{DEMO_SLICE}")' in (demo / "train.py").read_text()

    train, show, guides = _next_commands(done.stdout)
    assert train.startswith("RAYFORM_OFFLINE=1 RAYFORM_CACHE_DIR=") and "train.py" in train
    assert "source .venv/bin/activate" in done.stdout  # how to get `rayform` on the PATH
    env["RAYFORM_ENDPOINT"] = "http://127.0.0.1:9"
    steps = (
        (train, "epoch 1: 120 samples"),
        (show, f"<Slice {DEMO_SLICE}"),
        (guides, "rayform.torch.EpisodeDataset"),  # the list of guides
    )
    for command, expected in steps:
        ran = subprocess.run(
            ["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
        )
        assert ran.returncode == 0 and expected in ran.stdout, (command, ran.stdout, ran.stderr)
