"""Text streams on the sample grid: a state's string and a step's events.

* **State** (``quantity: state``): the record in force at ``t`` is the latest at or before
  ``t`` (of records at one time, the last); before the first record there is none: ``""``.
* **Events** (``quantity: events``): the grid step at ``t_k`` holds the records with times in
  ``(t_{k-1}, t_k]``, where ``t_{k-1}`` is the previous grid time (``round`` of the same
  arithmetic as the grid, so consecutive steps' windows meet exactly: every event lies in one
  step, never two). A step's events are a :class:`TextEvents`, a list of record dicts
  (``content``, ``role``, ``style``, ``camera``, ``tool_calls``), empty when there are none.

``TextEvents`` is registered in torch's ``default_collate_fn_map`` (the extension point its
``collate`` documents), so ``default_collate`` and ``rayform.torch.collate`` batch a key of
events as a list with one list of records per sample, where a plain list of lists of
different lengths would be refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.data._utils.collate import default_collate_fn_map

from rayform.errors import InvalidArgumentError
from rayform.manifest import Stream

__all__ = ["TextEvents", "events_in", "state_at", "text_values", "tokenize", "tokenize_strings"]


class TextEvents(list[dict[str, Any]]):
    """The events of one grid step: a list of record dicts, in time order (empty: none)."""

    __slots__ = ()


def _collate_events(
    batch: list[TextEvents], *, collate_fn_map: object = None
) -> list[list[dict[str, Any]]]:
    return [list(events) for events in batch]


default_collate_fn_map.setdefault(TextEvents, _collate_events)


def state_at(t_rec: np.ndarray, records: list[dict[str, Any]], t_query: np.ndarray) -> list[str]:
    """The content in force at every query time (``""`` before the first record).

    Args:
        t_rec: record times, ns, ``int64 (N,)``, non-decreasing.
        records: the ``N`` records.
        t_query: query times, ns, ``int64 (M,)``.
    """
    idx = np.searchsorted(t_rec, t_query, side="right") - 1
    # A record without text (a tool call alone) holds no string: "" as before any record.
    return [(records[i]["content"] or "") if i >= 0 else "" for i in idx.tolist()]


def events_in(
    t_rec: np.ndarray, records: list[dict[str, Any]], t_prev: np.ndarray, t_query: np.ndarray
) -> list[TextEvents]:
    """The records with times in ``(t_prev, t_query]``, per query (each its own copies).

    Args:
        t_rec: record times, ns, ``int64 (N,)``, non-decreasing.
        records: the ``N`` records.
        t_prev: the previous grid time of each query, ns, ``int64 (M,)``.
        t_query: query times, ns, ``int64 (M,)``.
    """
    lo = np.searchsorted(t_rec, t_prev, side="right")
    hi = np.searchsorted(t_rec, t_query, side="right")
    return [
        TextEvents(dict(records[j]) for j in range(a, b))
        for a, b in zip(lo.tolist(), hi.tolist(), strict=True)
    ]


def text_values(
    stream: Stream | None,
    timing: str,
    load: Callable[[Stream], tuple[np.ndarray, list[dict[str, Any]]]],
    grid_ns: Callable[[np.ndarray], np.ndarray],
    steps: np.ndarray,
    obs_t: np.ndarray,
) -> list[Any]:
    """Per sample, one episode's text at ``obs_t``: a state's string, or a step's events.

    Args:
        stream: the episode's text stream, or ``None`` where it has none (no state: ``""``;
            no events: ``[]``).
        timing: ``"state"`` or ``"events"``.
        load: ``(t_ns (N,), records)`` of a text stream (the reader's, fetched on demand).
        grid_ns: the episode's grid time in ns of any steps (negative ones too).
        steps: ``int64 (B,)`` the samples' grid steps.
        obs_t: ``int64 (B, n)`` the times of their ``n`` observation steps (a padded history
            step, before the grid start, repeats step 0's time).

    Returns:
        ``B`` values, each the value itself with ``n == 1``, else a list of ``n`` (a padded
        step's events are empty: it repeats no step's events).
    """
    b, n = obs_t.shape
    flat_t = obs_t.reshape(-1)
    values: list[Any]
    if stream is None:
        values = ["" if timing == "state" else TextEvents() for _ in range(b * n)]
    else:
        t_rec, records = load(stream)
        if timing == "state":
            values = state_at(t_rec, records, flat_t)
        else:
            hist = steps[:, None] + np.arange(-n + 1, 1)[None, :]  # (B, n)
            values = events_in(t_rec, records, grid_ns(hist - 1).reshape(-1), flat_t)
            for i in np.flatnonzero(hist.reshape(-1) < 0).tolist():
                values[i] = TextEvents()
    if n == 1:
        return values
    return [values[i * n : (i + 1) * n] for i in range(b)]


def tokenize_strings(
    tokenizer: Callable[[list[str]], Mapping[str, torch.Tensor]], texts: list[str], what: str
) -> dict[str, torch.Tensor]:
    """``tokenizer(texts)``, calling it on each distinct string once: a batch repeats a few
    tasks, and every row of the result is the row of its string (a tokenizer pads each string
    alike whether it sees one copy or many; padding to the longest sees the same strings).

    Args:
        tokenizer: ``callable(list of N strings) -> {name: tensor (N, ...)}``.
        texts: the batch's strings.
        what: names the strings in errors.

    Returns:
        ``{name: tensor (len(texts), ...)}``.

    Raises:
        InvalidArgumentError: the tokenizer returned no mapping of tensors with one row per
            string.
    """
    distinct = list(dict.fromkeys(texts))
    out = tokenizer(distinct)
    if not isinstance(out, Mapping) or not all(
        isinstance(v, torch.Tensor) and v.ndim >= 1 and v.shape[0] == len(distinct)
        for v in out.values()
    ):
        raise InvalidArgumentError(
            f"tokenizer({len(distinct)} strings of {what}) returned {type(out).__name__}, not "
            f"a dict of tensors with {len(distinct)} rows; for a Hugging Face tokenizer pass "
            "functools.partial(tokenizer, return_tensors='pt', padding='max_length', "
            "truncation=True, max_length=L)"
        )
    if len(distinct) == len(texts):
        return dict(out)
    row = {text: i for i, text in enumerate(distinct)}
    index = torch.tensor([row[t] for t in texts], dtype=torch.long)
    return {name: tensor.index_select(0, index) for name, tensor in out.items()}


def tokenize(
    samples: list[dict[str, Any]],
    keys: list[str],
    tokenizer: Callable[[list[str]], Mapping[str, torch.Tensor]],
) -> None:
    """Add ``<key>_<name>`` to every sample: ``tokenizer`` run once per key on the batch's
    distinct strings (a key with history: its ``n`` strings per sample, rows ``(n, ...)``).

    Raises:
        InvalidArgumentError: the tokenizer returned no mapping of tensors with one row per
            string.
    """
    if not samples:
        return
    for key in keys:
        values = [s[key] for s in samples]
        steps = len(values[0]) if isinstance(values[0], list) else 0
        texts = [t for v in values for t in v] if steps else values
        out = tokenize_strings(tokenizer, texts, repr(key))
        for name, tensor in out.items():
            rows = tensor.reshape(len(values), steps, *tensor.shape[1:]) if steps else tensor
            for sample, row in zip(samples, rows.unbind(0), strict=True):
                sample[f"{key}_{name}"] = row
