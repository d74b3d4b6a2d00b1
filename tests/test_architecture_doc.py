"""docs/architecture.md's module tables stay true: every module of the SDK and of the server
stub has a row, and every row names a module that exists (so a new module comes with its line
in the map, and a moved one takes its line along)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "architecture.md"
#: The packages whose modules the tables list, and the folder each lives in.
PACKAGES = {
    "rayform": REPO / "sdk" / "rayform",
    "rayform_server": REPO / "server_stub" / "rayform_server",
}
_ROW = re.compile(r"^\|\s*(?:\*\*)?`([A-Za-z_][\w.]*)`")


def table_modules(text: str) -> list[str]:
    """The module named in the first cell of each row of the ``## Modules`` section's tables."""
    start = text.index("\n## Modules\n")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end >= 0 else len(text)]
    return [m.group(1) for line in section.splitlines() if (m := _ROW.match(line))]


def code_modules() -> set[str]:
    """Every module of the packages, by dotted name (a package by its ``__init__``)."""
    out = set()
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out.add(".".join([package, *parts]))
    return out


def test_every_module_has_a_row_and_every_row_a_module() -> None:
    rows = table_modules(DOC.read_text())
    assert len(rows) == len(set(rows)), (
        f"listed twice: {sorted({r for r in rows if rows.count(r) > 1})}"
    )
    code = code_modules()
    missing, stale = sorted(code - set(rows)), sorted(set(rows) - code)
    assert not missing, f"modules without a row in docs/architecture.md's module tables: {missing}"
    assert not stale, f"rows of docs/architecture.md's module tables naming no module: {stale}"


def test_the_check_reads_rows_and_modules() -> None:
    text = (
        "# x\n\n## Modules\n\n| module | role |\n|---|---|\n"
        "| **`a.b`** (face) | r |\n| `a.b._c` | r |\n\n## Next\n| `z` | r |\n"
    )
    assert table_modules(text) == ["a.b", "a.b._c"]
    assert {"rayform", "rayform.manifest._segments", "rayform_server.ingest"} <= code_modules()
