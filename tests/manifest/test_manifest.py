"""The manifest format and blob byte formats: round trips, canonical bytes, validation."""

from __future__ import annotations

import json

import numpy as np
import pytest
from support.manifests import written

from rayform.errors import IntegrityError, InvalidArgumentError, ManifestError
from rayform.format import (
    MANIFEST_FORMAT_VERSION,
    canonical_json,
    check_hash,
    check_segment_id,
    check_slice_id,
    check_stream_name,
    decode_table,
    decode_timestamps,
    encode_table,
    encode_timestamps,
    hash_bytes,
    load_manifest,
)
from rayform.manifest import BlobRef, Manifest, Segment, Stream, manifest_hash

H1, H2, H3 = ("a" * 64, "b" * 64, "c" * 64)


def make_manifest() -> Manifest:
    video = Stream(
        name="cam0/rgb",
        kind="video",
        blob=BlobRef(H1, 10),
        timestamps=BlobRef(H2, 5),
        rate_hz=30.0,
        shape=(48, 64, 3),
        dtype="uint8",
        count=3,
        t0_ns=0,
        t1_ns=66_000_000,
        codec="h264",
        gop=10,
    )
    pose = Stream(
        name="ee/pose",
        kind="table",
        blob=BlobRef(H3, 7),
        rate_hz=100.0,
        shape=(7,),
        dtype="float32",
        count=2,
        t0_ns=5,
        t1_ns=10_000_005,
        units="m",
        frame="opencv",
        quantity="pose",
    )
    seg = Segment(
        id="seg_0123abcd",
        version=2,
        site="lab-a",
        start_ns=0,
        end_ns=66_000_000,
        streams={"cam0/rgb": video, "ee/pose": pose},
    )
    return Manifest(segments=(seg,), description="test")


def test_manifest_round_trip_is_canonical_and_hash_stable(tmp_path):
    m = make_manifest()
    root, paths = written(m, tmp_path)
    again = load_manifest(root, hash_bytes(root), lambda refs: paths)
    assert tuple(again.segments) == m.segments and again.description == m.description
    assert again.to_bytes() == root == canonical_json(json.loads(root))
    assert b" " not in root.replace(b'"description":"test"', b"")
    assert again.hash == hash_bytes(root) == manifest_hash(m) == manifest_hash(again)
    assert json.loads(root)["format_version"] == MANIFEST_FORMAT_VERSION == 3
    assert set(again.blobs()) == set(m.blobs()) == {H1, H2, H3}
    assert set(m.blobs(["ee/pose"])) == set(again.blobs(["ee/pose"])) == {H3}
    assert Manifest.from_json(m.to_json()) == m  # the in-memory JSON round trip


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda d: d["segments"][0].update(id="../etc"), "malformed segment ID"),
        (lambda d: d["segments"][0]["streams"]["cam0/rgb"].update(kind="audio"), "unknown kind"),
        (lambda d: d["segments"][0]["streams"]["ee/pose"].update(frame="enu"), "unknown frame"),
        (
            lambda d: d["segments"][0]["streams"]["ee/pose"]["blob"].update(hash="zz"),
            "malformed blob hash",
        ),
        (lambda d: d["segments"][0]["streams"]["ee/pose"]["blob"].update(size=-1), "size"),
        (lambda d: d["segments"][0].pop("site"), "schema"),
        (lambda d: d["segments"].append(d["segments"][0]), "twice"),
    ],
)
def test_malformed_segments_raise_manifest_error(mutate, match):
    doc = make_manifest().to_json()
    mutate(doc)
    with pytest.raises(ManifestError, match=match):
        Manifest.from_json(json.loads(json.dumps(doc)))


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda d: d.update(format="other"), "not a Rayform manifest"),
        (lambda d: d.update(format_version=99), "format_version 99 is not supported.*Upgrade"),
        (
            lambda d: d.update(format_version=2),
            "format_version 2 is an older.*rayform-server migrate",
        ),
        (
            lambda d: d.update(format_version=1),
            "format_version 1 is an older.*rayform cache migrate",
        ),
        (lambda d: d.update(page_format="parquet"), "unknown page_format"),
    ],
)
def test_malformed_roots_raise_manifest_error(tmp_path, mutate, match):
    root, paths = written(make_manifest(), tmp_path)
    doc = json.loads(root)
    mutate(doc)
    with pytest.raises(ManifestError, match=match):
        load_manifest(canonical_json(doc), None, lambda refs: paths)


def test_manifest_hash_mismatch_and_garbage(tmp_path):
    root, paths = written(make_manifest(), tmp_path)
    with pytest.raises(ManifestError, match="do not match"):
        load_manifest(root, "0" * 64, lambda refs: paths)
    with pytest.raises(ManifestError, match="not valid JSON"):
        load_manifest(b"\xff{", None, lambda refs: paths)


def test_table_and_timestamp_blobs_round_trip_deterministically():
    t = np.array([1, 5, 9], dtype=np.int64)
    v = np.arange(6, dtype=np.float32).reshape(3, 2)
    data = encode_table(t, v)
    assert data == encode_table(t.copy(), v.copy())
    t2, v2 = decode_table(data)
    np.testing.assert_array_equal(t2, t)
    np.testing.assert_array_equal(v2, v)
    assert v2.dtype == np.float32
    np.testing.assert_array_equal(decode_timestamps(encode_timestamps(t)), t)
    with pytest.raises(IntegrityError):
        decode_table(data[:-3])
    with pytest.raises(IntegrityError, match="strictly increasing"):
        encode_timestamps(np.array([3, 3]))


@pytest.mark.parametrize(
    "bad", ["slc_123", "SLC_7c1e04aa", "slc_7C1E04AA", "slc_../../x", 7, None, "slc_" + "a" * 65]
)
def test_bad_slice_ids(bad):
    with pytest.raises(InvalidArgumentError, match="slice ID"):
        check_slice_id(bad)


def test_good_ids():
    assert check_slice_id("slc_7c1e04aa") == "slc_7c1e04aa"
    assert check_segment_id("seg_00112233") == "seg_00112233"
    assert check_hash(H1) == H1
    assert check_stream_name("joints/position_delta") == "joints/position_delta"
    for bad in ("../x", "a//b", "/abs", "Cam0", "a/../b"):
        with pytest.raises(InvalidArgumentError):
            check_stream_name(bad)
