"""Weights & Biases: ``log_dataset`` in offline mode; the test reads the run's own files back
(no network) and rebuilds the dataset from what W&B recorded."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import wandb
from support import DEMO_SLICE, TOKEN, WRITE_TOKEN, ServerProcess
from support.lineage import (
    assert_same_samples,
    demo_dataset,
    demo_mixture,
    mixture_digests,
    relabel_success,
    success_filter_dataset,
)
from wandb.proto import wandb_internal_pb2 as pb

import rayform
from rayform import InvalidArgumentError, MixtureURI
from rayform.integrations.wandb import log_dataset
from rayform.torch import EpisodeDataset, EpisodeSampler, MixtureDataset


@pytest.fixture
def wandb_dir(
    tmp_path: Path, client_env: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """Offline W&B writing only under a temp dir, and the demo server for Rayform."""
    root = tmp_path / "wandb"
    root.mkdir()
    for name, value in {
        "WANDB_MODE": "offline",
        "WANDB_DIR": root,
        "WANDB_SILENT": "true",
        "WANDB_CONSOLE": "off",
        "WANDB_CONFIG_DIR": root / "config",
        "WANDB_CACHE_DIR": root / "cache",
        "WANDB_DATA_DIR": root / "data",
        "WANDB_DISABLE_GIT": "true",
    }.items():
        monkeypatch.setenv(name, str(value))
    yield root
    wandb.teardown()  # ends W&B's service process


def read_records(run_dir: Path) -> list[Any]:
    """The records of an offline run's ``run-*.wandb`` log (LevelDB-log framing: 32 KiB
    blocks, 7-byte record headers, chunks FULL=1 / FIRST=2 / MIDDLE=3 / LAST=4)."""
    (path,) = run_dir.glob("run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, chunk, records = 32768, 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pos += 7
        if kind == 0 and n == 0:  # zero padding up to the block's end
            pos += left - 7
            continue
        chunk += data[pos : pos + n]
        pos += n
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(chunk)
            records.append(record)
            chunk = b""
    return records


def logged(run_dir: Path) -> tuple[dict[str, Any], list[Any]]:
    """(config as logged, artifact records) of an offline run."""
    config: dict[str, Any] = {}
    artifacts = []
    for record in read_records(run_dir):
        if record.HasField("config"):
            for item in record.config.update:
                config[item.key] = json.loads(item.value_json)
        if record.HasField("artifact"):
            artifacts.append(record.artifact)
    return config, artifacts


def _train(ds: EpisodeDataset | MixtureDataset, root: Path, **kwargs: Any) -> tuple[Path, Any]:
    run = wandb.init(project="rayform-test", dir=root)
    artifact = log_dataset(run, ds, **kwargs)
    run_dir = Path(run.dir).parent
    run.finish()
    wandb.teardown()  # the service process writes the run log; this waits for its last byte
    return run_dir, artifact


def test_logged_run_rebuilds_the_same_samples(wandb_dir: Path):
    ds = demo_dataset(rayform.Client(), DEMO_SLICE)
    run_dir, artifact = _train(ds, wandb_dir, sampler=EpisodeSampler(ds))
    config, artifacts = logged(run_dir)
    assert config["dataset"]["order"] == EpisodeSampler(ds).describe()  # the window and why

    assert config["dataset"]["uri"] == ds.uri
    assert config["dataset"]["manifest_hash"] == ds.slice.manifest_hash
    assert config["dataset"]["fps"] == 15 and config["dataset"]["obs"] == ds.obs
    (record,) = artifacts
    assert record.name == DEMO_SLICE and record.type == "dataset"
    assert record.use_after_commit, "the run must record the slice as its input"
    assert record.digest == artifact.digest
    (entry,) = record.manifest.contents
    assert entry.digest == ds.slice.manifest_hash
    assert entry.ref == ds.uri.split("?")[0] and entry.size == ds.slice.nbytes
    metadata = json.loads(record.metadata)
    assert metadata["profile"]["segments"] == 2
    assert metadata["sample"]["cam0/rgb"]["dtype"] == "uint8"

    rebuilt = EpisodeDataset.from_uri(config["dataset"]["uri"])
    assert_same_samples(ds, rebuilt)


def test_a_logged_label_filter_rebuilds_its_episodes_after_the_labels_change(
    wandb_dir: Path, write_server: ServerProcess, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("RAYFORM_ENDPOINT", write_server.url)
    monkeypatch.setenv("RAYFORM_TOKEN", WRITE_TOKEN)
    slice_, ids, view, ds = success_filter_dataset(rayform.Client())
    run_dir, _ = _train(ds, wandb_dir, sampler=EpisodeSampler(ds))
    config, _ = logged(run_dir)
    assert f"select=filter:success;labels:{view.labels.hash}" in config["dataset"]["uri"]

    relabel_success(slice_, ids)  # the same filter now keeps other episodes; the run, its own
    rebuilt = EpisodeDataset.from_uri(config["dataset"]["uri"])
    assert set(rebuilt.segment_lengths) == {ids[0], ids[2]}
    assert_same_samples(ds, rebuilt)


def test_logged_mixture_rebuilds_the_same_draws(wandb_dir: Path):
    mix = demo_mixture(rayform.Client(), DEMO_SLICE, readahead_bytes=0)
    run_dir, artifact = _train(mix, wandb_dir)
    config, artifacts = logged(run_dir)

    assert config["dataset"]["uri"] == mix.uri
    assert config["dataset"]["digest"] == MixtureURI.parse(mix.uri).digest
    assert [s["weight"] for s in config["dataset"]["sources"]] == list(mix.weights)
    (record,) = artifacts
    assert (
        record.name == f"mix-{DEMO_SLICE}" and record.type == "dataset" and record.use_after_commit
    )
    assert record.digest == artifact.digest
    entries = sorted(record.manifest.contents, key=lambda e: e.path)
    assert [e.path for e in entries] == [f"0-{DEMO_SLICE}", f"1-{DEMO_SLICE}"]
    assert [e.digest for e in entries] == [ds.slice.manifest_hash for ds in mix.sources]
    assert all(e.ref == ds.uri.split("?")[0] for e, ds in zip(entries, mix.sources, strict=True))
    metadata = json.loads(record.metadata)
    assert [p["weight"] for p in metadata["profile"]["sources"]] == [3, 1]

    rebuilt = MixtureDataset.from_uri(config["dataset"]["uri"], readahead_bytes=0)
    assert mixture_digests(rebuilt) == mixture_digests(mix)


def test_runs_on_the_same_slice_version_share_the_artifact(wandb_dir: Path):
    client = rayform.Client()
    train = demo_dataset(client, DEMO_SLICE)
    other = demo_dataset(client, DEMO_SLICE, segments=None)  # other arguments, same data
    first_dir, first = _train(train, wandb_dir)
    second_dir, second = _train(other, wandb_dir, key="val_dataset")
    assert first.digest == second.digest  # same version in W&B: the lineage graph links them
    assert logged(second_dir)[0]["val_dataset"]["uri"] == other.uri != train.uri
    assert first_dir != second_dir


def test_token_is_in_nothing_wandb_wrote(wandb_dir: Path):
    ds = demo_dataset(rayform.Client(), DEMO_SLICE)
    _train(ds, wandb_dir)
    files = [p for p in wandb_dir.rglob("*") if p.is_file()]
    assert any(p.suffix == ".wandb" for p in files)
    for path in files:
        assert TOKEN.encode() not in path.read_bytes(), f"token leaked into {path}"


def test_log_dataset_refuses_what_is_not_a_dataset(wandb_dir: Path):
    run = wandb.init(project="rayform-test", dir=wandb_dir)
    try:
        with pytest.raises(InvalidArgumentError, match="EpisodeDataset"):
            log_dataset(run, object())
        with pytest.raises(InvalidArgumentError, match="config key"):
            log_dataset(run, demo_dataset(rayform.Client(), DEMO_SLICE), key="a b")
    finally:
        run.finish()
