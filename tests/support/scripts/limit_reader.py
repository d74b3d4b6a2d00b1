"""One training reader on a bounded cache: prints a digest of one epoch's samples, and on
stderr how many blobs the cache limit evicted.

Usage: ``python limit_reader.py ENDPOINT CACHE_DIR LIMIT SLICE ACTION OBS...``, where
``LIMIT`` is a number of bytes or ``none``.
"""

import hashlib
import sys

from torch.utils.data import DataLoader

import rayform
from rayform.torch import EpisodeDataset


def main(
    endpoint: str, cache_dir: str, limit: str, slice_id: str, action: str, obs: list[str]
) -> None:
    client = rayform.Client(
        endpoint=endpoint, cache_dir=cache_dir, cache_limit=int(limit) if limit != "none" else None
    )
    ds = EpisodeDataset(client.slices.get(slice_id), obs=obs, action=action, fps=15, horizon=4)
    h = hashlib.blake2b()
    for _epoch in range(1):
        for batch in DataLoader(ds, batch_size=8):
            for key in [*obs, "action", "t_ns"]:
                h.update(batch[key].numpy().tobytes())
    print(h.hexdigest())
    from rayform._net._fetchlog import fetch_log

    print("evicted", fetch_log().total().evicted_blobs, file=sys.stderr)


if __name__ == "__main__":
    a = sys.argv
    main(a[1], a[2], a[3], a[4], a[5], a[6:])
