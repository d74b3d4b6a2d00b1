"""What LeRobot's policies read, from an :class:`~rayform.torch.EpisodeDataset`: no glue.

* :func:`policy_features`: ``(input_features, output_features)`` for a policy config
  (``ACTConfig(input_features=..., output_features=...)``), classified as LeRobot's
  ``dataset_to_policy_features`` does: cameras ``VISUAL (3, H, W)``,
  ``observation.environment_state`` ``ENV``, other ``observation.*`` ``STATE``, the action
  ``ACTION (D,)`` (the per-step width; the policy's ``chunk_size`` is the dataset's horizon).
* :func:`lerobot_stats`: ``dataset.stats()`` as LeRobot's normalisation steps read them
  (``{key: {"mean", "std", "min", "max", "q01", "q99", "count"}}`` of numpy arrays), cameras
  with ImageNet's statistics (``(3, 1, 1)``, LeRobot's ``use_imagenet_stats`` default).
* :class:`LeRobotCollate`: batches with frames as ``float32`` in ``[0, 1]`` (converted in the
  DataLoader worker), as LeRobot's datasets return them, and without ``meta``. A ``task`` key
  (a state text stream) stays a list of strings, one per sample, as LeRobot's collate gives it
  and its processors read it (``batch["task"]``, and ``batch["subtask"]``); tokens, from a
  tokenizer run in the collate or from the dataset's own (``EpisodeDataset(tokenizer=...)``),
  are put under the keys LeRobot's tokenizer step writes (``observation.language.tokens``,
  ``observation.language.attention_mask``; ``observation.subtask.*``), which its
  language-conditioned policies read.

The dataset's sample keys must be LeRobot's (``obs={"observation.images.top": "top/rgb",
"observation.state": "observation/state"}``, ``action={"action": "action"}``). ``lerobot``
is imported only inside :func:`policy_features`, and only if it is installed.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import default_collate

from rayform.errors import InvalidArgumentError
from rayform.torch._text import tokenize_strings

if TYPE_CHECKING:
    from rayform.torch.dataset import EpisodeDataset

__all__ = [
    "IMAGENET_STATS",
    "LANGUAGE_KEYS",
    "LeRobotCollate",
    "PolicyFeatureSpec",
    "lerobot_stats",
    "policy_features",
]

#: The batch keys LeRobot's ``TokenizerProcessorStep`` writes, per text key it reads
#: (``OBS_LANGUAGE_TOKENS``, ``OBS_LANGUAGE_ATTENTION_MASK``, and the subtask's).
LANGUAGE_KEYS = {
    "task": ("observation.language.tokens", "observation.language.attention_mask"),
    "subtask": ("observation.subtask.tokens", "observation.subtask.attention_mask"),
}

#: ImageNet's per-channel statistics, as LeRobot's ``IMAGENET_STATS``.
IMAGENET_STATS = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}


@dataclass(frozen=True)
class PolicyFeatureSpec:
    """LeRobot's ``PolicyFeature`` where ``lerobot`` is not installed: ``type`` is the name of
    its ``FeatureType`` (``"VISUAL"``, ``"STATE"``, ``"ENV"``, ``"ACTION"``)."""

    type: str
    shape: tuple[int, ...]


def _types(ds: EpisodeDataset) -> dict[str, tuple[str, tuple[int, ...]]]:
    spec = ds.sample_spec()
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for key, stream in ds.obs_keys.items():
        if ds.spec.kind(stream) == "video":
            out[key] = ("VISUAL", tuple(ds.frame_shape(key)))
        elif key == "observation.environment_state":
            out[key] = ("ENV", (int(spec[key][1][-1]),))
        elif key.startswith("observation"):
            out[key] = ("STATE", (int(spec[key][1][-1]),))
    if ds.action_key is not None:
        out[ds.action_key] = ("ACTION", (int(spec[ds.action_key][1][-1]),))
    return out


def policy_features(ds: EpisodeDataset) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(input_features, output_features)`` of a LeRobot policy config for this dataset.

    Values are ``lerobot.configs.types.PolicyFeature`` when ``lerobot`` is installed, else
    :class:`PolicyFeatureSpec`. Observation keys that do not start with ``observation`` are
    left out (LeRobot's policies ignore them too).

    Raises:
        InvalidArgumentError: the dataset has no action, or no observation LeRobot reads.
    """
    types = _types(ds)
    if ds.action_key is None:
        raise InvalidArgumentError(
            "policy_features: the dataset has no action (pass action={'action': STREAM})"
        )
    if importlib.util.find_spec("lerobot") is not None:
        from lerobot.configs.types import FeatureType, PolicyFeature

        def make(kind: str, shape: tuple[int, ...]) -> Any:
            return PolicyFeature(type=FeatureType(kind), shape=shape)
    else:

        def make(kind: str, shape: tuple[int, ...]) -> Any:
            return PolicyFeatureSpec(kind, shape)

    inputs = {k: make(t, s) for k, (t, s) in types.items() if t != "ACTION"}
    if not inputs:
        raise InvalidArgumentError(
            "policy_features: no observation key starts with 'observation' (LeRobot's names: "
            "obs={'observation.images.top': 'top/rgb', 'observation.state': 'joints/position'})"
        )
    return inputs, {ds.action_key: make(*types[ds.action_key])}


def lerobot_stats(ds: EpisodeDataset, *, images: str = "imagenet") -> dict[str, dict[str, Any]]:
    """The dataset's statistics in LeRobot's layout, keyed by sample key.

    Vectors: ``mean``/``std``/``min``/``max``/``q01``/``q99`` as ``float32 (D,)`` arrays and
    ``count``, from :meth:`~rayform.torch.EpisodeDataset.stats` (every grid sample of the
    dataset's episodes). Cameras (``images="imagenet"``): ImageNet's mean and std, ``(3, 1,
    1)``, what LeRobot's training uses by default; ``images=None`` leaves cameras out.

    Pass it as ``make_pre_post_processors(cfg, dataset_stats=lerobot_stats(ds))``.
    """
    if images not in ("imagenet", None):
        raise InvalidArgumentError(f"images={images!r}: use 'imagenet' or None")
    arrays = ds.stats_arrays()
    streams = dict(ds.obs_keys)
    if ds.action_key is not None and ds.action is not None:
        streams[ds.action_key] = ds.action
    out: dict[str, dict[str, Any]] = {}
    for key, stream in streams.items():
        if stream in arrays:
            out[key] = {k: v for k, v in arrays[stream].items()}
        elif images == "imagenet" and ds.spec.kind(stream) == "video":
            out[key] = {
                k: np.asarray(v, dtype=np.float32).reshape(3, 1, 1)
                for k, v in IMAGENET_STATS.items()
            }
    return out


class LeRobotCollate:
    """A ``collate_fn`` giving LeRobot's batch: cameras ``float32`` in ``[0, 1]`` (converted in
    the worker that decoded them), vectors as they are, ``meta`` dropped (``keep_meta=True``
    keeps it). Picklable, so DataLoader workers use it.

    Text keys stay lists of ``B`` strings (``batch["task"]``, what LeRobot's processors read).
    For the sample keys ``task`` and ``subtask`` (state text streams, e.g. ``obs={"task":
    "task", "subtask": "language/subtask"}``), tokens go under LeRobot's keys
    (:data:`LANGUAGE_KEYS`): ``observation.language.tokens`` ``(B, L)`` and
    ``observation.language.attention_mask`` ``(B, L) bool``, from ``tokenizer`` when given
    (run here, in the worker, on the batch's strings), else from the dataset's own tokenizer
    (its ``task_input_ids`` and ``task_attention_mask``, which stay too).

    Args:
        ds: the dataset whose samples it batches.
        keep_meta: keep each sample's ``meta`` (as a list of dicts).
        tokenizer: ``callable(list of B strings) -> {"input_ids": (B, L), "attention_mask":
            (B, L)}`` (a Hugging Face tokenizer with ``return_tensors="pt",
            padding="max_length"``, through ``functools.partial``), or ``None``.

    Raises:
        InvalidArgumentError: ``tokenizer`` is not callable, or the dataset has no ``task``
            or ``subtask`` key of a state text stream for it to tokenize.
    """

    def __init__(
        self,
        ds: EpisodeDataset,
        *,
        keep_meta: bool = False,
        tokenizer: Callable[[list[str]], Mapping[str, torch.Tensor]] | None = None,
    ) -> None:
        self.cameras = tuple(k for k, s in ds.obs_keys.items() if ds.spec.kind(s) == "video")
        self.keep_meta = keep_meta
        state_text = set(ds.spec.state_text_keys)
        self.texts = tuple(k for k in LANGUAGE_KEYS if k in state_text)
        if tokenizer is not None and not callable(tokenizer):
            raise InvalidArgumentError(
                f"LeRobotCollate(tokenizer={tokenizer!r}): pass a callable (a list of strings "
                "-> a dict with input_ids and attention_mask) or None"
            )
        if tokenizer is not None and not self.texts:
            raise InvalidArgumentError(
                "LeRobotCollate(tokenizer=...) tokenizes the sample keys 'task' and 'subtask' "
                f"(state text streams); this dataset's obs keys are {sorted(ds.obs_keys)}: name "
                "one, e.g. obs={..., 'task': 'task'}"
            )
        self.tokenizer = tokenizer

    def __call__(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        if not self.keep_meta:
            samples = [{k: v for k, v in s.items() if k != "meta"} for s in samples]
        batch: dict[str, Any] = default_collate(samples)
        for key in self.cameras:
            batch[key] = batch[key].to(torch.float32).div_(255.0)
        for key in self.texts:
            tokens_key, mask_key = LANGUAGE_KEYS[key]
            if self.tokenizer is not None:
                out = tokenize_strings(self.tokenizer, list(batch[key]), repr(key))
                batch[tokens_key] = out["input_ids"]
                batch[mask_key] = torch.as_tensor(out["attention_mask"]).to(torch.bool)
            elif f"{key}_input_ids" in batch and f"{key}_attention_mask" in batch:
                batch[tokens_key] = batch[f"{key}_input_ids"]
                batch[mask_key] = batch[f"{key}_attention_mask"].to(torch.bool)
        return batch
