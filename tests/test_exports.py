"""The public API: what `import rayform` exports, and that it stays importable without torch."""

from __future__ import annotations

import subprocess
import sys

import rayform


def test_public_names_resolve():
    for name in rayform.__all__:
        assert getattr(rayform, name) is not None, name
    assert issubclass(rayform.OfflineError, rayform.RayformError)
    assert issubclass(rayform.InvalidArgumentError, ValueError)
    assert rayform.torch.EpisodeDataset is not None
    assert set(rayform.torch.__all__) == {
        "EpisodeDataset", "EpisodeSampler", "MixtureDataset", "collate", "split_episodes"
    }
    for name in rayform.torch.__all__:
        assert getattr(rayform.torch, name) is not None, name


def test_import_rayform_does_not_import_torch():
    code = "import sys, rayform; rayform.Client; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
