"""``import rayform`` imports no experiment tracker, and its MLflow integration no torch.

Usage: ``python no_trackers.py`` (exit status 0: neither was imported).
"""

import sys

import rayform

if __name__ == "__main__":
    touched = (rayform.Client, rayform.DatasetURI)  # names the package may load lazily
    assert not {"mlflow", "wandb"} & set(sys.modules), "a tracker was imported"
    import rayform.integrations.mlflow  # noqa: F401 - the import is what is checked

    assert "torch" not in sys.modules, "torch imported by the mlflow integration"
