"""Per-process state: the one way the SDK keeps anything that must not cross a fork.

Open decoders, loaded tables, HTTP connections, shared-memory slots, the set of temporary
files being written: each belongs to the process that created it. A PyTorch DataLoader forks
its workers (or pickles the dataset into spawned ones), and a worker that used its parent's
decoder or connection would corrupt both. Every such value lives in a :class:`PerProcess`
holder, which

* creates it lazily, on first :meth:`~PerProcess.get` in a process (construction opens nothing);
* forgets it in a forked child: the child's first ``get`` creates a fresh one, while the
  parent keeps its own (a fork generation counter, bumped in every child by
  ``os.register_at_fork``, tells them apart; unlike a pid, it cannot be recycled);
* drops it when pickled (``spawn``/``forkserver`` workers, ``copy.copy``), keeping only the
  factory;
* is thread-safe: concurrent first calls create one value.

Values inherited through fork are simply dropped, except with ``keep_inherited=True``: then
they stay referenced for the life of the process, never freed, for values whose cleanup is
unsafe in the child (an FFmpeg decoder's cleanup waits on threads that only exist in the
parent). They are taken at the fork itself, from every such holder alive in the parent,
reachable or not: a holder that was already garbage in the parent (a dataset in a reference
cycle that the collector had not reached yet) is collected in the child, and without that
reference its value would be freed there.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["PerProcess", "fork_generation"]

T = TypeVar("T")

_generation = 0  # forks between the interpreter's start and this process
#: Guards creation in every holder. Re-created in a forked child: a thread of the parent may
#: have held it at the instant of the fork, and that thread does not exist in the child.
_create_lock = threading.RLock()
#: Values inherited through fork by holders with ``keep_inherited=True``: never freed.
_inherited: list[Any] = []


#: Every holder with ``keep_inherited=True`` (weakly: the set does not keep them alive).
_keepers: weakref.WeakSet[PerProcess[Any]] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    global _generation, _create_lock
    _generation += 1
    _create_lock = threading.RLock()
    # Before the child's collector can run: it may free a holder that is unreachable garbage.
    for holder in list(_keepers):
        cell = holder._cell
        if cell is not None:
            _inherited.append(cell[1])


if hasattr(os, "register_at_fork"):  # every platform with fork
    os.register_at_fork(after_in_child=_after_fork_in_child)


def fork_generation() -> int:
    """How many forks separate this process from the interpreter that started (0 if none)."""
    return _generation


class PerProcess(Generic[T]):
    """A value created on first use in each process, forgotten across fork and pickling.

    Args:
        factory: makes the value (called with no arguments, at most once per process unless
            :meth:`clear` is called). Must be picklable if the owner is pickled (a module-level
            function, a class, or a bound method of the owner).
        keep_inherited: keep a value inherited through fork referenced, unused, for the life
            of the child instead of letting it be freed there.

    Example::

        self._http = PerProcess(self._open_client)
        self._http.get().get(url)      # this process's client, opened on first use
    """

    __slots__ = ("__weakref__", "_cell", "_factory", "_keep_inherited")

    def __init__(self, factory: Callable[[], T], *, keep_inherited: bool = False) -> None:
        self._factory = factory
        self._keep_inherited = keep_inherited
        # (generation, value) in one attribute: a thread reads both or neither.
        self._cell: tuple[int, T] | None = None
        if keep_inherited:
            _keepers.add(self)

    def get(self) -> T:
        """This process's value, created by the factory on first use."""
        cell = self._cell
        if cell is not None and cell[0] == _generation:
            return cell[1]
        with _create_lock:
            cell = self._cell
            if cell is None or cell[0] != _generation:
                cell = (_generation, self._factory())
                self._cell = cell
            return cell[1]

    def peek(self) -> T | None:
        """This process's value if it was created here, else ``None`` (creates nothing)."""
        cell = self._cell
        return cell[1] if cell is not None and cell[0] == _generation else None

    def clear(self) -> T | None:
        """Forget this process's value and return it (``None`` if there was none).

        The caller may close the returned value; the next :meth:`get` creates a new one. A
        value inherited from a parent is not returned (it is not this process's to close).
        """
        with _create_lock:
            value = self.peek()
            self._cell = None
            return value

    def __getstate__(self) -> dict[str, Any]:
        return {"factory": self._factory, "keep_inherited": self._keep_inherited}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._factory = state["factory"]
        self._keep_inherited = state["keep_inherited"]
        self._cell = None
        if self._keep_inherited:
            _keepers.add(self)

    def __repr__(self) -> str:
        held = "created" if self.peek() is not None else "empty"
        return f"<PerProcess {getattr(self._factory, '__qualname__', self._factory)!r} {held}>"
