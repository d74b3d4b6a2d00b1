"""White-box checks of rayform.torch._layout (the mixture's one sample layout) and of the
version 3 mixture URI that records it, without a server."""

from __future__ import annotations

import pytest
import torch

from rayform import MixtureURI
from rayform.errors import InvalidArgumentError
from rayform.torch._layout import Layout, dataset_spec, format_layout, parse_layout

HASH = "ab" * 32
SOURCE = (
    f"rayform://h/slc_7c1e04aa@{HASH}?v=1&action=a/b&action_mode=hold&fps=15&frame=&horizon=2"
    "&obs=c/d&obs_steps=1&seed=0"
)


def _specs(obs_steps: int = 2):
    wide = dataset_spec(
        [("cam", "video", (3, 4, 4)), ("state", "table", (5,))], ("action", 5), obs_steps, 3
    )
    narrow = dataset_spec(
        [("state", "table", (2,)), ("extra", "table", (1,))], ("action", 3), obs_steps, 3
    )
    return wide, narrow


def test_union_with_history_masks_missing_keys_and_padding() -> None:
    wide, narrow = _specs()
    layout = Layout("union", [wide, narrow], ["action", "action"])
    spec = layout.spec()
    assert spec["state"] == ("float32", (2, 5)) and spec["state_dim_is_pad"] == ("bool", (5,))
    assert spec["cam"] == ("uint8", (2, 3, 4, 4)) and spec["cam_is_missing"] == ("bool", ())
    assert spec["extra"] == ("float32", (2, 1)) and spec["action"] == ("float32", (3, 5))
    assert spec["cam_is_pad"] == ("bool", (2,)) and spec["action_is_pad"] == ("bool", (3,))
    sample = {
        "state": torch.ones(2, 2),
        "state_is_pad": torch.tensor([True, False]),
        "extra": torch.full((2, 1), 7.0),
        "extra_is_pad": torch.tensor([True, False]),
        "action": torch.ones(3, 3),
        "action_is_pad": torch.tensor([False, False, True]),
        "t_ns": torch.tensor(5),
        "meta": {"source": 1},
    }
    out = layout.plan(narrow).apply(sample)
    assert set(out) == {*spec, "meta"} and list(out)[-2:] == ["t_ns", "meta"]
    for key, (dtype, shape) in spec.items():
        assert out[key].dtype == getattr(torch, dtype) and tuple(out[key].shape) == shape, key
    assert out["state"].tolist() == [[1, 1, 0, 0, 0]] * 2
    assert out["state_dim_is_pad"].tolist() == [False, False, True, True, True]
    assert (
        out["action"][:, 3:].abs().sum() == 0
        and out["action_dim_is_pad"].tolist() == [False] * 3 + [True] * 2
    )
    assert (
        bool(out["cam_is_missing"])
        and out["cam"].sum() == 0
        and out["cam_is_pad"].tolist() == [True, True]
    )
    assert out["state_is_pad"].tolist() == [True, False]  # the source's own history mask


def test_explicit_layouts_and_their_errors() -> None:
    wide, narrow = _specs(obs_steps=1)
    explicit = {
        "cam": (3, 4, 4),
        "state": [8],
        "extra": {"dtype": "float32", "shape": [1]},
        "action": ("float32", (3, 6)),
        "action_is_pad": [3],
        "t_ns": [],
    }
    layout = Layout(explicit, [wide, narrow], ["action", "action"])
    assert layout.spec()["state"] == ("float32", (8,)) and layout.spec()["action"] == (
        "float32",
        (3, 6),
    )
    assert parse_layout(format_layout(layout.arg)) == layout.arg
    with pytest.raises(InvalidArgumentError, match="only widen"):
        Layout({**explicit, "state": (4,)}, [wide, narrow], ["action", "action"])
    with pytest.raises(InvalidArgumentError, match="no source has"):
        Layout({**explicit, "other": (2,)}, [wide, narrow], ["action", "action"])
    with pytest.raises(InvalidArgumentError, match="not a shape"):
        Layout({**explicit, "state": "wide"}, [wide, narrow], ["action", "action"])
    with pytest.raises(InvalidArgumentError, match="same action key"):
        Layout("union", [wide, narrow], ["action", "act"])
    with pytest.raises(InvalidArgumentError, match="obs_steps and horizon"):
        Layout("union", [_specs(2)[0], _specs(3)[1]], ["action", "action"])
    with pytest.raises(InvalidArgumentError, match="use 'union'"):
        Layout("widest", [wide], ["action"])


def test_mixture_uri_version_3_holds_layout_and_names() -> None:
    from rayform import DatasetURI

    src = DatasetURI.parse(SOURCE)
    v2 = MixtureURI(((1.0, src), (2.0, src)), num_samples=10)
    assert str(v2).startswith("rayform:///mix?v=2&") and "layout" not in str(v2)
    v3 = MixtureURI(
        ((1.0, src), (2.0, src)),
        num_samples=10,
        layout=format_layout({"state": (8,)}),
        names=("a", "b"),
    )
    text = str(v3)
    assert text.startswith("rayform:///mix?v=3&") and text.endswith(
        "&layout=%7B%22state%22%3A%5B8%5D%7D&names=a,b&num_samples=10&replacement=0&seed=0"
    )
    assert MixtureURI.parse(text) == v3 and v3.digest != v2.digest
    assert MixtureURI.parse(str(v2)) == v2
    with pytest.raises(InvalidArgumentError, match="unknown parameter"):
        MixtureURI.parse(str(v2).replace("num_samples", "names=a,b&num_samples"))  # names need v=3
