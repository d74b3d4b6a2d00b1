"""Experiment-tracker integrations: a logged run leads back to exactly the samples trained on.

* :mod:`rayform.integrations.mlflow` (``pip install "rayform[mlflow]"``):
  ``mlflow.log_input(from_episode_dataset(ds), context="training")``.
* :mod:`rayform.integrations.wandb` (``pip install "rayform[wandb]"``):
  ``log_dataset(run, ds)``.

Both record the dataset URI (``ds.uri``); ``EpisodeDataset.from_uri`` rebuilds the dataset
from it. Recipes, including a plain JSON log: ``docs/tracking.md``. Nothing here is imported
by ``import rayform``, so neither tracker is needed unless it is used.
"""
