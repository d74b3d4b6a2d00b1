"""The public API: what `import rayform` exports, and that it stays importable without torch."""

from __future__ import annotations

import json
import subprocess
import sys

from support import SCRIPTS

import rayform


def test_public_names_resolve():
    for name in rayform.__all__:
        assert getattr(rayform, name) is not None, name
    assert issubclass(rayform.OfflineError, rayform.RayformError)
    assert issubclass(rayform.InvalidArgumentError, ValueError)
    assert rayform.torch.EpisodeDataset is not None
    assert set(rayform.torch.__all__) == {
        "DatasetSpec",
        "EpisodeDataset",
        "EpisodeSampler",
        "MixtureDataset",
        "SamplerDataset",
        "collate",
        "split_episodes",
        "unnormalize",
    }
    for name in rayform.torch.__all__:
        assert getattr(rayform.torch, name) is not None, name


def test_format_and_files_are_the_public_wire_contract():
    import rayform.files
    import rayform.format

    assert sorted(rayform.format.__all__) == [
        "ColumnarManifest",
        "HASH_RE",
        "MANIFEST_FORMAT",
        "MANIFEST_FORMAT_VERSION",
        "PAGE_FORMAT",
        "PAGE_ROWS",
        "SEGMENT_ID_RE",
        "SLICE_ID_RE",
        "STREAM_NAME_RE",
        "build_root",
        "canonical_json",
        "check_hash",
        "check_segment_id",
        "check_slice_id",
        "check_stream_name",
        "decode_table",
        "decode_text",
        "decode_timestamps",
        "encode_table",
        "encode_text",
        "encode_timestamps",
        "hash_bytes",
        "hash_file",
        "load_manifest",
        "new_hasher",
        "page_refs",
        "segments_to_table",
        "sharded_path",
        "table_to_pages",
    ]
    assert sorted(rayform.files.__all__) == ["publish", "unique_tmp_name", "write_atomic"]
    for module in (rayform.format, rayform.files):
        for name in module.__all__:
            assert getattr(module, name) is not None, name
    table = rayform.format.segments_to_table([])
    doc = json.loads(rayform.format.build_root(table, rayform.format.table_to_pages(table), ""))
    assert (doc["format"], doc["format_version"]) == (
        rayform.format.MANIFEST_FORMAT,
        rayform.format.MANIFEST_FORMAT_VERSION,
    )


def test_import_rayform_does_not_import_torch():
    code = (
        "import sys, rayform, rayform.format, rayform.files; rayform.Client; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_import_rayform_does_not_import_trackers():
    # The mlflow entry point loads rayform.integrations.mlflow whenever mlflow.data is
    # imported, so that module must not drag torch in either.
    subprocess.run([sys.executable, str(SCRIPTS / "no_trackers.py")], check=True)
