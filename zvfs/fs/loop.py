"""A cheaper wait between FUSE requests in pyfuse3's session loop.

Before each request it reads, pyfuse3 (3.x, ``_session_loop`` in internal.pxi) takes a
trio lock and parks on the FUSE device until epoll reports it readable: two trips through
trio's scheduler and epoll's system calls, even when requests are already queued, as they
are when several readers share the mount or the kernel reads ahead. Those trips, on the
one trio thread, are much of what a request costs the daemon.

This wraps that wait (the loop looks it up by name at every request): a zero-timeout
poll(2) first, and a request already queued is read at once. The loop reads the device
right after the wait returns, with no await between, so a request the poll saw is still
there to read. A task that epoll woke checks the same way before it returns, since a task
on the fast path may have taken the request it was woken for, and a read with no request
queued would block the whole loop. Any event other than a request (the device's end at
unmount) also ends the wait: the loop's read reports it and the loop stops.

A run of fast waits passes through the scheduler every ``STREAK`` requests, so a stream of
requests never starves the mount's other tasks (worker threads' results, timers).

A reader going through files one by one (cp, rsync, a warm re-read) sends its next request
a few tens of microseconds after the daemon answered the last: sooner than the daemon can
go to sleep in epoll and be woken, which with trio's two scheduler passes is much of what
such a request costs. So the daemon busy-polls for the next request (``busy_poll``
seconds, the mount option of that name) before it goes to sleep, as network stacks
busy-poll their sockets. Only when nothing else waits for the trio thread (no task ready
to run, no worker's result coming) and the process may use two CPUs or more (its CPU
affinity and its cgroup's CPU quota both count): on one CPU the reader could not run
while the daemon polled. And only once the mount's workers have
been idle for a while (QUIET): while their jobs come and go, a polling daemon takes the
CPU from them and from the reader (a cold read of a zip was 8% slower so).

pyfuse3 does not tell its device descriptor: it is the process's one descriptor of
/dev/fuse. When that cannot be told, or pyfuse3 has no such wait, nothing is changed.
"""

from __future__ import annotations

import ctypes
import logging
import os
import select
import time
import weakref
from collections.abc import Awaitable, Callable

import trio

from zvfs.cpus import usable_cpus
from zvfs.fs.fuse import pyfuse3
from zvfs.stats import Counters

log = logging.getLogger(__name__)

#: requests read on the fast path before one pass through trio's scheduler
STREAK = 16
#: seconds the mount's workers must have been idle before the daemon busy-polls: while
#: their jobs come and go (disk reads, decoding, S3) the CPU is theirs
QUIET = 0.001
#: pyfuse3's wait, looked up by its session loop at every request
WAIT_NAME = "_wait_fuse_readable"


class _PollFd(ctypes.Structure):
    _fields_ = [("fd", ctypes.c_int), ("events", ctypes.c_short), ("revents", ctypes.c_short)]


def fuse_device_fd() -> int | None:
    """The process's one descriptor open on /dev/fuse; None if it has none or several."""
    found = []
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return None
    for name in names:
        try:
            if os.readlink(f"/proc/self/fd/{name}") == "/dev/fuse":
                found.append(int(name))
        except (OSError, ValueError):
            continue  # closed meanwhile (listdir's own descriptor among them)
    return found[0] if len(found) == 1 else None


def queued_check(fd: int) -> Callable[[], bool]:
    """A check of whether ``fd`` has an event now (a request to read, or its end).

    poll(2) is called without letting go of the GIL: with a zero timeout it cannot block,
    and a thread that lets go of the GIL waits up to a switch interval to get it back
    while worker threads decode."""
    pollfd = _PollFd(fd, select.POLLIN, 0)
    poll = ctypes.PyDLL(None).poll
    poll.argtypes = [ctypes.POINTER(_PollFd), ctypes.c_ulong, ctypes.c_int]
    poll.restype = ctypes.c_int
    ref = ctypes.byref(pollfd)

    def queued() -> bool:
        return poll(ref, 1, 0) > 0

    return queued


def install(counters: Counters | None = None, fd: int | None = None, busy_poll: float = 0.0,
            idle_for: Callable[[], float] | None = None) -> Callable[[], None] | None:
    """Wrap pyfuse3's wait for the device ``fd`` (by default the one /dev/fuse descriptor);
    call after ``pyfuse3.init``. Returns what undoes it, or None when it was left as it is.

    ``busy_poll``: seconds to poll for the next request before sleeping, when no other
    request is in hand, trio has no task ready and ``idle_for()``, the seconds the mount's
    workers have had no job, is at least QUIET. The requests found waiting are counted as ``fuse_requests_queued``, those
    that came while the daemon polled as ``fuse_requests_polled``."""
    original: Callable[[], Awaitable[bool]] | None = getattr(pyfuse3, WAIT_NAME, None)
    if fd is None:
        fd = fuse_device_fd()
    if original is None or fd is None:
        log.debug("pyfuse3's session loop left as it is (its wait: %s; device: %s)", original, fd)
        return None
    queued = queued_check(fd)
    spin_ns = int(busy_poll * 1e9) if usable_cpus() >= 2 else 0
    clock = time.perf_counter_ns
    streak = 0
    # pyfuse3's session tasks, and how many of them are in this wait: the others are
    # answering a request
    sessions: weakref.WeakSet[trio.lowlevel.Task] = weakref.WeakSet()
    waiting = 0

    def quiet() -> bool:
        """No other request in hand and no worker job lately: the daemon has nothing else to
        do (with 64 readers on S3, polling between their requests raised the daemon's peak
        RSS by about 10 MiB, for no gain: their requests are queued anyway)."""
        return len(sessions) <= waiting and (idle_for is None or idle_for() >= QUIET)

    def others_ready() -> bool:
        stats = trio.lowlevel.current_statistics()
        return bool(stats.tasks_runnable or stats.run_sync_soon_queue_size)

    def poll_for(ns: int) -> bool:
        until = clock() + ns
        while clock() < until:
            if queued():
                return True
        return False

    def count(name: str) -> None:
        if counters is not None:
            counters.add(name)

    async def wait_fuse_readable() -> bool:
        nonlocal waiting
        sessions.add(trio.lowlevel.current_task())
        waiting += 1
        try:
            return await wait_for_request()
        finally:
            waiting -= 1

    async def wait_for_request() -> bool:
        nonlocal streak
        while True:
            if streak < STREAK:
                if queued():
                    streak += 1
                    count("fuse_requests_queued")
                    return True
                if spin_ns > 0 and quiet():
                    # tasks ready to run (often only pyfuse3's own, handed its lock) run
                    # first: one pass through the scheduler, still no sleep
                    if others_ready():
                        await trio.lowlevel.cancel_shielded_checkpoint()
                    if quiet() and not others_ready() and (queued() or poll_for(spin_ns)):
                        streak += 1
                        count("fuse_requests_polled")
                        return True
            streak = 0
            if not await original():
                return False
            if queued():
                return True
            # another task read the request this one was woken for: wait again

    setattr(pyfuse3, WAIT_NAME, wait_fuse_readable)

    def undo() -> None:
        setattr(pyfuse3, WAIT_NAME, original)

    return undo
