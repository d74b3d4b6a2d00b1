"""As user ``nobody``: try to open each file for writing in every mode; prints how many
attempts succeeded (``0``: the mode bits refuse them all).

Usage: ``python -I -S write_attempt.py FILE...`` (as root, which it gives up first).
"""

import os
import sys


def main(paths: list[str]) -> None:
    os.setgid(65534)
    os.setuid(65534)
    bad = []
    for p in paths:
        with open(p, "rb") as f:
            f.read(1)  # readable, so refusals below are the mode bits
        for mode in ("r+b", "ab", "wb"):
            try:
                open(p, mode).close()
                bad.append((p, mode))
            except PermissionError:
                pass
    print(len(bad))


if __name__ == "__main__":
    main(sys.argv[1:])
