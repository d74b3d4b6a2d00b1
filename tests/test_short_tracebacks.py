"""Argument errors end at the public call that got the bad argument (short notebook tracebacks)."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support import DEMO_SLICE
from support.fakes import StoreBlobs

import rayform
from rayform.errors import InvalidArgumentError, NotFoundError
from rayform.slice import Slice
from rayform.torch import EpisodeDataset
from rayform_server.store import Store


@pytest.fixture
def demo(demo_root: Path, tmp_path: Path) -> Slice:
    store = Store(demo_root)
    manifest = store.load_manifest(store.get_slice(DEMO_SLICE)["manifest"])
    return Slice(DEMO_SLICE, manifest.hash, manifest, StoreBlobs(store, tmp_path))


def _shown_frames(exc: BaseException) -> list[tuple[str, str]]:
    """``(file name, function)`` of the Rayform frames IPython and pytest show (they leave out
    frames that set ``__tracebackhide__``)."""
    out = []
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if "/rayform/" in code.co_filename and not tb.tb_frame.f_locals.get("__tracebackhide__"):
            out.append((Path(code.co_filename).name, code.co_name))
        tb = tb.tb_next
    return out


CASES: dict[str, tuple[Callable[[Slice, Path], Any], type[Exception], str, tuple[str, str]]] = {
    "fps": (
        lambda s, _: EpisodeDataset(s, obs=["joints/position"], action=None, fps=-1),
        InvalidArgumentError,
        "fps=-1",
        ("dataset.py", "__init__"),
    ),
    "unknown stream": (
        lambda s, _: EpisodeDataset(s, obs=["nope/x"], action=None, fps=10),
        NotFoundError,
        "available streams",
        ("dataset.py", "__init__"),
    ),
    "unknown segment": (
        lambda s, _: EpisodeDataset(
            s, obs=["joints/position"], action=None, fps=10, segments=["seg_00000000"]
        ),
        NotFoundError,
        "seg_00000000",
        ("dataset.py", "__init__"),
    ),
    "empty selection": (
        lambda s, _: s.select(sites=["nowhere"]),
        InvalidArgumentError,
        "keeps no segment",
        ("slice.py", "select"),
    ),
    "bad slice ID": (
        lambda _, tmp: rayform.Client("http://127.0.0.1:9", "t", cache_dir=tmp).slices.get(
            "bad id"
        ),
        InvalidArgumentError,
        "malformed slice ID",
        ("client.py", "get"),
    ),
    "bad endpoint": (
        lambda _, tmp: rayform.Client(endpoint="ftp://x", token="t", cache_dir=tmp),
        InvalidArgumentError,
        "ftp://x",
        ("client.py", "__init__"),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_argument_error_ends_at_the_public_call(case: str, demo: Slice, tmp_path: Path) -> None:
    call, error, message, public = CASES[case]
    with pytest.raises(error, match=message) as info:
        call(demo, tmp_path / "cache")
    assert _shown_frames(info.value) == [public]
    # Plain Python shows the public frame last, with the line that made the check.
    last = traceback.extract_tb(info.value.__traceback__)[-1]
    assert (Path(last.filename).name, last.name) == public


def test_other_errors_keep_their_whole_traceback(demo: Slice) -> None:
    def bad_transform(sample: dict[str, Any]) -> dict[str, Any]:
        raise ValueError("from the user's own code")

    with pytest.raises(TypeError) as info:
        EpisodeDataset(demo, obs=["joints/position"], action=None, fps=10, no_such_argument=1)  # type: ignore[call-arg]
    assert "no_such_argument" in str(info.value)
    ds = EpisodeDataset(demo, obs=["joints/position"], action=None, fps=10, transform=bad_transform)
    with pytest.raises(ValueError, match="user's own code") as raised:
        ds[0]
    assert traceback.extract_tb(raised.value.__traceback__)[-1].name == "bad_transform"
