"""The digest of epoch 2 of the determinism tests' dataset (``support.determinism``), read by a
``DataLoader`` with two workers in this fresh process: the same bits as in the test's own process.

Usage: ``python loader_digest.py TEST_DIR STORE_ROOT SLICE``: ``TEST_DIR``'s parent holds the
``support`` package, ``STORE_ROOT`` the server store of ``SLICE``.
"""

import sys
from pathlib import Path

from torch.utils.data import DataLoader

from rayform.slice import Slice
from rayform.torch import EpisodeSampler
from rayform_server.store import Store


def main(test_dir: str, store_root: str, slice_id: str) -> None:
    sys.path[:0] = [str(Path(test_dir).parent)]  # the ``support`` package
    from support import determinism as t
    from support.fakes import StoreBlobs

    store = Store(store_root)
    ref = store.get_slice(slice_id)
    assert ref is not None, slice_id
    sl = Slice(
        slice_id,
        ref["manifest"],
        store.load_manifest(ref["manifest"]),
        StoreBlobs(store, Path(".")),
    )
    ds = t.make(sl)
    ds.set_epoch(2)
    print(
        t.digest_epoch(DataLoader(ds, batch_size=8, sampler=EpisodeSampler(ds), num_workers=2))[0]
    )


if __name__ == "__main__":
    main(*sys.argv[1:4])
