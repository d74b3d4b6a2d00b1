"""The packet decoder's checks kept on disk: a later process with the same decoders skips the
check (and torchcodec's import), never under other decoders, never with a wrong verdict."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from rayform.torch._decoding import _checks
from rayform.torch._decoding._intra import open_intra
from rayform.torch._decoding._video import DecoderCache, forget_intra_checks, intra_checks
from rayform_server._video import encode_video

#: A fresh process: reads frames 0, 5 and 9 of the video through a DecoderCache left to choose
#: its backend, saves them, and says which backend served them and whether torchcodec loaded.
CHILD = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import numpy as np, torch
    from rayform.torch._decoding._video import DecoderCache, intra_checks
    path, out = Path(sys.argv[1]), Path(sys.argv[2])
    cache = DecoderCache(4)
    frames = cache.get_frames("v", path, np.array([0, 5, 9]), 30.0)
    torch.save(frames, out)
    print(json.dumps({"backends": cache.open_backends(), "torchcodec": "torchcodec" in sys.modules,
                      "checks": list(intra_checks().values())}))
    """
)


@pytest.fixture
def video(tmp_path: Path) -> Path:
    y, x = np.mgrid[0:48, 0:64]
    frames = [
        np.stack([(x * 3 + 7 * i) % 256, (y * 5 + 3 * i) % 256, (x + y + 11 * i) % 256], -1)
        for i in range(10)
    ]
    path = tmp_path / "v.mp4"
    encode_video([f.astype(np.uint8) for f in frames], path, rate_hz=30, gop=1)
    return path


def run_child(video: Path, tmp_path: Path, **env: str) -> tuple[dict, torch.Tensor]:
    out = tmp_path / f"frames-{len(list(tmp_path.glob('frames-*')))}.pt"
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(video), str(out)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1]), torch.load(out)


def test_a_later_process_reuses_the_verdict_without_loading_torchcodec(
    video: Path, tmp_path: Path
) -> None:
    first, frames = run_child(video, tmp_path)
    assert first == {"backends": ["intra"], "torchcodec": True, "checks": [True]}
    kept = json.loads(_checks.path().read_text())
    assert kept["format"] == 1 and [list(v.values()) for v in kept["fingerprints"].values()] == [
        [True]
    ]
    second, again = run_child(video, tmp_path)
    assert second == {"backends": ["intra"], "torchcodec": False, "checks": [True]}
    assert torch.equal(again, frames)
    # The reference: the general backend's bits, which the kept verdict stands for.
    reference = DecoderCache(4, backend="torchcodec").get_frames(
        "v", video, np.array([0, 5, 9]), 30.0
    )
    assert torch.equal(frames, reference)


def test_other_decoders_are_checked_again(video: Path, tmp_path: Path) -> None:
    run_child(video, tmp_path)
    # Another FFmpeg on the loader's path: another fingerprint, so the check runs again.
    other = tmp_path / "ffmpeg-libs"
    other.mkdir()
    (other / "libavcodec.so.99").write_bytes(b"not really")
    moved, _ = run_child(video, tmp_path, LD_LIBRARY_PATH=str(other))
    assert moved["torchcodec"] is True and moved["checks"] == [True]
    assert len(json.loads(_checks.path().read_text())["fingerprints"]) == 2
    # The same directory with that library changed: a third fingerprint.
    (other / "libavcodec.so.99").write_bytes(b"not really, but longer")
    changed, _ = run_child(video, tmp_path, LD_LIBRARY_PATH=str(other))
    assert changed["torchcodec"] is True
    assert len(json.loads(_checks.path().read_text())["fingerprints"]) == 3


def test_a_failed_check_is_kept_and_forgotten_on_demand(video: Path, tmp_path: Path) -> None:
    forget_intra_checks()
    try:
        _checks.store(_signature(video), False)  # as a process whose check failed leaves it
        failed, frames = run_child(video, tmp_path)
        assert failed == {"backends": ["torchcodec"], "torchcodec": True, "checks": [False]}
        reference = DecoderCache(4, backend="torchcodec").get_frames(
            "v", video, np.array([0, 5, 9]), 30.0
        )
        assert torch.equal(frames, reference)
        forget_intra_checks()  # drops this process's and the file's verdicts
        assert _checks.load(_signature(video)) is None and intra_checks() == {}
        fresh, _ = run_child(video, tmp_path)
        assert fresh["backends"] == ["intra"] and fresh["checks"] == [True]
    finally:
        forget_intra_checks()


@pytest.mark.parametrize("state", ["a file", "garbage"])
def test_an_unusable_file_costs_only_the_check(video: Path, tmp_path: Path, state: str) -> None:
    target = _checks.path()
    if state == "a file":  # where the directory should be: nothing can be written
        target.parent.parent.mkdir(parents=True, exist_ok=True)
        target.parent.write_text("in the way")
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("{not json")
    for i in range(2):
        got, _ = run_child(video, tmp_path)
        assert got["backends"] == ["intra"] and got["checks"] == [True]
        # Garbage is replaced by the first process's verdict; a blocked directory stays so.
        assert got["torchcodec"] is (i == 0 or state == "a file")


def _signature(video: Path) -> tuple:
    decoder = open_intra(video)
    assert decoder is not None
    return decoder.signature
