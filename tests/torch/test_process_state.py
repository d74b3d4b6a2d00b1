"""``rayform._process.PerProcess``: the one holder of state that must not cross a fork."""

from __future__ import annotations

import copy
import os
import pickle
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import pytest

from rayform import _process
from rayform._process import PerProcess, fork_generation


class Counter:
    """A factory that numbers what it makes (picklable: a module-level class)."""

    made = 0

    def __init__(self) -> None:
        Counter.made += 1
        self.n = Counter.made
        self.pid = os.getpid()


def in_child(fn) -> object:
    """Run ``fn`` in a forked child and return what it returned (or raise what it raised)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running the parent's cleanup
        try:
            out = pickle.dumps(("ok", fn()))
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            out = pickle.dumps(("error", repr(exc)))
        os.write(w, out)
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        status, value = pickle.loads(f.read())
    os.waitpid(pid, 0)
    assert status == "ok", value
    return value


def test_created_once_on_first_use() -> None:
    holder = PerProcess(Counter)
    assert holder.peek() is None  # construction creates nothing
    first = holder.get()
    assert holder.get() is first and holder.peek() is first


def test_a_forked_child_starts_fresh_and_the_parent_keeps_its_own() -> None:
    holder = PerProcess(Counter)
    mine = holder.get()
    generation = fork_generation()

    def child() -> tuple[bool, int, int, bool]:
        fresh = holder.peek() is None
        value = holder.get()
        return fresh, value.pid, fork_generation(), holder.get() is value

    fresh, child_pid, child_generation, stable = in_child(child)
    assert fresh and stable
    assert child_pid != os.getpid() and child_generation == generation + 1
    assert holder.get() is mine and mine.pid == os.getpid()  # the parent is untouched


def test_a_grandchild_never_sees_an_ancestors_value() -> None:
    holder = PerProcess(Counter)
    holder.get()
    # The child does not touch the holder; its own child must still start fresh.
    assert in_child(lambda: in_child(lambda: holder.peek() is None)) is True


def test_inherited_values_are_kept_only_when_asked() -> None:
    kept, dropped = PerProcess(Counter, keep_inherited=True), PerProcess(Counter)
    kept.get(), dropped.get()

    def child() -> tuple[int, int]:
        before = len(_process._inherited)
        kept.get(), dropped.get()
        return before, len(_process._inherited)

    before, after = in_child(child)
    assert after == before + 1  # only the keep_inherited value, referenced for good


def test_pickling_and_copying_drop_the_value_and_keep_the_factory() -> None:
    holder = PerProcess(Counter, keep_inherited=True)
    value = holder.get()
    for clone in (pickle.loads(pickle.dumps(holder)), copy.copy(holder), copy.deepcopy(holder)):
        assert clone.peek() is None
        assert clone.get() is not value and isinstance(clone.get(), Counter)
        assert clone._keep_inherited
    assert holder.get() is value


class Owner:
    """An object whose holder's factory is its own bound method (as Transport does)."""

    def __init__(self) -> None:
        self.opened = 0
        self.state = PerProcess(self._open)

    def _open(self) -> int:
        self.opened += 1
        return self.opened


def test_an_owner_with_a_bound_method_factory_pickles() -> None:
    owner = Owner()
    assert owner.state.get() == 1
    clone = pickle.loads(pickle.dumps(owner))
    assert clone.state.peek() is None
    assert clone.state.get() == 2 and clone.opened == 2  # the clone's own factory ran
    assert owner.state.get() == 1


def test_clear_returns_this_process_value_only() -> None:
    holder = PerProcess(Counter)
    assert holder.clear() is None
    value = holder.get()
    assert holder.clear() is value and holder.peek() is None
    assert holder.get() is not value
    assert in_child(
        lambda: holder.clear() is None
    )  # the parent's value is not the child's to close


def test_concurrent_first_calls_create_one_value() -> None:
    made = []
    start = threading.Barrier(8)

    def slow_factory() -> object:
        made.append(threading.current_thread().name)
        time.sleep(0.002)  # widens the window in which an unguarded holder would create twice
        return object()

    for _ in range(20):
        made.clear()
        holder = PerProcess(slow_factory)

        def race(_: int, holder: PerProcess[object] = holder) -> object:
            start.wait()
            return holder.get()

        with ThreadPoolExecutor(8) as pool:
            values = list(pool.map(race, range(8)))
        assert len(made) == 1 and all(v is values[0] for v in values)


def test_a_fork_while_another_thread_creates_does_not_deadlock_the_child() -> None:
    entered, release = threading.Event(), threading.Event()

    def blocking_factory() -> object:
        entered.set()
        release.wait(30)
        return object()

    busy = PerProcess(blocking_factory)
    thread = threading.Thread(target=busy.get)
    thread.start()
    try:
        assert entered.wait(30)  # the creation lock is held by that thread now
        other = PerProcess(Counter)
        with warnings.catch_warnings():  # Python 3.12+ warns about forking with threads
            warnings.simplefilter("ignore", DeprecationWarning)
            child = in_child(lambda: other.get().pid)
    finally:
        release.set()
        thread.join(30)
    assert child != os.getpid()


def test_a_failing_factory_creates_nothing() -> None:
    calls = []

    def factory() -> int:
        calls.append(1)
        if len(calls) == 1:
            raise OSError("no file handles left")
        return 7

    holder = PerProcess(factory)
    with pytest.raises(OSError, match="file handles"):
        holder.get()
    assert holder.peek() is None and holder.get() == 7
