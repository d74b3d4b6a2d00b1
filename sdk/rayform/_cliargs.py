"""The argument parsing rules of the ``rayform`` command line, shared by its subcommands.

Each rule closes a way of being silently misread:

* no abbreviations (``--stream`` is not taken for ``--streams``);
* an unknown option is reported by the subcommand that got it, with its own usage and the
  closest option it has (argparse reports it at the top level, with the top-level usage);
* a list option (``--streams a b``) ends at the next option: when it took a positional
  argument (the slice ID after the list), the error says so and how to write it;
* a size may be written with a space before its unit (``--max-size 10 GB``);
* a command that needs torch says which extra to install (:func:`torch_module`).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import re
from collections.abc import Iterable, Sequence
from types import ModuleType
from typing import NoReturn, TypeVar, overload

from rayform.errors import InvalidArgumentError

__all__ = ["ListOption", "Parser", "SizeOption", "torch_module"]

_N = TypeVar("_N")


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` with the rules above; its subparsers are of the same class
    (``add_subparsers`` makes them with ``type(self)``), so a new subcommand follows them too."""

    #: The list options of the parse in progress, and what each took (set by ListOption).
    _lists: list[tuple[str, list[str]]]

    @property
    def allow_abbrev(self) -> bool:
        """Never: ``--stream`` must not be read as ``--streams``, whatever a caller passed."""
        return False

    @allow_abbrev.setter
    def allow_abbrev(self, value: bool) -> None:
        pass  # argparse's __init__ sets it; the rule above stands

    # typeshed declares the base method with these three overloads; an override must match
    # them all. The behaviour is the base class's, plus the check.
    @overload
    def parse_known_args(
        self, args: Iterable[str] | None = None, namespace: None = None
    ) -> tuple[argparse.Namespace, list[str]]: ...

    @overload
    def parse_known_args(
        self, args: Iterable[str] | None, namespace: _N
    ) -> tuple[_N, list[str]]: ...

    @overload
    def parse_known_args(self, *, namespace: _N) -> tuple[_N, list[str]]: ...

    def parse_known_args(
        self, args: Iterable[str] | None = None, namespace: _N | None = None
    ) -> tuple[_N | argparse.Namespace, list[str]]:
        """Parse ``args``; an argument no option or positional takes is an error here, in the
        (sub)command that got it (its usage, its options), instead of at the top level."""
        self._lists = []
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(self._unrecognized(extras))
        return parsed, extras

    def error(self, message: str) -> NoReturn:
        """Print this (sub)command's usage and ``message``, then exit with status 2."""
        lists = getattr(self, "_lists", [])
        if message.startswith("the following arguments are required") and lists:
            option, took = lists[-1]
            missing = message.partition(":")[2].strip()
            message += (
                f" ({option} took {' '.join(took)!r}: a list ends at the next option, so put "
                f"{missing} before {option}, or end the list with --)"
            )
        super().error(message)

    def _unrecognized(self, extras: list[str]) -> str:
        # The options as --help lists them (argparse's own list of actions is private).
        options = sorted(set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", self.format_help())))
        hints = []
        for arg in extras:
            name = arg.partition("=")[0]
            if name in options:  # after "--", where every argument is positional
                hints.append(f"{name} is an option: put it before --")
            elif name.startswith("-"):
                close = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
                if close:
                    hints.append(f"{name}: did you mean {close[0]}?")
        text = f"unrecognized arguments: {' '.join(extras)}"
        return f"{text} ({'; '.join(hints)})" if hints else text


class ListOption(argparse.Action):
    """``--opt A B`` (give it ``nargs="+"``): a list that ends at the next option, which the
    parser's error names when it took a positional argument."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[object] | None,
        option_string: str | None = None,
    ) -> None:
        took = [str(v) for v in (values or [])]
        if isinstance(parser, Parser):
            parser._lists.append((option_string or self.dest, took))
        setattr(namespace, self.dest, took)


class SizeOption(argparse.Action):
    """A size such as ``10GB``, also written ``10 GB`` (two arguments: a number and a unit).

    The value is kept as text, one word (``"10GB"``); its number is read where it is used, so
    that a bad one gets that command's message. Give it ``nargs="+"``.
    """

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[object] | None,
        option_string: str | None = None,
    ) -> None:
        words = [str(v) for v in (values or [])]
        if len(words) == 2 and words[1].isalpha():
            words = [words[0] + words[1]]  # "10 GB": the unit apart
        if len(words) != 1:
            option = option_string or self.dest
            parser.error(
                f"argument {option}: {' '.join(words)!r} is not one size: write a number with "
                f"an optional unit (e.g. {option} 10GB or {option} '10 GB'), and put other "
                f"arguments before {option}"
            )
        setattr(namespace, self.dest, words[0])


def torch_module(name: str, command: str) -> ModuleType:
    """Module ``name`` of ``rayform.torch``, loaded by name when ``command`` runs (``import
    rayform`` never needs torch); without the torch extra, an error saying how to add it."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise InvalidArgumentError(
            f"{command} needs the torch extra ({exc}): pip install 'rayform[torch]'"
        ) from exc
