"""Take a lock with filelock, as the cache would with it (``mode=0o664``, the team's bits);
prints ``held <mode>`` or ``refused <error>``.

Usage: ``python team_filelock.py LOCK``.
"""

import os
import sys

import filelock


def main(path: str) -> None:
    lock = filelock.FileLock(path, mode=0o664)
    try:
        with lock.acquire(blocking=False):
            print(f"held {os.stat(path).st_mode & 0o777:o}")
    except OSError as exc:
        print(f"refused {type(exc).__name__}")


if __name__ == "__main__":
    main(sys.argv[1])
