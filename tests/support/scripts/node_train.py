"""One node's training job on a shared, bounded cache (``RAYFORM_CACHE_LIMIT`` from the
environment): epochs over the demo slice with real DataLoader workers, shuffled by episode.

Usage: ``python node_train.py ENDPOINT SLICE EPOCHS WORKERS SEED``. Prints one line per epoch:
a digest of the epoch's samples that does not depend on their order (the sorted per-sample
digests), so jobs with different seeds can be compared with one reference. Warnings of the
``rayform`` loggers go to stderr (a blob fetched again says so there).
"""

import hashlib
import logging
import sys

from torch.utils.data import DataLoader

import rayform
from rayform.torch import EpisodeDataset, EpisodeSampler

OBS = ["cam0/rgb", "wrist/rgb", "joints/position"]
ACTION = "joints/position_delta"


def main(endpoint: str, slice_id: str, epochs: int, workers: int, seed: int) -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    client = rayform.Client(endpoint=endpoint)
    ds = EpisodeDataset(
        client.slices.get(slice_id), obs=OBS, action=ACTION, fps=15, horizon=4, seed=seed
    )
    sampler = EpisodeSampler(ds)
    loader = DataLoader(
        ds, batch_size=8, sampler=sampler, num_workers=workers, persistent_workers=workers > 0
    )
    for epoch in range(epochs):
        ds.set_epoch(epoch)  # the sampler reads it when iterated
        digests = []
        for batch in loader:
            for i in range(len(batch["t_ns"])):
                h = hashlib.blake2b(digest_size=16)
                for key in [*OBS, "action", "t_ns"]:
                    h.update(batch[key][i].numpy().tobytes())
                h.update(batch["meta"]["segment"][i].encode())
                digests.append(h.digest())
        print(hashlib.blake2b(b"".join(sorted(digests))).hexdigest(), flush=True)


if __name__ == "__main__":
    a = sys.argv
    main(a[1], a[2], int(a[3]), int(a[4]), int(a[5]))
