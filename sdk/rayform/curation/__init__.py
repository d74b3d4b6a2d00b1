"""Curation: episode labels, filters on them, and selections published as new slices.

The public face of the curation package, used by the SDK (``Slice.labels``, ``Slice.label``,
``Slice.select(where=...)``, ``client.slices.create``) and by the server stub, which validates
and merges every write with the same code the SDK checks every read with.

Modules: ``_labelset`` (the label-set document, its limits and the merge rule of concurrent
writes), ``_labels`` (:class:`Labels`, one version as rows and columns), ``_filter`` (filters as
data: parsed, checked, evaluated on columns), ``_lineage`` (what a published slice records of
its parent), ``_view`` (the rows a filtered selection keeps), ``_remote`` (the client side of
the write and label endpoints), ``_cli`` (``rayform labels`` and ``rayform slices create``).
"""

from rayform.curation._cli import add_curation_parsers, create_slice
from rayform.curation._filter import (
    FIELD_KINDS,
    MAX_FILTER_CHARS,
    Columns,
    Filter,
    check_filters,
    parse_filter,
)
from rayform.curation._labels import Labels, table_changes
from rayform.curation._labelset import (
    EPISODE_FIELDS,
    KINDS,
    LABELS_FORMAT,
    LIMITS,
    check_changes,
    check_spans_within,
    empty_labelset,
    labelset_bytes,
    merge,
    parse_labelset,
)
from rayform.curation._lineage import child_slice_id, lineage_of
from rayform.curation._remote import LabelHost, LabelRemote
from rayform.curation._view import view_rows

__all__ = [
    "EPISODE_FIELDS",
    "FIELD_KINDS",
    "KINDS",
    "LABELS_FORMAT",
    "LIMITS",
    "MAX_FILTER_CHARS",
    "Columns",
    "Filter",
    "LabelHost",
    "LabelRemote",
    "Labels",
    "add_curation_parsers",
    "check_changes",
    "check_filters",
    "check_spans_within",
    "child_slice_id",
    "create_slice",
    "empty_labelset",
    "labelset_bytes",
    "lineage_of",
    "merge",
    "parse_filter",
    "parse_labelset",
    "table_changes",
    "view_rows",
]
