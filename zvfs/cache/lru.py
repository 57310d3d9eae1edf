"""A byte-bounded, optionally expiring LRU whose loads are single-flight.

One mechanism serves decoded chunks (bounded by bytes, never expiring),
listings and metadata (bounded by count, expiring after the metadata TTL).
Single-flight: while a key is loading, later callers wait for that load
instead of starting their own, so two readers of one chunk cause one fetch
and one decode. A failed load is not cached; every waiter sees its error.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import trio


def default_size(value: Any) -> int:
    """What an entry's value takes: ``.nbytes`` (one element for a broadcast fill), else ``len()``."""
    nbytes = getattr(value, "nbytes", None)
    if nbytes is not None:
        strides = getattr(value, "strides", None)
        if strides and not any(strides):  # a broadcast (fill) array holds one element
            return int(getattr(value, "itemsize", 1))
        return int(nbytes)
    try:
        return len(value)
    except TypeError:
        return 1


#: puts between two sweeps of expired entries, at least (see Cache._sweep)
SWEEP_AFTER = 256


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    waits: int = 0  # callers that joined an in-flight load
    evictions: int = 0
    load_errors: int = 0


@dataclass(slots=True)
class _Flight:
    #: set when the load ends; the keys of one get_many load share one
    done: trio.Event = field(default_factory=trio.Event)
    value: Any = None
    error: BaseException | None = None
    #: invalidated while loading: its callers get the value, the cache does not keep it
    stale: bool = False
    #: loaded with other keys, and that load failed: no failure of this key's own (another
    #: key's bad bytes), so a waiter loads it alone rather than take the error
    retry: bool = False


class Cache:
    """LRU keyed by any hashable; ``max_bytes`` bounds the sum of sizes.

    ``ttl`` is seconds an entry stays valid (None: forever, 0: never cached); a
    ``get``/``put`` may give its own ``ttl`` for that entry. ``sizeof`` measures an
    entry; by default ``.nbytes`` or ``len()``, plus ``overhead`` bytes for the
    bookkeeping, so a million tiny entries cannot outgrow the bound unnoticed.
    ``on_drop`` is given every value the cache lets go (evicted, invalidated, expired,
    replaced): the chunk cache hands its buffers to the mount's BufferPool.
    """

    def __init__(
        self,
        max_bytes: int,
        ttl: float | None = None,
        sizeof: Callable[[Any], int] = default_size,
        overhead: int = 0,
        on_drop: Callable[[Any], None] | None = None,
    ) -> None:
        self.max_bytes = max_bytes
        self.ttl = ttl
        self._sizeof = sizeof
        self._overhead = overhead
        self._on_drop = on_drop
        self._entries: OrderedDict[Hashable, tuple[Any, int, float | None]] = OrderedDict()
        self._flights: dict[Hashable, _Flight] = {}
        self.current_bytes = 0
        self.stats = CacheStats()
        #: puts since expired entries were last swept out (only once an entry may expire)
        self._puts_since_sweep = 0
        self._may_expire = False

    def __len__(self) -> int:
        return len(self._entries)

    def peek(self, key: Hashable, count: bool = True) -> Any | None:
        """The cached value or None, without loading (counted as a hit when found, unless
        ``count`` is False: a look ahead of any reader's request)."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        value, _, expires = entry
        if expires is not None and time.monotonic() > expires:
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        if count:
            self.stats.hits += 1
        return value

    def contains(self, key: Hashable) -> bool:
        return key in self._entries or key in self._flights

    async def get(
        self, key: Hashable, load: Callable[[], Awaitable[Any]], ttl: float | None | bool = True
    ) -> Any:
        """The value for ``key``; on a miss, ``await load()`` once for all concurrent callers.

        ``ttl`` True means the cache's own TTL; a number or None sets this entry's."""
        while True:
            value = self.peek(key)
            if value is not None:
                return value
            flight = self._flights.get(key)
            if flight is None:
                break
            self.stats.waits += 1
            await flight.done.wait()
            if flight.retry or (flight.error is not None and not isinstance(flight.error, Exception)):
                # its loader's caller gave up (a read that failed by another chunk), or its
                # batch failed (get_many): not this caller's failure; raised here, it ended
                # this task without a value. A loader that ran a nursery of its own (a
                # gather) is cancelled with a group of Cancelled, not a Cancelled: raised in a
                # waiter no scope cancelled, that group passed every request handler's
                # ``except Exception`` and ended the mount (a helper's audit)
                continue
            if flight.error is not None:
                raise flight.error
            return flight.value
        self.stats.misses += 1
        flight = _Flight()
        self._flights[key] = flight
        try:
            flight.value = await load()
        except BaseException as exc:
            flight.error = exc
            self.stats.load_errors += 1
            raise
        finally:
            if self._flights.get(key) is flight:
                del self._flights[key]
            flight.done.set()
        if not flight.stale:
            self.put(key, flight.value, ttl)
        return flight.value

    async def get_many(
        self, keys: list[Hashable], load_many: Callable[[list[Hashable]], Awaitable[dict[Hashable, Any]]],
        ttl: float | None | bool = True,
    ) -> dict[Hashable, Any]:
        """The values for ``keys``: the cached ones, those another caller is loading (waited
        for), and the rest by one ``await load_many(rest)`` (a dict holding each), each of
        them single-flight with :meth:`get`: many tiny chunks are loaded in one worker hop,
        and a reader of one of them joins that load rather than start its own.

        A failed ``load_many`` raises here; the callers waiting on one of its keys load that
        key alone (the failure may be another key's)."""
        out: dict[Hashable, Any] = {}
        mine: dict[Hashable, _Flight] = {}
        theirs = []
        # the keys loaded here end together: one event for them all (a read of 65,536 tiny
        # chunks made and set as many)
        done = trio.Event()
        for key in keys:
            value = self.peek(key)
            if value is not None:
                out[key] = value
            elif key in self._flights:
                theirs.append(key)
            elif key not in mine:
                self.stats.misses += 1
                mine[key] = self._flights[key] = _Flight(done)
        if mine:
            try:
                loaded = await load_many(list(mine))
                for key, flight in mine.items():
                    flight.value = loaded[key]
            except BaseException as exc:
                for flight in mine.values():
                    flight.error, flight.retry = exc, True
                self.stats.load_errors += 1
                raise
            finally:
                for key, flight in mine.items():
                    if self._flights.get(key) is flight:
                        del self._flights[key]
                done.set()
            for key, flight in mine.items():
                if not flight.stale:
                    self.put(key, flight.value, ttl)
                out[key] = flight.value
        for key in theirs:
            async def alone(key: Hashable = key) -> Any:
                return (await load_many([key]))[key]

            out[key] = await self.get(key, alone, ttl)
        return out

    def put(self, key: Hashable, value: Any, ttl: float | None | bool = True) -> None:
        if ttl is True:
            ttl = self.ttl
        if ttl == 0 or value is None:
            return
        size = self._sizeof(value) + self._overhead
        if size > self.max_bytes:
            return
        if key in self._entries:
            self._drop(key)
        self._entries[key] = (value, size, None if ttl is None else time.monotonic() + ttl)
        self.current_bytes += size
        if ttl is not None:
            self._may_expire = True
        if self._may_expire:
            self._puts_since_sweep += 1
            if self._puts_since_sweep >= max(SWEEP_AFTER, len(self._entries) // 2):
                self._sweep()
        while self.current_bytes > self.max_bytes and self._entries:
            old = next(iter(self._entries))
            self._drop(old)
            self.stats.evictions += 1

    def _sweep(self) -> None:
        """Drop every expired entry. An expired entry went only when asked for again or
        evicted by the bound: a listings cache bounded by count (100,000) kept the listing
        of every prefix a store ever had, stale, for the mount's life (a bucket with a new
        prefix a day; a directory store whose arrays are rewritten under new names). Run
        once every len(entries) / 2 puts: a put costs O(1) on average."""
        self._puts_since_sweep = 0
        now = time.monotonic()
        for key in [k for k, (_, _, expires) in self._entries.items() if expires is not None and now > expires]:
            self._drop(key)

    def invalidate(self, key: Hashable) -> None:
        """Forget ``key``. A load of it under way began before the change: its value is
        not kept, and later callers start a load of their own instead of joining it."""
        if key in self._entries:
            self._drop(key)
        self.outdate_load(key)

    def outdate_load(self, key: Hashable) -> None:
        """A load of ``key`` under way began before a change the cached value was patched
        for: its value is not kept (later callers load anew); the cached value stays."""
        flight = self._flights.pop(key, None)
        if flight is not None:
            flight.stale = True

    def invalidate_matching(self, match: Callable[[Hashable], bool]) -> None:
        """:meth:`invalidate` every key ``match`` accepts (a scan of them all)."""
        for key in [k for k in self._entries if match(k)]:
            self._drop(key)
        for key in [k for k in self._flights if match(k)]:
            self._flights.pop(key).stale = True

    def _drop(self, key: Hashable) -> None:
        value, size, _ = self._entries.pop(key)
        self.current_bytes -= size
        if self._on_drop is not None:
            self._on_drop(value)
