"""One of the crowd on one cache: an ``EpisodeDataset`` read by a ``DataLoader`` with two
workers; prints how many samples it saw.

Usage: ``python crowd_loader.py SLICE ACTION OBS...`` (endpoint, token and cache from the
environment).
"""

import sys


def main(slice_id: str, action: str, obs: list[str]) -> None:
    from torch.utils.data import DataLoader

    import rayform
    from rayform.torch import EpisodeDataset

    ds = EpisodeDataset(
        rayform.Client().slices.get(slice_id), obs=obs, action=action, fps=15, horizon=8
    )
    print(sum(len(b["t_ns"]) for b in DataLoader(ds, batch_size=8, num_workers=2)))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
