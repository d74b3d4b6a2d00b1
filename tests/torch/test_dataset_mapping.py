"""Sample keys mapped from stream names (issue 23): the dict form of obs= and action=, its
reserved names, its place in the URI (version 4 only when mapped) and describe()."""

from __future__ import annotations

import pytest
import torch
from support import DEMO_SLICE, ServerProcess

import rayform
from rayform import DatasetURI
from rayform.errors import InvalidArgumentError
from rayform.torch import EpisodeDataset

OBS = ["cam0/rgb", "joints/position"]
ACTION = "joints/position_delta"
MAPPED = {"image_primary": "cam0/rgb", "state": "joints/position"}


@pytest.fixture
def slice_(client_env: ServerProcess):
    return rayform.Client().slices.get(DEMO_SLICE)


def test_mapped_keys_hold_the_same_tensors(slice_) -> None:
    plain = EpisodeDataset(
        slice_, obs=OBS, action=ACTION, fps=15, horizon=3, obs_steps=2, readahead_bytes=0
    )
    mapped = EpisodeDataset(
        slice_,
        obs=MAPPED,
        action={"act": ACTION},
        fps=15,
        horizon=3,
        obs_steps=2,
        readahead_bytes=0,
    )
    a, b = plain[7], mapped[7]
    assert list(b) == [
        "image_primary",
        "image_primary_is_pad",
        "state",
        "state_is_pad",
        "act",
        "act_is_pad",
        "t_ns",
        "meta",
    ]
    assert torch.equal(a["cam0/rgb"], b["image_primary"]) and torch.equal(
        a["joints/position"], b["state"]
    )
    assert torch.equal(a["action"], b["act"]) and torch.equal(a["action_is_pad"], b["act_is_pad"])
    assert mapped.obs == OBS and mapped.action == ACTION  # the streams read
    assert mapped.obs_keys == MAPPED and mapped.action_key == "act"
    assert set(mapped.sample_spec()) == set(b) - {"meta"}
    assert mapped.frame_shape("image_primary") == mapped.frame_shape("cam0/rgb")


def test_uri_is_unchanged_without_mapping_and_version_4_with_it(slice_) -> None:
    listed = EpisodeDataset(slice_, obs=OBS, action=ACTION, fps=15)
    same = EpisodeDataset(slice_, obs={k: k for k in OBS}, action={"action": ACTION}, fps=15)
    assert same.uri == listed.uri and "?v=1&" in listed.uri and "keys=" not in listed.uri
    assert "obs_keys" not in listed.describe()
    mapped = EpisodeDataset(
        slice_,
        obs=MAPPED,
        action={"action": ACTION},
        fps=15,
        image_size={"image_primary": (32, 32)},
    )
    uri = mapped.uri
    assert "?v=4&" in uri and "keys=image_primary,state,action" in uri and "image_size=32x32" in uri
    assert DatasetURI.parse(uri).dataset_kwargs()["obs"] == MAPPED
    again = EpisodeDataset.from_uri(uri)
    assert (
        again.uri == uri
        and again.obs_keys == MAPPED
        and again.frame_shape("image_primary") == (3, 32, 32)
    )
    d = mapped.describe()
    assert d["obs_keys"] == MAPPED and d["action_key"] == "action" and d["uri"] == uri


def test_from_uri_keeps_each_cameras_size_when_a_key_is_another_cameras_stream(slice_) -> None:
    # The sample key "cam0/rgb" reads wrist/rgb and "wrist/rgb" reads cam0/rgb: sizes keyed by
    # sample key must come back to the same cameras through the URI (which keys them by stream).
    swapped = {"cam0/rgb": "wrist/rgb", "wrist/rgb": "cam0/rgb"}
    ds = EpisodeDataset(
        slice_,
        obs=swapped,
        action=None,
        fps=15,
        image_size={"cam0/rgb": (64, 64), "wrist/rgb": (32, 32)},
        resize="squash",
    )
    with pytest.raises(InvalidArgumentError, match="names one camera twice"):
        EpisodeDataset(  # the sample key "image" and the stream name "cam0/rgb": one camera
            slice_,
            obs={"image": "cam0/rgb"},
            action=None,
            fps=15,
            image_size={"image": (8, 8), "cam0/rgb": (9, 9)},
        )
    again = EpisodeDataset.from_uri(ds.uri)
    for d in (ds, again):
        sample = d[3]
        assert sample["cam0/rgb"].shape == (3, 64, 64) and sample["wrist/rgb"].shape == (3, 32, 32)
    assert again.uri == ds.uri
    # What the dataset reports is keyed as the user keyed it, so it can be passed back as it is.
    sizes = {"cam0/rgb": (64, 64), "wrist/rgb": (32, 32)}
    assert ds.image_size == again.image_size == sizes
    assert ds.describe()["image_size"] == {k: list(v) for k, v in sizes.items()}
    same = EpisodeDataset(
        slice_, obs=swapped, action=None, fps=15, image_size=ds.image_size, resize="squash"
    )
    assert same.uri == ds.uri and same.frame_shape("cam0/rgb") == (3, 64, 64)


@pytest.mark.parametrize(
    ("obs", "action", "match"),
    [
        ({"meta": "cam0/rgb"}, ACTION, "reserved"),
        ({"t_ns": "cam0/rgb"}, ACTION, "reserved"),
        ({"action": "joints/position"}, ACTION, "reserved"),
        ({"state_is_pad": "joints/position"}, ACTION, "_is_pad"),
        ({"state_dim_is_pad": "joints/position"}, ACTION, "_dim_is_pad"),
        ({"cam_is_missing": "cam0/rgb"}, ACTION, "_is_missing"),
        ({"a,b": "cam0/rgb"}, ACTION, "letters"),
        ({"x": "cam0/rgb", "y": "cam0/rgb"}, ACTION, "two keys to one stream"),
        ({"x": "cam0/rgb"}, {"x": ACTION}, "both an observation and the action"),
        ({"x": "cam0/rgb"}, {"a": ACTION, "b": ACTION}, "exactly one"),
        ({"x": "cam0/rgb"}, {"action_is_pad": ACTION}, "reserved"),
        ({}, ACTION, "at least one"),
    ],
)
def test_reserved_and_malformed_keys_are_refused(slice_, obs, action, match) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        EpisodeDataset(slice_, obs=obs, action=action, fps=15)
