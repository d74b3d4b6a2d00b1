"""The SDK's escapes from its type checker stay few: ``: Any`` annotations and ``type: ignore``.

Each ``: Any`` is a value mypy does not check, each ``type: ignore`` an error it was told to
overlook. They were 29 and 27; precise types (``object`` where a function only inspects a
value, a ``TypeVar`` where it hands one back, Ray's and argparse's own types) brought them to
20 and 10. A new one must replace an old one (or the budget is raised here, with the reason).
Raised to 22 for ``rayform slices stats`` (``curation/_cli.py``): its helpers take a ``Slice``
they cannot name, since ``rayform.slice`` imports ``rayform.curation`` and the import rules
forbid the cycle even under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import re
from pathlib import Path

SDK = Path(__file__).resolve().parents[1] / "sdk" / "rayform"

#: ``name: Any`` in a signature or an assignment (``dict[str, Any]`` and ``-> Any`` do not count:
#: a container of unchecked values, or an unchecked result, is a narrower escape).
ANY = re.compile(r"\w+: Any\b")
IGNORE = re.compile(r"#\s*type:\s*ignore\b")
ANY_BUDGET = 22
IGNORE_BUDGET = 10


def _count(pattern: re.Pattern[str]) -> list[str]:
    return [
        f"{path.relative_to(SDK)}:{n}"
        for path in sorted(SDK.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]


def test_any_annotations_within_budget() -> None:
    found = _count(ANY)
    assert len(found) <= ANY_BUDGET, found


def test_type_ignores_within_budget() -> None:
    found = _count(IGNORE)
    assert len(found) <= IGNORE_BUDGET, found


def test_the_counts_see_what_they_look_for() -> None:
    assert ANY.search("def f(x: Any) -> None:") and ANY.search("    self._c: Any = None")
    assert not ANY.search("def f() -> dict[str, Any]:")
    assert IGNORE.search("x = y  # type: ignore[attr-defined]")
    assert len(_count(ANY)) > 0 and len(_count(IGNORE)) > 0  # the tree is read
