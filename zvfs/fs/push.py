"""Handing a file's bytes to the kernel's page cache with its open (FUSE_NOTIFY_STORE).

A reader of many small files (cp -r, rsync, a loop over a zip's members) pays three round
trips through the daemon a file: LOOKUP, OPEN and READ. When the daemon has the whole file
in memory already at the open (a small zip member read ahead in one worker hop with the
one before it), it can store those bytes in the kernel's page cache before it answers the
open with keep_cache: the reader's read is then answered by the kernel, and one round trip
of three is gone (20,000 members of 170 bytes: 4,300 files a second to 5,500 here).

pyfuse3 has ``notify_store``, but it lets go of the GIL around the write, and getting it
back waits up to a switch interval (5 ms) while a worker thread runs Python: so the message
is written here, with the GIL held, as zvfs.fs.loop polls the device. It is one write(2) of
a header and the bytes; the kernel copies them into the file's pages and returns.

The kernel locks each page it stores into. A page locked by a read waiting for this daemon
would block the write, and the daemon with it, so the fs layer pushes only for an open that
is the file's only one (no read of the file can be under way).
"""

from __future__ import annotations

import ctypes
import struct

#: the notify code of a store, in the error field of the reply header (linux/fuse.h)
FUSE_NOTIFY_STORE = 4
#: struct fuse_out_header {u32 len; i32 error; u64 unique} and
#: struct fuse_notify_store_out {u64 nodeid; u64 offset; u32 size; u32 padding}
_MESSAGE = struct.Struct("<IiQQQII")


class PagePush:
    """Stores bytes into the kernel's page cache of an inode, through the FUSE device ``fd``."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        libc = ctypes.PyDLL(None)  # PyDLL: the call keeps the GIL
        self._write = libc.write
        self._write.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
        self._write.restype = ctypes.c_ssize_t

    def push(self, inode: int, data: bytes | memoryview) -> bool:
        """Store ``data`` as the first bytes of ``inode``'s pages; False if the kernel
        refused (it forgot the inode, or knows no such message): the reads then come."""
        n = len(data) if isinstance(data, bytes) else data.nbytes
        message = _MESSAGE.pack(_MESSAGE.size + n, FUSE_NOTIFY_STORE, 0, inode, 0, n, 0) + data
        return self._write(self._fd, message, len(message)) == len(message)
