"""docs/notebook.ipynb runs in a real Jupyter kernel (nbclient + ipykernel) on the demo slice:
every step displays its repr and none fails; docs/notebook.md is its executed form."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support import TOKEN, ServerProcess
from support.notebook import NOTEBOOK, PAGE, execute, fingerprint, outputs, page_fingerprint, render

REPO = Path(__file__).resolve().parents[2]


def _kernel_env(server: ServerProcess, cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAYFORM_")}
    # This checkout first: the kernel must import the rayform under test, not an installed one.
    path = [str(REPO / "sdk"), str(REPO / "server_stub"), env.get("PYTHONPATH", "")]
    env.update(
        PYTHONPATH=os.pathsep.join(p for p in path if p),
        RAYFORM_ENDPOINT=server.url,
        RAYFORM_TOKEN=TOKEN,
        RAYFORM_CACHE_DIR=str(cache),
        PYTHONWARNINGS="error::DeprecationWarning:rayform",
    )
    return env


def _text(out: dict) -> str:
    if out["output_type"] == "stream":
        return out["text"]
    return out["data"].get("text/plain", "")


def _html(out: dict) -> str:
    return out.get("data", {}).get("text/html", "")


def test_the_notebook_runs_and_shows_every_repr(demo_server: ServerProcess, tmp_path: Path) -> None:
    nb = execute(NOTEBOOK, tmp_path, _kernel_env(demo_server, tmp_path / "cache"))
    cells = outputs(nb)
    assert not [o for cell in cells for o in cell if o["output_type"] == "error"]
    shown = [[o for o in cell if o["output_type"] == "execute_result"] for cell in cells]
    sl, segs, arrow, seg, report, printed, ds, sample, stats = cells
    # The slice, its segments (a paged table, not `<... at 0x...>`), one segment, as HTML.
    assert "Slice slc_7c1e04aa" in _html(shown[0][0]) and "<Slice slc_7c1e04aa" in _text(
        shown[0][0]
    )
    assert (
        "4 segments" in _html(shown[1][0])
        and "<th" in _html(shown[1][0])
        and " at 0x" not in _text(shown[1][0])
    )
    assert "'duration_s'" in _text(arrow[0]) and "'nbytes'" in _text(arrow[0])
    assert "UTC" in _html(seg[0]) and "KiB" in _html(seg[0]) and "Stream(" not in _text(seg[0])
    # The pull: a bar in binary units (text: no ipywidgets here), its report as HTML and as a line.
    bar = "".join(o["text"] for o in report if o["output_type"] == "stream")
    assert "MiB" in bar or "KiB" in bar
    assert "MB/s" not in bar and "verified in cache" in _html(shown[4][0])
    assert "blobs" in _text(printed[0]) and "verified in cache; fetched" in _text(printed[0])
    # The dataset: every argument and the URI; a sample; stats as arrays.
    assert (
        "horizon=16" in _text(ds[0])
        and "frame='ros'" in _text(ds[0])
        and "uri=rayform+http://" in _text(ds[0])
    )
    assert "EpisodeDataset on slc_7c1e04aa" in _html(ds[0])
    assert "'cam0/rgb': (3, " in _text(sample[0]) and "'action': (16, 14)" in _text(sample[0])
    assert "array(" in _text(stats[0]) and "dtype=float32" in _text(stats[0])
    page = render(nb)
    if os.environ.get("RAYFORM_UPDATE_DOCS") == "1":
        PAGE.write_text(page, encoding="utf-8")
    # The docs page is this notebook's executed form (regenerate it when the notebook changes).
    committed = PAGE.read_text(encoding="utf-8")
    assert page_fingerprint(committed) == fingerprint(nb), (
        "docs/notebook.md is stale: run RAYFORM_UPDATE_DOCS=1 pytest tests/docs/test_notebook.py"
    )
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell["source"].strip() in committed
    assert committed.count('<div class="nb-output">') == page.count('<div class="nb-output">')


@pytest.mark.parametrize("name", ["nbclient", "ipykernel"])
def test_the_dev_extra_installs_the_notebook_runner(name: str) -> None:
    text = (REPO / "pyproject.toml").read_text()
    dev = text.split("\ndev = [", 1)[1].split("]\n", 1)[0]
    assert f'"{name}' in dev
