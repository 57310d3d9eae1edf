"""Unit tests of zvfs.fs.derived: when the kernel's caches of the derived files are dropped
after a write, and which replies wait for it. The drop itself is the kernel's (pyfuse3's
invalidate calls, tested through real mounts in test_writes); here it is a function that
blocks until the test lets it go, so the order of events is the test's."""

from __future__ import annotations

import logging
import threading

import trio
import trio.testing

from zvfs.fs.derived import MAX_SETTLING, DerivedCaches
from zvfs.logonce import LogOnce
from zvfs.stats import Counters


def _log_once() -> LogOnce:
    return LogOnce(logging.getLogger("zvfs"))


class _Drops:
    """A drop that records what it was given and holds each pass until ``let_go``."""

    def __init__(self) -> None:
        self.passes: list[tuple[list[int], list[tuple[int, bytes]]]] = []
        self.gate = threading.Event()
        self.started = threading.Event()

    def __call__(self, inodes: list[int], entries: list[tuple[int, bytes]]) -> None:
        self.passes.append((inodes, entries))
        self.started.set()
        self.gate.wait(10)

    def let_go(self) -> None:
        self.gate.set()


def test_write_replies_waiting_for_an_invalidation_are_bounded() -> None:
    """A write's reply waits for the kernel to drop its caches of the derived files, but at
    most MAX_SETTLING replies wait at once: each holds one of pyfuse3's session tasks, and
    the invalidation may wait for a read that only a free task can take. The rest reply at
    once and are counted; all the waiters go once the invalidation is done."""
    from zvfs.daemon import MAX_SESSION_TASKS

    assert MAX_SETTLING * 2 <= MAX_SESSION_TASKS
    counters = Counters()
    drops = _Drops()
    caches = DerivedCaches(counters, _log_once(), lambda: ([5], [(1, b".zvfs")]), drops)
    done: list[int] = []

    async def reply(i: int) -> None:
        await caches.settle()
        done.append(i)

    async def main() -> None:
        await caches.settle()  # nothing under way: no wait
        caches.changed()
        async with trio.open_nursery() as nursery:
            for i in range(MAX_SETTLING + 20):
                nursery.start_soon(reply, i)
            await trio.testing.wait_all_tasks_blocked()
            # 20 replied at once (which 20 is trio's choice: it runs a batch in either order)
            assert len(done) == 20 and caches.waiting == MAX_SETTLING
            assert counters.snapshot()["settle_skipped"] == 20
            drops.let_go()
        assert sorted(done) == list(range(MAX_SETTLING + 20)) and caches.waiting == 0
        assert drops.passes == [([5], [(1, b".zvfs")])]

    trio.run(main)


def test_a_burst_of_writes_during_a_pass_costs_one_more_pass() -> None:
    """Writes while a pass is under way ask for one more pass after it, not one each; the
    targets are asked for at the start of each pass, so the second sees what the writes
    made; and a reply that came during the first pass waits for the second."""
    asked: list[int] = []

    def targets() -> tuple[list[int], list[tuple[int, bytes]]]:
        asked.append(len(asked))
        return [len(asked)], []

    drops = _Drops()
    caches = DerivedCaches(Counters(), _log_once(), targets, drops)

    async def main() -> None:
        caches.changed()
        await trio.to_thread.run_sync(drops.started.wait, 10)
        for _ in range(5):
            caches.changed()
        settled = trio.Event()

        async def reply() -> None:
            await caches.settle()
            settled.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reply)
            await trio.testing.wait_all_tasks_blocked()
            assert not settled.is_set()
            drops.let_go()
        assert drops.passes == [([1], []), ([2], [])]
        await caches.settle()

    trio.run(main)


def test_a_pass_that_fails_lets_the_replies_go_and_the_mount_go_on(caplog) -> None:
    """The targets or the drop may fail (a bug, a name the kernel refuses): that pass is
    counted, and logged once a kind of error; the waiting replies go, and the next write
    starts a new pass. (An error let out of the pass, a trio system task, would end the
    whole mount.)"""
    calls: list[int] = []

    def drop(inodes: list[int], entries: list[tuple[int, bytes]]) -> None:
        calls.append(inodes[0])
        if len(calls) <= 2:
            raise OSError(22, "refused")

    counters = Counters()
    caches = DerivedCaches(counters, _log_once(), lambda: ([len(calls) + 2], []), drop)

    async def main() -> None:
        for _ in range(3):  # two passes fail, the third drops
            caches.changed()
            with trio.fail_after(10):
                await caches.settle()

    trio.run(main)
    assert calls == [2, 3, 4]
    assert counters.snapshot()["fuse_errors_invalidate"] == 2  # counted each time, logged once
    failed = [r for r in caplog.records if "derived files" in r.getMessage()]
    assert len(failed) == 1 and "refused" in failed[0].getMessage(), caplog.text
