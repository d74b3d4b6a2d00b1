"""A mixture of robots (issue 23): one sample layout over sources with different vector widths,
cameras, rates and statistics, on a real server with real DataLoader workers.

Three sources: the small bimanual demo (two cameras, 14 joints, sampled at 25 Hz), the small
single-arm demo (one wrist camera, 7 joints, 15 Hz, other stream names) and a renamed copy of a
bimanual slice (seed 1, its own slice ID, the wrist camera and the 7-D tool pose mapped to the
same keys, 10 Hz).
"""

from __future__ import annotations

import json
from collections import Counter
from itertools import islice
from pathlib import Path

import numpy as np
import pytest
import torch
from support import DEMO_SLICE, TOKEN, ServerProcess, make_client
from torch.utils.data import DataLoader, default_collate

from rayform.errors import InvalidArgumentError
from rayform.torch import EpisodeDataset, EpisodeSampler, MixtureDataset, collate
from rayform_server.demo import SINGLE_ARM_SLICE, build_demo

COPY_SLICE = "slc_0c0ffee1"
SIZE = (48, 64)
NO_READAHEAD = {"readahead_bytes": 0}


@pytest.fixture(scope="module")
def robots(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("robots")
    build_demo(root, DEMO_SLICE, small=True)
    build_demo(root, SINGLE_ARM_SLICE, small=True, robot="single-arm")
    build_demo(root, COPY_SLICE, small=True, seed=1, episodes=2)
    server = ServerProcess(root)
    yield server
    server.stop()


@pytest.fixture
def client(robots: ServerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RAYFORM_ENDPOINT", robots.url)
    monkeypatch.setenv("RAYFORM_TOKEN", TOKEN)
    return make_client(robots.url, tmp_path / "cache")


def three(client, normalize=None, **kw):
    bi = EpisodeDataset(
        client.slices.get(DEMO_SLICE),
        obs={"image_primary": "cam0/rgb", "image_wrist": "wrist/rgb", "state": "joints/position"},
        action={"action": "joints/position_delta"},
        fps=25,
        horizon=4,
        image_size=SIZE,
        resize="squash",
        normalize=normalize,
        **NO_READAHEAD,
        **kw,
    )
    arm = EpisodeDataset(
        client.slices.get(SINGLE_ARM_SLICE),
        obs={"image_wrist": "hand/rgb", "state": "arm/joint_pos"},
        action={"action": "arm/joint_cmd_delta"},
        fps=15,
        horizon=4,
        image_size={"image_wrist": SIZE},
        resize="squash",
        normalize=normalize,
        **NO_READAHEAD,
        **kw,
    )
    copy = EpisodeDataset(
        client.slices.get(COPY_SLICE),
        obs={"image_wrist": "wrist/rgb", "state": "ee/pose"},
        action={"action": "joints/position_delta"},
        fps=10,
        horizon=4,
        image_size=SIZE,
        resize="squash",
        normalize=normalize,
        **NO_READAHEAD,
        **kw,
    )
    return bi, arm, copy


def mixture(client, normalize=None, seed=3, num_samples=90, **kw):
    bi, arm, copy = three(client, normalize=normalize, **kw)
    return MixtureDataset(
        [(bi, 0.5, "bimanual"), (arm, 0.3, "single_arm"), (copy, 0.2, "copy")],
        layout="union",
        num_samples=num_samples,
        seed=seed,
    )


WANT = {
    "image_primary": ("uint8", (3, *SIZE)),
    "image_primary_is_missing": ("bool", ()),
    "image_wrist": ("uint8", (3, *SIZE)),
    "image_wrist_is_missing": ("bool", ()),
    "state": ("float32", (14,)),
    "state_dim_is_pad": ("bool", (14,)),
    "action": ("float32", (4, 14)),
    "action_dim_is_pad": ("bool", (14,)),
    "action_is_pad": ("bool", (4,)),
    "t_ns": ("int64", ()),
}


def test_union_layout_keys_shapes_and_masks_in_every_batch(client) -> None:
    mix = mixture(client)
    assert mix.sample_spec() == WANT
    widths = {"bimanual": (14, 14), "single_arm": (7, 7), "copy": (7, 14)}
    missing = {"bimanual": False, "single_arm": True, "copy": True}
    seen = Counter()
    for collate_fn in (None, collate):
        loader = DataLoader(
            mix,
            batch_size=8,
            sampler=EpisodeSampler(mix),
            num_workers=2,
            **({"collate_fn": collate_fn} if collate_fn else {}),
        )
        for batch in loader:
            assert set(batch) == {*WANT, "meta"}
            n = len(batch["t_ns"])
            for key, (dtype, shape) in WANT.items():
                assert batch[key].dtype == getattr(torch, dtype) and tuple(batch[key].shape) == (
                    n,
                    *shape,
                ), key
            assert set(batch["meta"]) == {
                "slice",
                "segment",
                "segment_version",
                "site",
                "source",
                "source_name",
            }
            for i, name in enumerate(batch["meta"]["source_name"]):
                seen[name] += 1
                assert batch["meta"]["source"][i].item() == [
                    "bimanual",
                    "single_arm",
                    "copy",
                ].index(name)
                ws, wa = widths[name]
                assert batch["state_dim_is_pad"][i].tolist() == [d >= ws for d in range(14)]
                assert batch["action_dim_is_pad"][i].tolist() == [d >= wa for d in range(14)]
                # Padded components are exactly zero; the real ones are data (joint angles are never all 0).
                assert torch.all(batch["state"][i, ws:] == 0) and torch.all(
                    batch["action"][i, :, wa:] == 0
                )
                assert torch.any(batch["state"][i, :ws] != 0)
                assert batch["image_primary_is_missing"][i].item() == missing[name]
                assert batch["image_wrist_is_missing"][i].item() is False
                if missing[name]:
                    assert torch.all(batch["image_primary"][i] == 0)
                else:
                    assert batch["image_primary"][i].float().mean() > 10
    # Exact weighted shares: 45 / 27 / 18 of 90 draws, twice (two loaders).
    assert seen == {"bimanual": 90, "single_arm": 54, "copy": 36}
    assert list(mix.quotas) == [45, 27, 18]


def _tag(sample: dict) -> dict:
    return {**sample, "task_id": torch.tensor(7)}


def _crop(sample: dict) -> dict:
    return {**sample, "image_wrist": sample["image_wrist"][..., :8, :8]}


def test_a_transform_that_changes_a_shape_the_layout_places_is_a_clear_error(client) -> None:
    mix = mixture(client, transform=_crop)
    with pytest.raises(InvalidArgumentError, match=r"source '\w+': sample key 'image_wrist' is"):
        mix.__getitems__(list(EpisodeSampler(mix))[:4])


def test_keys_a_transform_adds_pass_through_the_layout(client) -> None:
    mix = mixture(client, transform=_tag)
    samples = mix.__getitems__(list(EpisodeSampler(mix))[:24])
    assert {s["meta"]["source_name"] for s in samples} == {"bimanual", "single_arm", "copy"}
    for s in samples:
        assert list(s) == [*WANT, "meta"][:-2] + ["task_id", "t_ns", "meta"]
        assert int(s["task_id"]) == 7


def test_padded_values_never_leak_into_real_entries(client) -> None:
    mix = mixture(client)
    bi, arm, copy = mix.sources
    sampler = EpisodeSampler(mix)
    keys = list(islice(iter(sampler), 30))
    got = mix.__getitems__([(k.sample, k.epoch) if hasattr(k, "sample") else k for k in keys])
    src, local = mix.locate(np.array([k.sample if hasattr(k, "sample") else k[0] for k in keys]))
    for sample, k, i in zip(got, src.tolist(), local.tolist(), strict=True):
        own = mix.sources[k][(int(i), 0)]
        w = own["state"].shape[-1]
        assert torch.equal(sample["state"][:w], own["state"])
        assert torch.equal(sample["action"][:, : own["action"].shape[-1]], own["action"])
        assert torch.equal(sample["action_is_pad"], own["action_is_pad"])
        assert torch.equal(sample["image_wrist"], own["image_wrist"])


def test_resume_after_n_batches_and_from_uri(client) -> None:
    def run(mix, state=None, stop=None):
        sampler = EpisodeSampler(mix)
        if state is not None:
            sampler.load_state_dict(state)
        loader = DataLoader(mix, batch_size=6, sampler=sampler, num_workers=2, collate_fn=collate)
        out = [
            (
                b["meta"]["source_name"],
                b["t_ns"].tolist(),
                b["state"].sum().item(),
                b["image_wrist"].sum().item(),
            )
            for b in islice(loader, stop)
        ]
        return out, sampler.state_dict(consumed=6 * len(out))

    mix = mixture(client)
    full, _ = run(mix)
    head, state = run(mixture(client), stop=5)
    tail, _ = run(mixture(client), state=json.loads(json.dumps(state)))
    assert head + tail == full
    uri = mix.uri
    assert (
        uri.startswith("rayform:///mix?v=3&")
        and "layout=union" in uri
        and "names=bimanual,single_arm,copy" in uri
    )
    assert "keys=image_primary,image_wrist,state,action" in mix.sources[0].uri
    again = MixtureDataset.from_uri(uri, **NO_READAHEAD)
    assert again.uri == uri and again.source_names == mix.source_names
    assert run(again)[0] == full


def test_normalised_vectors_have_mean_0_std_1_per_source(client) -> None:
    mix = mixture(client, normalize="mean_std", num_samples=200)
    for k, ds in enumerate(mix.sources):
        # Over an epoch of the source alone: every grid sample once.
        loader = DataLoader(ds, batch_size=32, num_workers=0)
        state = torch.cat([b["state"] for b in loader])
        stats = ds.stats()
        std = np.asarray(stats[ds.obs_keys["state"]]["std"])
        live = torch.from_numpy(std > 1e-6)
        assert torch.allclose(state.mean(0), torch.zeros(state.shape[1]), atol=1e-3), k
        assert torch.allclose(
            state.std(0, unbiased=False)[live], torch.ones(int(live.sum())), atol=1e-3
        ), k
        assert torch.all(state[:, ~live] == 0)  # never changes: only centred
    # unnormalize on the mixture: back to the source's robot units, its own width.
    draws = EpisodeSampler(mix).next_indices(12)
    src, local = mix.locate(draws)
    batch = default_collate(mix.__getitems__([(int(i), 0) for i in draws]))
    for j, (k, i) in enumerate(zip(src.tolist(), local.tolist(), strict=True)):
        back = mix.unnormalize(batch["action"][j], source=mix.source_names[k])
        ds = mix.sources[k]
        width = ds.sample_spec()[ds.action_key][1][-1]
        assert back.shape == (4, width)
        plain = _plain(ds)[(int(i), 0)]["action"]
        assert torch.allclose(back, plain, atol=1e-4)
        listed = mix.unnormalize(batch["action"][j].tolist(), source=mix.source_names[k])
        assert np.allclose(listed, back.numpy())  # a list, as a policy might return, works too


def _plain(ds):
    """The same dataset without normalisation (from its URI's arguments)."""
    from rayform import DatasetURI

    kw = DatasetURI.parse(ds.uri).dataset_kwargs()
    kw.pop("normalize")
    return EpisodeDataset(ds.slice, **kw, **NO_READAHEAD)


def test_quantile_and_given_statistics(client) -> None:
    bi, arm, _ = three(client, normalize="quantile")
    stats = arm.normalization()
    assert set(stats) == {"state", "action"} and set(stats["state"]) == {"q01", "q99"}
    x = torch.cat([b["state"] for b in DataLoader(arm, batch_size=64)])
    live = torch.tensor(np.asarray(stats["state"]["q99"]) > np.asarray(stats["state"]["q01"]))
    inside = (x[:, live].abs() <= 1 + 1e-5).float().mean()
    assert inside > 0.95  # q01..q99 -> -1..1
    # A validation dataset normalised with the training set's numbers: same values, URI holds them.
    val = EpisodeDataset(
        arm.slice,
        obs=arm.obs_keys,
        action={"action": arm.action},
        fps=15,
        horizon=4,
        image_size={"image_wrist": SIZE},
        resize="squash",
        normalize=stats,
        **NO_READAHEAD,
    )
    assert val.normalize == "given" and val.normalization() == stats
    assert torch.equal(val[3]["state"], arm[3]["state"])
    assert (
        "normalize=%7B" in val.uri
        and EpisodeDataset.from_uri(val.uri, **NO_READAHEAD).uri == val.uri
    )
    with pytest.raises(InvalidArgumentError, match="missing: state"):
        EpisodeDataset(
            arm.slice,
            obs=arm.obs_keys,
            action={"action": arm.action},
            fps=15,
            normalize={"action": stats["action"]},
        )


def test_explicit_layout_and_clear_errors(client) -> None:
    bi, arm, copy = three(client)
    spec = {
        "image_primary": (3, *SIZE),
        "image_wrist": (3, *SIZE),
        "state": (16,),
        "action": (4, 16),
    }
    mix = MixtureDataset([(bi, 1.0), (arm, 1.0)], layout=spec)
    assert mix.sample_spec()["state"] == ("float32", (16,)) and mix.source_names == (
        DEMO_SLICE,
        SINGLE_ARM_SLICE,
    )
    src, _ = mix.locate(np.arange(len(mix)), epoch=0)
    sample = mix[(int(np.flatnonzero(src == 1)[0]), 0)]  # a draw of the single arm
    assert sample["state_dim_is_pad"].tolist() == [d >= 7 for d in range(16)]
    # The tracker's form ({key: {"dtype", "shape"}} with masks) is accepted as it is logged.
    logged = {k: {"dtype": d, "shape": list(s)} for k, (d, s) in mix.sample_spec().items()}
    assert MixtureDataset([(bi, 1.0), (arm, 1.0)], layout=logged).sample_spec() == mix.sample_spec()
    with pytest.raises(InvalidArgumentError, match="only widen"):
        MixtureDataset([(bi, 1.0), (arm, 1.0)], layout={**spec, "state": (8,)})
    with pytest.raises(InvalidArgumentError, match="lacks 'image_primary'"):
        MixtureDataset(
            [(bi, 1.0), (arm, 1.0)], layout={k: v for k, v in spec.items() if k != "image_primary"}
        )
    with pytest.raises(InvalidArgumentError, match="layout='union'"):
        MixtureDataset([(bi, 1.0), (arm, 1.0)])  # today's rule without a layout, with the way out
    small = EpisodeDataset(
        arm.slice,
        obs={"image_wrist": "hand/rgb"},
        action={"action": arm.action},
        fps=15,
        horizon=4,
        image_size=(32, 32),
        resize="pad",
    )
    with pytest.raises(InvalidArgumentError, match="image_size="):
        MixtureDataset([(bi, 1.0), (small, 1.0)], layout="union")
    history = three(client, obs_steps=2)[1]  # the single arm with two steps of history
    with pytest.raises(InvalidArgumentError, match="need the same obs_steps"):
        MixtureDataset([(bi, 1.0), (history, 1.0)], layout="union")
    with pytest.raises(InvalidArgumentError, match="give each source its own name"):
        MixtureDataset([(bi, 1.0, "a"), (arm, 1.0, "a")], layout="union")
    with pytest.raises(InvalidArgumentError, match="source="):
        mix.unnormalize(torch.zeros(4, 16), source="nope")


def test_sharding_and_elastic_resume_are_unchanged_by_a_layout(client) -> None:
    whole = Counter(EpisodeSampler(mixture(client, shard=None)).next_indices(90).tolist())
    seen: Counter[int] = Counter()
    state = None
    for r in range(2):
        sampler = EpisodeSampler(mixture(client, shard=(r, 2)))
        seen.update(k.sample for k in islice(sampler, 11))
        state = sampler.state_dict()
    for r in range(3):
        sampler = EpisodeSampler(mixture(client, shard=(r, 3)))
        sampler.load_state_dict(state)
        seen.update(k.sample for k in sampler)
    assert not whole - seen and sum((seen - whole).values()) <= 2
