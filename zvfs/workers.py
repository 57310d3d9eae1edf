"""The one way blocking work leaves the trio thread: :class:`Workers` (one per mount, in
its context), and :func:`run_abandonable` for calls that may wait on the mount itself.
"""

from __future__ import annotations

import contextvars
import inspect
import itertools
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
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


#: what the work on the trio task now is for (the fs layer sets a file's inode around its
#: reads); the tasks it starts inherit it. None: no file's (listings, metadata, writes)
current_flow: contextvars.ContextVar[object | None] = contextvars.ContextVar("zvfs_flow", default=None)


def flow_cap(limit: int) -> int:
    """Threads one flow may hold at once: all but an eighth of them (one at least), which
    stay for the reads of other files (14 of the 16 by default: one file read alone keeps
    most of the connections a read ahead of it can use)."""
    return max(1, limit - max(1, limit // 8))


@dataclass(eq=False)
class _Waiter:
    task: trio.lowlevel.Task
    flow: object | None


class _Lanes:
    """``limit`` threads for two queues: a job of the urgent lane takes the next free
    thread before any waiting job of the other, and each lane is served in order.

    Urgent jobs are what a person at a prompt waits on (a directory listing, the
    discovery of the arrays): short, and few. Behind a cold decoded read, the other lane
    holds up to half the cache of chunks to decode, and an ``ls`` that queued behind them
    took 0.2-0.35 s instead of 6 ms.

    The jobs of one flow (the reads of one file) hold at most ``flow_cap`` threads; a job
    over it waits, and the jobs of other flows behind it go first. Without that, the reads
    of one file whose chunks the server stalled held every thread, each up to the 60 s
    deadline, and a read of any other file of the mount waited behind them: 178 s."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.cap = flow_cap(limit)
        #: threads held (by a job running, or by one abandoned whose thread has not ended)
        self.used = 0
        self._held: dict[object, int] = {}
        self._urgent: deque[_Waiter] = deque()
        self._normal: deque[_Waiter] = deque()

    def _may(self, flow: object | None) -> bool:
        return flow is None or self._held.get(flow, 0) < self.cap

    def _take(self, flow: object | None) -> None:
        if flow is not None:
            self._held[flow] = self._held.get(flow, 0) + 1

    def _next(self) -> _Waiter | None:
        """The first waiter, urgent lane first, whose flow may take a thread."""
        for lane in (self._urgent, self._normal):
            for waiter in lane:
                if self._may(waiter.flow):
                    lane.remove(waiter)
                    return waiter
        return None

    async def acquire(self, urgent: bool, flow: object | None = None) -> None:
        """Take a thread, waiting in ``urgent``'s lane while none is free (or ``flow`` holds
        its share). A waiter woken by :meth:`release` is handed that thread; one cancelled
        while waiting takes none."""
        lanes = (self._urgent,) if urgent else (self._urgent, self._normal)
        queued = any(self._may(w.flow) for lane in lanes for w in lane)
        if self.used < self.limit and not queued and self._may(flow):
            self.used += 1
            self._take(flow)
            return
        waiter = _Waiter(trio.lowlevel.current_task(), flow)
        lane = self._urgent if urgent else self._normal
        lane.append(waiter)

        def abort(_: object) -> trio.lowlevel.Abort:
            lane.remove(waiter)
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    def release(self, flow: object | None = None) -> None:
        """A job of ``flow`` ended: its thread goes to the first waiter that may take it."""
        if flow is not None:
            left = self._held[flow] - 1
            if left:
                self._held[flow] = left
            else:
                del self._held[flow]
        waiter = self._next()
        if waiter is None:
            self.used -= 1
            return
        self._take(waiter.flow)
        trio.lowlevel.reschedule(waiter.task)


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
    flow = current_flow.get()
    await lanes.acquire(urgent, flow)
    waiting: list[trio.lowlevel.Task | None] = [trio.lowlevel.current_task()]

    def back(result: outcome.Outcome) -> None:  # on the trio thread
        lanes.release(flow)
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
        lanes.release(flow)
        raise

    def abort(_: object) -> trio.lowlevel.Abort:
        waiting[0] = None
        return trio.lowlevel.Abort.SUCCEEDED

    return await trio.lowlevel.wait_task_rescheduled(abort)


K = TypeVar("K")


async def gather(keys: list[K], fn: Callable[[K], Awaitable[T]]) -> dict[K, T]:
    """``{k: await fn(k)}`` for all keys concurrently; the first error is re-raised as itself.

    Errors are collected rather than left to the nursery so callers see the plain
    exception (e.g. NodeError) on every trio version, not an exception group. The first
    one cancels the calls still under way: the result fails whatever they give, and those
    still waiting for a thread (one file holds at most ``flow_cap`` of them) would each
    have run a request to its deadline first: a read of 16 chunks that S3 refused took
    two deadlines with 16 threads, and 16 with 2. A call already in a thread is left to
    end there (see ``_hop``).
    """
    out: dict[K, T] = {}
    if len(keys) == 1:
        out[keys[0]] = await fn(keys[0])
        return out
    errors: list[BaseException] = []

    async with trio.open_nursery() as nursery:

        async def one(k: K) -> None:
            try:
                out[k] = await fn(k)
            except Exception as exc:  # noqa: BLE001 - re-raised below
                errors.append(exc)
                nursery.cancel_scope.cancel()

        for k in keys:
            nursery.start_soon(one, k)
    if errors:
        raise errors[0]
    return out


async def gather_batched(keys: Iterable[K], fn: Callable[[K], Awaitable[T]], batch: int) -> dict[K, T]:
    """:func:`gather` over ``keys`` ``batch`` at a time: a bounded number of tasks however
    many keys (every chunk of an array, every group of a hierarchy)."""
    out: dict[K, T] = {}
    it = iter(keys)
    while group := list(itertools.islice(it, batch)):
        out.update(await gather(group, fn))
    return out
