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


def test_import_rayform_does_not_import_torch():
    code = "import sys, rayform; rayform.Client; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_import_rayform_does_not_import_trackers():
    # The mlflow entry point loads rayform.integrations.mlflow whenever mlflow.data is
    # imported, so that module must not drag torch in either.
    code = (
        "import sys, rayform; rayform.Client; rayform.DatasetURI\n"
        "assert not {'mlflow', 'wandb'} & set(sys.modules), 'a tracker was imported'\n"
        "import rayform.integrations.mlflow\n"
        "assert 'torch' not in sys.modules, 'torch imported by the mlflow integration'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
