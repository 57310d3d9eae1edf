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

pyfuse3 does not tell its device descriptor: it is the process's one descriptor of
/dev/fuse. When that cannot be told, or pyfuse3 has no such wait, nothing is changed.
"""

from __future__ import annotations

import ctypes
import logging
import os
import select
from collections.abc import Awaitable, Callable

import pyfuse3

from zvfs.stats import Counters

log = logging.getLogger(__name__)

#: requests read on the fast path before one pass through trio's scheduler
STREAK = 16
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


def install(counters: Counters | None = None, fd: int | None = None) -> Callable[[], None] | None:
    """Wrap pyfuse3's wait for the device ``fd`` (by default the one /dev/fuse descriptor);
    call after ``pyfuse3.init``. Returns what undoes it, or None when it was left as it is.
    ``fuse_requests_queued`` counts the requests read at once."""
    original: Callable[[], Awaitable[bool]] | None = getattr(pyfuse3, WAIT_NAME, None)
    if fd is None:
        fd = fuse_device_fd()
    if original is None or fd is None:
        log.debug("pyfuse3's session loop left as it is (its wait: %s; device: %s)", original, fd)
        return None
    queued = queued_check(fd)
    streak = 0

    async def wait_fuse_readable() -> bool:
        nonlocal streak
        while True:
            if streak < STREAK and queued():
                streak += 1
                if counters is not None:
                    counters.add("fuse_requests_queued")
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
