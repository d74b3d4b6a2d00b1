"""Both ways with LeRobot: a slice as a LeRobot dataset, and LeRobot's policies fed by a slice.

::

    from rayform.torch.lerobot import export_lerobot
    export_lerobot(slice_, "out/my_dataset")                  # LeRobot v3.0 (or version="2.1")

    from rayform.torch.lerobot import policy_features, lerobot_stats, LeRobotCollate
    ds = rayform.torch.EpisodeDataset(slice_, obs={"observation.images.top": "top/rgb", ...},
                                      action={"action": "action"}, fps=30, horizon=100)
    input_features, output_features = policy_features(ds)   # for ACTConfig(...)
    stats = lerobot_stats(ds)                               # for make_pre_post_processors(...)
    loader = DataLoader(ds, ..., collate_fn=LeRobotCollate(ds))   # frames float in [0, 1]

The ``lerobot`` package is not needed for the export; :func:`policy_features` builds
LeRobot's own ``PolicyFeature`` objects when it is installed. ``docs/lerobot.md``.
"""

from __future__ import annotations

from rayform.torch.lerobot._export import ExportReport, export_lerobot
from rayform.torch.lerobot._plan import default_feature_name
from rayform.torch.lerobot._policy import (
    LANGUAGE_KEYS,
    LeRobotCollate,
    PolicyFeatureSpec,
    lerobot_stats,
    policy_features,
)

__all__ = [
    "LANGUAGE_KEYS",
    "ExportReport",
    "LeRobotCollate",
    "PolicyFeatureSpec",
    "default_feature_name",
    "export_lerobot",
    "lerobot_stats",
    "policy_features",
]
