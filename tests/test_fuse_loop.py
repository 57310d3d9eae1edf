"""The wait between FUSE requests (zvfs.fs.loop): a request already queued is read at once,
a task woken for a request another took waits again, the device's end ends the wait; and
through a real mount, many readers at once get every byte and the daemon ends at unmount."""

from __future__ import annotations

import json
import os
import threading

import pyfuse3
import pytest
import trio
from conftest import _pid_alive, daemon_pids, in_threads, run, store_files, tool, wait_until

from zvfs.fs import loop
from zvfs.stats import Counters


def test_the_device_is_the_one_descriptor_of_dev_fuse() -> None:
    assert loop.fuse_device_fd() is None  # the test process has none
    a = os.open("/dev/fuse", os.O_RDWR)
    try:
        assert loop.fuse_device_fd() == a
        b = os.open("/dev/fuse", os.O_RDWR)
        try:
            assert loop.fuse_device_fd() is None  # which one is pyfuse3's cannot be told
        finally:
            os.close(b)
    finally:
        os.close(a)


def test_queued_sees_data_and_the_end() -> None:
    r, w = os.pipe()
    try:
        queued = loop.queued_check(r)
        assert not queued()
        os.write(w, b"x")
        assert queued()
        os.read(r, 1)
        assert not queued()
        os.close(w)
        w = -1
        assert queued()  # the other end gone (POLLHUP): the read will report it
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


class _FakeWait:
    """pyfuse3's wait, stood in for: counts its calls, and may make a request arrive (a byte
    written to the pipe) at its n-th call."""

    def __init__(self, w: int, arrive_at: int | None = None) -> None:
        self.w = w
        self.calls = 0
        self.arrive_at = arrive_at

    async def __call__(self) -> bool:
        self.calls += 1
        assert self.calls < 50, "woken 50 times with nothing queued: the wait spins"
        await trio.lowlevel.checkpoint()
        if self.calls == self.arrive_at:
            os.write(self.w, b"r")
        return True  # woken: as if epoll said readable


@pytest.fixture
def pipe():
    r, w = os.pipe()
    yield r, w
    for fd in (r, w):
        try:
            os.close(fd)
        except OSError:
            pass


def _installed(monkeypatch, fake: _FakeWait, fd: int, counters: Counters | None = None):
    monkeypatch.setattr(pyfuse3, loop.WAIT_NAME, fake)
    undo = loop.install(counters, fd=fd)
    assert undo is not None
    wait = getattr(pyfuse3, loop.WAIT_NAME)
    assert wait is not fake
    return wait, undo


def test_a_queued_request_is_read_without_the_wait(monkeypatch, pipe) -> None:
    r, w = pipe
    fake = _FakeWait(w)
    counters = Counters()
    wait, undo = _installed(monkeypatch, fake, r, counters)
    os.write(w, b"r" * (loop.STREAK + 1))

    async def main() -> list[int]:
        seen = []
        for _ in range(loop.STREAK + 1):
            assert await wait()
            seen.append(fake.calls)
        return seen

    seen = trio.run(main)
    # STREAK requests at once, then one pass through the scheduler (pyfuse3's own wait)
    assert seen == [0] * loop.STREAK + [1]
    assert counters.snapshot()["fuse_requests_queued"] == loop.STREAK
    undo()
    assert getattr(pyfuse3, loop.WAIT_NAME) is fake


def test_a_task_woken_for_a_request_another_took_waits_again(monkeypatch, pipe) -> None:
    """The wait says readable (as epoll did) with nothing queued: returning then would make
    the loop block in read(). It must wait until a request is really there."""
    r, w = pipe
    fake = _FakeWait(w, arrive_at=3)
    wait, _undo = _installed(monkeypatch, fake, r)

    async def main() -> None:
        assert await wait()

    trio.run(main)
    assert fake.calls == 3
    assert os.read(r, 8) == b"r"


def test_the_device_end_ends_the_wait(monkeypatch, pipe) -> None:
    """At unmount the device reports its end, not a request: the wait returns, so the loop's
    read sees the end and stops (else the loop spins, and the daemon never exits)."""
    r, w = pipe
    fake = _FakeWait(w)
    wait, _undo = _installed(monkeypatch, fake, r)
    os.close(w)

    async def main() -> bool:
        return await wait()

    assert trio.run(main) is True
    assert fake.calls == 0


def test_pyfuse3_without_its_wait_is_left_alone(monkeypatch, pipe) -> None:
    monkeypatch.delattr(pyfuse3, loop.WAIT_NAME)
    assert loop.install(fd=pipe[0]) is None
    assert not hasattr(pyfuse3, loop.WAIT_NAME)


def test_many_readers_at_once_get_every_byte_and_the_daemon_ends(mount, zarr_dir) -> None:
    """Sixteen threads read every file of the store through one mount, over and over: the
    requests queue up, the loop reads them at once (counted), and every byte is the
    file's. Then the daemon exits at unmount."""
    ref = {k: p.read_bytes() for k, p in store_files(zarr_dir).items()}
    m = mount(zarr_dir)
    keys = sorted(ref) * 20
    lock = threading.Lock()
    bad: list[str] = []

    def reader(_i: int) -> None:
        while True:
            with lock:
                if not keys:
                    return
                key = keys.pop()
            with open(m.path / key, "rb") as f:
                if f.read() != ref[key]:
                    bad.append(key)

    assert in_threads(reader, 16) == []
    assert bad == []
    stats = json.loads((m.path / ".zvfs" / "stats.json").read_text())
    assert stats["fuse_requests_queued"] > 0, stats
    pids = daemon_pids(m.path)
    assert len(pids) == 1, pids
    run([tool("fusermount3"), "-u", m.path], check=True)
    assert wait_until(lambda: not _pid_alive(pids[0]), 10), "the daemon did not end at unmount"
