"""Fetch one fixed blob into a team cache (claims beat every 0.1 s and go stale after 1 s);
prints the bytes this process downloaded (``0``: another process's download was waited for).

Usage: ``python team_claim.py CACHE``.
"""

import sys

from rayform.cache import Cache
from rayform.format import hash_bytes
from rayform.manifest import BlobRef

DATA = bytes(range(256)) * 64
REF = BlobRef(hash_bytes(DATA), len(DATA))


def main(root: str) -> None:
    cache = Cache(root, claim_heartbeat_s=0.1, claim_stale_s=1.0, stall_s=60.0)
    _, fetched = cache.fetch_blob(REF, lambda part: part.write(DATA[part.offset :]))
    print(fetched)


if __name__ == "__main__":
    main(sys.argv[1])
