"""The examples of README.md and docs/: finding them, and comparing what they show with what runs.

The rules a doc author follows (which blocks run, the ``<!-- not-run: <reason> -->`` marker,
``$ `` transcripts and their expected output, ``...`` wildcards, ``>>> `` doctests, what is
normalised) are written for them in docs/contributing-docs.md; this module implements them and
``tests/docs/test_docs_examples.py`` runs them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Block", "Command", "collect", "doc_files", "matches", "normalise", "transcript"]

REPO = Path(__file__).resolve().parents[2]
SHELL = {"sh", "bash", "shell", "console"}
PYTHON = {"python", "pycon", "py"}
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)(?P<info>[^`]*)$")
_MARKER = re.compile(r"^\s*<!--\s*not-run(?P<rest>.*?)-->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language, its text, and why it is not run (if so)."""

    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    not_run: str | None

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.not_run is None and (self.lang in SHELL or self.lang in PYTHON)


def doc_files() -> list[Path]:
    """README.md and every Markdown file under docs/ (new pages are picked up by themselves)."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def collect(path: Path, rel: Path | None = None) -> tuple[list[Block], list[str]]:
    """The fenced blocks of ``path``, and the problems with its not-run markers (reported as
    in ``rel``, default ``path`` relative to the repository)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    problems: list[str] = []
    rel = rel if rel is not None else path.relative_to(REPO)
    shown_as = REPO / rel
    i = 0
    pending: tuple[int, str | None] | None = None  # a marker on the line before
    while i < len(lines):
        m_marker = _MARKER.match(lines[i])
        if m_marker:
            rest = m_marker.group("rest").strip()
            reason = rest[1:].strip() if rest.startswith(":") else ""
            if not reason:
                problems.append(
                    f"{rel}:{i + 1}: a not-run marker needs a reason: <!-- not-run: <reason> -->"
                )
            if i + 1 >= len(lines) or not _FENCE.match(lines[i + 1]):
                problems.append(
                    f"{rel}:{i + 1}: a not-run marker must be on the line right "
                    "before a block's opening fence"
                )
            pending = (i + 1, reason or None)
            i += 1
            continue
        m = _FENCE.match(lines[i])
        if not m:
            pending = None
            i += 1
            continue
        indent, fence = m.group("indent"), m.group("fence")
        lang = (m.group("info").strip().split() or [""])[0].lower()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(
                lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i].lstrip()
            )
            i += 1
        not_run = pending[1] if pending is not None and pending[0] == start else None
        if pending is not None and pending[0] == start and not_run is None:
            not_run = ""  # marked, but without a reason: reported above, never run
        blocks.append(Block(shown_as, start + 1, lang, "\n".join(body) + "\n", not_run))
        pending = None
        i += 1
    return blocks, problems


@dataclass(frozen=True)
class Command:
    """One ``$ `` command of a console transcript and the output shown after it."""

    line: int
    cmd: str
    expected: list[str]


def transcript(block: Block) -> list[Command] | None:
    """The commands of a shell transcript, or None if the block is a plain script."""
    lines = block.text.splitlines()
    if not any(ln.startswith("$ ") for ln in lines):
        return None
    commands: list[Command] = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith("$ "):
            if lines[i].strip() and not commands:
                raise ValueError(f"{block.where}: output before the first `$ ` command")
            if commands:
                commands[-1].expected.append(lines[i])
            i += 1
            continue
        line = block.line + 1 + i
        cmd = lines[i][2:]
        while cmd.endswith("\\") and i + 1 < len(lines):
            i += 1
            cmd = cmd + "\n" + lines[i]  # bash joins the lines at the backslash
        commands.append(Command(line, cmd, []))
        i += 1
    for c in commands:
        while c.expected and not c.expected[-1].strip():
            c.expected.pop()
    return commands


_NORMALISE = [
    (re.compile(r"\[\d+:\d+(?::\d+)?<[^\]]*\]"), "[<elapsed<eta, rate>]"),  # tqdm
    (re.compile(r"\|[█▏▎▍▌▋▊▉ ]*\|"), "|<bar>|"),  # tqdm's bar: as wide as the terminal allows
    (re.compile(r"\b\d+(?:\.\d+)?\s?[kKMGT]?i?B/s\b"), "<rate>"),
    (re.compile(r"\b\d+(?:\.\d+)?\s?(?:samples|batches|frames)/s\b"), "<rate>"),
    (re.compile(r"\bin \d+(?:\.\d+)? ?(?:s|ms|µs)\b"), "in <duration>"),
    (re.compile(r"\b(?:127\.0\.0\.1|localhost|0\.0\.0\.0):\d+\b"), "<host>:<port>"),
]


def terminal(text: str) -> list[str]:
    """Lines as a terminal shows ``text``: a carriage return moves back to the start of the
    line, and what follows overwrites it (a progress bar redrawn in place)."""
    shown = []
    for raw in text.replace("\r\n", "\n").split("\n"):
        line = ""
        for part in raw.split("\r"):
            line = part + line[len(part) :]
        shown.append(line)
    while shown and not shown[-1].strip():
        shown.pop()
    return shown


def normalise(line: str, workdir: Path | None = None) -> str:
    """``line`` with the parts that legitimately vary from run to run replaced by placeholders."""
    if workdir is not None:
        line = line.replace(str(workdir), "<workdir>")
    for pattern, repl in _NORMALISE:
        line = pattern.sub(repl, line)
    return line.rstrip()


def _line_matches(expected: str, actual: str) -> bool:
    if "..." not in expected:
        return expected == actual
    parts = [re.escape(p) for p in expected.split("...")]
    return re.fullmatch(".*".join(parts), actual) is not None


def matches(expected: list[str], actual: list[str]) -> bool:
    """Whether ``actual`` lines fit ``expected`` ones; an ``...`` line stands for any lines."""
    if not expected:
        return not actual
    head, rest = expected[0], expected[1:]
    if head.strip() == "...":
        return any(matches(rest, actual[k:]) for k in range(len(actual) + 1))
    return bool(actual) and _line_matches(head, actual[0]) and matches(rest, actual[1:])
