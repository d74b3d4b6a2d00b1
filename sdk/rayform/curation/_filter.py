"""Filters: which episodes a selection keeps, written as data (text), evaluated on columns.

A filter is a short expression over episode fields and label keys::

    success and quality >= 0.7 and site in ['lab-berkeley', 'lab-zurich']
    not success or 'regrasp' in tags
    duration_s > 6 and version == 2

It is parsed with Python's own expression parser (:mod:`ast`) and then checked against a
closed grammar: ``and``, ``or``, ``not``, parentheses, one comparison (``==``, ``!=``, ``<``,
``<=``, ``>``, ``>=``, ``in``, ``not in``) between a field or label and a literal (a number,
a string, ``true``/``false``, or a list of those), ``'tag' in tags`` for a tags label (or a
spans label: the episode has a time range of that name), and a bool label alone (``success``
means ``success == true``). Nothing is ever executed: the tree
is walked here, each comparison one numpy or pyarrow kernel over the whole column, so a
million episodes cost milliseconds. :attr:`Filter.text` is the canonical form (one spelling
per filter), which a dataset URI pins.

An episode without a value for a label fails every comparison on it (``!=`` and ``not in``
included); ``not (...)`` keeps it again.

Episode fields (:data:`FIELD_KINDS`) come from the manifest. ``task`` is the episode's
``task`` text stream (docs/language.md): an episode may hold several task records, and
``task == X`` (``task in [...]``) keeps it when **any** of them is X (one of the list);
``task != X`` (``task not in [...]``) keeps an episode that has a task stream and no record
that is X (none of the list). An episode without a task stream fails both, as a missing label
does. The manifest's blob hashes say which episodes share a task blob, so the column reads one
small blob per distinct task (:mod:`rayform.curation._textcols`), never one per episode.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rayform._untrusted import shown
from rayform.curation._textcols import ReadBlob, TextColumn, text_column
from rayform.errors import InvalidArgumentError
from rayform.manifest import Segments

__all__ = ["FIELD_KINDS", "MAX_FILTER_CHARS", "Columns", "Filter", "check_filters", "parse_filter"]

#: Episode fields a filter reads, and their kinds (``number`` or ``category``). The one place
#: a new field is added.
FIELD_KINDS: dict[str, str] = {
    "id": "category",
    "site": "category",
    "version": "number",
    "start_ns": "number",
    "end_ns": "number",
    "duration_ns": "number",
    "duration_s": "number",
    "task": "category",
}
#: The text stream the ``task`` field reads.
TASK_STREAM = "task"
#: Longest filter text accepted, in characters.
MAX_FILTER_CHARS = 4096
_ORDER = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
_OPS = {
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.In: "in",
    ast.NotIn: "not in",
}
_LITERALS = {"true": True, "false": False}


def _error(text: str, why: str) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"filter {shown(repr(text), 200)}: {why}. A filter compares fields and labels with "
        "literals, e.g. \"success and quality >= 0.7 and site in ['lab-zurich']\" (docs/curation.md)"
    )


@dataclass(frozen=True)
class Filter:
    """A parsed, checked filter.

    Attributes:
        text: the canonical text (what ``select(where=...)`` records and a dataset URI pins).
        names: every field and label key it reads.
    """

    text: str
    names: frozenset[str]
    tree: ast.expr = field(repr=False, compare=False)

    def mask(self, columns: Columns) -> np.ndarray:
        """``(S,) bool``: which of ``columns``' episodes the filter keeps.

        Raises:
            InvalidArgumentError: a name that is neither a field nor a label key, or a literal
                of the wrong kind for it (the message lists the names and kinds there are).
        """
        kinds = columns.kinds()
        unknown = sorted(self.names - set(kinds))
        if unknown:
            raise _error(
                self.text,
                f"{', '.join(map(repr, unknown))} is not a field or label; there are "
                + ", ".join(f"{k} ({v})" for k, v in sorted(kinds.items())),
            )
        if TASK_STREAM in self.names and TASK_STREAM not in columns.labels:
            why = columns.missing_text(TASK_STREAM)
            if why:
                raise _error(self.text, why)
        return _eval(self.tree, columns, self.text)


def parse_filter(text: str) -> Filter:
    """Parse and check filter ``text`` (the grammar is in the module docstring).

    Raises:
        InvalidArgumentError: not a filter (the message says which part and shows an example).
    """
    if not isinstance(text, str) or not text.strip():
        raise _error(str(text), "pass a non-empty string")
    if len(text) > MAX_FILTER_CHARS:
        raise _error(text[:100], f"it is {len(text)} characters long, at most {MAX_FILTER_CHARS}")
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise _error(text, f"it does not parse ({exc.msg})") from None
    names: set[str] = set()
    tree = _check(tree, text, names)
    return Filter(ast.unparse(tree), frozenset(names), tree)


def _literal(node: ast.expr, text: str) -> ast.expr:
    if isinstance(node, ast.Name) and node.id in _LITERALS:
        return ast.Constant(_LITERALS[node.id])
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _literal(node.operand, text)
        value = inner.value if isinstance(inner, ast.Constant) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return ast.Constant(-value)
    if isinstance(node, ast.Constant) and type(node.value) in (bool, int, float, str):
        return node
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        items = [_literal(e, text) for e in node.elts]
        if not items or any(isinstance(i, ast.List) for i in items):
            raise _error(text, "a list holds one or more plain literals")
        return ast.List(items, ast.Load())
    raise _error(text, f"{ast.unparse(node)!r} is not a literal (a number, a string, true/false)")


def _check(node: ast.expr, text: str, names: set[str]) -> ast.expr:
    """The tree with literals normalised, or an error for anything outside the grammar."""
    if isinstance(node, ast.BoolOp):
        return ast.BoolOp(node.op, [_check(v, text, names) for v in node.values])
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return ast.UnaryOp(ast.Not(), _check(node.operand, text, names))
    if isinstance(node, ast.Name) and node.id not in _LITERALS:
        names.add(node.id)
        return ast.Name(node.id, ast.Load())
    if isinstance(node, ast.Compare):
        if len(node.ops) != 1:
            raise _error(text, "chain comparisons with 'and' (e.g. 'a >= 1 and a < 2')")
        op, left, right = node.ops[0], node.left, node.comparators[0]
        if type(op) not in _OPS:
            raise _error(text, f"use one of {', '.join(_OPS.values())}")
        if isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, ast.Name):
            tag = _literal(left, text)  # 'regrasp' in tags
            if not isinstance(tag, ast.Constant) or not isinstance(tag.value, str):
                raise _error(text, f"'X in {right.id}' needs a string X (a tag)")
            names.add(right.id)
            return ast.Compare(tag, [op], [ast.Name(right.id, ast.Load())])
        if not isinstance(left, ast.Name) or left.id in _LITERALS:
            raise _error(text, f"{ast.unparse(node)!r}: put the field or label on the left")
        value = _literal(right, text)
        if isinstance(op, (ast.In, ast.NotIn)) != isinstance(value, ast.List):
            raise _error(
                text, f"{ast.unparse(node)!r}: 'in' takes a list, other comparisons one value"
            )
        names.add(left.id)
        return ast.Compare(ast.Name(left.id, ast.Load()), [op], [value])
    raise _error(text, f"{ast.unparse(node)!r} is not part of the filter grammar")


class Columns:
    """What a filter reads: the episode fields of some segments and the labels on them.

    Args:
        segments: the episodes a filter runs over (a selection's, or a whole slice's).
        labels: label key -> ``(kind, column)`` for these segments, in their order: a
            ``float64`` array with ``NaN`` for numbers, an ``int8`` array (1, 0, -1 for none)
            for bools, a pyarrow string or list-of-string array with nulls otherwise.
        read_blob: reads a blob's verified bytes: what the ``task`` field reads its text
            stream's blobs with (``None``: a filter on ``task`` is an error).
    """

    def __init__(
        self,
        segments: Segments,
        labels: Mapping[str, tuple[str, Callable[[], Any]]],
        read_blob: ReadBlob | None = None,
    ) -> None:
        self.segments = segments
        self.labels = labels
        self.read_blob = read_blob
        self._made: dict[str, tuple[str, Any]] = {}

    def missing_text(self, stream: str) -> str | None:
        """Why the text field ``stream`` cannot be read here, or ``None`` when it can."""
        kinds = self.segments.stream_values(stream, "kind")
        if not kinds:
            texts = sorted(
                name
                for name, d in self.segments.summary()["streams"].items()
                if d["kind"] == "text"
            )
            return (
                f"{stream!r} reads the episodes' {stream!r} text stream, and these episodes have "
                f"none (their text streams: {', '.join(texts) or 'none'}; docs/language.md)"
            )
        if kinds != {"text"}:
            return f"{stream!r} reads a text stream; stream {stream!r} here is {'/'.join(kinds)}"
        if self.read_blob is None:
            return f"{stream!r} reads text blobs, and these columns were given no way to read them"
        return None

    def kinds(self) -> dict[str, str]:
        return {**FIELD_KINDS, **{k: kind for k, (kind, _) in self.labels.items()}}

    def __len__(self) -> int:
        return len(self.segments)

    def get(self, name: str) -> tuple[str, Any]:
        """``(kind, column)`` of a field or label, built once."""
        if name not in self._made:
            if name in self.labels:
                kind, make = self.labels[name]
                self._made[name] = (kind, make())
            else:
                self._made[name] = (FIELD_KINDS[name], self._field(name))
        return self._made[name]

    def _field(self, name: str) -> Any:
        segs = self.segments
        if name == "id":
            return segs.ids()
        if name == "site":
            return segs.sites()
        if name == TASK_STREAM:
            if self.read_blob is None:  # Filter.mask says why first
                raise InvalidArgumentError(f"{name!r}: {self.missing_text(name)}")
            return text_column(segs, name, self.read_blob)
        if name in ("duration_ns", "duration_s"):
            ns = segs.column("end_ns").astype(np.int64) - segs.column("start_ns").astype(np.int64)
            return ns if name == "duration_ns" else ns / 1e9
        return segs.column(name).astype(np.int64)


def _eval(node: ast.expr, cols: Columns, text: str) -> np.ndarray:
    if isinstance(node, ast.BoolOp):
        masks = [_eval(v, cols, text) for v in node.values]
        reduce = np.logical_and if isinstance(node.op, ast.And) else np.logical_or
        return np.asarray(reduce.reduce(masks), dtype=bool)
    if isinstance(node, ast.UnaryOp):
        return ~_eval(node.operand, cols, text)
    if isinstance(node, ast.Name):
        kind, col = cols.get(node.id)
        if kind != "bool":
            raise _error(
                text, f"{node.id!r} holds {kind} values: compare it, e.g. '{node.id} == ...'"
            )
        return np.asarray(col == 1)
    assert isinstance(node, ast.Compare)
    op, left, right = node.ops[0], node.left, node.comparators[0]
    if isinstance(right, ast.Name):  # 'tag' in tags
        kind, col = cols.get(right.id)
        if kind not in ("tags", "spans"):
            raise _error(
                text,
                f"'X in {right.id}' needs a tags or spans label; {right.id!r} holds {kind} values",
            )
        assert isinstance(left, ast.Constant)
        return _has_tag(col, str(left.value), isinstance(op, ast.NotIn), len(cols))
    assert isinstance(left, ast.Name)
    kind, col = cols.get(left.id)
    items = right.elts if isinstance(right, ast.List) else [right]
    values = [e.value for e in items if isinstance(e, ast.Constant)]  # literals, by _check
    return _compare(left.id, kind, col, op, values, text)


def _compare(
    name: str, kind: str, col: object, op: ast.cmpop, values: list[Any], text: str
) -> np.ndarray:
    want = {"number": (int, float), "bool": (bool,), "category": (str,), "text": (str,)}.get(kind)
    if want is None or not all(type(v) in want for v in values):
        shown_values = ", ".join(repr(v) for v in values)
        hint = (
            "use 'X in " + name + "'"
            if kind in ("tags", "spans")
            else f"compare it with {kind} values"
        )
        raise _error(text, f"{name!r} holds {kind} values, not {shown_values}: {hint}")
    if kind in ("category", "text"):
        if isinstance(op, _ORDER):
            raise _error(text, f"{name!r} holds strings: use ==, !=, in or not in")
        if isinstance(col, TextColumn):  # several records per episode: any of them
            return col.any_of(values, isinstance(op, (ast.NotEq, ast.NotIn)))
        import pyarrow as pa  # noqa: PLC0415  (lazily: `import rayform` stays light)
        import pyarrow.compute as pc  # noqa: PLC0415

        hit = pc.is_in(col, value_set=pa.array(values, pa.string()))
        present = pc.is_valid(col)
        if isinstance(op, (ast.NotEq, ast.NotIn)):
            hit = pc.and_(present, pc.invert(hit))
        return np.asarray(pc.fill_null(hit, False).to_numpy(zero_copy_only=False), dtype=bool)
    arr = np.asarray(col)
    if kind == "bool":
        if isinstance(op, _ORDER):
            raise _error(text, f"{name!r} holds true/false: use == or !=")
        present = arr >= 0
        hit = np.isin(arr, [int(v) for v in values])
    else:
        present = ~np.isnan(arr) if arr.dtype.kind == "f" else np.ones(len(arr), dtype=bool)
        if isinstance(op, (ast.In, ast.NotIn, ast.Eq, ast.NotEq)):
            hit = np.isin(arr, values)
        else:
            fn = {
                ast.Lt: np.less,
                ast.LtE: np.less_equal,
                ast.Gt: np.greater,
                ast.GtE: np.greater_equal,
            }
            with np.errstate(invalid="ignore"):
                hit = fn[type(op)](arr, values[0])
    if isinstance(op, (ast.NotEq, ast.NotIn)):
        hit = ~hit
    return np.asarray(hit & present, dtype=bool)


def _has_tag(col: object, tag: str, negate: bool, n: int) -> np.ndarray:
    import pyarrow.compute as pc  # noqa: PLC0415  (lazily: `import rayform` stays light)

    hit = np.zeros(n, dtype=bool)
    flat = pc.list_flatten(col)
    if len(flat):
        parents = np.asarray(pc.list_parent_indices(col).to_numpy(zero_copy_only=False))
        match = np.asarray(pc.equal(flat, tag).to_numpy(zero_copy_only=False), dtype=bool)
        hit[parents[match]] = True
    if negate:
        present = np.asarray(pc.is_valid(col).to_numpy(zero_copy_only=False), dtype=bool)
        return np.asarray(~hit & present, dtype=bool)
    return hit


def check_filters(texts: list[str]) -> str:
    """One canonical filter that keeps what every filter of ``texts`` keeps (a chain of views)."""
    parsed = [parse_filter(t) for t in texts]
    if len(parsed) == 1:
        return parsed[0].text
    return parse_filter(" and ".join(f"({p.text})" for p in parsed)).text
