"""Hold a blob's download claim while downloading nothing, print ``held``, then sleep until
killed: a process of this host whose store has stalled.

Usage: ``python hold_claim.py CLAIM HEARTBEAT_S``.
"""

import sys
import time
from pathlib import Path

from rayform.cache._claims import blob_claim


def main(claim: str, heartbeat_s: float) -> None:
    with blob_claim(Path(claim), done=lambda: False, heartbeat_s=heartbeat_s) as held:
        print("held" if held.held else "not-held", flush=True)
        time.sleep(60)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
