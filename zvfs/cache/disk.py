"""An optional disk tier under the memory cache, for objects fetched from a slow store.

It wraps a store (so it sits between the views and the network) and keeps what
``get``, ``get_at_most``, ``get_range``, ``get_suffix`` and ``get_version`` returned as
files under ``--cache-dir``, bounded by ``--cache-max-size`` and by a floor of free space
on that disk.

An entry is named by a hash of (key, range, version), where the version is the one the
store gave the key (S3's ETag) in a listing or an ``info`` at most ``metadata_ttl`` ago
(older, the key's ``info`` is asked again, a HEAD, before an entry on disk is served), or the one a reader
pinned: bytes are fetched pinned to that version (``get_version``; a key replaced since
raises Stale, and what is then read unpinned is not kept), so an entry only ever holds the
bytes of the version it is named for, and a key rewritten behind the mount is read anew
once the TTL has passed, as without the disk tier. A key of no version, or that no
listing has named yet, is cached for this mount only, and for one TTL. Each file
begins with a header that names the entry and holds its length and CRC-32C: a file that
was truncated, changed, swapped for another entry, or is no regular file is dropped (one
log line naming the key) and read again from the store, never served.

A mount declared immutable (``metadata_ttl=indefinite``, read-only) keeps its entries in
a directory of its source (its URL and endpoint), which later mounts reuse, as rclone's
VFS cache is reused; a listing that shows a key changed names new entries, so the old
ones are never served and age out. Only one mount uses that directory at a time (it holds
a lock): another mount of the same source, and every other mount, caches in a directory
of its own, removed at unmount (or, after a crash, by the next mount that finds it
unlocked).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import shutil
import stat
import struct
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path

import crc32c

from zvfs.logonce import LogOnce
from zvfs.stats import Counters
from zvfs.stores._util import no_descriptors_hint
from zvfs.stores.base import KeyWriter, Stale, Store, StoreError, TooLarge, WrappedStore
from zvfs.stores.listing import KeyInfo, Listing

log = logging.getLogger("zvfs")

#: the key's size after a cached tail (get_suffix of a key with no known version)
_SIZE = struct.Struct("<Q")
#: an entry file's header: magic, the sha256 its name is the hex of, payload length, CRC-32C
_HEAD = struct.Struct("<8s32sQI")
_MAGIC = b"zvfsdc2\n"
#: the entry format, part of the shared directory's name: entries of another format are
#: never read as these
_FORMAT = "2"
_LOCK = ".lock"
#: prefix of a directory one mount caches in for its own life
_PRIVATE = "mount-"
#: what such a directory's lock file holds, written once the mount holds the lock: the
#: mark that zvfs made the directory. --cache-dir may hold the user's own files (a
#: "mount-scripts/" among them), and a directory without the mark is never removed
_OWNED = b"zvfs: the disk cache of one mount, removed at its unmount\n"
#: how long close() waits for the entries being written (each is one value's bytes)
_CLOSE_WAIT = 30

#: suffix of an entry of a key with no known version: never reused by a later mount
_LOCAL = ".m"
#: seconds between two scans of --cache-dir for idle kept caches to evict from
_IDLE_RESCAN = 10.0
#: seconds a mount waits before it tries again the lock of its source's kept cache: another
#: mount holds it shared for a moment when it looks whether that cache is in use
_PEEK_WAIT = 0.05


def _locked(directory: Path, strict: bool = False) -> int | None:
    """``directory``'s lock file, locked (its descriptor), or None if another holds it.
    On a file system that has no locks the file is only held open (``strict``: None)."""
    fd = os.open(directory / _LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if strict or exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            os.close(fd)
            return None
        log.debug("disk cache: cannot lock %s: %s", directory, exc)
    return fd


def _reserve(tmp: Path, size: int) -> tuple[int, bool]:
    """Create ``tmp`` and allocate its ``size`` bytes at once: from then on the disk's free
    space shows the whole entry, so the room check of the next one (under the same lock)
    counts it exactly once. Counting it as "still to come" until written counted the bytes
    already landed twice, and a cache at its floor evicted an entry it had room for. The
    descriptor, and whether the space is allocated (not where the file system cannot)."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            return fd, False
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    return fd, True


def _remove_leftovers(top: Path) -> None:
    """Remove the private directories of mounts that are gone (killed, crashed): a
    directory zvfs made (its lock file holds ``_OWNED``) whose lock no live mount holds."""
    try:
        found = [e for e in os.scandir(top) if e.name.startswith(_PRIVATE)
                 and e.is_dir(follow_symlinks=False)]
    except OSError:
        return
    for entry in found:
        path = Path(entry.path)
        fd = _open_lock(path, owned=True)
        if fd is None:
            continue  # not zvfs's (or being made this moment)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held until the directory is gone
        except OSError:
            continue  # a live mount's (or no locks here to tell)
        else:
            shutil.rmtree(path, ignore_errors=True)
            log.info("disk cache: removed %s, left by a mount that is gone", path)
        finally:
            os.close(fd)


def _hex(name: str, digits: int) -> bool:
    """Whether ``name`` is ``digits`` lower-case hex digits: what zvfs names entries (64)
    and the caches kept for a source (16) with, and nothing else there is."""
    return len(name) == digits and all(c in "0123456789abcdef" for c in name)


def _is_entry(name: str) -> bool:
    """Whether ``name`` is an entry file's (64 hex digits, or those and _LOCAL)."""
    return _hex(name.removesuffix(_LOCAL), 64)


def _open_lock(directory: Path, owned: bool) -> int | None:
    """The lock file of a cache directory zvfs made, open (the caller closes it), or None:
    none there, not a regular file, or (``owned``) without the mark of a private one."""
    try:
        fd = os.open(directory / _LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode) and (not owned or os.pread(fd, len(_OWNED) + 1, 0) == _OWNED):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def _caches_of_others(top: Path, own: Path, idle_only: bool = False) -> list[Path]:
    """The cache directories under ``top`` that zvfs made, other than ``own``: a private one
    (its lock file holds ``_OWNED``) or one kept for later mounts (16 hex digits, with a
    lock file); ``idle_only``: only those no live mount holds. The user's own directories
    there are never among them."""
    out = []
    try:
        entries = list(os.scandir(top))
    except OSError:
        return out
    for entry in entries:
        path = Path(entry.path)
        if path == own or not entry.is_dir(follow_symlinks=False):
            continue
        shared = _hex(entry.name, 16)
        if not shared and not entry.name.startswith(_PRIVATE):
            continue
        fd = _open_lock(path, owned=not shared)
        if fd is None:
            continue
        try:
            if idle_only:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # held: a live mount's (OSError)
            out.append(path)
        except OSError:
            continue
        finally:
            os.close(fd)
    return out


def _unlink_if_idle(path: str) -> bool:
    """Unlink ``path``, an entry of another cache directory, if no mount holds that directory:
    under a shared lock of it, which a mount taking the directory waits out (_PEEK_WAIT).
    The idle entries listed once were unlinked until the list was used up: a source mounted
    again meanwhile lost its entries under its mount, which read them from the store again
    and counted bytes no longer there (a helper's audit)."""
    directory = Path(path).parent
    fd = _open_lock(directory, owned=not _hex(directory.name, 16))
    if fd is None:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # a live mount holds it: OSError
        os.unlink(path)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _entries_of(directories: list[Path]) -> list[tuple[float, str]]:
    """(atime, path) of the entry files in ``directories``, most recently used first."""
    found = []
    for directory in directories:
        try:
            with os.scandir(directory) as it:
                for e in it:
                    if _is_entry(e.name) and e.is_file(follow_symlinks=False):
                        found.append((e.stat(follow_symlinks=False).st_atime, e.path))
        except OSError:
            continue
    found.sort(reverse=True)
    return found


def _make_private(top: Path) -> tuple[Path, int | None]:
    """A directory of this mount's own under ``top``, and its lock (None: no locks here).
    The mark is written only once the lock is held, so a mount that reads it to remove
    leftovers finds the lock taken."""
    path = Path(tempfile.mkdtemp(prefix=_PRIVATE, dir=top))
    fd = os.open(path / _LOCK, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:  # no locks on this file system: never taken for a leftover
        log.debug("disk cache: cannot lock %s: %s", path, exc)
        os.close(fd)
        return path, None
    os.write(fd, _OWNED)
    return path, fd


#: errors of an entry's open that say nothing of the entry (no descriptor, no memory, a
#: signal): it is kept, and the read goes to the store. Counting it corrupt, and removing
#: it, wiped a cache kept for later mounts whenever the daemon ran out of descriptors
_NOT_THE_ENTRYS = (errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EINTR)


class DiskCachedStore(WrappedStore):
    def __init__(
        self,
        inner: Store,
        directory: str | os.PathLike[str],
        max_bytes: int,
        min_free_bytes: int,
        persistent: bool,
        counters: Counters,
        identity: str | None = None,
        ttl: float | None = None,
    ) -> None:
        """``identity``: what names the source (its URL and endpoint), so a later mount of
        the same finds the entries; the store's description when None. ``ttl``: the
        mount's metadata TTL (None: indefinite), how long what a listing said is trusted."""
        super().__init__(inner)
        self.ttl = ttl
        self.max_bytes = max_bytes
        self.min_free = min_free_bytes
        self.counters = counters
        top = Path(directory)
        top.mkdir(parents=True, exist_ok=True)
        _remove_leftovers(top)
        #: entries of keys with no known version are named with it: no later mount has it
        self._nonce = os.urandom(16).hex()
        self._lock_fd: int | None = None
        self.private = True
        if persistent:
            text = f"{_FORMAT}\0{identity if identity is not None else inner.description}"
            shared = top / hashlib.sha256(text.encode()).hexdigest()[:16]
            try:
                shared.mkdir(mode=0o700, exist_ok=True)  # the bucket's bytes: no other user's to read
                if shared.is_symlink():
                    # mkdir's exist_ok follows it, and the index's load then removed every
                    # file of the link's target as "no entry" (a helper's audit)
                    raise OSError(errno.ELOOP, "a symbolic link, not a directory zvfs made", str(shared))
                self._lock_fd = _locked(shared)
                if self._lock_fd is None:  # or held a moment by a mount that looked whether
                    time.sleep(_PEEK_WAIT)  # it is in use (_caches_of_others): once more
                    self._lock_fd = _locked(shared)
                why = "it is in use by another mount of the same source" if self._lock_fd is None else None
            except OSError as exc:  # a file there, a .lock that is none: not worth a failed mount
                why = f"{exc.strerror or exc} ({exc.filename}); remove it"
            if why is not None:
                log.warning("disk cache: cannot keep this mount's cache in %s for later mounts: %s. "
                            "It caches in a directory of its own, removed at unmount", shared, why)
            else:
                self.dir, self.private = shared, False
        if self.private:
            self.dir, self._lock_fd = _make_private(top)
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, int] = OrderedDict()
        #: key -> the names cached for it this mount, so a write through the mount drops them
        self._names_of: dict[str, set[str]] = {}
        #: key -> how many times it was written through the mount: bytes fetched before a
        #: write, and returned after it, are the old content and must not be kept
        self._writes: dict[str, int] = {}
        #: key -> what the latest listing (or info) that passed through said of it, and when
        self._known: dict[str, tuple[KeyInfo, float]] = {}
        self._bytes = 0
        #: entries being written now, which close() waits for
        self._writing = 0
        #: bytes of those whose space could not be allocated ahead (_reserve): the disk's
        #: free space does not show them yet
        self._unreserved = 0
        #: set by close(): no entry is written after it, and it waits for those under way
        self._closing = False
        self._written = threading.Condition(self._lock)
        self._once = LogOnce(log)
        #: entries of idle kept caches beside this one, to evict before its own (_evict_idle)
        self._idle: list[tuple[float, str]] = []
        self._idle_scanned = -_IDLE_RESCAN
        self._load_index()

    def _load_index(self) -> None:
        """Pick up what an earlier mount left, least recently used first; drop what no
        mount can use (files half written, entries of one mount, what is no entry)."""
        found = []
        strange = []
        for entry in os.scandir(self.dir):
            name = entry.name
            if name == _LOCK:
                continue
            try:
                if _hex(name, 64) and entry.is_file(follow_symlinks=False):
                    st = entry.stat(follow_symlinks=False)
                    found.append((st.st_atime, name, st.st_size))
                    continue
                if not name.endswith((".tmp", _LOCAL)):
                    strange.append(name)
                self._remove(Path(entry.path))
            except OSError:
                pass
        if strange:
            log.warning("disk cache: removed %d file(s) from %s that no mount wrote there (%s)",
                        len(strange), self.dir, ", ".join(sorted(strange)[:3]))
        for _, name, size in sorted(found):
            self._entries[name] = size
            self._bytes += size
        with self._lock:
            self._shrink(0)

    @staticmethod
    def _remove(path: Path) -> None:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)

    def _name(self, key: str, start: int = -1, length: int = -1, version: object = None) -> str:
        """An entry's file name. Bytes read from one version of the key are named for it:
        a version the listing gives, or one an open file is pinned to (it reads on after a
        write through the mount, and what it reads must not be served to those that open
        the new one). Without a version the name is this mount's only."""
        if version is None:  # this mount's, for one TTL
            epoch = 0 if not self.ttl else int(time.monotonic() // self.ttl)
            text = f"{key}\0{start}\0{length}\0\0{self._nonce}\0{epoch}"
        else:
            text = f"{key}\0{start}\0{length}\0v{version}"
        name = hashlib.sha256(text.encode()).hexdigest()
        return name + _LOCAL if version is None else name

    # -- what the listings say -----------------------------------------------------------

    def _learn(self, key: str, info: KeyInfo) -> None:
        self._known[key] = (info, time.monotonic())

    def _info_of(self, key: str, name_of: Callable[[KeyInfo], str]) -> KeyInfo | None:
        """The key's size and version as listed less than a TTL ago; None if there is no
        version, the store could not say, or no listing named the key (a chunk never
        written is not asked about twice). Listed longer ago, the version is asked again
        (``info``: a HEAD) only when the disk holds its entry ``name_of(info)``, which must
        not be served unchecked: a fetch pinned to the version checks it as it reads, and
        a HEAD before each cold read after the TTL doubled the requests of a read."""
        known = self._known.get(key)
        if known is None:
            return None
        info = known[0]
        if info.version is None:
            return None
        if self.ttl is not None and time.monotonic() - known[1] >= self.ttl:
            with self._lock:
                on_disk = name_of(info) in self._entries
            if on_disk:
                try:
                    info = self.info(key)
                except StoreError:  # gone, or failing: the read itself will say
                    self._known.pop(key, None)
                    return None
        return info if info.version is not None else None

    def _pinned(self, key: str, info: KeyInfo, fetch: Callable[[], bytes]) -> Callable[[], bytes]:
        """``fetch``, pinned to ``info``'s version; once it read, the version is known to
        be the key's now (for another TTL), unless a write or listing has said since; if
        the key was replaced (Stale), the version is forgotten, so the next read is not
        pinned to it again (two requests a read until a listing came)."""

        def pinned() -> bytes:
            try:
                data = fetch()
            except Stale:
                with self._lock:
                    known = self._known.get(key)
                    if known is not None and known[0] is info:
                        del self._known[key]
                raise
            with self._lock:
                known = self._known.get(key)
                if known is not None and known[0] is info:
                    self._known[key] = (info, time.monotonic())
            return data

        return pinned

    def info(self, key: str) -> KeyInfo:
        info = self.inner.info(key)
        self._learn(key, info)
        return info

    def list_dir(self, prefix: str) -> Listing:
        listing = self.inner.list_dir(prefix)
        for name, info in listing.keys.items():
            self._learn(prefix + name, info)
        return listing

    def list_tree(self, prefix: str) -> Iterator[tuple[str, KeyInfo]]:
        listing = self.inner.list_tree(prefix)  # its errors at once, as the inner store's

        def learnt() -> Iterator[tuple[str, KeyInfo]]:
            for key, info in listing:
                self._learn(key, info)
                yield key, info

        return learnt()

    # -- entries -------------------------------------------------------------------------

    def _bad(self, key: str, name: str, why: str) -> None:
        """The entry ``name`` of ``key`` cannot be trusted: drop it, say so once."""
        self.counters.add("disk_cache_corrupt")
        self._once.warning(key, "disk cache: dropped the cached copy of %s (%s): %s; read from "
                           "the store instead", key, self.dir / name, why)
        with self._lock:
            self._bytes -= self._entries.pop(name, 0)
        try:
            self._remove(self.dir / name)
        except OSError:
            pass

    def _read(self, key: str, name: str) -> bytes | None:
        with self._lock:
            if name not in self._entries:
                return None
            self._entries.move_to_end(name)
        path = self.dir / name
        why = None
        try:
            # O_NONBLOCK: a FIFO in its place must not hold the read (and a thread) forever
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:  # removed by hand: a miss
            with self._lock:
                self._bytes -= self._entries.pop(name, 0)
            return None
        except OSError as exc:
            if exc.errno in _NOT_THE_ENTRYS:  # the daemon's trouble, not the file's: a miss
                self._once.warning(f"\0open{exc.errno}", "disk cache: cannot open its entries in "
                                   "%s: %s; read from the store meanwhile (said once)", self.dir,
                                   f"{exc.strerror}{no_descriptors_hint(exc)}")
                return None
            why = "a symbolic link" if exc.errno == errno.ELOOP else exc.strerror or str(exc)
        else:
            try:
                why, data = self._check(fd, name)
            except OSError as exc:
                why = exc.strerror or str(exc)
            finally:
                os.close(fd)
        if why is not None:
            self._bad(key, name, why)
            return None
        self.counters.add("disk_cache_hits")
        return data

    @staticmethod
    def _check(fd: int, name: str) -> tuple[str | None, bytes]:
        """(why the file is not the entry ``name``, or None; its payload)."""
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return "not a regular file", b""
        head = os.pread(fd, _HEAD.size, 0)
        if len(head) < _HEAD.size:
            return f"{st.st_size} bytes, shorter than its header", b""
        magic, digest, length, crc = _HEAD.unpack(head)
        if magic != _MAGIC:
            return "no entry header", b""
        if digest != bytes.fromhex(name[:64]):
            return "the entry of another key or range", b""
        if st.st_size != _HEAD.size + length:
            return f"{st.st_size - _HEAD.size} bytes where {length} were kept", b""
        data = os.pread(fd, length, _HEAD.size) if length else b""
        if len(data) != length:
            return f"read {len(data)} of {length} bytes", b""
        if crc32c.crc32c(data) != crc:
            return "its bytes do not match their checksum", b""
        return None, data

    def _shrink(self, incoming: int) -> bool:
        """Evict until ``incoming`` more bytes fit both bounds; False if they never can.
        Called with the lock held."""
        if incoming > self.max_bytes:
            return False

        def above_floor() -> bool:
            return shutil.disk_usage(self.dir).free - self._unreserved - incoming >= self.min_free

        def fits() -> bool:
            return self._bytes + incoming <= self.max_bytes and above_floor()

        if not above_floor():
            self._evict_idle(above_floor)
        return self._evict_until(fits)

    def _evict_until(self, fits: Callable[[], bool]) -> bool:
        """Evict, least recently used first, until ``fits()``; whether it then does. Called
        with the lock held."""
        while self._entries:
            if fits():
                return True
            name, size = self._entries.popitem(last=False)
            self._bytes -= size
            self.counters.add("disk_cache_evictions")
            try:
                os.unlink(self.dir / name)
            except OSError:
                pass
        return fits()

    def on_disk_of(self, path: str | os.PathLike[str]) -> bool:
        """Whether ``path`` is on the file system this cache writes in."""
        try:
            return os.stat(path).st_dev == os.stat(self.dir).st_dev
        except OSError:
            return False

    def make_room(self, free: int) -> None:
        """Evict, least recently used first, until the disk has ``free`` bytes free or nothing
        is left to evict: writes staged on the same disk come before what is cached."""
        def fits() -> bool:
            return shutil.disk_usage(self.dir).free - self._unreserved >= free

        with self._lock:
            try:
                if self._evict_until(fits):
                    return
            except OSError:  # the disk cannot be told: the write's own check decides
                return
        try:
            self._evict_others(fits)
        except OSError:
            pass

    def _evict_others(self, fits: Callable[[], bool]) -> None:
        """Evict the entries of the other mounts' caches under the same --cache-dir, least
        recently used first, until ``fits()``. One --cache-dir for all of a machine's mounts
        is the natural setting, and a read-only mount's cache held the disk at its floor, so
        that every write staged there failed. Only entry files of zvfs's own directories go;
        the mount that held one reads it from the store again (a missing entry is a miss)."""
        self._evict_listed(_entries_of(_caches_of_others(self.dir.parent, self.dir)), fits)

    def _evict_listed(self, found: list[tuple[float, str]], fits: Callable[[], bool]) -> bool:
        """Unlink the entry files ``found`` ((atime, path), oldest last) until ``fits()``."""
        while not fits():
            if not found:
                return False
            _, path = found.pop()
            try:
                os.unlink(path)
            except OSError:
                continue
            self.counters.add("disk_cache_evictions")
        return True

    def _evict_idle(self, fits: Callable[[], bool]) -> bool:
        """Evict entries of the caches kept for later mounts that no mount uses now, least
        recently used first, until ``fits()``: a source mounted once with
        metadata_ttl=indefinite kept its entries for ever, and once they held the disk at
        --cache-min-free, a mount of any other source cached nothing. They go before this
        mount's own. Called with the lock held; the directories are scanned again at most
        every _IDLE_RESCAN seconds."""
        now = time.monotonic()
        if not self._idle and now - self._idle_scanned >= _IDLE_RESCAN:
            self._idle_scanned = now
            self._idle = _entries_of(_caches_of_others(self.dir.parent, self.dir, idle_only=True))
        try:
            while not fits():
                if not self._idle:
                    return False
                _, path = self._idle.pop()
                if _unlink_if_idle(path):
                    self.counters.add("disk_cache_evictions")
        except OSError:  # the free space unknown (fits): as before, nothing more evicted
            return False
        return True

    def _write(self, key: str, name: str, data: bytes, writes: int) -> None:
        """Keep ``data`` as ``name``, unless ``key`` was written through the mount since
        its fetch began (``writes`` is the count then)."""
        size = _HEAD.size + len(data)
        with self._lock:
            if self._closing or self._writes.get(key, 0) != writes:
                return
            self._names_of.setdefault(key, set()).add(name)
            if name in self._entries:
                return
            try:
                fits = self._shrink(size)
            except OSError as exc:  # its free space unknown: the directory was removed, or fails
                self._cannot_write(exc)
                return
            if not fits:
                if size <= self.max_bytes:
                    self._once.warning("\0floor", "disk cache: %s keeps no more: its disk would drop "
                                       "below --cache-min-free (%d bytes free); reads go on from "
                                       "the store", self.dir, shutil.disk_usage(self.dir).free)
                return
            tmp = self.dir / f"{name}.{os.getpid()}.{threading.get_ident()}.tmp"
            try:
                fd, reserved = _reserve(tmp, size)
            except OSError as exc:
                self._cannot_write(exc)
                return
            self._entries[name] = size
            self._bytes += size
            self._writing += 1
            unreserved = 0 if reserved else size
            self._unreserved += unreserved
        try:
            head = _HEAD.pack(_MAGIC, bytes.fromhex(name[:64]), len(data), crc32c.crc32c(data))
            with open(fd, "wb") as f:
                f.write(head)
                f.write(data)
            os.replace(tmp, self.dir / name)
            with self._lock:
                if name not in self._entries:
                    # evicted by a concurrent _shrink while it was written: an untracked
                    # file would hold space the bound does not see
                    (self.dir / name).unlink(missing_ok=True)
        except OSError as exc:  # a full or failing cache disk must not fail the read
            self._cannot_write(exc)
            with self._lock:
                self._bytes -= self._entries.pop(name, 0)
            tmp.unlink(missing_ok=True)
        finally:
            with self._lock:
                self._writing -= 1
                self._unreserved -= unreserved
                self._written.notify_all()

    def _cannot_write(self, exc: OSError) -> None:
        self._once.warning(f"\0{exc.errno}", "disk cache: cannot write in %s: %s; what does "
                           "not fit is read from the store (said once)", self.dir,
                           exc.strerror or exc)

    def _cached(self, key: str, name: str, fetch, keep=None, fallback=None):  # type: ignore[no-untyped-def]
        """``fetch()`` unless ``name`` is on disk; what it fetched is kept there unless
        ``keep(data)`` says it is not what ``name`` names. A fetch pinned to the version
        the listing gave may find the key replaced since (Stale): ``fallback()`` then reads
        what is there now, which is not kept (the listing has not named it yet)."""
        if self.ttl == 0 and name.endswith(_LOCAL):  # trusted for no time at all
            return fetch()
        data = self._read(key, name)
        if data is None:
            self.counters.add("disk_cache_misses")
            with self._lock:
                writes = self._writes.get(key, 0)
            try:
                data = fetch()
            except Stale:
                if fallback is None:
                    raise
                return fallback()
            if keep is None or keep(data):
                self._write(key, name, data, writes)
        return data

    def _through(self, key: str, start: int, length: int, unpinned: Callable[[], bytes],
                 pinned: Callable[[object], bytes]) -> bytes:
        """Bytes ``start``/``length`` of ``key`` through the cache: by the version a listing
        gave (``pinned(version)`` fetches them, ``unpinned()`` once the key was replaced),
        or, with none known, this mount's own entry of ``unpinned()``."""
        info = self._info_of(key, lambda i: self._name(key, start, length, i.version))
        if info is None:
            return self._cached(key, self._name(key, start, length), unpinned)
        return self._cached(key, self._name(key, start, length, info.version),
                            self._pinned(key, info, lambda: pinned(info.version)), fallback=unpinned)

    def get(self, key: str) -> bytes:
        return self._through(key, -1, -1, lambda: self.inner.get(key),
                             lambda v: self.inner.get_version(key, 0, None, v))

    def get_at_most(self, key: str, limit: int) -> bytes:
        """The whole value, kept as ``get`` keeps it; a version too large is never kept."""
        info = self._info_of(key, lambda i: self._name(key, version=i.version))
        if info is None or info.size > limit:
            return self.inner.get_at_most(key, limit)

        def fetch() -> bytes:
            data = self.inner.get_version(key, 0, None, info.version, limit + 1)
            if len(data) > limit:
                raise TooLarge(f"{key}: holds more than the {limit} bytes it may")
            return data

        data = self._cached(key, self._name(key, version=info.version), self._pinned(key, info, fetch),
                            fallback=lambda: self.inner.get_at_most(key, limit))
        if len(data) > limit:
            raise TooLarge(f"{key}: holds {len(data)} bytes, more than the {limit} it may")
        return data

    def get_range(self, key: str, start: int, length: int) -> bytes:
        return self._through(key, start, length, lambda: self.inner.get_range(key, start, length),
                             lambda v: self.inner.get_version(key, start, length, v))

    def get_suffix(self, key: str, length: int) -> tuple[bytes, int]:
        """With a listed version, the range the listed size puts the tail at; else kept as
        the tail followed by the key's size (8 bytes), so a hit needs no request."""
        def tail_of(i: KeyInfo) -> str:
            first = max(0, i.size - length)
            return self._name(key, first, i.size - first, i.version)

        info = self._info_of(key, tail_of) if length >= 0 else None
        if info is not None:
            start = max(0, info.size - length)
            if start == info.size:
                return self.inner.get_suffix(key, length)
            fell_back: list[tuple[bytes, int]] = []

            def fallback() -> bytes:
                fell_back.append(self.inner.get_suffix(key, length))
                return b""

            data = self._cached(key, tail_of(info),
                                self._pinned(key, info, lambda: self.inner.get_version(
                                    key, start, info.size - start, info.version)),
                                fallback=fallback)
            return fell_back[0] if fell_back else (data, info.size)

        def fetch() -> bytes:
            data, size = self.inner.get_suffix(key, length)
            return data + _SIZE.pack(size)

        entry = self._cached(key, self._name(key, -2, length), fetch)  # -2: no range starts there
        return entry[: -_SIZE.size], _SIZE.unpack(entry[-_SIZE.size:])[0]

    def get_version(self, key: str, start: int, length: int | None, version: str | None,
                    limit: int | None = None) -> bytes:
        # a read to the end from 0 is the whole value; from elsewhere, its start names it.
        # One that ``limit`` may have cut short is kept only if it ended before the limit.
        name = (self._name(key, version=version) if length is None and start == 0
                else self._name(key, start, -1 if length is None else length, version))
        data = self._cached(key, name, lambda: self.inner.get_version(key, start, length, version, limit),
                            None if limit is None else (lambda d: len(d) < limit))
        return data if limit is None or length is not None else data[:limit]

    def close(self) -> None:
        """Remove this mount's own directory, once the entries being written are: a
        fetch still in flight at unmount (a read-ahead the kernel no longer waits for)
        wrote its file between rmtree's scan and its rmdir, and the directory stayed,
        its lock file gone, so no later mount took it for a leftover."""
        with self._lock:
            self._closing = True
            if not self._written.wait_for(lambda: self._writing == 0, _CLOSE_WAIT):
                log.warning("disk cache: an entry of %s still being written after %d s; "
                            "removing it anyway", self.dir, _CLOSE_WAIT)
        try:
            self.inner.close()
        finally:
            if self.private:
                shutil.rmtree(self.dir, ignore_errors=True)
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    def _forget(self, key: str) -> None:
        """Drop what is cached of ``key``: it is being written through the mount (a
        writable mount's cache is its own, so only this mount's names are tracked)."""
        with self._lock:
            self._writes[key] = self._writes.get(key, 0) + 1
            self._known.pop(key, None)  # listed again once written
            names = self._names_of.pop(key, set())
            for name in names:
                size = self._entries.pop(name, None)
                if size is not None:
                    self._bytes -= size
                    (self.dir / name).unlink(missing_ok=True)

    def _forget_prefix(self, prefix: str) -> None:
        with self._lock:
            keys = [k for k in self._names_of if k.startswith(prefix)]
        for key in keys:
            self._forget(key)

    def open_writer(self, key: str, *, truncate: bool, create: bool, exclusive: bool = False) -> KeyWriter:
        self._forget(key)
        return _ForgetOnCommit(self, self.inner.open_writer(
            key, truncate=truncate, create=create, exclusive=exclusive))

    @contextlib.contextmanager
    def _changing(self, *keys: str, prefixes: tuple[str, ...] = ()) -> Iterator[None]:
        """Around a change the store makes of ``keys`` (and of every key under ``prefixes``):
        what is cached of them goes before it, and again after it. A read during the change
        (a decoded reader beside zarr-python's rename of a chunk's .partial over it) cached
        the old bytes, under no version, and they were served after it (a helper's audit)."""
        def forget() -> None:
            for key in keys:
                self._forget(key)
            for prefix in prefixes:
                self._forget_prefix(prefix)

        forget()
        try:
            yield
        finally:
            forget()

    def delete(self, key: str) -> None:
        with self._changing(key):
            self.inner.delete(key)

    def rename(self, src: str, dst: str, replace: bool = True) -> None:
        with self._changing(src, dst):
            self.inner.rename(src, dst, replace)

    def link(self, src: str, dst: str) -> KeyInfo | None:
        with self._changing(dst):
            return self.inner.link(src, dst)

    def rename_dir(self, src: str, dst: str, replace: bool = True) -> None:
        with self._changing(prefixes=(src, dst)):
            self.inner.rename_dir(src, dst, replace)

    @property
    def used_bytes(self) -> int:
        return self._bytes


class _ForgetOnCommit(KeyWriter):
    """A writer whose commits drop the key's cached copies (a read may have cached the old
    bytes while the file was open)."""

    def __init__(self, cache: DiskCachedStore, inner: KeyWriter) -> None:
        self._cache = cache
        self._inner = inner
        self.key = inner.key
        self.staged = inner.staged

    @property
    def size(self) -> int:
        return self._inner.size

    @property
    def mtime_ns(self) -> int | None:
        return self._inner.mtime_ns

    def write(self, offset: int, data: bytes) -> int:
        return self._inner.write(offset, data)

    def read(self, offset: int, length: int) -> bytes:
        return self._inner.read(offset, length)

    def read_at_once(self, offset: int, length: int) -> bytes | memoryview | None:
        return self._inner.read_at_once(offset, length)

    def unfetched(self, offset: int, length: int) -> KeyInfo | None:
        return self._inner.unfetched(offset, length)

    def truncate(self, size: int) -> None:
        self._inner.truncate(size)

    def commit(self, durable: bool = False) -> KeyInfo | None:
        info = self._inner.commit(durable)
        self._cache._forget(self.key)
        return info

    def close(self) -> None:
        self._inner.close()

    @property  # type: ignore[override]
    def stored(self) -> bool:
        return self._inner.stored

    @property
    def closed(self) -> bool:
        return self._inner.closed

    def append(self, data: bytes) -> int:
        return self._inner.append(data)

    def discard(self) -> None:
        self._inner.discard()

    def undiscard(self) -> None:
        self._inner.undiscard()

    def abandon(self) -> None:
        self._inner.abandon()

    def moved(self, key: str) -> None:
        self._inner.moved(key)
        self.key = key

    def background_work(self) -> list[Callable[[], None]]:
        return self._inner.background_work()
