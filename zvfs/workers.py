"""The one way blocking work leaves the trio thread: :class:`Workers` (one per mount, in
its context), and :func:`run_abandonable` for calls that may wait on the mount itself.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import trio

if TYPE_CHECKING:
    import outcome

T = TypeVar("T")

# A cancelled caller (the daemon shutting down) does not wait for a thread stuck in a
# socket read: the thread is abandoned, so SIGTERM unmounts at once even while the
# store hangs. (trio renamed the flag in 0.23.)
_ABANDON: dict[str, Any] = (
    {"abandon_on_cancel": True}
    if "abandon_on_cancel" in inspect.signature(trio.to_thread.run_sync).parameters
    else {"cancellable": True}
)


async def run_abandonable(fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` in a thread of its own (outside the worker limit), abandoned if the
    caller is cancelled: for calls that may wait on the mount itself (a stat through FUSE,
    the kernel's cache invalidation)."""
    return await trio.to_thread.run_sync(fn, *args, **_ABANDON)


class _Lanes:
    """``limit`` threads for two queues: a job of the urgent lane takes the next free
    thread before any waiting job of the other, and each lane is served in order.

    Urgent jobs are what a person at a prompt waits on (a directory listing, the
    discovery of the arrays): short, and few. Behind a cold decoded read, the other lane
    holds up to half the cache of chunks to decode, and an ``ls`` that queued behind them
    took 0.2-0.35 s instead of 6 ms."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        #: threads held (by a job running, or by one abandoned whose thread has not ended)
        self.used = 0
        self._urgent = trio.lowlevel.ParkingLot()
        self._normal = trio.lowlevel.ParkingLot()

    async def acquire(self, urgent: bool) -> None:
        """Take a thread, waiting in ``urgent``'s lane while none is free. A waiter woken by
        :meth:`release` is handed that thread; one cancelled while waiting takes none."""
        queued = bool(self._urgent) if urgent else bool(self._urgent or self._normal)
        if self.used < self.limit and not queued:
            self.used += 1
            return
        await (self._urgent if urgent else self._normal).park()

    def release(self) -> None:
        """Give the thread to the first waiter of the urgent lane, else of the other."""
        for lot in (self._urgent, self._normal):
            if lot:
                lot.unpark(count=1)
                return
        self.used -= 1


class Workers:
    """The mount's worker threads: every store call and every decode goes through :meth:`run`,
    so the number of threads (and thus of S3 connections and concurrent decodes) is
    bounded by one limit that the options size. The mount's context owns it."""

    def __init__(self, limit: int = 16) -> None:
        self.limit = max(1, int(limit))
        self._lanes: _Lanes | None = None  # made in the trio run that uses it
        self._busy = 0
        self._last = 0.0

    @property
    def in_use(self) -> int:
        """Threads held now, abandoned ones included (each is given back when it ends)."""
        return self._lanes.used if self._lanes is not None else 0

    def idle_for(self) -> float:
        """Seconds since the last job ended; 0 while any is running (each will hand a result
        back to the trio thread)."""
        if self._busy:
            return 0.0
        return time.monotonic() - self._last

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """Run ``fn(*args)`` in a worker thread (one hop) and return its result."""
        return await self._run(False, fn, args)

    async def run_urgent(self, fn: Callable[..., T], *args: object) -> T:
        """:meth:`run`, ahead of every job waiting in the ordinary lane: for the short store
        calls someone waits on interactively (listings, metadata), not for data."""
        return await self._run(True, fn, args)

    async def _run(self, urgent: bool, fn: Callable[..., T], args: tuple[object, ...]) -> T:
        if self._lanes is None:
            self._lanes = _Lanes(self.limit)
        self._busy += 1
        try:
            return await _hop(self._lanes, urgent, fn, args)
        finally:
            self._busy -= 1
            self._last = time.monotonic()


async def _hop(lanes: _Lanes, urgent: bool, fn: Callable[..., T], args: tuple[object, ...]) -> T:
    """``fn(*args)`` in a cached worker thread: ``trio.to_thread.run_sync`` without what every
    chunk paid for and zvfs never uses. trio renames the OS thread before and after each
    job (two ctypes calls, each a release and re-take of the GIL, which the trio thread
    holds most of the time), copies the context and installs ``trio.from_thread``'s token.

    Same contract otherwise: the thread is held until it is done, even by a caller that
    was cancelled (abandoned: the thread's result is dropped)."""
    await trio.lowlevel.checkpoint_if_cancelled()
    token = trio.lowlevel.current_trio_token()
    await lanes.acquire(urgent)
    waiting: list[trio.lowlevel.Task | None] = [trio.lowlevel.current_task()]

    def back(result: outcome.Outcome) -> None:  # on the trio thread
        lanes.release()
        if waiting[0] is not None:
            trio.lowlevel.reschedule(waiting[0], result)

    def deliver(result: outcome.Outcome) -> None:  # on the worker thread
        try:
            token.run_sync_soon(back, result)
        except trio.RunFinishedError:
            pass

    try:
        trio.lowlevel.start_thread_soon(lambda: fn(*args), deliver)
    except BaseException:
        lanes.release()
        raise

    def abort(_: object) -> trio.lowlevel.Abort:
        waiting[0] = None
        return trio.lowlevel.Abort.SUCCEEDED

    return await trio.lowlevel.wait_task_rescheduled(abort)


K = TypeVar("K")


async def gather(keys: list[K], fn: Callable[[K], Awaitable[T]]) -> dict[K, T]:
    """``{k: await fn(k)}`` for all keys concurrently; the first error is re-raised as itself.

    Errors are collected rather than left to the nursery so callers see the plain
    exception (e.g. NodeError) on every trio version, not an exception group.
    """
    out: dict[K, T] = {}
    if len(keys) == 1:
        out[keys[0]] = await fn(keys[0])
        return out
    errors: list[BaseException] = []

    async def one(k: K) -> None:
        try:
            out[k] = await fn(k)
        except Exception as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    async with trio.open_nursery() as nursery:
        for k in keys:
            nursery.start_soon(one, k)
    if errors:
        raise errors[0]
    return out
