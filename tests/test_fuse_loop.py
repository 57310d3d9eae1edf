"""The wait between FUSE requests (zvfs.fs.loop): a request already queued is read at once,
a task woken for a request another took waits again, the device's end ends the wait; and
through a real mount, many readers at once get every byte and the daemon ends at unmount."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pyfuse3
import pytest
import trio
from conftest import (
    _pid_alive,
    daemon_pids,
    in_threads,
    mount_stats,
    run,
    store_files,
    tool,
    wait_until,
)

from zvfs import cpus
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


class _Clock:
    """perf_counter_ns stood in for: each reading is ``step`` ns after the last; at reading
    ``arrive_at`` a request arrives (a byte in the pipe)."""

    def __init__(self, w: int, step: int, arrive_at: int | None = None) -> None:
        self.w, self.step, self.arrive_at = w, step, arrive_at
        self.now = self.readings = 0

    def __call__(self) -> int:
        self.readings += 1
        if self.readings == self.arrive_at:
            os.write(self.w, b"r")
        self.now += self.step
        return self.now


def _polling(monkeypatch, pipe, clock: _Clock, idle_for: float = 1.0, cpus: int = 2):
    r, _w = pipe
    fake = _FakeWait(pipe[1], arrive_at=1)  # the sleeping wait: a request comes at once
    counters = Counters()
    monkeypatch.setattr(loop.time, "perf_counter_ns", clock)
    monkeypatch.setattr(loop, "usable_cpus", lambda: cpus)
    monkeypatch.setattr(pyfuse3, loop.WAIT_NAME, fake)
    assert loop.install(counters, fd=r, busy_poll=100e-6, idle_for=lambda: idle_for) is not None
    wait = getattr(pyfuse3, loop.WAIT_NAME)

    async def main() -> bool:
        return await wait()

    assert trio.run(main) is True
    assert os.read(r, 8) == b"r"
    return fake.calls, counters.snapshot()


def test_busy_polling_catches_a_request_that_comes_soon(monkeypatch, pipe) -> None:
    """The next request comes 50 us after the wait began (the 5th reading of a clock
    stepping 10 us): the daemon, polling for up to 100 us, reads it without sleeping."""
    clock = _Clock(pipe[1], 10_000, arrive_at=5)
    calls, stats = _polling(monkeypatch, pipe, clock)
    assert calls == 0
    assert stats["fuse_requests_polled"] == 1 and stats["fuse_requests_queued"] == 0
    assert clock.readings == 5  # polled until it came, no longer


def test_busy_polling_gives_up_after_its_time(monkeypatch, pipe) -> None:
    """Nothing comes within 100 us: the daemon stops polling then, and sleeps in
    pyfuse3's wait."""
    clock = _Clock(pipe[1], 10_000)
    calls, stats = _polling(monkeypatch, pipe, clock)
    assert calls == 1 and stats["fuse_requests_polled"] == 0
    assert 10 <= clock.readings <= 12


@pytest.mark.parametrize("idle_for,cpus", [(0.0, 2), (loop.QUIET / 2, 2), (1.0, 1)])
def test_no_busy_polling_while_workers_work_or_on_one_cpu(monkeypatch, pipe, idle_for, cpus) -> None:
    """A worker's job running or just ended (its CPU is needed), or one CPU only (the
    reader could not run meanwhile): the daemon sleeps at once."""
    clock = _Clock(pipe[1], 10_000, arrive_at=2)
    calls, stats = _polling(monkeypatch, pipe, clock, idle_for=idle_for, cpus=cpus)
    assert calls == 1 and stats["fuse_requests_polled"] == 0
    assert clock.readings < 2  # no polling began


def test_no_busy_polling_while_another_request_is_in_hand(monkeypatch, pipe) -> None:
    """Another session task is answering a request (many readers at once): their requests
    queue anyway, and polling between them only held the trio thread (the daemon's peak
    RSS under 64 readers on S3 rose by about 10 MiB). The daemon sleeps at once."""
    import trio.testing

    r, w = pipe
    clock = _Clock(w, 10_000, arrive_at=2)
    fake = _FakeWait(w, arrive_at=1)
    monkeypatch.setattr(loop.time, "perf_counter_ns", clock)
    monkeypatch.setattr(loop, "usable_cpus", lambda: 2)
    monkeypatch.setattr(pyfuse3, loop.WAIT_NAME, fake)
    assert loop.install(Counters(), fd=r, busy_poll=100e-6, idle_for=lambda: 1.0) is not None
    wait = getattr(pyfuse3, loop.WAIT_NAME)
    os.write(w, b"q")

    async def main() -> None:
        done = trio.Event()

        async def answering() -> None:  # took a request, and is answering it
            assert await wait()
            assert os.read(r, 1) == b"q"
            await done.wait()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(answering)
            await trio.testing.wait_all_tasks_blocked()
            assert await wait()
            done.set()

    trio.run(main)
    assert clock.readings == 0 and fake.calls == 1


def test_pyfuse3_without_its_wait_is_left_alone(monkeypatch, pipe) -> None:
    monkeypatch.delattr(pyfuse3, loop.WAIT_NAME)
    assert loop.install(fd=pipe[0]) is None
    assert not hasattr(pyfuse3, loop.WAIT_NAME)


def _read_at_once(root, ref: dict[str, bytes], rounds: int, threads: int) -> list[BaseException]:
    """``threads`` threads share ``rounds`` passes over the files ``ref`` names under
    ``root``, each checking every byte; what they raised."""
    keys = sorted(ref) * rounds
    lock = threading.Lock()

    def reader(_i: int) -> None:
        while True:
            with lock:
                if not keys:
                    return
                key = keys.pop()
            assert (root / key).read_bytes() == ref[key], key

    return in_threads(reader, threads)


def test_many_readers_at_once_get_every_byte_and_the_daemon_ends(mount, zarr_dir) -> None:
    """Sixteen threads read every file of the store through one mount, over and over: the
    requests queue up, the loop reads them at once (counted), and every byte is the
    file's. Then the daemon exits at unmount."""
    ref = {k: p.read_bytes() for k, p in store_files(zarr_dir).items()}
    m = mount(zarr_dir)
    assert _read_at_once(m.path, ref, rounds=20, threads=16) == []
    stats = mount_stats(m.path)
    assert stats["fuse_requests_queued"] > 0, stats
    pids = daemon_pids(m.path)
    assert len(pids) == 1, pids
    run([tool("fusermount3"), "-u", m.path], check=True)
    assert wait_until(lambda: not _pid_alive(pids[0]), 10), "the daemon did not end at unmount"


@pytest.mark.exclusive  # pins itself and the daemon on CPUs of their own
@pytest.mark.parametrize("busy_poll", ["0", "2000"])
def test_a_reader_going_file_by_file_is_answered_by_busy_polling(mount, zarr_dir, busy_poll) -> None:
    """After a burst of 16 readers, one reader opens and reads the store's files one after
    the other, again and again (the bytes are then in the page cache: each open is answered
    from memory). With a 2 ms busy poll its requests come while the daemon polls; with 0,
    never.

    The reader and the daemon run on CPUs of their own, as the busy poll assumes. Left to
    the scheduler, they sometimes shared one for the whole loop (about 1 run in 30): each
    reply then woke the reader on the daemon's CPU, and its next request was already
    queued when the daemon came back to wait, so none came while it polled."""
    ref = {k: p.read_bytes() for k, p in store_files(zarr_dir).items()}
    m = mount(zarr_dir, "--busy-poll", busy_poll)
    # first 16 readers at once: pyfuse3 starts more session tasks, which end once idle
    # again; the daemon must still see when it has nothing but the next request to wait for
    assert _read_at_once(m.path, ref, rounds=8, threads=16) == []
    before = mount_stats(m.path)["fuse_requests_polled"]
    with _apart(daemon_pids(m.path)):
        for _ in range(10):
            for key, want in sorted(ref.items()):
                assert (m.path / key).read_bytes() == want, key
    stats = mount_stats(m.path)
    if busy_poll == "0":
        assert stats["fuse_requests_polled"] == 0, stats
    else:
        assert stats["fuse_requests_polled"] > before, stats


@contextmanager
def _apart(pids: list[int]) -> Iterator[None]:
    """This thread on one CPU and every thread of ``pids`` on another, for the block."""
    mine = os.sched_getaffinity(0)
    ids = sorted(mine)
    assert len(ids) >= 2 and pids, (ids, pids)
    threads = [int(t) for pid in pids for t in os.listdir(f"/proc/{pid}/task")]
    for tid in threads:
        try:
            os.sched_setaffinity(tid, {ids[1]})
        except ProcessLookupError:
            pass  # a worker thread that ended since the listing (idle for 10 s, trio ends it)
    os.sched_setaffinity(0, {ids[0]})
    try:
        yield
    finally:
        os.sched_setaffinity(0, mine)
        for tid in threads:
            try:
                os.sched_setaffinity(tid, mine)
            except ProcessLookupError:
                pass  # a worker thread that has ended


def _cgroup_tree(tmp_path, files: dict[str, str], cgroup_lines: list[str]):
    root = tmp_path / "sys-fs-cgroup"
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    proc = tmp_path / "cgroup"
    proc.write_text("\n".join(cgroup_lines) + "\n")
    return str(proc), str(root)


def test_a_cgroup_quota_bounds_the_cpus_for_busy_polling(tmp_path) -> None:
    """A systemd unit's CPUQuota= or a container's --cpus is a cgroup CPU quota: the
    smallest on the cgroup's path counts, in cgroup v2 and v1 alike; none set, None."""
    proc, root = _cgroup_tree(tmp_path, {
        "cpu.max": "max 100000\n",
        "system.slice/cpu.max": "150000 100000\n",
        "system.slice/zvfs@a.service/cpu.max": "max 100000\n",
    }, ["0::/system.slice/zvfs@a.service"])
    assert cpus.cgroup_cpu_quota(proc, root) == 1.5
    assert cpus.usable_cpus(proc, root) <= 1.5  # too few to poll: the reader needs a CPU

    proc, root = _cgroup_tree(tmp_path / "v1", {
        "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "250000\n",
        "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
        "cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
        "cpu,cpuacct/cpu.cfs_period_us": "100000\n",
    }, ["4:memory:/docker/abc", "2:cpu,cpuacct:/docker/abc", "0::/"])
    assert cpus.cgroup_cpu_quota(proc, root) == 2.5

    proc, root = _cgroup_tree(tmp_path / "none", {"cpu.max": "max 100000\n"}, ["0::/"])
    assert cpus.cgroup_cpu_quota(proc, root) is None
    assert cpus.cgroup_cpu_quota(str(tmp_path / "missing"), root) is None
    assert cpus.usable_cpus(proc, root) == len(os.sched_getaffinity(0))
