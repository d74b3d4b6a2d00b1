"""Dataset URIs: canonical form, rebuild, a rebuilt slice detected, offline, no token."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import DEMO_SLICE, TOKEN, ServerProcess, forbid_network
from support.lineage import (
    ACTION,
    assert_same_samples,
    copy_root,
    demo_dataset,
    rebuild_slice_without_first_segment,
)

import rayform
from rayform import DatasetURI, InvalidArgumentError, OfflineError, SliceChangedError
from rayform.torch import EpisodeDataset

HASH = "ab" * 32
ARGS = "action=&action_mode=hold&fps=15&frame=&horizon=1&obs=a&obs_steps=1&seed=0"


@pytest.fixture(scope="module")
def own_server(
    demo_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """A server on a private copy of the demo root, whose slice a test may rebuild."""
    server = ServerProcess(copy_root(demo_root, tmp_path_factory.mktemp("own") / "root"))
    yield server
    server.stop()


def test_uri_is_canonical_and_rebuilds_the_same_samples(client_env: ServerProcess):
    ds = demo_dataset(rayform.Client(), DEMO_SLICE)
    uri = ds.uri
    port = client_env.port
    assert uri.startswith(
        f"rayform+http://127.0.0.1:{port}/{DEMO_SLICE}@{ds.slice.manifest_hash}?v=1&"
    )
    segs = ",".join(s.id for s in ds.segments)
    assert uri.endswith(
        f"?v=1&action={ACTION}&action_mode=hold&fps=15&frame=ros&horizon=4"
        f"&obs=cam0/rgb,wrist/rgb,joints/position&obs_steps=1&seed=3&segments={segs}"
    )
    assert str(DatasetURI.parse(uri)) == uri
    assert ds.describe()["uri"] == uri
    assert TOKEN not in uri and TOKEN not in json.dumps(ds.describe())

    again = EpisodeDataset.from_uri(uri)
    assert again.uri == uri
    assert [s.id for s in again.segments] == [s.id for s in ds.segments]
    assert_same_samples(ds, again)


def test_every_segment_is_no_segments_parameter(client_env: ServerProcess):
    ds = demo_dataset(rayform.Client(), DEMO_SLICE, segments=None)
    assert "segments=" not in ds.uri
    assert len(EpisodeDataset.from_uri(ds.uri)) == len(ds)


def test_options_pass_through_but_sample_arguments_do_not(client_env: ServerProcess):
    uri = demo_dataset(rayform.Client(), DEMO_SLICE).uri
    ds = EpisodeDataset.from_uri(uri, shard=(1, 2), decoder_cache_size=2)
    assert ds.sharded and ds.decoder_cache_size == 2
    with pytest.raises(InvalidArgumentError, match="fps") as info:
        EpisodeDataset.from_uri(uri, fps=30)
    assert "transform" in str(info.value)


def test_parse_accepts_any_order_and_prints_canonically():
    scrambled = (
        f"rayform://data.example.com:8443/api/slc_7c1e04aa@{HASH}?seed=0&obs=a/b,c"
        "&v=1&fps=7.50&horizon=16&frame=&action=&obs_steps=2&action_mode=linear"
    )
    parsed = DatasetURI.parse(scrambled)
    assert parsed.endpoint == "https://data.example.com:8443/api"
    assert parsed.obs == ("a/b", "c") and parsed.action is None and parsed.frame is None
    assert parsed.fps == 7.5 and parsed.obs_steps == 2 and parsed.segments is None
    assert str(parsed) == (
        f"rayform://data.example.com:8443/api/slc_7c1e04aa@{HASH}?v=1&action="
        "&action_mode=linear&fps=7.5&frame=&horizon=16&obs=a/b,c&obs_steps=2&seed=0"
    )
    assert DatasetURI.parse(str(parsed)) == parsed
    no_host = DatasetURI.parse(
        str(parsed).replace("rayform://data.example.com:8443/api", "rayform://")
    )
    assert no_host.endpoint is None and str(no_host).startswith("rayform:///slc_7c1e04aa@")


def test_digest_ignores_the_host_and_follows_data_and_arguments():
    base = DatasetURI(
        endpoint="https://a.example.com",
        slice_id="slc_7c1e04aa",
        manifest_hash=HASH,
        obs=("cam0/rgb",),
        action=None,
        fps=15,
    )
    other_host = DatasetURI.parse(str(base).replace("a.example.com", "b.example.com"))
    assert other_host.digest == base.digest
    assert base.digest.startswith(HASH[:16]) and len(base.digest) <= 36
    other_fps = DatasetURI.parse(str(base).replace("fps=15", "fps=10"))
    assert other_fps.digest != base.digest and other_fps.digest[:16] == base.digest[:16]


@pytest.mark.parametrize(
    ("uri", "match"),
    [
        (f"https://h/slc_7c1e04aa@{HASH}?v=1", "not a dataset URI"),
        ("rayform://h/slc_7c1e04aa?v=1", "must end in /slc_...@MANIFEST_HASH"),
        (f"rayform://user:{TOKEN}@h/slc_7c1e04aa@{HASH}?v=1", "never holds credentials"),
        (
            f"rayform://h/slc_7c1e04aa@{HASH}?v=6&obs=a",
            "v=6; this rayform reads v=1, v=2, v=3, v=4 and v=5",
        ),  # v=5: labels
        (f"rayform://h/slc_7c1e04aa@{HASH}?obs=a", "starts its query with v=1"),
        (f"rayform://h/slc_7c1e04aa@{HASH}?v=1&obs=a&select=sites:x", "select= under v=1"),
        (f"rayform://h/slc_7c1e04aa@{HASH}?v=2&{ARGS}&select=site:x", "KEY one of end_ns"),
        (f"rayform://h/slc_7c1e04aa@{HASH}?v=2&{ARGS}&select=sites:", "lists nothing"),
        (f"rayform://h/slc_7c1e04aa@{HASH}?v=2&obs=a&mix=1:x", "mixture URI"),
        ("rayform:///mix?v=2&mix=1:x", "MixtureDataset.from_uri"),
        (f"rayform://h/slc_7c1e04aa@{HASH}?v=1&obs=a&colour=red", "unknown parameter"),
        (f"rayform://h/slc_7c1e04aa@{HASH}?v=1&obs=a", "lacks action, action_mode, fps"),
        (f"rayform://h/slc_7c1e04aa@{HASH[:-1]}?v=1", "manifest hash"),
        (f"rayform://h/slc_7c1e04aa@{HASH}?v=1&v=1", "twice"),
        (f"rayform://h/slc_7c1e04aa@{HASH}?v=4&{ARGS}&labels={HASH}", "labels= under v=4"),
        (f"rayform://h/slc_7c1e04aa@{HASH}?v=5&{ARGS}&labels={HASH}", "pinned exactly when"),
        (f"rayform://h/slc_7c1e04aa@{HASH}?v=5&{ARGS}&within=events", "pinned exactly when"),
        (
            f"rayform://h/slc_7c1e04aa@{HASH}?v=5&{ARGS}&labels={HASH}&within=Bad:x",
            "not KEY or KEY:NAME",
        ),
        (
            f"rayform://h/slc_7c1e04aa@{HASH}?v=5&{ARGS.replace('obs=a', 'obs=label:Ev')}",
            "malformed stream",
        ),
    ],
)
def test_parse_refuses_what_it_cannot_rebuild_exactly(uri: str, match: str):
    with pytest.raises(InvalidArgumentError, match=match) as info:
        DatasetURI.parse(uri)
    assert TOKEN not in str(info.value)


def test_token_is_never_in_a_uri_even_from_an_endpoint_with_credentials():
    uri = DatasetURI(
        endpoint=f"https://me:{TOKEN}@h.example.com/",
        slice_id="slc_7c1e04aa",
        manifest_hash=HASH,
        obs=("a",),
        action=None,
        fps=1,
    )
    assert TOKEN not in str(uri) and str(uri).startswith("rayform://h.example.com/slc_7c1e04aa@")


def test_environment_token_is_not_sent_to_another_server(
    client_env: ServerProcess, monkeypatch: pytest.MonkeyPatch
):
    uri = demo_dataset(rayform.Client(), DEMO_SLICE).uri
    monkeypatch.setenv("RAYFORM_ENDPOINT", "https://elsewhere.example.com")
    with pytest.raises(InvalidArgumentError, match="RAYFORM_TOKEN is only sent to the latter"):
        EpisodeDataset.from_uri(uri)
    # With an explicit client the caller chose the server: it rebuilds.
    client = rayform.Client(endpoint=client_env.url)
    assert len(EpisodeDataset.from_uri(uri, client=client)) > 0


def test_rebuilt_slice_rebuilds_online_by_hash_and_offline_from_the_cache(
    own_server: ServerProcess, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    monkeypatch.setenv("RAYFORM_ENDPOINT", own_server.url)
    monkeypatch.setenv("RAYFORM_TOKEN", TOKEN)
    ds = demo_dataset(rayform.Client(), DEMO_SLICE)
    for i in range(len(ds)):  # fetch every blob it reads into the cache
        ds[i]
    uri, old = ds.uri, ds.slice.manifest_hash

    new = rebuild_slice_without_first_segment(own_server.root, DEMO_SLICE)
    assert new != old
    # Online, from a cold cache: the server hands out the pinned manifest by hash, and the
    # blobs only the old version names (its first segment's) through the slice.
    cold = rayform.Client(cache_dir=tmp_path / "cold")
    again = EpisodeDataset.from_uri(uri, client=cold)
    assert again.slice.manifest_hash == old and again.uri == uri
    assert_same_samples(ds, again)
    # The current version is still what a fresh resolve gives, in the cache too.
    assert cold.slices.get(DEMO_SLICE).manifest_hash == new
    assert cold.cache.get_ref(None, DEMO_SLICE)["manifest"] == new  # type: ignore[index]

    # Offline, the cache still holds the pinned manifest and blobs: the same samples.
    monkeypatch.setenv("RAYFORM_OFFLINE", "1")
    forbid_network(monkeypatch)
    again = EpisodeDataset.from_uri(uri)
    assert again.slice.manifest_hash == old
    assert_same_samples(ds, again)


def test_a_withdrawn_version_is_refused_online(
    demo_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    root = copy_root(demo_root, tmp_path / "root")
    server = ServerProcess(root)
    try:
        client = rayform.Client(endpoint=server.url, token=TOKEN, cache_dir=tmp_path / "cache")
        ds = demo_dataset(client, DEMO_SLICE)
        old = ds.slice.manifest_hash
        new = rebuild_slice_without_first_segment(root, DEMO_SLICE)
        (root / "history" / DEMO_SLICE / old).unlink()  # the operator withdraws the old version
        with pytest.raises(SliceChangedError) as info:
            EpisodeDataset.from_uri(ds.uri, client=client)
        message = str(info.value)
        assert old[:12] in message and new[:12] in message and "RAYFORM_OFFLINE=1" in message
        assert isinstance(info.value, rayform.NotFoundError) and TOKEN not in message
    finally:
        server.stop()


def test_offline_rebuild_from_the_cache(client_env: ServerProcess, monkeypatch: pytest.MonkeyPatch):
    ds = demo_dataset(rayform.Client(), DEMO_SLICE, segments=None)
    ds.slice.pull(streams=[*ds.obs, ACTION])
    monkeypatch.setenv("RAYFORM_OFFLINE", "1")
    monkeypatch.delenv("RAYFORM_ENDPOINT")
    forbid_network(monkeypatch)
    again = EpisodeDataset.from_uri(ds.uri)
    assert again.uri == ds.uri
    assert_same_samples(ds, again)


def test_offline_without_the_pinned_manifest_names_the_fix(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RAYFORM_OFFLINE", "1")
    forbid_network(monkeypatch)
    uri = f"rayform+http://127.0.0.1:9/{DEMO_SLICE}@{HASH}?v=1&action=&action_mode=hold&fps=15&frame=&horizon=1&obs=cam0/rgb&obs_steps=1&seed=0"
    with pytest.raises(OfflineError, match=f"rayform pull {DEMO_SLICE} --manifest {HASH}"):
        EpisodeDataset.from_uri(uri)


def test_constructed_uri_equals_its_parse():
    uri = DatasetURI(
        endpoint="http://127.0.0.1:8765/",
        slice_id="slc_7c1e04aa",
        manifest_hash=HASH,
        obs=["cam0/rgb"],
        action="joints/position_delta",
        fps=15,
        segments=["seg_0a1b2c3d"],
    )
    assert DatasetURI.parse(str(uri)) == uri and hash(DatasetURI.parse(str(uri))) == hash(uri)
    assert str(uri).startswith(f"rayform+http://127.0.0.1:8765/slc_7c1e04aa@{HASH}?v=1&")
    assert uri.dataset_kwargs()["segments"] == ["seg_0a1b2c3d"]


def test_uri_without_a_host_uses_the_configured_server(client_env: ServerProcess):
    ds = demo_dataset(rayform.Client(), DEMO_SLICE)
    hostless = "rayform:///" + ds.uri.split("/", 3)[3]
    assert hostless.startswith(f"rayform:///{DEMO_SLICE}@")
    again = EpisodeDataset.from_uri(hostless)
    assert again.slice.client.endpoint == client_env.url
    assert again.uri == ds.uri  # the rebuilt dataset names the server it was read from


def test_a_uri_that_reads_labels_is_version_5_and_round_trips():
    uri = DatasetURI(
        endpoint=None,
        slice_id=DEMO_SLICE,
        manifest_hash=HASH,
        obs=("joints/position", "label:events"),
        action=ACTION,
        fps=15,
        labels="cd" * 32,
        within="events:grasp failed",
    )
    text = str(uri)
    assert "?v=5&" in text and "obs=joints/position,label:events" in text
    assert f"labels={'cd' * 32}" in text and text.endswith("within=events:grasp%20failed")
    assert DatasetURI.parse(text) == uri and str(DatasetURI.parse(text)) == text
    kwargs = uri.dataset_kwargs()
    assert kwargs["labels"] == "cd" * 32 and kwargs["within"] == "events:grasp failed"
