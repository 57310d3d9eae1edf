"""Open a local file only when that cannot wait on the disk: openat2 with RESOLVE_CACHED.

A directory store's open runs in a worker thread because resolving a path can read
directories from the disk (or a network file system). But most opens find every
component in the kernel's dentry cache (the tree was just listed, or the file read
before), and then the thread hop, about 150 us, is nearly all an open costs. Linux 5.12
can say which case it is: ``openat2(..., RESOLVE_CACHED)`` opens at once when the path
is cached and fails with EAGAIN instead of doing any I/O. RESOLVE_NO_SYMLINKS makes a
symlink anywhere on the path fail too, so what opens here is exactly the file the key
names below the store's root, with no link followed; the caller's full resolution
(in a worker) decides every other case.

Python has no wrapper for openat2: it is called through libc's ``syscall``. Where it is
missing (an older kernel, a seccomp filter, not Linux), every call answers None.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys

_SYS_OPENAT2 = 437  # one number on every Linux architecture (it came after their unification)
_AT_FDCWD = -100
_RESOLVE_NO_SYMLINKS = 0x04  # no symlink (nor /proc magic link) on the whole path
_RESOLVE_CACHED = 0x20  # only from the dentry cache: EAGAIN where I/O would be needed


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def _syscall() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_long
    fn.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t]
    return fn


_call = _syscall()


def open_if_cached(path: str, flags: int) -> int | None:
    """A descriptor of absolute ``path`` opened with ``flags`` (no O_CREAT or O_TRUNC), or
    None: not every component cached, a symlink on the way, any error, or no openat2 here.
    The caller owns the descriptor."""
    global _call
    if _call is None:
        return None
    how = _OpenHow(flags, 0, _RESOLVE_NO_SYMLINKS | _RESOLVE_CACHED)
    fd = _call(_SYS_OPENAT2, _AT_FDCWD, os.fsencode(path), ctypes.byref(how), ctypes.sizeof(how))
    if fd >= 0:
        return fd
    if ctypes.get_errno() in (errno.ENOSYS, errno.EPERM, errno.EINVAL):
        _call = None  # no openat2, a filter refusing it, or no RESOLVE_CACHED (before 5.12)
    return None
