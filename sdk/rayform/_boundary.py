"""Argument errors reported from the public call that was given the bad argument.

A check may live in a private helper a few calls down (``_check_streams``, ``select_rows``,
``check_slice_id``); its traceback then shows those frames before the one line that matters.
:func:`argument_errors` wraps a public function so that an :class:`InvalidArgumentError` or a
:class:`NotFoundError` raised anywhere under it ends at the public function's own line (the
message already says what was wrong and what to do), and its wrapper frame is marked with
``__tracebackhide__``, which IPython, Jupyter and pytest leave out. Other errors keep their
whole traceback.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from rayform.errors import InvalidArgumentError, NotFoundError

__all__ = ["argument_errors"]

P = ParamSpec("P")
R = TypeVar("R")


def argument_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Decorator: an argument error raised in ``func`` or below shows ``func``'s frame last."""

    @functools.wraps(func)
    def public(*args: P.args, **kwargs: P.kwargs) -> R:
        __tracebackhide__ = True  # noqa: F841  (read by IPython and pytest, not by Python)
        try:
            return func(*args, **kwargs)
        except (InvalidArgumentError, NotFoundError) as exc:
            # The traceback's first entry is this frame, the next one is ``func``'s: end there.
            inner = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
            if inner is not None:
                inner.tb_next = None
            raise exc.with_traceback(inner) from (
                exc.__cause__ if exc.__cause__ is not None else None
            )

    return public
