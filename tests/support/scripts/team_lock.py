"""Take a cache lock in shared mode (``0o664``) within a stall bound; prints ``held`` or
``not-held``.

Usage: ``python team_lock.py LOCK STALL_S``.
"""

import sys
from pathlib import Path

from rayform.cache._locks import bounded_lock


def main(lock: str, stall_s: float) -> None:
    with bounded_lock(
        Path(lock), done=lambda: False, progress=lambda: 0, stall_s=stall_s, mode=0o664
    ) as held:
        print("held" if held else "not-held")


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
