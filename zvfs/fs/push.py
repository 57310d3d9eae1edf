"""Handing a small file's bytes to the kernel's page cache with its open (FUSE_NOTIFY_STORE).

A reader of many small files (cp -r, rsync, a loop over a zip's members) pays three round
trips through the daemon a file: LOOKUP, OPEN and READ. When the daemon has the whole file
in memory at its first open (a small zip member read ahead in one worker hop with the one
before it, an S3 object fetched ahead, a document built in memory), it can store those
bytes in the kernel's page cache before it answers the open with keep_cache: the reader's
read is then answered by the kernel, and one round trip of three is gone (20,000 zip
members of 170 bytes: 3,913 to 4,291 files a second in the bench's zip group).

pyfuse3 has ``notify_store``, but it lets go of the GIL around the write, and getting it
back waits up to a switch interval (5 ms) while a worker thread runs Python: so the message
is written here, with the GIL held, as zvfs.fs.loop polls the device. It is one writev(2)
of a header and the bytes, which the kernel copies into the file's pages.

The kernel locks each page it stores into. A page locked by a read waiting for this daemon
would block the write, and the daemon with it, so the fs layer pushes only for an open that
is the file's only one (no read of the file can be under way), and only at a first open
(the kernel has no pages of the file to copy over).
"""

from __future__ import annotations

import ctypes
import struct

#: the notify code of a store, in the error field of the reply header (linux/fuse.h)
FUSE_NOTIFY_STORE = 4
#: struct fuse_out_header {u32 len; i32 error; u64 unique} and
#: struct fuse_notify_store_out {u64 nodeid; u64 offset; u32 size; u32 padding}
_MESSAGE = struct.Struct("<IiQQQII")


class _IoVec(ctypes.Structure):
    # c_char_p: a bytes object is pointed to as it is, not copied
    _fields_ = [("base", ctypes.c_char_p), ("len", ctypes.c_size_t)]


#: the biggest file pushed: the trio thread hands the kernel the bytes to copy, for a
#: reader that may want only the start of the file (a bigger file is read in one READ of
#: up to 1 MiB or more anyway, so little is saved by pushing it)
PUSH_MAX = 256 << 10


class PagePush:
    """Stores bytes into the kernel's page cache of an inode, through the FUSE device ``fd``.
    Used from the trio thread only: its one iovec pair is reused (1.9 µs a push, not 3.9)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        libc = ctypes.PyDLL(None)  # PyDLL: the call keeps the GIL
        self._writev = libc.writev
        self._writev.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_int]
        self._writev.restype = ctypes.c_ssize_t
        self._iov = (_IoVec * 2)()

    def push(self, inode: int, data: bytes | memoryview) -> bool:
        """Store ``data`` as the first bytes of ``inode``'s pages; False if the kernel
        refused (it forgot the inode, or knows no such message): the reads then come."""
        if not isinstance(data, bytes):
            data = bytes(data)  # every node gives bytes today; any other buffer is copied once
        n = len(data)
        header = _MESSAGE.pack(_MESSAGE.size + n, FUSE_NOTIFY_STORE, 0, inode, 0, n, 0)
        iov = self._iov
        iov[0].base, iov[0].len = header, len(header)
        iov[1].base, iov[1].len = data, n
        try:
            return self._writev(self._fd, iov, 2) == len(header) + n
        finally:
            iov[0].base = iov[1].base = None  # the bytes are not kept alive here
