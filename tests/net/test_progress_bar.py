"""The pull's progress bar shows on every terminal, also one that reports no size."""

from __future__ import annotations

import os
import pty
import select
import sys

import pytest

from rayform._net._progress import byte_bar


def _drain(fd: int) -> bytes:
    out = b""
    while select.select([fd], [], [], 0.2)[0]:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    return out


@pytest.mark.parametrize("sized", [False, True])
def test_the_bar_draws_on_a_terminal_sized_or_not(
    sized: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    master, slave = pty.openpty()
    if sized:
        import fcntl
        import struct
        import termios

        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    with os.fdopen(slave, "w") as terminal:
        # A pseudo-terminal nobody sized reports 0 x 0, as some container and CI runners'
        # do: tqdm drew the bar 0 columns wide there (a blank line) before.
        assert os.get_terminal_size(slave).columns == (100 if sized else 0)
        monkeypatch.setattr(sys, "stderr", terminal)
        bar = byte_bar(4 << 20, "pull slc_test")
        bar.update(4 << 20)
        bar.close()
        terminal.flush()
        shown = _drain(master).decode()
    os.close(master)
    assert "pull slc_test: 100%" in shown and "4.0 MiB/4.0 MiB" in shown, repr(shown)
    longest = max(len(line) for line in shown.replace("\r", "\n").split("\n"))
    assert longest <= (100 if sized else 80), repr(shown)
