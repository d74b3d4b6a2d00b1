"""Mixture URIs (``rayform:///mix?v=2&mix=W:URI&...``): canonical, rebuilt to the same draws."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from support import DEMO_SLICE, TOKEN, ServerProcess
from support.lineage import demo_mixture, mixture_digests

import rayform
from rayform import DatasetURI, InvalidArgumentError, MixtureURI
from rayform.torch import EpisodeDataset, MixtureDataset

# Read-ahead off: it is not what these tests check, and it does not change samples.
NO_READAHEAD = {"readahead_bytes": 0}


def test_mixture_uri_rebuilds_the_same_draws(client_env: ServerProcess):
    mix = demo_mixture(rayform.Client(), DEMO_SLICE, **NO_READAHEAD)
    uri = mix.uri
    first, second = (quote(ds.uri, safe="") for ds in mix.sources)
    assert (
        uri
        == f"rayform:///mix?v=2&mix=3:{first}&mix=1:{second}&num_samples=40&replacement=1&seed=5"
    )
    assert "select=sites" in mix.sources[0].uri
    again = MixtureDataset.from_uri(uri, **NO_READAHEAD)
    assert (
        again.uri == uri and again.weights == mix.weights and list(again.quotas) == list(mix.quotas)
    )
    assert mixture_digests(again) == mixture_digests(mix)
    assert mix.describe()["uri"] == uri and TOKEN not in uri


def test_options_go_to_every_source(client_env: ServerProcess):
    mix = demo_mixture(rayform.Client(), DEMO_SLICE)
    again = MixtureDataset.from_uri(mix.uri, client=rayform.Client(), decoder_cache_size=2)
    assert all(ds.decoder_cache_size == 2 for ds in again.sources)
    with pytest.raises(InvalidArgumentError, match="only transform"):
        MixtureDataset.from_uri(mix.uri, fps=10)


def test_parse_is_canonical_and_the_digest_follows_weights_and_data():
    src = (
        "rayform://h/slc_7c1e04aa@" + "ab" * 32 + "?v=1&action=&action_mode=hold&fps=15&frame="
        "&horizon=1&obs=a&obs_steps=1&seed=0"
    )
    other = src.replace("ab" * 32, "cd" * 32)
    item = quote(src, safe="")
    uri = MixtureURI.parse(
        f"rayform:///mix?v=2&mix=0.5:{item}&mix=2:{quote(other, safe='')}"
        "&seed=1&replacement=0&num_samples=7"
    )
    assert str(uri).endswith("&num_samples=7&replacement=0&seed=1")
    assert MixtureURI.parse(str(uri)) == uri
    assert uri.sources[0] == (0.5, DatasetURI.parse(src))
    assert uri.digest.startswith("mix-") and len(uri.digest) <= 36
    reweighted = MixtureURI(((1.0, uri.sources[0][1]), uri.sources[1]), num_samples=7, seed=1)
    moved = MixtureURI(
        (uri.sources[0], (2.0, DatasetURI.parse(other.replace("cd" * 32, "ef" * 32)))),
        num_samples=7,
        seed=1,
    )
    assert len({uri.digest, reweighted.digest, moved.digest}) == 3


@pytest.mark.parametrize(
    ("uri", "match"),
    [
        ("rayform:///mix?v=4&num_samples=1&replacement=0&seed=0", "v=4"),  # v=3: layouts (issue 23)
        ("rayform:///mix?v=2&num_samples=1&replacement=0&seed=0", "names no source"),
        ("rayform:///mix?v=2&mix=1&num_samples=1&replacement=0&seed=0", "mix=WEIGHT:SOURCE_URI"),
        ("rayform:///mix?v=2&mix=1:x&num_samples=1&replacement=0&seed=0", "not a dataset URI"),
        ("rayform:///mix?v=2&colour=red&num_samples=1&replacement=0&seed=0", "unknown parameter"),
        ("rayform:///mix?v=2&replacement=0&seed=0", "lacks num_samples"),
    ],
)
def test_parse_refuses_what_it_cannot_rebuild_exactly(uri: str, match: str):
    with pytest.raises(InvalidArgumentError, match=match):
        MixtureURI.parse(uri)


def test_episode_dataset_points_a_mixture_uri_to_mixture_dataset():
    with pytest.raises(InvalidArgumentError, match="MixtureDataset.from_uri"):
        EpisodeDataset.from_uri("rayform:///mix?v=2&num_samples=1&replacement=0&seed=0")
