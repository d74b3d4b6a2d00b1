"""``rayform._process.PerProcess``: the one holder of state that must not cross a fork."""

from __future__ import annotations

import copy
import gc
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


class Tracked:
    """A value that says, through a pipe, which process freed it."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __del__(self) -> None:
        os.write(self.fd, f"{os.getpid()}\n".encode())


def test_inherited_values_are_kept_only_when_asked() -> None:
    kept, dropped = PerProcess(Counter, keep_inherited=True), PerProcess(Counter)
    kept_value, dropped_value = kept.get(), dropped.get()

    def child() -> tuple[bool, bool, bool]:
        held = [id(v) for v in _process._inherited]
        fresh = kept.get() is not kept_value and dropped.get() is not dropped_value
        return id(kept_value) in held, id(dropped_value) in held, fresh

    assert in_child(child) == (True, False, True)  # only the keep_inherited value, for good


def test_an_inherited_value_of_unreachable_garbage_is_never_freed_in_the_child() -> None:
    # A dataset in a reference cycle that the parent's collector has not reached yet: the
    # child's collector frees the cycle, and must not free the value with it (an FFmpeg
    # decoder's cleanup there waits forever on the parent's threads).
    r, w = os.pipe()

    class Owner:
        def __init__(self, keep: bool) -> None:
            self.state = PerProcess(lambda: Tracked(w), keep_inherited=keep)
            self.me = self  # the cycle

    gc.disable()
    try:
        kept, dropped = Owner(keep=True), Owner(keep=False)
        kept.state.get(), dropped.state.get()
        del kept, dropped  # unreachable, not collected: gc is off
        pid = os.fork()
        if pid == 0:
            gc.collect()
            os._exit(0)
        os.waitpid(pid, 0)
    finally:
        gc.enable()
    gc.collect()  # the parent frees both, as usual
    os.close(w)
    with os.fdopen(r) as f:
        freed_by = [int(line) for line in f.read().split()]
    # The child freed only the value whose holder did not ask to keep it; the parent both.
    assert sorted(freed_by) == sorted([pid, os.getpid(), os.getpid()])


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
