"""Cutting off response bodies still being read at their request's deadline.

A read of a body blocks until it has the bytes it asked for: the timeout between bytes
never trips for a server that sends one byte at a time, so a read could wait for as long
as that server liked (minutes, in the hostile-server audit), past the deadline the README
promises. One thread of the mount watches every body being read, and at its deadline
shuts its socket down: the blocked read returns at once, and the request fails as late.
Registering a body costs a lock and a heap push, not a thread per request.
"""

from __future__ import annotations

import heapq
import itertools
import socket
import threading
import time
from typing import Any


class Watchdog:
    """``watch(deadline, sock)`` until ``done(token)``; past the deadline the socket is shut
    down and ``fired(token)`` says so."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int]] = []
        self._watched: dict[int, socket.socket] = {}
        self._fired: set[int] = set()
        self._tokens = itertools.count(1)
        self._thread: threading.Thread | None = None

    def watch(self, deadline: float, sock: socket.socket | None) -> int:
        """A token for the body read through ``sock`` until ``deadline`` (time.monotonic());
        0, watching nothing, when there is no socket to cut."""
        if sock is None:
            return 0
        token = next(self._tokens)
        with self._cond:
            self._watched[token] = sock
            heapq.heappush(self._heap, (deadline, token))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="zvfs-s3-deadline", daemon=True)
                self._thread.start()
            elif self._heap[0][1] == token:
                self._cond.notify()
        return token

    def done(self, token: int) -> bool:
        """Stop watching; True when the deadline had passed and the socket was shut."""
        with self._cond:
            self._watched.pop(token, None)
            if token in self._fired:
                self._fired.discard(token)
                return True
        return False

    def _run(self) -> None:
        with self._cond:
            while True:
                while self._heap and self._heap[0][1] not in self._watched:
                    heapq.heappop(self._heap)  # done before its deadline
                if not self._heap:
                    self._cond.wait()
                    continue
                deadline, token = self._heap[0]
                left = deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                heapq.heappop(self._heap)
                sock = self._watched.pop(token)
                self._fired.add(token)
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # closed meanwhile


def body_socket(body: Any) -> socket.socket | None:
    """The socket a botocore response body reads from (its urllib3 response's connection),
    or None where that is not to be found."""
    raw = getattr(body, "_raw_stream", None)
    conn = getattr(raw, "connection", None) or getattr(raw, "_connection", None)
    sock = getattr(conn, "sock", None)
    return sock if isinstance(sock, socket.socket) else None
