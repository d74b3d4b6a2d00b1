"""Label sets: per-episode values over one manifest of a slice, as a content-addressed document.

A label set is canonical JSON (sorted keys, no whitespace), named by the BLAKE3 of its bytes::

    {"format": "rayform.labels", "format_version": 1,
     "slice": "slc_7c1e04aa", "manifest": "<hash of the manifest it annotates>",
     "version": 3, "parent": "<hash of version 2>" | null,
     "kinds": {"success": "bool", "quality": "number", "tags": "tags", "note": "text"},
     "episodes": {"seg_26294da5e6984c17": {"success": true, "quality": 0.8}, ...},
     "history": [{"version": 1, "by": "alice", "at": "2026-12-06T19:00:00Z",
                  "episodes": 20, "keys": ["success"]}, ...]}

Both sides use this module: the server validates and merges every write with it, and the SDK
checks every label set it reads with it (what a server sends is untrusted), so both accept
exactly the same documents. Nothing here does I/O.

The concurrency rule (:func:`merge`): a write names the version it read (its *base*). For each
episode and key it sets, the server compares the value in the base with the value now (the
*head*): if someone else changed that value since the base, and to something other than what
this write sets, the write is refused as a conflict (nothing is written); otherwise the write
applies on top of the head. So two people labelling different episodes, or different keys of
one episode, both land; setting the same key of the same episode to different values from the
same base is the one case refused, and the second writer re-reads and decides.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from rayform._hashing import hash_bytes
from rayform._ids import HASH_RE, SEGMENT_ID_RE, SLICE_ID_RE
from rayform._untrusted import loads, shown
from rayform.errors import ConflictError, InvalidArgumentError, ManifestError
from rayform.manifest import Segments, canonical_json

__all__ = [
    "EPISODE_FIELDS",
    "KINDS",
    "LABELS_FORMAT",
    "LIMITS",
    "check_changes",
    "check_key",
    "check_spans_within",
    "check_value",
    "empty_labelset",
    "labelset_bytes",
    "merge",
    "parse_labelset",
]

LABELS_FORMAT = "rayform.labels"
LABELS_FORMAT_VERSION = 1
#: The kinds a label key may hold: ``bool``; ``number`` (finite, stored as a float);
#: ``category`` (a short string, the default for strings); ``text`` (a longer note, declared
#: with ``kinds={"note": "text"}``); ``tags`` (a set of short strings, stored sorted);
#: ``spans`` (time ranges within the episode, each ``[t0_ns, t1_ns, name]``, half-open, in
#: ns since the Unix epoch like every record time; stored sorted, without repeats).
KINDS = ("bool", "number", "category", "text", "tags", "spans")
#: Episode fields a filter reads from the manifest; a label key may not take one of these
#: names. ``task`` is reserved for the language streams' per-episode task.
EPISODE_FIELDS = ("id", "site", "version", "start_ns", "end_ns", "duration_ns", "duration_s")
_RESERVED = (*EPISODE_FIELDS, "task", "and", "or", "not", "in", "true", "false")

#: Bounds of every write and of every label set, on both sides (docs/curation.md).
LIMITS = {
    "write_bytes": 16 * 2**20,  # a write request's body
    "write_values": 200_000,  # (episode, key) values one write sets or removes
    "keys": 64,  # distinct keys in a label set
    "key_chars": 32,  # a key: [a-z][a-z0-9_]*
    "category_chars": 128,
    "text_chars": 2000,
    "tags": 32,  # tags on one episode
    "spans": 256,  # time ranges of one key on one episode
    "tag_chars": 64,
    "labelset_bytes": 64 * 2**20,  # a whole label set
    "versions": 10_000,  # versions of one label set (its history)
    "author_chars": 64,
}
_KEY_RE = re.compile(r"[a-z][a-z0-9_]{0,31}")
_TIME_RE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def check_key(key: object, where: str = "label") -> str:
    """A label key, checked: ``[a-z][a-z0-9_]*`` of at most 32 characters, not a field name."""
    if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
        raise InvalidArgumentError(
            f"{where} key {shown(repr(key), 60)} is not allowed: use 1-32 lowercase letters, "
            "digits and _, starting with a letter, e.g. 'success' or 'grasp_quality'"
        )
    if key in _RESERVED:
        raise InvalidArgumentError(
            f"{where} key {key!r} is reserved (episode fields and filter words: "
            f"{', '.join(_RESERVED)}): choose another name, e.g. 'label_{key}'"
        )
    return key


def _kind_of(value: object) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "category"
    if (
        isinstance(value, (list, tuple))
        and value
        and all(isinstance(v, (list, tuple)) for v in value)
    ):
        return "spans"
    if isinstance(value, (list, tuple, set, frozenset)):
        return "tags"
    return type(value).__name__


def _spans(value: object, what: str) -> list[list[Any]]:
    """Time ranges ``[[t0_ns, t1_ns, name], ...]`` checked and sorted, without repeats."""
    spans: list[Any] = list(value) if isinstance(value, (list, tuple)) else [value]
    ok = len(spans) <= LIMITS["spans"] and all(
        isinstance(s, (list, tuple))
        and len(s) == 3
        and all(isinstance(t, int) and not isinstance(t, bool) for t in s[:2])
        and -(2**62) <= s[0] < s[1] <= 2**62
        and isinstance(s[2], str)
        and s[2]
        for s in spans
    )
    if not ok:
        raise InvalidArgumentError(
            f"{what}: {shown(repr(value), 80)} is not a list of at most {LIMITS['spans']} time "
            "ranges [t0_ns, t1_ns, name] with integer times t0_ns < t1_ns (ns, Unix epoch, "
            "half-open) and a non-empty name"
        )
    unique = {(int(s[0]), int(s[1]), _string(s[2], LIMITS["tag_chars"], what)) for s in spans}
    return [list(s) for s in sorted(unique)]


def _string(value: str, limit: int, what: str) -> str:
    if len(value) > limit or _CONTROL.search(value):
        raise InvalidArgumentError(
            f"{what}: {shown(repr(value), 60)} is not allowed: at most {limit} characters, "
            "no control characters"
            + (
                "; declare the key as text (kinds={'KEY': 'text'}) for longer notes"
                if limit == LIMITS["category_chars"]
                else ""
            )
        )
    return value


def check_value(key: str, kind: str, value: object, where: str) -> Any:
    """``value`` as stored for a key of ``kind`` (numbers as floats, tags sorted), or
    :class:`InvalidArgumentError` naming the episode, key, value and what is allowed."""
    what = f"{where}, label {key!r} ({kind})"
    got = _kind_of(value)
    if kind == "text" and isinstance(value, str):
        return _string(value, LIMITS["text_chars"], what)
    if got != kind:
        raise InvalidArgumentError(
            f"{what}: got {shown(repr(value), 60)}, a {got}; this key holds {kind} values "
            "(a key keeps the kind of its first value)"
        )
    if isinstance(value, (int, float)) and not isinstance(value, bool):  # a number
        number = float(value)
        if not math.isfinite(number):
            raise InvalidArgumentError(f"{what}: {value!r} is not a finite number")
        return number
    if isinstance(value, str):  # a category
        return _string(value, LIMITS["category_chars"], what)
    if kind == "tags" and isinstance(value, (list, tuple, set, frozenset)):
        tags = list(value)
        if len(tags) > LIMITS["tags"] or not all(isinstance(t, str) and t for t in tags):
            raise InvalidArgumentError(
                f"{what}: use a list of at most {LIMITS['tags']} non-empty strings"
            )
        return sorted({_string(t, LIMITS["tag_chars"], what) for t in tags})
    if kind == "spans":
        return _spans(value, what)
    return value


def check_changes(
    changes: object, kinds: Mapping[str, str], declared: object = None
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Check a write: ``{episode: {key: value or None}}`` (``None`` removes the key) and the
    kinds it declares, against the kinds a label set holds already.

    Returns:
        ``(changes as stored, kinds after the write)``.

    Raises:
        InvalidArgumentError: a malformed episode ID, key or value, a kind that does not match,
            or a write over :data:`LIMITS` (the message names the value and the limit).
    """
    new_kinds = dict(kinds)
    if declared is not None:
        if not isinstance(declared, Mapping):
            raise InvalidArgumentError(
                f"kinds={declared!r}: pass a dict such as {{'note': 'text'}}"
            )
        for key, kind in declared.items():
            check_key(key, "kinds")
            if kind not in KINDS:
                raise InvalidArgumentError(
                    f"kinds[{key!r}]={shown(repr(kind), 40)}: use one of {', '.join(KINDS)}"
                )
            if key in new_kinds and new_kinds[key] != kind:
                raise InvalidArgumentError(
                    f"label {key!r} holds {new_kinds[key]} values already; it cannot become {kind}"
                )
            new_kinds[key] = kind
    if not isinstance(changes, Mapping) or not changes:
        raise InvalidArgumentError(
            "a label write names at least one episode: {episode_id: {key: value}}"
        )
    out: dict[str, dict[str, Any]] = {}
    count = 0
    for episode, values in changes.items():
        if not isinstance(episode, str) or not SEGMENT_ID_RE.fullmatch(episode):
            raise InvalidArgumentError(
                f"episode {shown(repr(episode), 80)} is not a segment ID such as "
                "'seg_26294da5e6984c17' (see slice_.segments.ids())"
            )
        if not isinstance(values, Mapping) or not values:
            raise InvalidArgumentError(
                f"episode {episode}: give its labels as a non-empty dict, e.g. {{'success': True}}"
            )
        row: dict[str, Any] = {}
        for key, value in values.items():
            check_key(key)
            count += 1
            if value is None:
                row[key] = None
                continue
            kind = new_kinds.get(key)
            if kind is None:
                kind = new_kinds[key] = _kind_of(value)
                if kind not in KINDS:
                    raise InvalidArgumentError(
                        f"episode {episode}, label {key!r}: {shown(repr(value), 60)} is a {kind}; "
                        "a label is a bool, a number, a string or a list of strings (tags)"
                    )
            row[key] = check_value(key, kind, value, f"episode {episode}")
        out[episode] = row
    if count > LIMITS["write_values"]:
        raise InvalidArgumentError(
            f"this write sets {count} values; one write sets at most {LIMITS['write_values']}: "
            "split it into several writes"
        )
    if len(new_kinds) > LIMITS["keys"]:
        raise InvalidArgumentError(
            f"a label set holds at most {LIMITS['keys']} keys; this write would make "
            f"{len(new_kinds)}: reuse keys (tags hold many values)"
        )
    return out, new_kinds


def check_spans_within(
    changes: Mapping[str, Mapping[str, Any]], kinds: Mapping[str, str], segments: Segments
) -> None:
    """Every time range a write sets lies within its episode: ``start_ns <= t0_ns`` and
    ``t1_ns <= end_ns + 1`` (an episode's ``end_ns`` is its last record time).

    Raises:
        InvalidArgumentError: the first range outside its episode, with the episode's times.
    """
    keyed = [
        (e, k, v)
        for e, row in changes.items()
        for k, v in row.items()
        if v is not None and kinds.get(k) == "spans"
    ]
    if not keyed:
        return
    episodes = sorted({e for e, _, _ in keyed})
    pos = segments.find(episodes)
    start, end = segments.column("start_ns"), segments.column("end_ns")
    bounds = {
        e: (int(start[p]), int(end[p]) + 1)
        for e, p in zip(episodes, pos.tolist(), strict=True)
        if p >= 0
    }
    for episode, key, spans in keyed:
        if episode not in bounds:
            continue  # an unknown episode is refused by the caller, naming it
        t0, t1 = bounds[episode]
        for span in spans:
            if span[0] < t0 or span[1] > t1:
                raise InvalidArgumentError(
                    f"episode {episode}, label {key!r}: the range [{span[0]}, {span[1]}) "
                    f"{shown(repr(span[2]), 40)} lies outside the episode [{t0}, {t1}) (ns): "
                    "take times from its records (segment.start_ns, segment.end_ns)"
                )


def empty_labelset(slice_id: str, manifest_hash: str) -> dict[str, Any]:
    """The label set of a manifest that nobody labelled yet (version 0, never stored)."""
    return {
        "format": LABELS_FORMAT,
        "format_version": LABELS_FORMAT_VERSION,
        "slice": slice_id,
        "manifest": manifest_hash,
        "version": 0,
        "parent": None,
        "kinds": {},
        "episodes": {},
        "history": [],
    }


def merge(
    base: Mapping[str, Any],
    head: Mapping[str, Any],
    head_hash: str | None,
    changes: Mapping[str, Mapping[str, Any]],
    kinds: Mapping[str, str],
    *,
    by: str,
    at: str,
) -> dict[str, Any] | None:
    """The next version of ``head`` with ``changes`` applied (see the module docstring for the
    rule), or ``None`` if the write changes nothing (a retried write lands once).

    Args:
        base: the label set the writer read (``head`` itself when it read the latest).
        head: the latest label set.
        head_hash: its hash (``None`` for the empty version 0).
        changes: checked changes (:func:`check_changes`).
        kinds: the kinds after the write.
        by: who writes (the token's name).
        at: when, ``YYYY-MM-DDTHH:MM:SSZ``.

    Raises:
        ConflictError: a key of an episode was changed since ``base`` to another value than
            this write's (the message names the first few, their values and what to do).
    """
    base_eps, head_eps = base["episodes"], head["episodes"]
    conflicts = []
    for episode, row in changes.items():
        was, now = base_eps.get(episode, {}), head_eps.get(episode, {})
        for key, value in row.items():
            if now.get(key) != was.get(key) and now.get(key) != value:
                conflicts.append(
                    f"{episode} {key}: you read {was.get(key)!r}, it is now {now.get(key)!r}, "
                    f"you set {value!r}"
                )
    if conflicts:
        raise ConflictError(
            f"{len(conflicts)} label(s) changed since version {base['version']}, which this write "
            f"read (now version {head['version']}): "
            + "; ".join(shown(c, 200) for c in conflicts[:3])
            + ("; ..." if len(conflicts) > 3 else "")
            + ". Nothing was written: read the labels again and write what you still mean."
        )
    episodes = {e: dict(v) for e, v in head_eps.items()}
    changed: set[str] = set()
    touched = 0
    for episode, row in changes.items():
        current = episodes.get(episode, {})
        keys = {
            k for k, v in row.items() if current.get(k) != v and (v is not None or k in current)
        }
        if not keys:
            continue
        touched += 1
        changed |= keys
        for key in keys:
            if row[key] is None:
                del current[key]
            else:
                current[key] = row[key]
        if current:
            episodes[episode] = current
        else:
            episodes.pop(episode, None)
    if not changed and dict(kinds) == dict(head["kinds"]):
        return None
    version = int(head["version"]) + 1
    if version > LIMITS["versions"]:
        raise InvalidArgumentError(
            f"this label set has {LIMITS['versions']} versions, the most it may hold: "
            "publish a curated slice and label that instead"
        )
    used = {k for row in episodes.values() for k in row}
    entry = {"version": version, "by": by, "at": at, "episodes": touched, "keys": sorted(changed)}
    return {
        **empty_labelset(str(head["slice"]), str(head["manifest"])),
        "version": version,
        "parent": head_hash,
        "kinds": {k: v for k, v in kinds.items() if k in used},
        "episodes": episodes,
        "history": [*head["history"], entry],
    }


def labelset_bytes(doc: Mapping[str, Any]) -> bytes:
    """The canonical bytes of a label set (what its hash names)."""
    return canonical_json(dict(doc))


def _bad(what: str, value: object, expected: str) -> ManifestError:
    return ManifestError(
        f"label set: {what} is {shown(repr(value), 80)}, expected {expected}; the server sent "
        "an unusable label set: nothing was cached, report it to the data owners"
    )


def parse_labelset(
    data: bytes, expected_hash: str | None, slice_id: str, manifest_hash: str
) -> dict[str, Any]:
    """Parse and check label-set bytes (untrusted: a server's or a cache's).

    Raises:
        ManifestError: the bytes do not match ``expected_hash``, or break the format, or the
            set annotates another slice or manifest (the message names the field).
    """
    if len(data) > LIMITS["labelset_bytes"]:
        raise _bad("its size", len(data), f"at most {LIMITS['labelset_bytes']} bytes")
    if expected_hash is not None and hash_bytes(data) != expected_hash:
        raise ManifestError(
            f"label set bytes do not match their hash {expected_hash[:12]}...; nothing was cached"
        )
    try:
        doc = loads(data)
    except ValueError as exc:
        raise _bad("the document", str(exc), "JSON") from None
    if not isinstance(doc, dict):
        raise _bad("the document", type(doc).__name__, "an object")
    if doc.get("format") != LABELS_FORMAT or doc.get("format_version") != LABELS_FORMAT_VERSION:
        raise _bad(
            "format/format_version",
            (doc.get("format"), doc.get("format_version")),
            f"{LABELS_FORMAT!r} version {LABELS_FORMAT_VERSION} (upgrade rayform if newer)",
        )
    if doc.get("slice") != slice_id or not SLICE_ID_RE.fullmatch(str(slice_id)):
        raise _bad('"slice"', doc.get("slice"), slice_id)
    if doc.get("manifest") != manifest_hash:
        raise _bad('"manifest"', doc.get("manifest"), manifest_hash)
    version = doc.get("version")
    if (
        isinstance(version, bool)
        or not isinstance(version, int)
        or not 1 <= version <= LIMITS["versions"]
    ):
        raise _bad('"version"', version, f"an integer from 1 to {LIMITS['versions']}")
    parent = doc.get("parent")
    if not (parent is None or (isinstance(parent, str) and HASH_RE.fullmatch(parent))):
        raise _bad('"parent"', parent, "null or a hash")
    kinds = doc.get("kinds")
    if not isinstance(kinds, dict) or len(kinds) > LIMITS["keys"]:
        raise _bad('"kinds"', type(kinds).__name__, f"an object of at most {LIMITS['keys']} keys")
    for key, kind in kinds.items():
        try:
            check_key(key)
        except InvalidArgumentError:
            raise _bad("a key", key, "a label key") from None
        if kind not in KINDS:
            raise _bad(f"the kind of {key!r}", kind, f"one of {', '.join(KINDS)}")
    episodes = doc.get("episodes")
    if not isinstance(episodes, dict):
        raise _bad('"episodes"', type(episodes).__name__, "an object")
    for episode, row in episodes.items():
        if not SEGMENT_ID_RE.fullmatch(episode) or not isinstance(row, dict) or not row:
            raise _bad("an episode", episode, "a segment ID with a non-empty object of labels")
        for key, value in row.items():
            if key not in kinds:
                raise _bad(f"label {key!r} of {episode}", key, "a key listed in kinds")
            try:
                stored = check_value(key, kinds[key], value, f"episode {episode}")
            except InvalidArgumentError as exc:
                raise _bad(f"label {key!r} of {episode}", value, str(exc)) from None
            if stored != value:
                raise _bad(f"label {key!r} of {episode}", value, "its canonical form")
    history = doc.get("history")
    if not isinstance(history, list) or len(history) != version:
        raise _bad('"history"', type(history).__name__, f"a list of {version} entries")
    for i, entry in enumerate(history):
        if (
            not isinstance(entry, dict)
            or entry.get("version") != i + 1
            or not isinstance(entry.get("by"), str)
            or len(entry["by"]) > LIMITS["author_chars"]
            or not _TIME_RE.fullmatch(str(entry.get("at")))
            or not isinstance(entry.get("episodes"), int)
            or not isinstance(entry.get("keys"), list)
            or not all(isinstance(k, str) and _KEY_RE.fullmatch(k) for k in entry["keys"])
        ):
            raise _bad(f"history entry {i}", entry, "{version, by, at, episodes, keys}")
    return doc
