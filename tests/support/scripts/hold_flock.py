"""Hold an exclusive ``flock`` on a file, print ``held``, then sleep until killed.

Usage: ``python hold_flock.py LOCK``.
"""

import fcntl
import sys
import time


def main(lock: str) -> None:
    f = open(lock, "w")  # noqa: SIM115 - held open until the process is killed
    fcntl.flock(f, fcntl.LOCK_EX)
    print("held", flush=True)
    time.sleep(60)


if __name__ == "__main__":
    main(sys.argv[1])
