"""Every pattern that checks a name from the wire or the user matches the whole string:
a trailing newline (which ``$`` accepts) or any other suffix is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from rayform.errors import InvalidArgumentError
from rayform.format import (
    HASH_RE,
    SEGMENT_ID_RE,
    SLICE_ID_RE,
    STREAM_NAME_RE,
    check_hash,
    check_segment_id,
    check_slice_id,
    check_stream_name,
)
from rayform.uri._selexpr import parse_selection
from rayform.view._api import _PREFIX_RE, _SITE_RE  # white-box: the view's own patterns
from rayform.view._server import _RANGE_RE
from rayform_server._blobfile import check_ranges
from rayform_server.app import ApiError
from rayform_server.auth import load_tokens_file
from rayform_server.staging import BATCH_RE

H = "ab" * 32
GOOD = {"slice": "slc_7c1e04aa", "segment": "seg_0a1b2c3d", "hash": H, "stream": "cam0/rgb"}
CHECKS = {
    "slice": check_slice_id,
    "segment": check_segment_id,
    "hash": check_hash,
    "stream": check_stream_name,
}
PATTERNS = {
    "slice": SLICE_ID_RE,
    "segment": SEGMENT_ID_RE,
    "hash": HASH_RE,
    "stream": STREAM_NAME_RE,
}
SUFFIXES = ["\n", "\r\n", "\n\n", "\nx", "\x00", " ", "\t"]


@pytest.mark.parametrize("kind", sorted(GOOD))
def test_good_values_pass(kind: str) -> None:
    assert CHECKS[kind](GOOD[kind]) == GOOD[kind]


@pytest.mark.parametrize("suffix", SUFFIXES, ids=repr)
@pytest.mark.parametrize("kind", sorted(GOOD))
def test_a_trailing_newline_is_refused(kind: str, suffix: str) -> None:
    value = GOOD[kind] + suffix
    with pytest.raises(InvalidArgumentError):
        CHECKS[kind](value)
    # The exported patterns refuse it whichever method a caller uses.
    for method in ("match", "fullmatch", "search"):
        assert getattr(PATTERNS[kind], method)(value) is None, (kind, method)


@pytest.mark.parametrize("kind", sorted(GOOD))
def test_a_leading_newline_is_refused(kind: str) -> None:
    with pytest.raises(InvalidArgumentError):
        CHECKS[kind]("\n" + GOOD[kind])


def test_the_page_check_regex_is_anchored_at_the_end_of_text() -> None:
    # The v2 page check runs RE2 (pyarrow), whose "$" never matches before a final newline.
    ids = pa.array(["seg_0a1b2c3d", "seg_0a1b2c3d\n"])
    assert pc.match_substring_regex(ids, r"^seg_[0-9a-f]{8,64}$").to_pylist() == [True, False]


@pytest.mark.parametrize(
    "text", ["sites:lab-a\n", "segments:seg_0a1b2c3d\n", "segments:seg_0a1b2c3d%0A"]
)
def test_selection_expressions_refuse_a_newline(text: str) -> None:
    with pytest.raises(InvalidArgumentError):
        parse_selection(text)


def test_wandb_config_key_refuses_a_newline() -> None:
    pytest.importorskip("wandb")
    from rayform.integrations.wandb import _KEY_RE  # needs the optional wandb package

    assert _KEY_RE.fullmatch("dataset") and not _KEY_RE.fullmatch("dataset\n")


def test_staging_batch_names_refuse_a_newline() -> None:
    assert BATCH_RE.match("run-0412") and not BATCH_RE.match("run-0412\n")


@pytest.mark.parametrize(
    "entry",
    [
        {"name": "ops\n", "token": "t" * 24, "slices": ["*"]},
        {"name": "ops", "token": "t" * 24 + "\n", "slices": ["*"]},
        {"name": "ops", "token": "t" * 24, "slices": ["slc_*\n"]},
    ],
)
def test_tokens_file_fields_refuse_a_newline(tmp_path: Path, entry: dict[str, object]) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"tokens": [entry]}))
    with pytest.raises(InvalidArgumentError):
        load_tokens_file(path)


def test_range_header_refuses_a_newline() -> None:
    assert check_ranges("bytes=0-9", 100) == "bytes=0-9"
    with pytest.raises(ApiError):
        check_ranges("bytes=0-9\n1", 100)


def test_view_patterns_refuse_a_newline() -> None:
    for pattern, good in (
        (_SITE_RE, "lab-zurich"),
        (_PREFIX_RE, "seg_2a"),
        (_RANGE_RE, "bytes=0-9"),
    ):
        assert pattern.fullmatch(good) and pattern.match(good)
        for method in ("match", "fullmatch"):
            assert getattr(pattern, method)(good + "\n") is None, (pattern.pattern, method)
