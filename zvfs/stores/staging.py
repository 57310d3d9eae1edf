"""Local disk space for files being written to a remote store.

A file written through an S3 mount lives here while it is open, and until its
upload succeeds. The space has its own bound and a floor of free space on its
disk, so a big ``cp`` fails with ENOSPC instead of filling the disk. Staged
files that could not be uploaded are kept (never deleted by zvfs), and their
path is logged: nothing written is lost silently.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Callable

from zvfs.stores._util import HeldDescriptors, no_descriptors_hint
from zvfs.stores.base import WriteRefused

log = logging.getLogger(__name__)

#: seconds a write that finds staging full waits for space being given back (see grow())
RELEASE_WAIT = 1.0
#: each daemon stages in a directory of its own, named so, which it holds locked (flock)
DIR_PREFIX = "zvfs-staging-"
#: extended attributes of a staged file: the whole key it is written for, and the source
#: (its name holds only the key's last segment, and $TMPDIR is every writable mount's)
KEY_ATTR = "user.zvfs.key"
SOURCE_ATTR = "user.zvfs.source"
#: extended attribute of a staged file kept on purpose (its upload failed, the daemon stopped
#: before the store answered): why and when, so the next mount tells it from a file a killed
#: daemon left (and one whose upload failed is not copied back blindly over a newer object)
KEPT_ATTR = "user.zvfs.kept"
#: extended attribute of a staging directory made by a zvfs that holds it locked while it
#: lives: one unlocked is a dead daemon's, and removed once empty (an older zvfs took no lock)
DIR_ATTR = "user.zvfs.staging"


class Staging:
    """``directory`` (a private temporary one when None), bounded by ``max_bytes`` and
    leaving ``min_free`` bytes free on its disk."""

    def __init__(self, directory: str | None, max_bytes: int, min_free: int, source: str = "") -> None:
        """``source``: what the staged files are written to (the bucket and prefix, and the
        endpoint), recorded with each so that bytes a dead daemon left can be put back."""
        # a directory of this daemon's own, locked while it lives: the next daemon can tell
        # what one that died (kill -9, a crash) left unstored, and say so
        self.base = tempfile.gettempdir() if directory is None else os.path.join(directory, "staging")
        self._lock = -1
        self.source = source
        #: the staging disk keeps extended attributes (tmpfs before Linux 6.6 keeps no user.*)
        self._labels = True
        self._make_dir()
        self.max_bytes = max_bytes
        self.min_free = min_free
        self.used = 0
        #: staged files open now, within the budget of held descriptors (see new_file)
        self.held = HeldDescriptors()
        self._cond = threading.Condition()
        self._remade = threading.Lock()
        #: asked to free this many bytes on the staging disk before a write is refused for
        #: its floor (a disk cache sharing the disk), or None
        self.make_room: Callable[[int], None] | None = None

    def _make_dir(self) -> None:
        """Make this daemon's directory, and hold it locked."""
        os.makedirs(self.base, mode=0o700, exist_ok=True)
        # made under a name no daemon looks at, locked, then given its name: a directory named
        # so is always locked while its daemon lives (another daemon starting at that moment
        # took it for a dead one's)
        made = tempfile.mkdtemp(prefix="." + DIR_PREFIX, dir=self.base)
        lock = os.open(made, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        fcntl.flock(lock, fcntl.LOCK_EX)
        self.label(lock, None)  # made by a zvfs that locks it: once unlocked and empty, removable
        self.dir = os.path.join(self.base, os.path.basename(made)[1:])
        os.rename(made, self.dir)
        if self._lock >= 0:
            os.close(self._lock)
        self._lock = lock

    def new_file(self, key: str, counted: bool = True) -> tuple[str, int]:
        """A new empty staged file for ``key``: (path, fd opened read-write); ``counted``:
        one of the open files, given back by file_closed().

        Each file open for writing holds its staged file's descriptor until its close has
        uploaded it. Past the budget of held descriptors (held_budget), a create is ENFILE
        at once: 300 writers at once under a limit of 256 took every descriptor, and then the
        uploads of their closes found none for a connection, each failed after its retries
        (EIO at close for 227 of them, two minutes on) and a listing failed EIO meanwhile.

        The directory removed under the daemon (systemd-tmpfiles ages out what sat unused in
        /tmp for 10 days, a clean-up script, an operator) is made again, with one warning:
        every create failed with EIO until the mount was remade."""
        if counted and not self.held.take():
            raise self.held.refusal(key, "for writing", "their uploads")
        try:
            return self._new_file(key)
        except BaseException:
            if counted:
                self.file_closed()
            raise

    def file_closed(self) -> None:
        """A counted staged file's descriptor was closed."""
        self.held.give()

    def _new_file(self, key: str) -> tuple[str, int]:
        # the key's name, for whoever looks into the staging directory: its first 80 bytes,
        # not characters (75 CJK characters are 225 bytes, past 255 with the rest: every
        # create of such a name failed EIO, "File name too long")
        shown = os.path.basename(key).encode(errors="surrogateescape")[:80].decode(errors="ignore")
        name = f"{uuid.uuid4().hex}-{shown}"
        gone = self.dir
        try:
            return self._create(key, name)
        except FileNotFoundError:
            pass
        with self._remade:
            if self.dir == gone:  # not made again by another writer meanwhile
                try:
                    self._make_dir()
                except OSError as e:
                    raise WriteRefused(errno.EIO, f"{key}: the staging directory {gone} was removed, "
                                       f"and it cannot be made again under {self.base}: "
                                       f"{e.strerror}") from None
                log.warning("the staging directory %s was removed under the mount; staging in %s "
                            "from now on", gone, self.dir)
        return self._create(key, name)

    def label(self, fd: int, key: str | None) -> None:
        """Record on the staged file ``fd`` the key it is written for (again at a rename), so
        the next mount can name it if this daemon dies before storing it; on this daemon's
        directory (``key`` None), that a zvfs that locks it made it. Best effort: a disk
        that keeps no extended attributes leaves only the file's name to go by."""
        if not self._labels:
            return
        try:
            if key is None:
                os.setxattr(fd, DIR_ATTR, self.source.encode())
                return
            os.setxattr(fd, KEY_ATTR, os.fsencode(key))
            if self.source:
                os.setxattr(fd, SOURCE_ATTR, self.source.encode())
        except OSError as e:
            if e.errno in (errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM):
                self._labels = False
                log.info("staging: %s keeps no extended attributes: the files a daemon that dies "
                         "leaves there are named by their key's last segment only", self.base)
            # else (ENOSPC, EDQUOT, ...): that file goes unlabelled; its write is what matters

    def label_kept(self, fd: int, why: str) -> None:
        """Record on the staged file ``fd`` why it is kept (best effort, as :meth:`label`); the
        first reason stays (a failed upload, then the close that keeps the file)."""
        if not self._labels:
            return
        stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        try:
            os.setxattr(fd, KEPT_ATTR, f"{why} ({stamp})".encode(), os.XATTR_CREATE)
        except OSError:
            pass  # labelled already, or unlabelled: then told as a stopped daemon's

    def _create(self, key: str, name: str) -> tuple[str, int]:
        path = os.path.join(self.dir, name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:
            raise
        except OSError as e:  # a full disk, or one turned read-only: said as what it is
            full = e.errno in (errno.ENOSPC, errno.EDQUOT)
            raise WriteRefused(errno.ENOSPC if full else errno.EIO,
                               f"{key}: cannot stage in {self.dir}: {e.strerror}{no_descriptors_hint(e)}") from None
        self.label(fd, key)
        return path, fd

    def grow(self, key: str, extra: int) -> None:
        """Account ``extra`` more staged bytes, or refuse with ENOSPC.

        A refusal waits up to RELEASE_WAIT first: a file's space comes back when the kernel
        releases it, just after its close() returned, so a ``cp`` of one big file after
        another near the bound could meet the last one's space still held."""
        with self._cond:
            if extra <= 0:
                self.used += extra
                self._cond.notify_all()
                return
            deadline = time.monotonic() + RELEASE_WAIT
            while True:
                refusal = self._refusal(key, extra)
                if refusal is None:
                    self.used += extra
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    raise refusal
                self._cond.wait(left)

    def _refusal(self, key: str, extra: int) -> WriteRefused | None:
        if self.used + extra > self.max_bytes:
            return WriteRefused(
                errno.ENOSPC,
                f"{key}: staging space is full ({self.used} of {self.max_bytes} bytes in use; "
                "raise --staging-max-size)",
            )
        if self._short_of(extra):
            floor = (f"would drop below its {self.min_free} free bytes (--staging-min-free)"
                     if self.min_free else "is full")
            return WriteRefused(errno.ENOSPC, f"{key}: the staging disk ({self.dir}) {floor}")
        return None

    def _short_of(self, extra: int) -> bool:
        """Whether ``extra`` more bytes would take the disk below the floor, after what
        shares the disk (make_room) has made room."""
        if self._free() - extra >= self.min_free:
            return False
        if self.make_room is None:
            return True
        self.make_room(self.min_free + extra)
        return self._free() - extra < self.min_free

    def _free(self) -> int:
        """Free bytes on the staging disk, from the directory's own descriptor: by its path,
        every write to a file already open failed with EIO once the directory was removed."""
        st = os.fstatvfs(self._lock)
        return st.f_bavail * st.f_frsize

    def cleanup(self) -> None:
        """At unmount: remove this daemon's directory if nothing was kept in it."""
        try:
            if not os.listdir(self.dir):
                os.rmdir(self.dir)
        except OSError:
            pass
        if self._lock >= 0:
            os.close(self._lock)
            self._lock = -1

    def left_behind(self) -> list[tuple[str, int, int]]:
        """(directory, files, bytes) of what daemons that died staged and never stored (a kill
        -9 left them with no line said). A directory still locked is a live daemon's; one that
        holds files is never removed, nor an empty one without DIR_ATTR (it may be a live
        daemon's of a zvfs that took no lock): an empty one marked so is a dead daemon's, and
        goes."""
        return _left_behind(self.base, self.dir)


def _remove_if_marked(fd: int, path: str) -> None:
    """Remove the empty directory ``path`` (open as ``fd``, locked) of a dead daemon, if a zvfs
    that locks its directory made it: every kill -9 left one for ever."""
    try:
        os.getxattr(fd, DIR_ATTR)
    except OSError:
        return  # unmarked: perhaps a live older zvfs's, which takes no lock
    try:
        os.rmdir(path)
    except OSError:
        pass


def staged_keys(directory: str) -> list[tuple[str, str | None, str | None, str | None]]:
    """(file name, key, source, why kept) of each file staged in ``directory``, as recorded
    (None where nothing was: a disk without extended attributes, an older zvfs, and for why
    kept, a daemon that stopped with no word)."""
    out: list[tuple[str, str | None, str | None, str | None]] = []
    try:
        files = sorted(f.name for f in os.scandir(directory) if f.is_file(follow_symlinks=False))
    except OSError:
        return out
    for name in files:
        path = os.path.join(directory, name)
        found: list[str | None] = []
        for attr in (KEY_ATTR, SOURCE_ATTR, KEPT_ATTR):
            try:
                found.append(os.fsdecode(os.getxattr(path, attr, follow_symlinks=False)))
            except OSError:
                found.append(None)
        out.append((name, found[0], found[1], found[2]))
    return out


def _left_behind(base: str, own: str) -> list[tuple[str, int, int]]:
    out: list[tuple[str, int, int]] = []
    try:
        entries = [e for e in os.scandir(base) if e.name.startswith(DIR_PREFIX) and e.path != own]
    except OSError:
        return out
    for entry in entries:
        try:
            fd = os.open(entry.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its daemon is alive
            files = [f for f in os.scandir(entry.path) if f.is_file(follow_symlinks=False)]
            if not files:
                _remove_if_marked(fd, entry.path)
                continue
            out.append((entry.path, len(files), sum(f.stat(follow_symlinks=False).st_size for f in files)))
        except OSError:
            continue
        finally:
            os.close(fd)
    return out
