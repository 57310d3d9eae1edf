"""zvfs.logonce: one line per key, however many threads report it, within a bounded memory."""

from __future__ import annotations

import logging
import threading

import pytest

from zvfs.logonce import LogOnce


def test_one_line_per_key(caplog: pytest.LogCaptureFixture) -> None:
    once = LogOnce(logging.getLogger("zvfs.test"))
    with caplog.at_level(logging.WARNING, logger="zvfs.test"):
        for _ in range(3):
            once.warning("a/c/0", "bad chunk %s", "a/c/0")
            once.warning("a/c/1", "bad chunk %s", "a/c/1")
    assert [r.getMessage() for r in caplog.records] == ["bad chunk a/c/0", "bad chunk a/c/1"]


def test_threads_report_a_key_once() -> None:
    once = LogOnce(logging.getLogger("zvfs.test"))
    firsts: list[bool] = []
    start = threading.Barrier(8)

    def report() -> None:
        start.wait()
        firsts.extend(once.first(f"k{i}") for i in range(2000))

    threads = [threading.Thread(target=report) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(firsts) == 2000  # each key answered True exactly once across the threads


def test_memory_is_bounded_oldest_forgotten_first() -> None:
    once = LogOnce(logging.getLogger("zvfs.test"), limit=3)
    assert [once.first(k) for k in "abcd"] == [True] * 4
    assert not once.first("d") and not once.first("b")
    assert once.first("a")  # the oldest was forgotten: it may log again
