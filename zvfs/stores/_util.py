"""Helpers shared by the store backends (key checks, prefix checks, log-once)."""

from __future__ import annotations

import ctypes
import errno
import os
import threading
from collections.abc import Callable
from typing import Any

from zvfs.logonce import LogOnce as LogOnce  # the one log-once; re-exported for the stores
from zvfs.stores.base import KeyNotFound, StoreError, WriteRefused
from zvfs.stores.keys import bad_segment


def check_key(key: str) -> None:
    """Refuse a key that cannot be a POSIX path; it can never exist in the mount."""
    why = bad_segment(key)
    if why is not None:
        raise KeyNotFound(f"unsafe key {key!r}: {why}")


def check_prefix(prefix: str) -> None:
    """A listing prefix is '' or a safe key followed by '/'."""
    if prefix == "":
        return
    if not prefix.endswith("/"):
        raise KeyNotFound(f"bad prefix {prefix!r}: must be '' or end with '/'")
    check_key(prefix[:-1])


#: what a read past a file's known size asks for first: a file that did not grow since
#: its size was taken then costs one small read, not a buffer as big as the rest could be
_PROBE = 64 << 10
_MAX_READ = 1 << 26


def pread_all(fd: int, start: int, length: int, key: str, *, beyond: int = 0) -> bytes:
    """Read ``length`` bytes at ``start`` (fewer at EOF); then, if all were there, up to
    ``beyond`` more, for a file that may have grown since its size was taken.

    Each read asks for what is expected: os.pread allocates all it asks for, and a buffer
    above malloc's mmap threshold is a fresh mapping to fault in and unmap (a TLB shootdown
    on the other cores), which cost decoded reads a tenth of their speed when every chunk
    read asked for the chunk's ceiling, or 1 MiB past its end."""
    parts: list[bytes] = []
    pos = start
    try:
        for want, step in ((length, _MAX_READ), (beyond, _PROBE)):
            while want > 0:
                chunk = os.pread(fd, min(want, step), pos)
                if not chunk:
                    return parts[0] if len(parts) == 1 else b"".join(parts)
                parts.append(chunk)
                pos += len(chunk)
                want -= len(chunk)
                step = min(step * 2, _MAX_READ)  # a file that did grow: read on in bigger steps
    except OSError as e:
        raise StoreError(f"{key}: read failed: {e.strerror}") from e
    return parts[0] if len(parts) == 1 else b"".join(parts)


#: preadv2's RWF_NOWAIT works here (cleared at the first refusal of it)
_nowait = hasattr(os, "RWF_NOWAIT")


#: pread_at_once reads a range of at most this many bytes with no probe of its last byte
PROBE_PAST = 16 << 10


def pread_at_once(fd: int, offset: int, length: int, size: int) -> memoryview | None:
    """preadv2 with RWF_NOWAIT: the ``length`` bytes at ``offset`` of a file of about
    ``size`` bytes (fewer at its end; a file that grew since is read on) when the page cache
    holds them all, else None (EAGAIN, or only some cached; the kernel starts reading the
    rest ahead meanwhile). Never blocks, never raises: the caller then reads in a worker,
    which reports any error."""
    global _nowait
    if not _nowait or length <= 0:
        return None
    try:
        # the last byte first: a range read cold misses there too, and then this costs
        # one small read, not a buffer of the whole length filled with zeros for nothing.
        # Not for a few pages, which cost less to fill than a system call (a zip's small
        # member and its local header, read at its open: two calls each)
        last = min(offset + length, size) - 1
        if length > PROBE_PAST and last > offset and not os.preadv(fd, [bytearray(1)], last, os.RWF_NOWAIT):
            return None
        buf = bytearray(length)
        n = os.preadv(fd, [buf], offset, os.RWF_NOWAIT)
    except BlockingIOError:
        return None
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            _nowait = False  # not on this file system or kernel: always in a worker
        return None
    if n < length:
        if offset + n < size:
            return None  # part of it cached; the rest would wait
        try:  # the end by ``size``; but the file may have grown since ``size`` was taken
            if os.preadv(fd, [bytearray(1)], offset + n, os.RWF_NOWAIT):
                return None
        except OSError:
            return None
    return memoryview(buf)[:n]


_FALLOC_FL_KEEP_SIZE = 1


def _libc(name: str, argtypes: list[Any]) -> Callable[..., int] | None:
    """libc's system call wrapper ``name`` (errno kept), or None where this libc has none."""
    try:
        fn = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = argtypes
    return fn


#: fallocate(2) itself: glibc's posix_fallocate writes zeros where a file system has none,
#: which is no reservation
_fallocate_call = _libc("fallocate", [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64])
#: renameat2(2), glibc 2.28 and later
_renameat2_call = _libc("renameat2", [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint])
_RENAME_NOREPLACE = 1


def rename_noreplace(src: str, src_dir: int, dst: str, dst_dir: int) -> None:
    """rename(2) of ``src`` to ``dst`` (names in the directories open as ``src_dir`` and
    ``dst_dir``), FileExistsError when ``dst`` exists, in one step (renameat2's
    RENAME_NOREPLACE): a check and then a rename replaced a file another writer made in
    between (a helper's audit). A file system or libc without it gets the check then the
    rename."""
    if _renameat2_call is not None:
        if _renameat2_call(src_dir, os.fsencode(src), dst_dir, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOSYS):
            raise OSError(err, os.strerror(err), dst)
    try:
        os.lstat(dst, dir_fd=dst_dir)
    except FileNotFoundError:
        os.rename(src, dst, src_dir_fd=src_dir, dst_dir_fd=dst_dir)
        return
    raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dst)


def reserve(fd: int, offset: int, length: int) -> None:
    """Have the disk hold room for ``length`` bytes at ``offset`` of ``fd`` before they are
    written (its size unchanged): OSError (ENOSPC, EDQUOT) when it cannot, so a write that
    follows lands whole or not at all. Nothing where the file system cannot reserve (then a
    write may still fall short)."""
    global _fallocate_call
    if _fallocate_call is None or length <= 0:
        return
    if _fallocate_call(fd, _FALLOC_FL_KEEP_SIZE, offset, length) == 0:
        return
    err = ctypes.get_errno()
    if err in (errno.EOPNOTSUPP, errno.ENOSYS):
        return  # this file system cannot (each call asks: a store may span several)
    if err in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EINTR):
        raise OSError(err, os.strerror(err))
    # anything else (EBADF, EINVAL on an odd file): the write decides


def pwrite_all(fd: int, data: bytes | memoryview, offset: int, *, append: bool = False,
               short: bool = False) -> int:
    """Write all of ``data`` at ``offset`` (pwrite may write less than asked); returns its length.

    ``append``: at the end the file has at each call, whoever else appends to it (O_APPEND's
    one step, RWF_APPEND; ``offset`` is ignored), not at an end read before. ``short``: an
    error after some bytes are written returns how many, as write(2) does; raising would
    tell the application none were, and a retry would leave a torn copy before a whole one.
    """
    view = memoryview(data)
    done = 0
    while done < len(view):
        try:
            if append:
                done += os.pwritev(fd, [view[done:]], 0, os.RWF_APPEND)
            else:
                done += os.pwrite(fd, view[done:], offset + done)
        except OSError:
            if short and done:
                return done
            raise
    return done


#: an open's errors that mean the process (ENFILE: the system) has no descriptor to give
NO_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)


def no_descriptors_hint(e: OSError) -> str:
    """'; which limit to raise' for an error of running out of descriptors, else ''."""
    if e.errno == errno.ENFILE:
        return "; the system's limit (fs.file-max) is reached"
    if e.errno != errno.EMFILE:
        return ""
    return (f"; the daemon's open-file limit ({open_file_limit()}) is reached: raise it (ulimit -Hn before "
            "zvfs mount, LimitNOFILE= in a systemd unit), or hold fewer files of the mount open")


#: descriptors at least that the opens of a mount leave for the daemon's other work (see
#: held_budget): at a limit of 64, 48 held left too few for the kept ones and the rest
HELD_RESERVE = 32


def _soft_file_limit() -> int | None:
    """The process's soft limit on open files; None when unlimited."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return None if soft == resource.RLIM_INFINITY else soft


def held_budget() -> int:
    """How many descriptors the opens of a mount may hold at once (a directory store's
    readers and writers, an S3 store's staged files): the open-file limit less a quarter of
    it, HELD_RESERVE at least. The rest serve everything else the mount does (kept read
    descriptors, listings, decoded reads, S3 connections, the log): held by the opens of one
    program, they made every other file of the mount fail with EIO."""
    soft = _soft_file_limit()
    if soft is None:
        return 1 << 62
    return max(1, soft - max(soft // 4, HELD_RESERVE))


def open_file_limit() -> str:
    """The process's soft limit on open files, as a log line names it."""
    soft = _soft_file_limit()
    return "unlimited" if soft is None else str(soft)


class HeldDescriptors:
    """How many descriptors the opens of a mount hold (see held_budget), within that budget:
    a store's files open for reading or writing take one each and give it back at close."""

    def __init__(self) -> None:
        self.budget = held_budget()
        self.count = 0
        self._lock = threading.Lock()

    def take(self) -> bool:
        """One more held, or False when the budget is spent."""
        with self._lock:
            if self.count >= self.budget:
                return False
            self.count += 1
            return True

    def give(self) -> None:
        with self._lock:
            self.count -= 1

    def refusal(self, key: str, how: str, beside: str) -> WriteRefused:
        """ENFILE for an open for writing past the budget, naming the limit to raise."""
        return WriteRefused(
            errno.ENFILE, f"{key}: {self.count} files are open {how}, as many as the daemon's "
            f"open-file limit ({open_file_limit()}) leaves room for beside {beside}: raise it "
            "(ulimit -Hn before zvfs mount, LimitNOFILE= in a systemd unit), or write fewer "
            "files at once")
