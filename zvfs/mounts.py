"""Reading the kernel's mount table (/proc/self/mountinfo), shared by the CLI and the daemon."""

from __future__ import annotations

import errno
import os
import re
import threading
from dataclasses import dataclass

_OCTAL = re.compile(rb"\\([0-7]{3})")
#: what a zvfs mount's source is in the mount table (its fsname): ``zvfs:`` + the source
MOUNT_TABLE_PREFIX = "zvfs:"
#: what a source keeps as it is in the mount table: printable ASCII but ``%``
_TABLE_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")


def table_source(source: str) -> str:
    """``source`` as the mount table holds it (after the prefix): pyfuse3 passes its options
    as ASCII, so the rest is %-escaped UTF-8, ``%`` too, which :func:`source_of_table` undoes.
    Python's backslashreplace was used: ``café`` and a literal ``caf\xe9`` were one text,
    which status showed and an fstab line copied from the table mounted (a helper's audit)."""
    from urllib.parse import quote

    return quote(source, safe=_TABLE_SAFE, errors="surrogateescape")


def source_of_table(text: str) -> str:
    """The source a mount table's ``zvfs:`` entry names (see :func:`table_source`)."""
    from urllib.parse import unquote

    return unquote(text.removeprefix(MOUNT_TABLE_PREFIX), errors="surrogateescape")


def _unescape(field: bytes) -> bytes:
    """mountinfo escapes space, tab, newline and backslash as \\ooo; other bytes are raw."""
    return _OCTAL.sub(lambda m: bytes([int(m.group(1), 8)]), field)


@dataclass(frozen=True)
class MountEntry:
    """One line of the mount table, the fields zvfs needs."""

    mountpoint: str
    device: str  # 'major:minor'
    fstype: str  # e.g. 'fuse.zvfs'
    source: str  # e.g. 'zvfs:s3://bucket/prefix'
    options: str  # per-mount options, e.g. 'ro,nosuid,nodev,noatime'
    super_options: str = ""  # the file system's, e.g. 'rw,user_id=0,group_id=0'

    @property
    def owner(self) -> int | None:
        """The uid that made a FUSE mount (its ``user_id=``), or None."""
        for opt in self.super_options.split(","):
            if opt.startswith("user_id=") and opt[8:].isdigit():
                return int(opt[8:])
        return None


def mount_table() -> list[MountEntry]:
    """Every mount of this mount namespace, in mount order."""
    out = []
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            pre, _, post = line.rstrip(b"\n").partition(b" - ")
            parts, tail = pre.split(b" "), post.split(b" ")
            if len(parts) < 6 or len(tail) < 2:
                continue
            out.append(MountEntry(
                mountpoint=os.fsdecode(_unescape(parts[4])),
                device=parts[2].decode(),
                fstype=tail[0].decode(errors="replace"),
                source=os.fsdecode(_unescape(tail[1])),
                options=parts[5].decode(errors="replace"),
                super_options=tail[2].decode(errors="replace") if len(tail) > 2 else "",
            ))
    return out


#: symlinks followed in one resolution, at most (the kernel's own limit)
_MAX_LINKS = 40


def resolve(path: str) -> str:
    """The absolute path with every symlink resolved, as ``os.path.realpath`` gives it,
    without a stat of any component.

    realpath lstat()s each component, and the lstat of a mountpoint is a request to its
    daemon: on a FUSE mount whose daemon has stopped answering it waits for ever, so
    ``zvfs status`` could not tell a hung mount, nor ``zvfs unmount`` unmount it. readlink
    asks the file system only of a symlink: a mountpoint, or any directory, gets EINVAL
    from the kernel at once. (A path *inside* a hung mount still waits: its lookups are
    the daemon's to answer.)"""
    links = 0

    def walk(base: str, rest: str) -> str:
        nonlocal links
        for part in rest.split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                base = os.path.dirname(base)
                continue
            here = os.path.join(base, part)
            try:
                target = os.readlink(here)
            except OSError:  # not a symlink (EINVAL), missing, or unreachable: taken as it is
                base = here
                continue
            links += 1
            if links > _MAX_LINKS:  # a loop: taken as it is, as realpath does
                base = here
                continue
            base = walk("/" if target.startswith("/") else base, target)
        return base

    # not abspath: it drops "x/.." before x is known not to be a symlink
    return walk("/", path if path.startswith("/") else os.getcwd() + "/" + path)


def mount_entry(path: str) -> MountEntry | None:
    """The file system mounted at ``path`` (the topmost one), or None.

    Found without asking the mount anything (:func:`resolve`), so a dead or hung FUSE mount
    is found too."""
    target = resolve(path)
    found = None
    for entry in mount_table():
        if entry.mountpoint == target:
            found = entry
    return found


def mount_device(path: str) -> str | None:
    """'major:minor' of the file system mounted at ``path`` (the topmost one), or None."""
    entry = mount_entry(path)
    return entry.device if entry else None


#: what the kernel answers on a FUSE mount whose connection is gone (the daemon died: ENOTCONN,
#: or the connection was aborted: ECONNABORTED)
DEAD_ERRNOS = (errno.ENOTCONN, errno.ECONNABORTED)


def is_dead(path: str, timeout: float = 2.0) -> bool:
    """True when ``path`` is a FUSE mount whose daemon is gone.

    statfs always reaches the daemon (a stat may be answered from the kernel's cache). It
    runs in a thread of its own, given up after ``timeout`` seconds: a daemon that is alive
    but answers nothing (stopped, or stuck) is not dead, and must not hang the caller."""
    result: list[bool] = []

    def ask() -> None:
        try:
            os.statvfs(path)
        except OSError as exc:
            result.append(exc.errno in DEAD_ERRNOS)
        else:
            result.append(False)

    asker = threading.Thread(target=ask, name="zvfs-statfs", daemon=True)
    asker.start()
    asker.join(timeout)
    return bool(result and result[0])


def enter_mount_namespace(path: str) -> None:
    """Move this process into the mount namespace ``path`` names (``/proc/PID/ns/mnt``, or the
    ``/proc/PID/fd/N`` that mount(8) hands its helpers with ``-N``), so that the mount is
    made there and the daemon forked after lives there. The kernel allows it only while the
    process has a single thread (EINVAL otherwise)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        setns = getattr(os, "setns", None)  # Python 3.12+
        if setns is not None:
            setns(fd, os.CLONE_NEWNS)
            return
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, 0x00020000) != 0:  # CLONE_NEWNS
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), path)
    finally:
        os.close(fd)


class UnmountFailed(Exception):
    """fusermount3 refused or is missing; the text says why and what to do."""


#: how long a plain unmount waits, at most, for a busy mount to be let go. Whatever walks
#: the machine's mounts (`zvfs status`, a plain df, updatedb, a monitoring agent) holds each
#: one for a moment, and an unmount in that moment (systemd's ExecStop) was refused as busy:
#: with `zvfs status` run in a loop beside it, 18 of 40 were. A file kept open, or a shell
#: inside, is still refused, this much later; a mount inside it is refused at once.
BUSY_WAIT = 2.0
#: the pause between two tries of a busy unmount
BUSY_RETRY = 0.05


def fusermount(path: str, lazy: bool, busy_wait: float = 0.0) -> None:
    """Unmount the FUSE mount at ``path`` with fusermount3 (``-z``: lazily, detached from
    the tree even while files in it are open), as any user who may unmount it can. A plain
    unmount found busy is tried again for up to ``busy_wait`` seconds (see BUSY_WAIT)."""
    import shutil
    import subprocess
    import time

    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    if tool is None:
        raise UnmountFailed("fusermount3 not found; install the fuse3 package (apt-get install fuse3)")
    deadline = time.monotonic() + busy_wait
    while True:
        res = subprocess.run([tool, "-uz" if lazy else "-u", path], capture_output=True, text=True)
        if res.returncode == 0:
            return
        reason = res.stderr.strip() or f"{tool} exited {res.returncode}"
        busy = "busy" in reason
        inside = mounts_inside(path) if busy else []  # read once: the retry and the hint
        if busy and not lazy and not inside and time.monotonic() < deadline:
            time.sleep(BUSY_RETRY)
            continue
        hint = _busy_hint(inside, busy_wait) if busy else ""
        raise UnmountFailed(f"cannot unmount {path}: {reason}{hint}")


def mounts_inside(path: str) -> list[str]:
    """The mountpoints below ``path`` (not ``path`` itself), from the mount table alone."""
    top = resolve(path).rstrip("/") + "/"
    try:
        return [e.mountpoint for e in mount_table() if e.mountpoint.startswith(top)]
    except OSError:
        return []


def mount_around(mountpoint: str) -> str | None:
    """The innermost mountpoint ``mountpoint`` lies below (not ``/``), from the mount table
    alone; None when it is on the root's file system."""
    around = [e.mountpoint for e in mount_table()
              if e.mountpoint not in (mountpoint, "/") and mountpoint.startswith(e.mountpoint.rstrip("/") + "/")]
    return max(around, key=len) if around else None


def _busy_hint(inside: list[str], waited: float = 0.0) -> str:
    """Why an unmount was busy, and what to do. A mount inside it (``inside``, from
    mounts_inside) keeps it busy with no file open: that one is named, to unmount first
    (-z would detach both)."""
    if inside:
        more = f" (and {len(inside) - 1} more)" if len(inside) > 1 else ""
        return f" (it is busy: {inside[0]}{more} is mounted inside it: unmount that first)"
    still = f", still after {waited:g} s" if waited else ""
    return f" (it is busy{still}: close the files open in it, or use zvfs unmount -z)"
