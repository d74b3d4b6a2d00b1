"""The rendition choice of a columnar manifest (format version 3) answered from its columns:
``Slice.blobs(image_size=...)`` gives the same dict as a pass over the segments with
``choose_rendition``, for every size, mode, per-camera size, view and stream filter, raises the
same errors, and builds no ``Segment``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest

from rayform import format as wire
from rayform._resolution import check_image_size, choose_rendition, resolution_blobs
from rayform.errors import InvalidArgumentError
from rayform.format import hash_bytes
from rayform.manifest import BlobRef, Manifest, Rendition, Segment, Segments, Stream
from rayform.slice import Slice

CAM = "cam0/rgb"  # 480x640, renditions 120x160 and 240x320 in every segment
WRIST = "wrist/rgb"  # 240x320, a 48x64 rendition in even segments only, absent in some
SIDE = "side/rgb"  # 96x128, never a rendition
JOINTS = "joints/position"  # a table
SHARED_TS = BlobRef("ab" * 32, 2400)  # one timestamps blob shared by every side camera
SIZES = [(32, 32), (60, 80), (100, 300), (224, 224), (240, 320), (300, 100), (480, 640), (900, 900)]


def _digest(*parts: object) -> str:
    return hash_bytes("/".join(map(str, parts)).encode())


def _camera(i: int, name: str, h: int, w: int, renditions: Sequence[tuple[int, int]]) -> Stream:
    return Stream(
        name=name,
        kind="video",
        blob=BlobRef(_digest(i, name), 10_000 + 7 * i),
        rate_hz=30.0,
        shape=(h, w, 3),
        dtype="uint8",
        count=300,
        t0_ns=0,
        t1_ns=10**10,
        timestamps=SHARED_TS if name == SIDE else BlobRef(_digest(i, name, "ts"), 2400),
        codec="h264",
        gop=30,
        renditions=tuple(
            Rendition(BlobRef(_digest(i, name, rh), 1000 + rh + i), rh, rw) for rh, rw in renditions
        ),
    )


def _segment(i: int) -> Segment:
    streams = {
        CAM: _camera(i, CAM, 480, 640, [(120, 160), (240, 320)]),
        JOINTS: Stream(
            name=JOINTS,
            kind="table",
            blob=BlobRef(_digest(i, JOINTS), 4000 + i),
            rate_hz=30.0,
            shape=(7,),
            dtype="float32",
            count=300,
            t0_ns=0,
            t1_ns=10**10,
        ),
    }
    if i % 5 != 4:
        streams[WRIST] = _camera(i, WRIST, 240, 320, [(48, 64)] if i % 2 == 0 else [])
    if i % 3 == 0:
        streams[SIDE] = _camera(i, SIDE, 96, 128, [])
    start = i * 10**11
    return Segment(
        id=f"seg_{i:08x}",
        version=1,
        site="lab-a" if i % 2 else "lab-b",
        start_ns=start,
        end_ns=start + 10**10,
        streams=streams,
    )


def _columnar(segments: list[Segment], folder: Path, page_rows: int) -> Any:
    table = wire.segments_to_table(segments)
    pages = wire.table_to_pages(table, page_rows)
    root = wire.build_root(table, pages, "rendition choice", page_rows)
    paths = []
    for page in pages:
        path = folder / hash_bytes(page)
        path.write_bytes(page)
        paths.append(path)
    return wire.load_manifest(root, hash_bytes(root), lambda refs: paths)


@pytest.fixture(scope="module")
def segments() -> list[Segment]:
    return [_segment(i) for i in range(50)]


@pytest.fixture(scope="module")
def v3(segments: list[Segment], tmp_path_factory: pytest.TempPathFactory) -> Any:
    # Pages of 16 rows: the stream rows span several pages, as in a large manifest.
    m = _columnar(segments, tmp_path_factory.mktemp("rcol"), page_rows=16)
    assert m.format_version == 3 and len(m.segments.positions()) == len(segments)
    return m


@pytest.fixture(scope="module")
def built(v3: Any, segments: list[Segment]) -> list[Segment]:
    """The columnar table's rows as ``Segment`` objects (streams in row order: by name), what
    the per-segment path iterated; built before any test forbids building them."""
    rows = list(v3.segments)
    assert rows == segments
    return rows


@pytest.fixture()
def slice_(v3: Any) -> Slice:
    return Slice("rcol", v3.hash, v3, None)  # type: ignore[arg-type]


def _expected(
    segments: Iterable[Segment],
    names: Sequence[str] | None,
    image_size: Any,
    resize: str,
) -> dict[str, BlobRef]:
    """The dict a pass over ``Segment`` objects gives (what the per-segment path did)."""
    segments = list(segments)
    kinds: dict[str, str] = {}
    for seg in segments:
        for name, stream in seg.streams.items():
            if names is None or name in names:
                kinds.setdefault(name, stream.kind)
    cameras = [n for n, k in sorted(kinds.items()) if k == "video"]
    targets = check_image_size(image_size, resize, cameras) or {}
    out: dict[str, BlobRef] = {}
    for seg in segments:
        for name, stream in seg.streams.items():
            if name not in kinds:
                continue
            target = targets.get(name)
            if stream.timestamps is None or target is None:
                refs = stream.blobs()
            else:
                chosen = choose_rendition(stream, target)
                refs = [stream.blob if chosen is None else chosen.blob, stream.timestamps]
            out.update((r.hash, r) for r in refs)
    return out


def _same(got: dict[str, BlobRef], want: dict[str, BlobRef]) -> None:
    assert got == want
    assert list(got) == list(want)  # the same order too (a pull fetches in it)


@pytest.fixture()
def no_segment_objects(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if anything builds (or iterates to) a ``Segment`` of a columnar table."""

    def refuse(self: Segments, i: object) -> Segment:
        raise AssertionError("the columnar path built a Segment")

    monkeypatch.setattr(Segments, "__getitem__", refuse)
    monkeypatch.setattr(Segments, "__iter__", refuse)


@pytest.mark.parametrize("resize", ["pad", "squash", "crop"])
def test_every_size_and_mode_chooses_as_the_segments_do(
    slice_: Slice, built: list[Segment], resize: str, no_segment_objects: None
) -> None:
    chosen_any = set()
    for size in SIZES:
        got = slice_.blobs(image_size=size, resize=resize)
        _same(got, _expected(built, None, size, resize))
        assert slice_.stream_nbytes(image_size=size, resize=resize) == sum(
            b.size for b in got.values()
        )
        chosen_any |= {
            r.height
            for seg in built
            for s in seg.streams.values()
            for r in s.renditions
            if r.blob.hash in got
        }
    assert chosen_any == {48, 120, 240}  # every rendition is chosen at some size


def test_a_size_per_camera_and_a_stream_filter(
    slice_: Slice, built: list[Segment], no_segment_objects: None
) -> None:
    per_camera = {CAM: (100, 100), WRIST: (40, 60), SIDE: (224, 224)}
    _same(
        slice_.blobs(image_size=per_camera, resize="crop"),
        _expected(built, None, per_camera, "crop"),
    )
    for names in ([CAM], [WRIST, JOINTS], [SIDE], [CAM, WRIST, "not/a-stream"]):
        sizes = {n: (48, 48) for n in names if n != JOINTS and n in (CAM, WRIST, SIDE)}
        for image_size in ((200, 200), sizes):
            _same(
                slice_.blobs(names, image_size=image_size, resize="pad"),
                _expected(built, names, image_size, "pad"),
            )


def test_views_choose_for_their_segments_only(
    slice_: Slice, built: list[Segment], v3: Any, no_segment_objects: None
) -> None:
    view = slice_.select(where=lambda c: c["start_ns"] % (3 * 10**11) != 0)  # no side camera
    picked = [s for s in built if s.start_ns % (3 * 10**11) != 0]
    _same(view.blobs(image_size=(64, 64)), _expected(picked, None, (64, 64), "pad"))
    # A table taken in another order, a segment twice: the dict follows that order.
    order = [33, 4, 17, 4, 0, 49, 18]
    taken = v3.segments.take(order)
    _same(
        resolution_blobs(taken, None, (30, 40), "squash"),
        _expected([built[i] for i in order], None, (30, 40), "squash"),
    )
    # Only odd segments: the wrist camera has no rendition there (and 9 has no wrist camera).
    odd = v3.segments.take([1, 3, 5, 7, 9])
    got = resolution_blobs(odd, [WRIST], (32, 32), "pad")
    _same(got, _expected([built[i] for i in (1, 3, 5, 7, 9)], [WRIST], (32, 32), "pad"))
    assert {built[i].streams[WRIST].blob.hash for i in (1, 3, 5, 7)} <= set(got)


def test_a_manifest_without_renditions_on_some_cameras_and_the_whole_table(
    v3: Any, built: list[Segment], no_segment_objects: None
) -> None:
    for size, resize in [((48, 64), "pad"), ((24, 32), "crop"), ((400, 10), "squash")]:
        _same(
            resolution_blobs(v3.segments, None, size, resize),
            _expected(built, None, size, resize),
        )


@pytest.mark.parametrize(
    ("names", "image_size", "resize"),
    [
        (None, (0, 10), "pad"),
        (None, (10, 10), "stretch"),
        (None, {CAM: (10, 10), JOINTS: (10, 10)}, "pad"),  # names a table
        (None, {CAM: (10, 10)}, "pad"),  # leaves cameras out
        (None, {"nope": (10, 10)}, "pad"),
        ([JOINTS], (10, 10), "pad"),  # no camera among the streams
        (None, {CAM: (10, 10), WRIST: (10, 10), SIDE: (-1, 10)}, "pad"),
    ],
)
def test_bad_arguments_raise_as_the_segments_do(
    slice_: Slice,
    built: list[Segment],
    names: list[str] | None,
    image_size: Any,
    resize: str,
) -> None:
    with pytest.raises(InvalidArgumentError) as want:
        _expected(built, names, image_size, resize)
    with pytest.raises(InvalidArgumentError) as got:
        slice_.blobs(names, image_size=image_size, resize=resize)
    assert str(got.value) == str(want.value)


def test_no_segment_has_no_camera(v3: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="no camera"):
        resolution_blobs(v3.segments.take([]), None, (32, 32), "pad")


def test_a_version_1_manifest_chooses_through_the_same_columns(
    segments: list[Segment], v3: Any
) -> None:
    v1 = Manifest(segments=tuple(segments))
    table = Segments(v1.segments)
    for size in SIZES[:4]:
        want = _expected(segments, None, size, "pad")
        got = resolution_blobs(table, None, size, "pad")
        assert got == want
        # In the columns' order (each segment's streams by name), as for version 3: a
        # version 1 segment built by hand may list its streams in another order.
        _same(got, resolution_blobs(v3.segments, None, size, "pad"))
