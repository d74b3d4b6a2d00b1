"""MLflow: a logged Rayform input leads back to the same samples, against a real tracking
server (``mlflow server`` on loopback, SQLite backend), in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import mlflow
import pytest
from support import DEMO_SLICE, SCRIPTS, TOKEN, WRITE_TOKEN, ServerProcess, free_port
from support.lineage import (
    demo_dataset,
    demo_mixture,
    mixture_digests,
    relabel_success,
    sample_digests,
    success_filter_dataset,
)

import rayform
from rayform import MixtureURI, SliceChangedError
from rayform.integrations._common import sample_spec
from rayform.integrations.mlflow import RayformDatasetSource, from_episode_dataset
from rayform.torch import MixtureDataset

TESTS = Path(__file__).resolve().parents[1]
# One `mlflow server` start per module (10-40 s on two busy cores).
pytestmark = pytest.mark.slow


class MlflowServer:
    """``mlflow server`` in a subprocess: SQLite backend and artifacts under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        exe = Path(sys.executable).parent / "mlflow"
        self.log = (root / "server.log").open("wb")
        self.proc = subprocess.Popen(
            [
                str(exe),
                "server",
                "--backend-store-uri",
                f"sqlite:///{root / 'mlflow.db'}",
                "--artifacts-destination",
                str(root / "artifacts"),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                "1",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=root,
        )
        deadline = time.monotonic() + 120  # first start migrates the SQLite schema
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"mlflow server exited: {(root / 'server.log').read_text()[-2000:]}"
                )
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError("mlflow server did not become healthy in 120 s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    # No usage reports from the client or the server: nothing leaves this machine.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
        mp.setenv("DO_NOT_TRACK", "true")
        server = MlflowServer(tmp_path_factory.mktemp("mlflow"))
        yield server
        server.stop()


@pytest.fixture
def tracking(
    mlflow_server: MlflowServer, client_env: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> MlflowServer:
    """MLflow and Rayform both configured through the environment (inherited by children)."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.url)
    mlflow.set_tracking_uri(mlflow_server.url)
    return mlflow_server


def _log_training_run(ds: rayform.torch.EpisodeDataset | rayform.torch.MixtureDataset) -> str:
    with mlflow.start_run() as run:
        sampler = rayform.torch.EpisodeSampler(ds)
        mlflow.log_input(from_episode_dataset(ds, sampler=sampler), context="training")
        mlflow.log_dict(ds.describe(), "dataset.json")
    return run.info.run_id


def _rebuilt(script: str, run_id: str) -> dict[str, Any]:
    """What ``script`` (a rebuild through MLflow's registry) prints for ``run_id``, run in a
    fresh process with ``tests/`` on its path."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    out = subprocess.run(
        [sys.executable, script, run_id],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


_REBUILD = str(
    SCRIPTS / "mlflow_rebuild.py"
)  # the run's dataset through MLflow's registry, as JSON


def test_logged_input_rebuilds_the_same_samples_in_a_fresh_process(tracking: MlflowServer):
    ds = demo_dataset(rayform.Client(), DEMO_SLICE)
    run_id = _log_training_run(ds)

    # What the tracking server stored.
    inputs = mlflow.get_run(run_id).inputs.dataset_inputs
    assert len(inputs) == 1
    logged = inputs[0].dataset
    assert [t.value for t in inputs[0].tags if t.key == "mlflow.data.context"] == ["training"]
    assert logged.name == DEMO_SLICE and logged.source_type == "rayform"
    assert logged.digest.startswith(ds.slice.manifest_hash[:16])
    assert json.loads(logged.source) == {"uri": ds.uri}
    profile = json.loads(logged.profile)
    assert profile["segments"] == 2 and profile["manifest_hash"] == ds.slice.manifest_hash
    assert sum(profile["sites"].values()) == 2 and profile["hours"] > 0
    assert profile["samples"] == len(ds)
    assert profile["order"] == rayform.torch.EpisodeSampler(ds).describe()  # window and why
    schema = json.loads(logged.schema)["mlflow_tensorspec"]
    features = {c["name"]: c for c in json.loads(schema["features"])}
    targets = {c["name"]: c for c in json.loads(schema["targets"])}
    # The schema is read from the manifest; it must match a real sample.
    sample = ds[0]
    for key, (dtype, shape) in sample_spec(ds).items():
        assert str(sample[key].dtype) == f"torch.{dtype}" and tuple(sample[key].shape) == shape
        col = (targets if key.startswith("action") else features)[key]
        assert col["tensor-spec"]["dtype"] == dtype and tuple(col["tensor-spec"]["shape"]) == shape

    # A fresh process finds the source type through the entry point and rebuilds.
    rebuilt = _rebuilt(_REBUILD, run_id)
    assert rebuilt["type"] == "RayformDatasetSource"
    assert rebuilt["uri"] == ds.uri
    assert rebuilt["samples"] == sample_digests(ds)


def test_a_logged_label_filter_rebuilds_its_episodes_after_the_labels_change(
    tracking: MlflowServer, write_server: ServerProcess, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("RAYFORM_ENDPOINT", write_server.url)
    monkeypatch.setenv("RAYFORM_TOKEN", WRITE_TOKEN)
    slice_, ids, view, ds = success_filter_dataset(rayform.Client())
    run_id = _log_training_run(ds)
    assert f"labels:{view.labels.hash}" in ds.uri

    relabel_success(slice_, ids)  # the same filter now keeps other episodes; the run, its own
    rebuilt = _rebuilt(_REBUILD, run_id)
    assert rebuilt["uri"] == ds.uri
    assert rebuilt["samples"] == sample_digests(ds)
    assert {s["meta"]["segment"] for s in ds.__getitems__(range(len(ds)))} == {ids[0], ids[2]}


_REBUILD_MIXTURE = str(SCRIPTS / "mlflow_rebuild_mixture.py")  # the run's mixture, as JSON


def test_logged_mixture_rebuilds_the_same_draws_in_a_fresh_process(tracking: MlflowServer):
    mix = demo_mixture(rayform.Client(), DEMO_SLICE, readahead_bytes=0)
    run_id = _log_training_run(mix)

    (logged_input,) = mlflow.get_run(run_id).inputs.dataset_inputs
    logged = logged_input.dataset
    assert logged.name == DEMO_SLICE and logged.source_type == "rayform"
    assert logged.digest == MixtureURI.parse(mix.uri).digest
    assert json.loads(logged.source) == {"uri": mix.uri}
    profile = json.loads(logged.profile)
    assert [p["weight"] for p in profile["sources"]] == [3, 1]
    assert [p["manifest_hash"] for p in profile["sources"]] == [
        ds.slice.manifest_hash for ds in mix.sources
    ]
    assert profile["num_samples"] == 40 and profile["sources"][1]["segments"] == 2
    # The digest covers the weights: the same sources weighted otherwise log another digest.
    reweighted = MixtureDataset(
        [(ds, 1) for ds in mix.sources], num_samples=40, replacement=True, seed=5
    )
    assert from_episode_dataset(reweighted).digest != logged.digest

    rebuilt = _rebuilt(_REBUILD_MIXTURE, run_id)
    assert rebuilt == {"type": "MixtureDataset", "uri": mix.uri, "samples": mixture_digests(mix)}


def test_source_refuses_a_slice_that_changed(tracking: MlflowServer):
    ds = demo_dataset(rayform.Client(), DEMO_SLICE)
    stale = ds.uri.replace(f"@{ds.slice.manifest_hash}", "@" + "0" * 64)
    source = mlflow.data.get_source(from_episode_dataset(ds))
    assert isinstance(source, RayformDatasetSource) and source.uri == ds.uri
    with pytest.raises(SliceChangedError, match="does not serve the pinned version"):
        RayformDatasetSource.from_json(json.dumps({"uri": stale})).load()


def test_token_is_in_nothing_mlflow_stored(tracking: MlflowServer):
    ds = demo_dataset(rayform.Client(), DEMO_SLICE, segments=None)
    _log_training_run(ds)
    files = [p for p in tracking.root.rglob("*") if p.is_file() and p.name != "server.log"]
    assert any(p.name == "mlflow.db" for p in files) and any(
        p.name == "dataset.json" for p in files
    )
    for path in files:
        assert TOKEN.encode() not in path.read_bytes(), f"token leaked into {path}"


def test_mlflow_resolves_a_dataset_uri_to_the_rayform_source():
    from mlflow.data.dataset_source_registry import resolve_dataset_source

    uri = (
        f"rayform://data.example.com/{DEMO_SLICE}@{'0' * 64}?v=1&action=&action_mode=hold"
        "&fps=15&frame=&horizon=1&obs=cam0/rgb&obs_steps=1&seed=0"
    )
    source = resolve_dataset_source(uri)
    assert isinstance(source, RayformDatasetSource) and source.uri == uri
    assert RayformDatasetSource.from_json(source.to_json()).uri == uri


def test_importing_the_integration_before_mlflow_still_registers_the_source():
    # The entry point names rayform.integrations.mlflow, which imports mlflow.data, which
    # loads the entry points: the source must still register, without a warning.
    uri = (
        f"rayform://data.example.com/{DEMO_SLICE}@{'0' * 64}?v=1&action=&action_mode=hold"
        "&fps=15&frame=&horizon=1&obs=cam0/rgb&obs_steps=1&seed=0"
    )
    code = SCRIPTS / "mlflow_entry_point.py"  # the integration first, then mlflow resolves the URI
    subprocess.run([sys.executable, "-W", "error", str(code), uri], check=True, timeout=120)
