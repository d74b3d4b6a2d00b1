"""One of the crowd on one cache: an ``EpisodeDataset`` read by a ``DataLoader`` with two
workers; prints how many samples it saw.

Usage: ``python crowd_loader.py [--fake-locks] SLICE ACTION OBS...`` (endpoint, token and
cache from the environment). ``--fake-locks``: every cache lock is granted at once (patched
in before the dataset is imported).
"""

import contextlib
import sys
from typing import Any


def fake_locks() -> None:
    import rayform.cache

    def granted(*a: Any, **k: Any) -> contextlib.nullcontext[bool]:
        return contextlib.nullcontext(True)

    setattr(rayform.cache, "bounded_lock", granted)  # noqa: B010 - a stand-in for the lock


def main(slice_id: str, action: str, obs: list[str]) -> None:
    from torch.utils.data import DataLoader

    import rayform
    from rayform.torch import EpisodeDataset

    ds = EpisodeDataset(
        rayform.Client().slices.get(slice_id), obs=obs, action=action, fps=15, horizon=8
    )
    print(sum(len(b["t_ns"]) for b in DataLoader(ds, batch_size=8, num_workers=2)))


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[0] == "--fake-locks":
        fake_locks()
        args.pop(0)
    main(args[0], args[1], args[2:])
