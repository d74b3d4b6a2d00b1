"""LeRobot's layout, the one definition the export writes and the ingest reads (no torch)."""

from __future__ import annotations

from rayform import lerobot_layout as layout


def test_files_are_chunked_by_a_thousand_files_or_episodes() -> None:
    assert layout.data_path("3.0", 1234, 7) == "data/chunk-001/file-234.parquet"
    assert layout.video_path("3.0", "observation.images.top", 5, 7) == (
        "videos/observation.images.top/chunk-000/file-005.mp4"
    )
    assert layout.data_path("2.1", 0, 2001) == "data/chunk-002/episode_002001.parquet"
    assert layout.video_path("2.1", "cam", 0, 999) == "videos/chunk-000/cam/episode_000999.mp4"
    assert layout.video_column("cam", "from_timestamp") == "videos/cam/from_timestamp"


def test_codebase_versions_map_to_layouts_both_ways() -> None:
    for version in layout.VERSIONS:
        assert layout.layout_version(layout.codebase_version(version)) == version
    assert layout.layout_version("v3.1") == "3.0" and layout.layout_version("v2.0") == "2.1"
    assert layout.layout_version("v1.6") is None and layout.layout_version("") is None
    assert list(layout.BOOKKEEPING_FEATURES) == [
        "timestamp",
        "frame_index",
        "episode_index",
        "index",
        "task_index",
    ]
