"""rayform.Client against the real server stub: resolving slices, typed errors, secrets, fork."""

from __future__ import annotations

import logging
import multiprocessing
import pickle
from pathlib import Path

import pytest
from support import DEMO_SLICE, TOKEN, ServerProcess, forbid_network

import rayform
from rayform.errors import (
    AccessDeniedError,
    InvalidArgumentError,
    NotFoundError,
    OfflineError,
    TransportError,
)
from rayform.format import hash_file


def test_get_returns_the_demo_slice(client_env: ServerProcess, isolated_env: Path) -> None:
    client = rayform.Client()
    assert client.cache_dir == isolated_env
    slice_ = client.slices.get(DEMO_SLICE)
    assert isinstance(slice_, rayform.Slice) and slice_.id == DEMO_SLICE
    assert len(slice_.segments) == 4
    assert {"cam0/rgb", "wrist/rgb", "joints/position", "joints/position_delta"} <= set(
        slice_.streams
    )
    assert slice_.manifest.hash == slice_.manifest_hash
    assert DEMO_SLICE in repr(slice_) and "segments=4" in repr(slice_)
    assert "<table>" in slice_._repr_html_() and "cam0/rgb" in slice_._repr_html_()
    # the manifest is cached under its hash and the resolution remembered for offline use
    assert (isolated_env / "manifests" / slice_.manifest_hash[:2] / slice_.manifest_hash).is_file()
    assert [r["id"] for r in client.cache.refs()] == [DEMO_SLICE]
    assert [s["id"] for s in client.slices.list()] == [DEMO_SLICE]


def test_unknown_slice_is_not_found(client_env: ServerProcess) -> None:
    with pytest.raises(NotFoundError, match="slc_0000000f was not found.*rayform slices ls"):
        rayform.Client().slices.get("slc_0000000f")


@pytest.mark.parametrize("bad", ["slc_XYZ", "7c1e04aa", "slc_7c1e04aa/../x", "", None])
def test_malformed_id_fails_without_a_request(bad: object, monkeypatch: pytest.MonkeyPatch) -> None:
    forbid_network(monkeypatch, "a request was made for a malformed ID")
    client = rayform.Client(endpoint="http://127.0.0.1:9", token=TOKEN)
    with pytest.raises(InvalidArgumentError, match="malformed slice ID"):
        client.slices.get(bad)  # type: ignore[arg-type]


def test_wrong_token_is_access_denied_and_never_shown(
    client_env: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrong = "wrong-token-9d8c7b6a5f"
    client = rayform.Client(token=wrong)
    with pytest.raises(AccessDeniedError, match="RAYFORM_TOKEN") as info:
        client.slices.get(DEMO_SLICE)
    assert wrong not in str(info.value) and TOKEN not in str(info.value)
    monkeypatch.delenv("RAYFORM_TOKEN")
    with pytest.raises(AccessDeniedError):  # no token at all
        rayform.Client().slices.list()


def test_token_absent_from_repr_errors_and_logs(
    client_env: ServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    client = rayform.Client()
    assert "token=***" in repr(client) and TOKEN not in repr(client)
    slice_ = client.slices.get(DEMO_SLICE)
    assert TOKEN not in repr(slice_) and TOKEN not in slice_._repr_html_()
    dead = rayform.Client(endpoint="http://127.0.0.1:9", attempts=2)
    with pytest.raises(TransportError) as info:
        dead.slices.get(DEMO_SLICE)
    assert TOKEN not in str(info.value)
    with pytest.raises(NotFoundError) as info2:
        client.slices.get("slc_0000000f")
    assert TOKEN not in str(info2.value)
    assert TOKEN not in caplog.text
    assert "Retrying resolving slice" in caplog.text  # the retry was logged, without the token


def test_client_construction_opens_no_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    forbid_network(monkeypatch, "connected at construction")
    client = rayform.Client(endpoint="http://127.0.0.1:9", token=TOKEN)
    assert client._transport_obj is None
    pickle.loads(pickle.dumps(client))


def test_offline_env_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAYFORM_OFFLINE", "1")
    client = rayform.Client(endpoint="http://127.0.0.1:9")
    assert client.offline
    with pytest.raises(OfflineError, match=f"rayform pull {DEMO_SLICE}"):
        client.slices.get(DEMO_SLICE)


def _child_fetch(client: rayform.Client, queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    try:
        slice_ = client.slices.get(DEMO_SLICE)
        ref = slice_.segments[1].streams["joints/position"].blob
        queue.put(hash_file(slice_.blob_path(ref)) == ref.hash)
    except BaseException as exc:  # reported to the parent
        queue.put(repr(exc))


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_client_works_across_fork_and_pickle(client_env: ServerProcess, method: str) -> None:
    client = rayform.Client()
    client.slices.get(DEMO_SLICE)  # the parent has an open connection now
    assert client.connected
    clone = pickle.loads(pickle.dumps(client))
    assert not clone.connected
    ctx = multiprocessing.get_context(method)
    queue = ctx.Queue()
    proc = ctx.Process(target=_child_fetch, args=(client, queue))
    proc.start()
    result = queue.get(timeout=60)
    proc.join(30)
    assert result is True, result
    # and the parent's connection still works after the child used its own
    ref = client.slices.get(DEMO_SLICE).segments[2].streams["joints/position"].blob
    assert hash_file(client.ensure_blob(DEMO_SLICE, ref)) == ref.hash


def test_client_is_a_context_manager_that_closes_and_can_reopen(client_env) -> None:
    with rayform.Client() as client:
        assert client.slices.get(DEMO_SLICE).id == DEMO_SLICE
        assert client.connected
    assert not client.connected  # connections closed on exit
    assert client.slices.get(DEMO_SLICE).id == DEMO_SLICE  # and reopened on the next use
    client.close()
