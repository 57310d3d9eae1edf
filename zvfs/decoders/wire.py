"""Messages between the daemon and its decoder processes: a pickled tuple after its length.

Both ends are zvfs, started together over pipes nothing else can write to. A request is a
few hundred bytes, under PIPE_BUF, so one write puts it in the pipe whole even when
several tasks write to the same process; one that is not (an array path of 4 KB) is not
sent (DecoderPool.decode)."""

from __future__ import annotations

import os
import pickle
import struct
from typing import Any

HEADER = struct.Struct("<I")
#: a message is a request or an answer: anything bigger is a broken pipe's garbage
MAX_MESSAGE = 1 << 20


class WireError(Exception):
    """The other end sent something that is not a message: the pipe cannot be trusted."""


def encode(message: tuple[Any, ...]) -> bytes:
    """A message's bytes, without its length (a packet of a SOCK_SEQPACKET socket)."""
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def decode(body: bytes) -> tuple[Any, ...]:
    return pickle.loads(body)


def pack(message: tuple[Any, ...]) -> bytes:
    """A message's bytes after its length (for a pipe, a stream of them)."""
    body = encode(message)
    return HEADER.pack(len(body)) + body


def read_message(fd: int) -> tuple[Any, ...] | None:
    """The next message from blocking ``fd``; None at its end (the other side is gone)."""
    head = _read_exactly(fd, HEADER.size)
    if head is None:
        return None
    (size,) = HEADER.unpack(head)
    if size > MAX_MESSAGE:
        raise WireError(f"message of {size} bytes")
    body = _read_exactly(fd, size)
    if body is None:
        return None
    return decode(body)


def write_all(fd: int, data: bytes) -> None:
    """Write ``data`` whole to blocking ``fd``."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read_exactly(fd: int, n: int) -> bytes | None:
    parts, got = [], 0
    while got < n:
        part = os.read(fd, n - got)
        if not part:
            return None
        parts.append(part)
        got += len(part)
    return b"".join(parts)


class Unpacker:
    """Messages out of a non-blocking stream, fed as its bytes arrive."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[Any, ...]]:
        self._buf += data
        out = []
        while len(self._buf) >= HEADER.size:
            (size,) = HEADER.unpack_from(self._buf)
            if size > MAX_MESSAGE:
                raise WireError(f"message of {size} bytes")
            end = HEADER.size + size
            if len(self._buf) < end:
                break
            out.append(decode(bytes(self._buf[HEADER.size:end])))
            del self._buf[:end]
        return out
