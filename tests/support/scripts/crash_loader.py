"""A shuffled ``DataLoader`` with two workers over the whole slice; prints how many samples it
saw, or exits 3 with the loader's error on stderr (a worker killed while it fetched).

Usage: ``python crash_loader.py SLICE ACTION OBS...`` (endpoint, token and cache from the
environment).
"""

import sys

from torch.utils.data import DataLoader

import rayform
from rayform.torch import EpisodeDataset


def main(slice_id: str, action: str, obs: list[str]) -> None:
    slice_ = rayform.Client().slices.get(slice_id)
    ds = EpisodeDataset(slice_, obs=obs, action=action, fps=15, horizon=16)
    loader = DataLoader(ds, batch_size=8, num_workers=2, shuffle=True)
    try:
        n = sum(len(b["t_ns"]) for b in loader)
    except RuntimeError as exc:
        print("loader failed:", exc, file=sys.stderr)
        sys.exit(3)
    print(n)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
