"""Train one epoch on a slice with a shuffled sampler and one worker; checks every sample was
seen and prints the count and the statistics' names.

Usage: ``python team_train.py SLICE`` (endpoint, token, cache from the environment).
"""

import sys

from torch.utils.data import DataLoader

import rayform
import rayform.torch


def main(slice_id: str) -> None:
    slice_ = rayform.Client().slices.get(slice_id)
    ds = rayform.torch.EpisodeDataset(
        slice_,
        obs=["cam0/rgb", "joints/position"],
        action="joints/position_delta",
        fps=15,
        horizon=4,
    )
    loader = DataLoader(
        ds, batch_size=16, num_workers=1, sampler=rayform.torch.EpisodeSampler(ds, shuffle=True)
    )
    n = sum(len(b["t_ns"]) for b in loader)
    assert n == len(ds), (n, len(ds))
    print("samples", n, "stats", sorted(ds.stats()))


if __name__ == "__main__":
    main(sys.argv[1])
