"""Settings from the environment (``rayform._env``): one on/off parser, one default cache dir."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import platformdirs
import pytest

import rayform
from rayform._env import default_cache_dir, env_flag
from rayform.cache import Cache
from rayform.errors import InvalidArgumentError

ON = ["1", "true", "TRUE", "yes", "Yes", "on", "ON", " 1 ", "true\n"]
OFF = ["", "0", "false", "no", "off", "OFF", " 0 "]
NEITHER = ["2", "enabled", "offline", "y", "-1"]


@pytest.mark.parametrize("value", ON)
def test_on_values_turn_every_flag_on(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAYFORM_OFFLINE", value)
    monkeypatch.setenv("RAYFORM_NO_LOCKS", value)
    assert env_flag("RAYFORM_OFFLINE") and env_flag("RAYFORM_NO_LOCKS")
    assert rayform.Client().offline
    assert not Cache("unused").locks


@pytest.mark.parametrize("value", OFF)
def test_off_values_turn_every_flag_off(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAYFORM_OFFLINE", value)
    monkeypatch.setenv("RAYFORM_NO_LOCKS", value)
    assert not env_flag("RAYFORM_OFFLINE") and not env_flag("RAYFORM_NO_LOCKS")
    assert not rayform.Client().offline
    assert Cache("unused").locks


@pytest.mark.parametrize("value", NEITHER)
def test_any_other_value_is_an_error_naming_the_variable(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Read as off, RAYFORM_OFFLINE=2 would go online without a word.
    monkeypatch.setenv("RAYFORM_OFFLINE", value)
    with pytest.raises(InvalidArgumentError) as raised:
        rayform.Client()
    message = str(raised.value)
    assert f"RAYFORM_OFFLINE={value!r}" in message
    assert "1, true, yes or on" in message and "0, false, no, off or empty" in message
    monkeypatch.delenv("RAYFORM_OFFLINE")
    monkeypatch.setenv("RAYFORM_NO_LOCKS", value)
    with pytest.raises(InvalidArgumentError, match="RAYFORM_NO_LOCKS="):
        Cache("unused")


def test_unset_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAYFORM_NO_LOCKS", raising=False)
    assert not env_flag("RAYFORM_NO_LOCKS") and Cache("unused").locks


def test_default_cache_dir_follows_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RAYFORM_CACHE_DIR", str(tmp_path / "mine"))
    assert default_cache_dir() == tmp_path / "mine"
    assert rayform.Client().cache_dir == tmp_path / "mine"
    for unset in (None, ""):
        if unset is None:
            monkeypatch.delenv("RAYFORM_CACHE_DIR")
        else:
            monkeypatch.setenv("RAYFORM_CACHE_DIR", unset)
        assert default_cache_dir() == Path(platformdirs.user_cache_dir("rayform"))


def test_the_cli_and_the_client_agree_on_the_cache_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RAYFORM_CACHE_DIR", str(tmp_path / "shared" / ".." / "c"))
    cli = subprocess.run(
        [sys.executable, "-m", "rayform", "cache", "path"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(cli) == rayform.Client().cache_dir
