"""One directory's entries, listed and stat'ed by ``find`` in a process of its own.

A listing of a directory store stats every file it holds: ``os.scandir`` gives the names,
and each ``stat`` is a system call made from the daemon. Each of those calls lets go of the
GIL and has to take it back, from a trio thread busy answering the kernel, so a walk of a
million files (find, du, ls -R) spent as long waiting for its listings as serving them, and
listing several directories at once in threads gained little. ``find`` makes the same calls
in C, in its own process: the daemon waits once per directory, reads one buffer and parses
it. Small directories are still listed in process, where starting a process costs more
than the listing.

The entries are what ``os.scandir`` and ``lstat`` would give: symlinks are not followed
(the caller resolves them under its escape rules), and each mtime is find's seconds and
nanoseconds as whole nanoseconds, as CPython computes ``st_mtime_ns``, so both ways agree.
Any failure (no ``find`` here, a file that vanished meanwhile, an unreadable directory) is
None: the caller then lists in process, which reports what is wrong.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from typing import NamedTuple

log = logging.getLogger(__name__)

#: a directory whose own size is at least this is listed by find: on ext4, xfs, btrfs and
#: tmpfs a directory's size grows with its entries, and 8 KiB is a few hundred names
MIN_DIR_BYTES = 8192

#: per entry: type letter, size, mtime (seconds.nanoseconds), name; NUL-terminated, as a
#: name may hold anything but NUL and '/'
_FORMAT = "%y %s %T@ %f\\0"


class Found(NamedTuple):
    """One entry of a directory as find saw it (not followed: a symlink is kind 'l')."""

    name: str
    kind: str  # 'f' file, 'd' directory, 'l' symlink, or another of find's %y letters
    size: int
    mtime_ns: int


#: where find is looked for: the system's own, never the daemon's PATH (a root daemon
#: must not run whatever a PATH entry names find)
SYSTEM_PATH = "/usr/bin:/bin"

_find: str | None | bool = False  # not looked for yet


def _find_path() -> str | None:
    """The system's find, if it has GNU find's -printf (busybox's has not); looked up once."""
    global _find
    if _find is False:
        _find = shutil.which("find", path=SYSTEM_PATH)
        if _find is not None:
            try:
                probe = subprocess.run([_find, "/", "-maxdepth", "0", "-printf", ""],
                                       stdin=subprocess.DEVNULL, capture_output=True, check=False)
                if probe.returncode != 0:
                    _find = None
            except OSError:
                _find = None
        if _find is None:
            log.debug("no GNU find in %s: large directories are listed in process", SYSTEM_PATH)
    return _find  # type: ignore[return-value]


def is_large(st: os.stat_result) -> bool:
    """True for a directory worth a find process (see MIN_DIR_BYTES)."""
    return st.st_size >= MIN_DIR_BYTES


def list_dir(path: str) -> list[Found] | None:
    """The entries of the directory ``path`` (absolute), or None when find could not give
    them all (the caller lists in process). Blocking: call from a worker thread."""
    find = _find_path()
    if find is None or not path.startswith("/"):
        return None
    try:
        proc = subprocess.run(
            # -H: ``path`` may be the daemon's descriptor (/proc/PID/fd/N), followed; nothing below it is
            [find, "-H", path, "-mindepth", "1", "-maxdepth", "1", "-printf", _FORMAT],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env={"LC_ALL": "C", "PATH": SYSTEM_PATH}, check=False)
    except OSError as exc:
        log.debug("find %s: %s", path, exc)
        return None
    if proc.returncode != 0:
        return None
    return parse(proc.stdout)


def parse(out: bytes) -> list[Found] | None:
    """find's ``-printf`` output in ``_FORMAT``; None if any record is not of that form."""
    found = []
    add = found.append
    kinds = {b"f": "f", b"d": "d", b"l": "l"}
    try:
        for record in out.split(b"\0")[:-1]:
            kind, size, mtime, name = record.split(b" ", 3)
            sec, _, frac = mtime.partition(b".")
            # GNU find gives 10 digits; nanoseconds are the first 9
            nsec = int(frac[:9]) if len(frac) >= 9 else int(frac.ljust(9, b"0") or b"0")
            # as CPython's stat: seconds (floored, so negative before 1970) plus nanoseconds
            add(Found(os.fsdecode(name), kinds.get(kind) or kind.decode(),
                      int(size), int(sec) * 1_000_000_000 + nsec))
    except ValueError:
        return None
    return found
