"""Cutting off S3 requests still under way at their deadline.

Each try of a request waits at most ``s3_timeout`` for the server's next bytes, and that
timeout never trips for a server that sends one byte at a time: a GET's body, a PUT's
answer or a listing page trickling in could keep a read, or a close() waiting for its
upload, for as long as the server liked (minutes, in the hostile-server audits), past the
deadline the README promises. So every request runs ``watching(deadline)``: each HTTP
connection the calling thread takes from the client's pools while it runs is attached to
it, and given back when the pool gets it back. One thread of the mount keeps the
deadlines, and at one it shuts down the sockets of the connections still attached: the
blocked send or receive returns at once, and the request fails as late. (The store does not
watch the requests S3 keeps alive with blanks while it works, such as a large copy.)

The connections are seen by the pools themselves (:func:`watch_pools` gives the client's
HTTP session pool classes that report what they hand out and get back), because botocore
hides the socket of every request but a GET's body. Registering a request costs a lock and
a heap push, not a thread per request.
"""

from __future__ import annotations

import heapq
import itertools
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class AnswerTooLarge(ValueError):
    """An answer read whole (a listing page, an upload's answer) went on past the bound the
    request set (:meth:`Watchdog.bounded`): a ValueError, as botocore's parse of a malformed
    answer raises, so the store fails the request and does not retry it."""


class Watch:
    """One request's deadline and the connections it holds; ``fired`` once the deadline
    passed, ``cut`` once a connection was shut down for it (one still held then, or taken
    after)."""

    __slots__ = ("outer", "conns", "fired", "cut", "ended")

    def __init__(self, outer: Watch | None) -> None:
        self.outer = outer  # the thread's watch before this one, back at its end
        self.conns: set[Any] = set()
        self.fired = False
        self.cut = False
        self.ended = False


#: seconds after which a watch that found a connection still connecting looks again
RECHECK = 0.05
#: the heap is rid of ended watches once it holds this many and four times the live ones
PRUNE_AT = 256


def _shut(conn: Any) -> bool:
    """Shut ``conn``'s socket down; False when it has none yet (still connecting)."""
    sock = getattr(conn, "sock", None)
    if not isinstance(sock, socket.socket):
        return False
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # closed meanwhile
    return True


class Watchdog:
    """Deadlines for the requests made by threads ``watching`` them."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Watch]] = []
        self._holder: dict[Any, Watch] = {}  # connection -> the watch holding it
        self._local = threading.local()  # .watch: the calling thread's request, if any
        self._seq = itertools.count()
        self._live = 0  # watches started and not ended
        self._thread: threading.Thread | None = None

    def start(self, deadline: float) -> Watch:
        """Until :meth:`end`, the calling thread's requests are cut off at ``deadline``
        (time.monotonic())."""
        watch = Watch(getattr(self._local, "watch", None))
        self._local.watch = watch
        with self._cond:
            heapq.heappush(self._heap, (deadline, next(self._seq), watch))
            self._live += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="zvfs-s3-deadline", daemon=True)
                self._thread.start()
            elif self._heap[0][2] is watch:
                self._cond.notify()
        return watch

    def end(self, watch: Watch) -> bool:
        """Stop watching (again: no harm); True when the deadline cut a request off (one
        done before it, whose connection went back to its pool, was not)."""
        with self._cond:
            if not watch.ended:
                watch.ended = True
                self._live -= 1
                self._local.watch = watch.outer
                for conn in watch.conns:
                    self._holder.pop(conn, None)
                watch.conns.clear()
                if len(self._heap) > PRUNE_AT and len(self._heap) > 4 * self._live:
                    # requests end long before their deadlines: without this the heap
                    # would hold every request of the last s3_deadline seconds
                    self._heap = [item for item in self._heap if not item[2].ended]
                    heapq.heapify(self._heap)
            return watch.cut

    @contextmanager
    def watching(self, deadline: float) -> Iterator[Watch]:
        """:meth:`start` to :meth:`end` around a block; the watch's ``cut`` says whether it
        was cut off."""
        watch = self.start(deadline)
        try:
            yield watch
        finally:
            self.end(watch)

    @contextmanager
    def bounded(self, limit: int) -> Iterator[None]:
        """Within the block, an answer the calling thread's requests read whole (each one but
        a GET's body, which the store reads itself, piece by piece) may hold at most
        ``limit`` bytes: botocore reads such a body into memory, then parses all of it, so a
        server sending a listing page without end (or an upload's answer of endless blanks,
        which only the timeout between bytes bounds) grew the daemon without bound."""
        outer = getattr(self._local, "limit", None)
        self._local.limit = limit
        try:
            yield
        finally:
            self._local.limit = outer

    def limit(self) -> int | None:
        """The calling thread's bound on an answer read whole (:meth:`bounded`), if any."""
        return getattr(self._local, "limit", None)

    def taken(self, conn: Any) -> None:
        """A pool handed ``conn`` to the calling thread: it counts against that thread's
        request; shut at once if that request's deadline has passed already."""
        watch = getattr(self._local, "watch", None)
        if watch is None:
            return
        with self._cond:
            if watch.ended:
                return
            watch.conns.add(conn)
            self._holder[conn] = watch
            if watch.fired:  # taken past the deadline
                if not _cut(watch, conn):  # not connected yet: looked at again shortly
                    heapq.heappush(self._heap, (time.monotonic() + RECHECK, next(self._seq), watch))
                    self._cond.notify()

    def given_back(self, conn: Any) -> None:
        """A pool got ``conn`` back: no deadline of the request that held it concerns it now
        (the next request to take it may be another thread's)."""
        with self._cond:
            watch = self._holder.pop(conn, None)
            if watch is not None:
                watch.conns.discard(conn)

    def _run(self) -> None:
        with self._cond:
            while True:
                while self._heap and self._heap[0][2].ended:
                    heapq.heappop(self._heap)  # done before its deadline
                if not self._heap:
                    self._cond.wait()
                    continue
                deadline, _, watch = self._heap[0]
                left = deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                heapq.heappop(self._heap)
                watch.fired = True
                connecting = False
                for conn in watch.conns:
                    if not _cut(watch, conn):
                        connecting = True
                if connecting:  # its socket comes once it connects: cut it then
                    heapq.heappush(self._heap, (time.monotonic() + RECHECK, next(self._seq), watch))


def _cut(watch: Watch, conn: Any) -> bool:
    """Shut ``conn`` for ``watch``. ``cut`` is set first: the shutdown wakes the request,
    which reads ``cut`` without the lock, and read it False once in a suite run (a HEAD cut
    at its deadline failed as a plain ConnectionClosedError). Put back if the socket is not
    connected yet (nothing was shut)."""
    was, watch.cut = watch.cut, True
    if _shut(conn):
        return True
    watch.cut = was
    return False


def watch_pools(client: Any, watchdog: Watchdog) -> bool:
    """Make the connection pools of botocore ``client`` report to ``watchdog`` each
    connection they hand out and get back. Call before the client's first request (pools
    are made at a host's first request, from the classes set here). Returns False, and
    changes nothing, where botocore is not laid out as expected."""
    session = getattr(getattr(client, "_endpoint", None), "http_session", None)
    classes = getattr(session, "_pool_classes_by_scheme", None)
    if not isinstance(classes, dict) or not classes:
        return False
    if not all(callable(getattr(cls, "_get_conn", None)) and callable(getattr(cls, "_put_conn", None))
               for cls in classes.values()):
        return False
    for scheme, base in list(classes.items()):
        classes[scheme] = _reporting(base, watchdog)
    return True


def _reporting(base: type, watchdog: Watchdog) -> type:
    """``base`` (a urllib3 connection pool class) reporting to ``watchdog``."""

    class Reporting(base):  # type: ignore[misc,valid-type]
        def _get_conn(self, *args: Any, **kwargs: Any) -> Any:
            conn = super()._get_conn(*args, **kwargs)
            watchdog.taken(conn)
            return conn

        def _put_conn(self, conn: Any) -> None:
            if conn is not None:
                watchdog.given_back(conn)
            super()._put_conn(conn)

        def urlopen(self, method: str, *args: Any, **kwargs: Any) -> Any:
            resp = super().urlopen(method, *args, **kwargs)
            limit = watchdog.limit()
            # a HEAD's answer has no body, whatever size its Content-Length gives (the object's)
            if limit is not None and method != "HEAD" and callable(getattr(resp, "stream", None)):
                _bound(resp, limit)
            return resp

    Reporting.__name__ = Reporting.__qualname__ = f"Watched{base.__name__}"
    return Reporting


def _bound(resp: Any, limit: int) -> None:
    """Make ``resp`` (a urllib3 response) fail its ``stream()``, which botocore reads an
    answer's whole body with, once more than ``limit`` bytes came, or at once when its
    Content-Length says more will. Raised there, not here: botocore would take an error
    of the send for a broken connection, and the request would be tried again."""
    stream = resp.stream

    def bounded(*args: Any, **kwargs: Any) -> Iterator[bytes]:
        try:
            announced = int(resp.headers.get("Content-Length") or 0)
        except (TypeError, ValueError):
            announced = 0
        got = 0
        if announced <= limit:
            for piece in stream(*args, **kwargs):
                got += len(piece)
                if got > limit:
                    break
                yield piece
            else:
                return
        resp.close()  # the rest is never read: the connection cannot be used again
        raise AnswerTooLarge(f"the server's answer holds more than {limit:,} bytes "
                             f"({max(got, announced):,} announced or read so far); zvfs reads no more")

    resp.stream = bounded
