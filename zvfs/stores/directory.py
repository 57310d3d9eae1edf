"""A store backed by a local directory: key ``a/b/c`` is the file ``root/a/b/c``.

Nothing escapes the base directory: every key is checked with
:func:`zvfs.stores.keys.bad_segment` before it becomes a path, and the resolved
path must stay below the (resolved) root. A symlink to a *file* inside the root
is followed; one pointing outside is treated as absent and logged once.

Symlinks to *directories* are never followed, even inside the root (as find,
cp -r and rsync do by default): a link such as ``sub/up -> ..`` would otherwise
make the tree endless, and discovery with it. Such a link is absent from the
listings and logged once.

Opening a key checks those rules with the kernel's name for the opened file
(``/proc/self/fd``): when it is the path as given, no symlink was on the way;
otherwise the path is resolved component by component. Reads keep a bounded
set of files open (:class:`~zvfs.stores.open_files.OpenFiles`), so a repeated read (the inner chunks
of one shard, a raw file read block by block) is one ``stat`` of its path and
one ``pread``, not an open and a close. A kept descriptor is used only while the
key's path still names the same file (device and inode, checked by that
``stat`` on every read): a file replaced or removed by anyone, through the
mount or not, is resolved and opened afresh under the escape rules above, and
changes made in place are read as they are. Writes through the store (unlink,
rename, link) let go of the descriptors of the names they change at once.
"""

from __future__ import annotations

import copy
import errno
import logging
import os
import stat
import sys
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager

from zvfs.pagecache import read_ahead_and_close
from zvfs.stores import find_lister
from zvfs.stores._util import (
    NO_DESCRIPTORS,
    HeldDescriptors,
    LogOnce,
    check_key,
    check_prefix,
    no_descriptors_hint,
    open_file_limit,
    pread_all,
    pread_at_once,
    pwrite_all,
    rename_noreplace,
    reserve,
)
from zvfs.stores.base import (
    GONE,
    KeyInfo,
    KeyNotFound,
    KeyReader,
    KeyWriter,
    Listing,
    Reopen,
    SourceError,
    Stale,
    Store,
    StoreError,
    TooLarge,
    WriteRefused,
)
from zvfs.stores.cached_open import open_if_cached
from zvfs.stores.keys import bad_segment, is_safe_key, safe_name
from zvfs.stores.open_files import KeptOpen, OpenFiles, kept_files

log = logging.getLogger(__name__)

# O_NONBLOCK so that opening a FIFO planted in the tree cannot hang a worker thread;
# O_NOFOLLOW so that a last component swapped for a symlink after we resolved it is refused.
_OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW

# errors that mean "this key is not a regular file here" (ENXIO: a UNIX socket, which no
# open reaches; it failed the store's reads as an error, and discovery with them for good)
_ABSENT = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EISDIR, errno.ENAMETOOLONG, errno.ENXIO)
#: bytes a path given to the kernel may hold, its closing NUL included (Linux's PATH_MAX)
PATH_MAX = 4096
#: bytes of one name at most
_NAME_MAX = 255


def _special(path: str, dir_fd: int | None = None) -> bool:
    """Whether ``path`` is a device node, a FIFO or a socket: not a key, and never opened (an
    open has effects of its own on a device: a watchdog arms, a tape rewinds, a serial line
    raises DTR). Checked before each open; a process that can make device nodes could swap
    one in between, and that one the open's fstat still refuses as a key, once opened."""
    try:
        mode = os.lstat(path, dir_fd=dir_fd).st_mode
    except OSError:
        return False  # the open that follows says what is wrong
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode))


#: the mode of a file made through the mount (the store keeps no modes; directories get 0755)
NEW_FILE_MODE = 0o644

#: directories listed at once ahead of a walk of the tree (see Store.list_ahead); for a
#: find over a million keys 2, 4 and 8 did alike (docs/benchmark-history.md, sixteenth session)
LIST_AHEAD = 4


#: keys of one directory that absent() looks up in a listing of it (when it is small)
#: rather than an lstat each
ABSENT_LISTED_MIN = 16


class DirectoryStore(Store):
    """Store over a directory tree (the Zarr file-system store layout).

    Writes pass straight through to the directory (POSIX semantics, atomic rename),
    under the same escape rules as reads: a key is written only where its parent
    directory is a real directory below the root, reached through no symlink.
    """

    can_write = True
    opens_readers = True
    local = True
    list_ahead = LIST_AHEAD

    def __init__(self, root: str | os.PathLike[str], open_files: int | None = None) -> None:
        shown = os.path.abspath(os.fspath(root))
        if not os.path.exists(shown):
            raise SourceError(f"source directory {shown} does not exist")
        if not os.path.isdir(shown):
            raise SourceError(f"source {shown} is not a directory")
        if not os.access(shown, os.R_OK | os.X_OK):
            raise SourceError(f"source directory {shown} is not readable (permission denied)")
        self.root = os.path.realpath(shown)
        self._root_sep = self.root if self.root.endswith("/") else self.root + "/"
        self.description = shown
        self._escapes = LogOnce(log)
        self._files = OpenFiles(kept_files() if open_files is None else open_files)
        self._held = HeldDescriptors()
        self._unheld = LogOnce(log)
        self._proc_fd = True  # /proc/self/fd names opened files (see _open_direct)
        weakref.finalize(self, self._files.close)  # a store dropped unclosed closes its files

    # -- path resolution -------------------------------------------------------------------

    def _inside(self, real: str) -> bool:
        return real == self.root or real.startswith(self._root_sep)

    def _resolve(self, rel: str, *, file_link_ok: bool = True) -> str | None:
        """Real path of ``rel`` below the root, or None if it is not reachable.

        Unreachable: a symlink leads outside the root, or the path passes through a
        symlinked directory. Only the last component may be a symlink (to a file, the
        caller checks), and only when ``file_link_ok``.
        """
        path = os.path.join(self.root, rel) if rel else self.root
        try:
            real = os.path.realpath(path)
        except OSError as e:
            # the path changed under realpath (a directory swapped for a symlink between two
            # of its steps: EINVAL): absent now, as at a lookup a moment later; it was EIO
            # with a bare "OSError: [Errno 22]" line (a helper's audit)
            self._escapes.warning(rel, "%s: %r changed while it was resolved (%s); treated as absent",
                                  self.description, rel, e.strerror)
            return None
        if real == path:  # keys are normalized (no '.', '..', '//'): no symlink on the way
            return real
        if not self._inside(real):
            self._escapes.warning(
                rel, "%s: %r resolves to %s, outside the source; treated as absent",
                self.description, rel, real,
            )
            return None
        parent = os.path.dirname(path)
        if file_link_ok and os.path.realpath(parent) == parent:
            return real
        link = self._first_link(rel)
        self._escapes.warning(
            link, "%s: %r is a symlink to a directory; not followed (it could loop)",
            self.description, link,
        )
        return None

    def _open_direct(self, key: str, flags: int = _OPEN_FLAGS, what: str = "open") -> int | None:
        """``key``'s path opened where no symlink is on the way, or None (then resolve it).

        The kernel names the file it opened (/proc/self/fd): the path as given means no
        symlink was followed, which is what a resolution component by component would
        establish, for two system calls instead of one per component. With O_PATH in
        ``flags`` nothing is opened for reading (no device touched, no FIFO waited on), and
        a symlink at the end is opened itself: the caller looks at what it got.
        """
        if not self._proc_fd:
            return None
        path = os.path.join(self.root, key)
        if not flags & os.O_PATH and _special(path):
            raise KeyNotFound(key)
        try:
            fd = self._os_open(path, flags)  # O_NOFOLLOW: a link at the end is ELOOP
        except OSError as e:
            if e.errno == errno.ELOOP:
                return None
            if e.errno in _ABSENT:
                raise KeyNotFound(key) from None
            raise _cannot_open(key, e, what) from e
        if self._opened_at(fd, path) and self._proc_fd:  # with no /proc here: always resolve
            return fd
        os.close(fd)
        return None

    def _opened_at(self, fd: int, path: str) -> bool:
        """Whether the kernel opened ``fd`` at ``path`` (no symlink followed on the way); True
        where /proc cannot tell (then the resolution's checks are all there is)."""
        if not self._proc_fd:
            return True
        where = _fd_path(fd)
        if where is None:
            self._proc_fd = False
            return True
        return where == path

    def _opened_as_resolved(self, fd: int, real: str, key: str) -> bool:
        """Whether ``fd`` is open at ``real``, which ``key`` resolved to; else a directory on
        the way became a symlink between the resolution and the open (another process
        racing us), what was opened may be outside, and one line says so."""
        if self._opened_at(fd, real):
            return True
        self._escapes.warning(key, "%s: %r changed while it was opened (a symlink swapped in); "
                              "treated as absent", self.description, key)
        return False

    def _first_link(self, rel: str) -> str:
        """The shortest prefix of ``rel`` that is a symlink (for the log line)."""
        parts = rel.split("/")
        for i in range(1, len(parts) + 1):
            sub = "/".join(parts[:i])
            if os.path.islink(os.path.join(self.root, sub)):
                return sub
        return rel

    def _open(self, key: str) -> tuple[int, os.stat_result]:
        """Open ``key`` as a regular file; the caller closes the fd."""
        check_key(key)
        fd = self._open_direct(key)
        if fd is None:  # a symlink on the way: the full rules decide
            real = self._resolve(key)
            if real is None or _special(real):
                raise KeyNotFound(key)
            try:
                fd = self._os_open(real, _OPEN_FLAGS)
            except OSError as e:
                if e.errno in _ABSENT:
                    raise KeyNotFound(key) from None
                raise _cannot_open(key, e) from e
            if not self._opened_as_resolved(fd, real, key):
                os.close(fd)
                raise KeyNotFound(key)
        try:
            st = os.fstat(fd)
        except OSError as e:
            os.close(fd)
            raise StoreError(f"{key}: cannot stat: {e.strerror}") from e
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise KeyNotFound(key)
        return fd, st

    # -- Store API ---------------------------------------------------------------------------

    def _borrow(self, key: str) -> tuple[KeptOpen, os.stat_result]:
        """A kept descriptor of ``key`` and the file's stat now; give it back when done.

        Kept: used while a stat of the key's path finds the same file; else the key is
        resolved and opened afresh (and kept). The caller gives the entry back."""
        entry = self._files.borrow(key)
        if entry is not None:
            try:
                st = os.stat(os.path.join(self.root, key))
                if (st.st_dev, st.st_ino) == entry.ident:
                    return entry, st
            except OSError:
                pass
            self._files.give_back(entry)
            self._files.drop(key, entry)  # replaced or gone: the name means something else now
        fd, st = self._open(key)
        return self._files.keep(key, fd, (st.st_dev, st.st_ino)), st

    def get(self, key: str) -> bytes:
        entry, st = self._borrow(key)
        try:
            return pread_all(entry.fd, 0, max(st.st_size, 0), key, beyond=sys.maxsize)
        finally:
            self._files.give_back(entry)

    def get_at_most(self, key: str, limit: int) -> bytes:
        entry, st = self._borrow(key)
        try:
            if st.st_size > limit:
                raise TooLarge(f"{key}: file holds {st.st_size} bytes, more than the {limit} it may")
            size = max(st.st_size, 0)
            data = pread_all(entry.fd, 0, size, key, beyond=limit + 1 - size)
        finally:
            self._files.give_back(entry)
        if len(data) > limit:  # grew since the stat
            raise TooLarge(f"{key}: file holds more than the {limit} bytes it may")
        return data

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if start < 0 or length < 0:
            raise StoreError(f"{key}: bad range start={start} length={length}")
        entry, _st = self._borrow(key)
        try:
            return pread_all(entry.fd, start, length, key)
        finally:
            self._files.give_back(entry)

    def get_suffix(self, key: str, length: int) -> tuple[bytes, int]:
        if length < 0:
            raise StoreError(f"{key}: bad suffix length {length}")
        entry, st = self._borrow(key)
        try:
            start = max(0, st.st_size - length)
            return pread_all(entry.fd, start, st.st_size - start, key), st.st_size
        finally:
            self._files.give_back(entry)

    def open_reader(self, key: str) -> KeyReader:
        if not self._held.take():
            return self._unheld_reader(key)
        try:
            fd, st = self._open(key)
        except BaseException:
            self._held.give()
            raise
        return _FileReader(key, fd, st, self._held)

    def _unheld_reader(self, key: str) -> KeyReader:
        """A reader of ``key`` that holds no descriptor: the opens of the mount hold their
        budget of them (see HeldDescriptors)."""
        self._unheld.warning(
            "", "%s: %d files are open through the mount, the most that hold a descriptor each "
            "(the rest of the daemon's open-file limit, %s, is kept for its other work; raise it "
            "with ulimit -Hn before zvfs mount, LimitNOFILE= in a systemd unit); further opens "
            "hold none, and one whose file is replaced or removed meanwhile reads ESTALE",
            self.description, self._held.budget, open_file_limit())
        entry, st = self._borrow(key)
        self._files.give_back(entry)
        return _UnheldReader(self, key, st)

    def will_need(self, keys: Sequence[str]) -> None:
        """Have the kernel read these files ahead. Each is opened under the same rules as
        a read (no symlink out of the store), which also leaves its path in the kernel's
        cache, so the reader's own open of it is answered at once (open_reader_at_once)."""
        for key in keys:
            try:
                fd, _st = self._open(key)
            except StoreError:  # gone, or not a file: only a hint
                continue
            read_ahead_and_close(fd)

    def open_reader_at_once(self, key: str) -> KeyReader | None:
        """Opened on the caller's thread when the kernel has the whole path cached and no
        symlink is on it (see :mod:`zvfs.stores.cached_open`); None sends the caller to
        ``open_reader``, in a worker, for everything else."""
        if bad_segment(key) is not None or not self._proc_fd:
            return None
        if not self._held.take():
            return None  # open_reader decides, in a worker
        reader = self._open_at_once(key)
        if reader is None:
            self._held.give()
        return reader

    def _open_at_once(self, key: str) -> KeyReader | None:
        # the path alone first (O_PATH opens nothing): a device node is never opened, and
        # an lstat here could wait on the disk, on the trio thread
        where = open_if_cached(self._root_sep + key, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        if where is None:
            return None
        try:
            st = os.fstat(where)
            if not stat.S_ISREG(st.st_mode):
                return None
            fd = os.open(f"/proc/self/fd/{where}", _OPEN_FLAGS & ~os.O_NOFOLLOW)  # that very file
        except OSError:
            return None
        finally:
            os.close(where)
        return _FileReader(key, fd, st, self._held)

    def info(self, key: str) -> KeyInfo:
        check_key(key)
        st = self._stat_direct(key)
        if st is None:
            real = self._resolve(key)
            if real is None:
                raise KeyNotFound(key)
            try:
                st = self._stat_resolved(key, real)
            except OSError as e:
                if e.errno in _ABSENT:
                    raise KeyNotFound(key) from None
                raise StoreError(f"{key}: cannot stat: {e.strerror}") from e
            if st is None:
                raise KeyNotFound(key)
        if not stat.S_ISREG(st.st_mode):
            raise KeyNotFound(key)
        return KeyInfo(st.st_size, st.st_mtime_ns)

    def _stat_resolved(self, key: str, real: str) -> os.stat_result | None:
        """The stat of ``real``, which ``key`` resolved to, if what is there is still that
        path (opened O_PATH, then checked as :meth:`_open` checks); None when a directory on
        the way became a symlink since (a stat of the path followed it, and showed the size
        of a file outside the store)."""
        fd = os.open(real, os.O_PATH | os.O_CLOEXEC)
        try:
            return os.fstat(fd) if self._opened_as_resolved(fd, real, key) else None
        finally:
            os.close(fd)

    def _stat_direct(self, key: str) -> os.stat_result | None:
        """``key``'s stat where no symlink is on the way (:meth:`_open_direct`, O_PATH); None
        for a symlink anywhere (then resolve it). A third of a realpath's time: a
        rediscovery past the TTL takes one per metadata key, and realpath was most of one
        of a store of 10,000 arrays."""
        fd = self._open_direct(key, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, "stat")
        if fd is None:
            return None
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        return None if stat.S_ISLNK(st.st_mode) else st  # a link at the end: resolved

    def absent(self, keys: Iterable[str]) -> set[str]:
        """One lstat each, no open: a path with nothing at it (or a file where a directory
        of it should be) is a key no get can find, whatever symlinks lie on its way. Many
        keys of one small directory (a sparse array's chunks) are looked up in one listing
        of it instead: a read over 1.25 million never-written chunks spent 43% of its time
        in their lstats."""
        out = set()
        by_parent: dict[str, list[str]] = {}
        for key in keys:
            if is_safe_key(key):
                by_parent.setdefault(key.rpartition("/")[0], []).append(key)
        for parent, group in by_parent.items():
            names = self._small_dir_names(parent) if len(group) >= ABSENT_LISTED_MIN else None
            if names is not None:
                out.update(key for key in group if key.rpartition("/")[2] not in names)
                continue
            for key in group:
                try:
                    os.lstat(os.path.join(self.root, key))
                except (FileNotFoundError, NotADirectoryError):
                    out.add(key)
                except (OSError, ValueError):
                    pass
        return out

    def _small_dir_names(self, parent: str) -> set[str] | None:
        """The names in the directory of key prefix ``parent`` ('' for the root), as the
        lstats of :meth:`absent` would find them: none when nothing is there (or a file is);
        None when it is large (a listing costs more than the lstats) or cannot be read."""
        path = os.path.join(self.root, parent) if parent else self.root
        try:
            st = os.stat(path)
            if not stat.S_ISDIR(st.st_mode):
                return set()
            if find_lister.is_large(st):
                return None
            return set(os.listdir(path))
        except (FileNotFoundError, NotADirectoryError):
            return set()
        except (OSError, ValueError):
            return None

    def list_dir(self, prefix: str) -> Listing:
        check_prefix(prefix)
        real = self._resolve(prefix[:-1], file_link_ok=False)
        if real is None:
            return Listing()
        return self._scan(prefix, real)[0]

    def list_prefix(self, prefix: str) -> Iterator[str]:
        """Every key below ``prefix``, sorted level by level."""
        check_prefix(prefix)
        real = self._resolve(prefix[:-1], file_link_ok=False)
        if real is None:
            return
        yield from self._walk(prefix, real, frozenset())

    def list_tree(self, prefix: str) -> Iterator[tuple[str, KeyInfo]]:
        """Every key below ``prefix`` with its info, in directory order, as the directory is read.

        Streamed (nothing sorted, no level read whole) so that a bounded look at a store,
        the metadata scan at mount for one, costs what it reads and not the size of the
        largest directory: a flat directory of a million chunks is not stat'ed whole.
        """
        check_prefix(prefix)
        real = self._resolve(prefix[:-1], file_link_ok=False)
        if real is None:
            return
        stack = [(prefix, real, frozenset[tuple[int, int]]())]
        while stack:
            pre, path, ancestors = stack.pop()
            try:
                st = os.stat(path)
            except OSError:
                continue
            ident = (st.st_dev, st.st_ino)
            if ident in ancestors:  # a loop (bind mount, hard-linked directory): walked once
                continue
            subdirs = []
            for name, target, st in self._entries(pre, path):
                if stat.S_ISREG(st.st_mode):
                    yield pre + name, KeyInfo(st.st_size, st.st_mtime_ns)
                else:
                    subdirs.append((pre + name + "/", target, ancestors | {ident}))
            stack.extend(reversed(subdirs))

    # -- writing -----------------------------------------------------------------------------

    @contextmanager
    def _in_parent(self, key: str) -> Iterator[tuple[int, str]]:
        """(descriptor of ``key``'s directory, ``key``'s name in it) for a write.

        The directory is a real one below the root with no symlink on the way (ENOENT
        otherwise), and the write goes relative to its descriptor, with the name's own
        symlink never followed: a directory swapped for a symlink by another process after
        the check cannot lead a write (a create, a truncation, an unlink) outside the store."""
        check_key(key)
        size = len(os.fsencode(os.path.join(self.root, key)))
        if size >= PATH_MAX:  # it could be made, but never listed nor opened by its path
            raise WriteRefused(errno.ENAMETOOLONG, f"{key[:80]}...: its path would be {size} bytes, "
                               f"more than the system takes (PATH_MAX, {PATH_MAX - 1})")
        parent, _, name = key.rpartition("/")
        parent_path = os.path.join(self.root, parent) if parent else self.root
        missing = WriteRefused(errno.ENOENT, f"{key}: its directory is missing or is a symlink")
        try:
            # realpath itself fails (ENOENT, EINVAL) when a link on the way is swapped as it reads it
            if os.path.realpath(parent_path) != parent_path:
                raise missing
        except OSError:
            raise missing from None
        try:
            fd = self._os_open(parent_path, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            if e.errno in NO_DESCRIPTORS:
                raise _cannot_open(key, e) from None
            raise missing from None
        try:
            if not self._opened_at(fd, parent_path):
                raise missing
            yield fd, name
        finally:
            os.close(fd)

    def open_writer(self, key: str, *, truncate: bool, create: bool, exclusive: bool = False) -> KeyWriter:
        flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
        flags |= (os.O_CREAT if create else 0) | (os.O_EXCL if exclusive else 0)
        flags |= os.O_TRUNC if truncate else 0
        if not self._held.take():
            raise self._held.refusal(key, "through the mount", "its other work")
        try:
            return self._open_writer(key, flags)
        except BaseException:
            self._held.give()
            raise

    def _open_writer(self, key: str, flags: int) -> KeyWriter:
        with self._in_parent(key) as (parent, name):
            if _special(name, parent):
                raise WriteRefused(errno.EPERM, f"{key}: not a regular file")  # never opened
            try:
                # not the application's mode: the store keeps none (chmod is not kept), and tools
                # that create 0600 and chmod after (rsync, cp -a, tar) left every file 0600
                fd = self._os_open(name, flags, NEW_FILE_MODE, dir_fd=parent)
            except OSError as e:
                if e.errno in NO_DESCRIPTORS:
                    raise _cannot_open(key, e) from None
                raise _refused(key, e) from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise WriteRefused(errno.EPERM, f"{key}: not a regular file")
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return _FileWriter(self, key, fd, self._held)

    def delete(self, key: str) -> None:
        self._files.drop(key)
        self._remove(key, key, os.unlink, stat.S_ISDIR, WriteRefused(errno.EISDIR, f"{key}: is a directory"))

    def _remove(self, key: str, shown: str, remove: Callable[..., None], refused_if: Callable[[int], bool],
                refusal: WriteRefused) -> None:
        """``remove(name, dir_fd=...)`` of ``key`` in its checked directory, unless the entry's
        own mode (not followed) is ``refused_if``: then ``refusal``."""
        with self._in_parent(key) as (parent, name):
            try:
                if refused_if(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
                    raise refusal
                remove(name, dir_fd=parent)
            except OSError as e:
                raise _refused(shown, e) from None

    def rename(self, src: str, dst: str, replace: bool = True) -> None:
        with self._in_parent(src) as (a_dir, a), self._in_parent(dst) as (b_dir, b):
            self._files.drop(src)
            self._files.drop(dst)
            try:
                if replace:
                    os.rename(a, b, src_dir_fd=a_dir, dst_dir_fd=b_dir)
                else:  # made since the mount's listing said not: refused, in the same step
                    rename_noreplace(a, a_dir, b, b_dir)
            except FileExistsError:
                raise WriteRefused(errno.EEXIST, f"{dst}: exists") from None
            except OSError as e:
                raise _refused(src, e) from None

    def rename_dir(self, src: str, dst: str, replace: bool = True) -> None:
        self._files.drop_prefix(src)
        self._files.drop_prefix(dst)
        self.rename(src.rstrip("/"), dst.rstrip("/"), replace)  # rename(2): ENOTEMPTY of its own

    def link(self, src: str, dst: str) -> KeyInfo:
        """``dst`` gets ``src``'s bytes as a file of its own, as on S3. A hard link showed in
        the mount as two files of one link each, and a write through one name left the
        other's size stale for the TTL: tar and rsync copied it cut short, and a rename of
        one name over the other was the no-op rename(2) makes it, hiding a name the store
        kept. The copy is made unnamed (O_TMPFILE) and linked into place: ``dst`` appears
        whole, and only if it is not there (EEXIST), as zarr-python's exclusive create
        (link, then unlink) needs."""
        with self._in_parent(src) as (a_dir, a), self._in_parent(dst) as (b_dir, b):
            self._files.drop(dst)
            source = self._open_link_source(src, a, a_dir)
            try:
                if not stat.S_ISREG(os.fstat(source).st_mode):
                    raise WriteRefused(errno.EPERM, f"{src}: not a regular file")
                return _copy_into_place(source, b_dir, b)
            except OSError as e:
                raise _refused(dst, e) from None
            finally:
                os.close(source)

    def _open_link_source(self, src: str, name: str, parent: int) -> int:
        """``src`` open for reading; a symlink to a file inside the store reads as that file
        in the mount, so its bytes are the source's (the rule of a read: _resolve)."""
        if _special(name, parent):  # a device is never opened (see _special)
            raise WriteRefused(errno.EPERM, f"{src}: not a regular file")
        try:
            return os.open(name, _OPEN_FLAGS, dir_fd=parent)
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise _refused(src, e) from None
        # a symlink: opened as a read opens it (_open), which checks the file opened is the
        # one resolved. This open did not, and a directory on the way swapped for a symlink
        # between the resolution and the open copied a file from outside the store into it
        # (a helper's audit: /etc/shadow, for a daemon run as root)
        try:
            return self._open(src)[0]
        except KeyNotFound:
            raise WriteRefused(errno.ENOENT, f"{src}: no file of the store") from None
        except StoreError as e:
            cause = e.__cause__
            raise _refused(src, cause) if isinstance(cause, OSError) else e from None

    def make_dir(self, prefix: str) -> None:
        with self._in_parent(prefix.rstrip("/")) as (parent, name):
            try:
                os.mkdir(name, 0o755, dir_fd=parent)
            except OSError as e:
                raise _refused(prefix, e) from None

    def remove_dir(self, prefix: str) -> None:
        self._remove(prefix.rstrip("/"), prefix, os.rmdir, stat.S_ISLNK,
                     WriteRefused(errno.ENOTDIR, f"{prefix}: a symlink, not a directory"))

    def sync_dir(self, prefix: str) -> None:
        """The directory itself, found as a write finds its parent (no symlink on the way)."""
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            if not prefix:
                fd = os.open(self.root, flags)
            else:
                with self._in_parent(prefix.rstrip("/")) as (parent, name):
                    fd = os.open(name, flags, dir_fd=parent)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            raise _refused(prefix or "/", e) from None

    def set_mtime_ns(self, key: str, mtime_ns: int) -> None:
        times = (time.time_ns(), mtime_ns)
        try:
            if not key:
                os.utime(self.root, ns=times, follow_symlinks=False)
                return
            with self._in_parent(key.rstrip("/")) as (parent, name):
                os.utime(name, ns=times, dir_fd=parent, follow_symlinks=False)
        except OSError as e:
            raise _refused(key, e) from None

    def reopen(self) -> Reopen:
        return Reopen("directory", self.root)

    def close_idle(self) -> None:
        self._files.close_idle()

    def close(self) -> None:
        self._files.close()

    # -- internals ---------------------------------------------------------------------------

    def _os_open(self, path: str, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        """os.open; out of descriptors, the kept ones no reader uses are closed and the open
        is tried once more (kept, they took every descriptor a low limit allows, and every
        open failed: a cat of a raw file too, for as long as they stayed)."""
        try:
            return os.open(path, flags, mode, dir_fd=dir_fd)
        except OSError as e:
            if e.errno not in NO_DESCRIPTORS or not self._files.shed():
                raise
        return os.open(path, flags, mode, dir_fd=dir_fd)

    def _walk(self, prefix: str, real: str, ancestors: frozenset[tuple[int, int]]) -> Iterator[str]:
        try:
            st = os.stat(real)
        except OSError:
            return
        ident = (st.st_dev, st.st_ino)
        if ident in ancestors:
            return
        listing, dirs = self._scan(prefix, real)
        inner = ancestors | {ident}
        names = listing.names()
        for name in names:
            if name in listing.keys:
                yield prefix + name
            if name in dirs:
                yield from self._walk(prefix + name + "/", dirs[name], inner)

    def _scan(self, prefix: str, real: str) -> tuple[Listing, dict[str, str]]:
        """One directory level: the listing and the real path of every subdirectory.

        A large directory is listed by find, in a process of its own (zvfs.stores.find_lister)."""
        listing = Listing()
        dirs: dict[str, str] = {}
        fd = self._open_dir(prefix, real)  # one checked descriptor, for find or for scandir
        if fd is None:
            return listing, dirs
        try:
            entries = self._found(prefix, real, fd)
            if entries is None:
                entries = ((name, target, stat.S_ISREG(st.st_mode), st.st_size, st.st_mtime_ns)
                           for name, target, st in self._read_dir(prefix, real, fd))
            for name, target, is_file, size, mtime_ns in entries:
                if is_file:
                    listing.keys[name] = KeyInfo(size, mtime_ns)
                else:
                    listing.prefixes.add(name)
                    dirs[name] = target
        finally:
            os.close(fd)
        return listing, dirs

    def _found(self, prefix: str, real: str, fd: int) -> list[tuple[str, str, bool, int, int]] | None:
        """(name, real path, is a file, size, mtime in ns) of each file and directory of the large
        directory ``real`` (open at ``fd``), as find lists them (symlinks to files in the
        store followed, as in :meth:`_entries`); None for a small one, or when find could not
        list it: then it is listed in process."""
        if not find_lister.is_large(os.fstat(fd)):
            return None
        # find lists the very directory checked, through the daemon's descriptor
        found = find_lister.list_dir(f"/proc/{os.getpid()}/fd/{fd}" if self._proc_fd else real)
        if found is None:
            return None
        out = []
        fits = self._within_path_max(prefix)
        for name, kind, size, mtime_ns in found:
            if not safe_name(name) or (fits is not None and not fits(name)):
                continue
            if kind == "l":
                try:
                    followed = self._follow(prefix + name)
                except OSError:
                    continue  # vanished: absent
                if followed is None or not stat.S_ISREG(followed[1].st_mode):
                    continue
                size, mtime_ns, kind = followed[1].st_size, followed[1].st_mtime_ns, "f"
            if kind in ("f", "d"):
                out.append((name, os.path.join(real, name), kind == "f", size, mtime_ns))
        return out

    def _follow(self, key: str) -> tuple[str, os.stat_result] | None:
        """A symlink at ``key``: its target inside the store and the target's stat, or None
        when it leads outside, dangles, or is a directory (logged once: never followed)."""
        target = self._resolve(key)
        if target is None:
            return None
        try:
            st = self._stat_resolved(key, target)
        except OSError:
            return None
        if st is None:
            return None
        if stat.S_ISDIR(st.st_mode):
            self._escapes.warning(
                key, "%s: %r is a symlink to a directory; not followed (it could loop)", self.description, key)
            return None
        return target, st

    def _entries(self, prefix: str, real: str) -> Iterator[tuple[str, str, os.stat_result]]:
        """The regular files and directories of one level, as read: (name, real path, stat).

        A symlink to a file inside the root is followed; one to a directory is left out
        (and logged once), as is anything that is neither a file nor a directory.
        """
        fd = self._open_dir(prefix, real)
        if fd is None:
            return
        try:
            yield from self._read_dir(prefix, real, fd)
        finally:
            os.close(fd)

    def _within_path_max(self, prefix: str) -> Callable[[str], bool] | None:
        """None when every name of the directory ``prefix`` makes a path the kernel takes,
        else a check of each name (False, and one line, for a name whose path is too long).

        The store opens a key by its path below the root: a key whose path passes PATH_MAX
        cannot be opened, so it is left out of its listing, said once, rather than listed
        and then absent (ENOENT) at its stat and open, its directories shown empty."""
        base = len(os.fsencode(os.path.join(self.root, prefix)))
        if base + _NAME_MAX < PATH_MAX:
            return None

        def fits(name: str) -> bool:
            size = base + len(os.fsencode(name))
            if size < PATH_MAX:
                return True
            self._escapes.warning(
                prefix + name, "%s: %r is left out: its path would be %d bytes, more than the system "
                "takes (PATH_MAX, %d)", self.description, prefix + name, size, PATH_MAX - 1)
            return False

        return fits

    def _read_dir(self, prefix: str, real: str, fd: int) -> Iterator[tuple[str, str, os.stat_result]]:
        """:meth:`_entries` of the directory ``real``, open at ``fd`` (the caller closes it)."""
        fits = self._within_path_max(prefix)
        with os.scandir(fd) as it:
            for entry in it:
                name = entry.name
                if not safe_name(name) or (fits is not None and not fits(name)):
                    continue
                try:
                    if entry.is_symlink():
                        followed = self._follow(prefix + name)
                        if followed is None:
                            continue
                        target, st = followed
                    else:
                        target = os.path.join(real, name)
                        st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue  # vanished or dangling: absent
                if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
                    yield name, target, st

    def _open_dir(self, prefix: str, real: str) -> int | None:
        """The directory ``real`` (resolved: no symlink on its path) opened for listing, or
        None when it is absent or is no longer what was resolved: a process that swaps a
        directory on the way for a symlink must not have the store list what lies outside."""
        for _ in range(_REOPENS):
            try:
                fd = self._os_open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError as e:
                if e.errno in _ABSENT:
                    return None
                if e.errno in NO_DESCRIPTORS:
                    raise _cannot_open(prefix or "/", e, "list") from e
                raise StoreError(f"{prefix or '/'}: cannot list: {e.strerror}") from e
            if self._opened_at(fd, real):
                return fd
            removed = self._proc_fd and _fd_path(fd) == real + " (deleted)"
            os.close(fd)
            if not removed:
                self._escapes.warning(prefix, "%s: %r changed while it was listed (a symlink swapped "
                                      "in); listed as empty", self.description, prefix)
                return None
            # removed as it was opened (rm -r, and perhaps made again since, as zarr's mode
            # "w" does): the name is opened anew. It was listed as empty, and cached so, while
            # the new directory filled up (rmtree then failed ENOTEMPTY on what it did not see)
        return None


#: opens of a directory to list that was removed just as it was opened, at most
_REOPENS = 3


def _cannot_open(key: str, e: OSError, what: str = "open") -> StoreError:
    """The error of an open that failed; out of descriptors, it says which limit to raise."""
    return StoreError(f"{key}: cannot {what}: {e.strerror}{no_descriptors_hint(e)}")


def _fd_path(fd: int) -> str | None:
    """Where /proc says ``fd`` is open ('PATH (deleted)' once removed), or None."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


def _refused(key: str, e: OSError) -> StoreError:
    """An OSError of a write as the store error that keeps its errno."""
    if e.errno == errno.ELOOP:  # O_NOFOLLOW met a symlink: we do not write through links
        return WriteRefused(errno.EPERM, f"{key}: is a symlink; zvfs does not write through links")
    if e.errno is None:
        return StoreError(f"{key}: {e}")
    return WriteRefused(e.errno, f"{key}: {e.strerror}")


class _FileReader(KeyReader):
    """A file of the directory open for reading: one descriptor for the whole open, so a
    rename over the key does not change what this reader reads (as on the directory)."""

    def __init__(self, key: str, fd: int, st: os.stat_result, held: HeldDescriptors) -> None:
        self.key = key
        self.size = st.st_size
        self.mtime_ns = st.st_mtime_ns
        self.version = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        self._fd = fd
        self._held = held  # given back at close

    def read(self, offset: int, length: int) -> bytes:
        return pread_all(self._fd, offset, length, self.key)

    def read_at_once(self, offset: int, length: int) -> memoryview | None:
        """The bytes when the page cache holds them all (a file read before, through this
        mount or not), else None."""
        return pread_at_once(self._fd, offset, length, self.size)

    def sync(self) -> None:
        try:
            os.fsync(self._fd)
        except OSError as e:
            raise _refused(self.key, e) from None

    def current_size_and_mtime_ns(self) -> tuple[int, int] | None:
        if self._fd < 0:
            return None
        try:
            st = os.fstat(self._fd)
        except OSError:
            return None
        return st.st_size, st.st_mtime_ns

    def unnamed(self) -> bool:
        try:
            return self._fd >= 0 and os.fstat(self._fd).st_nlink == 0
        except OSError:
            return False

    def again(self) -> _FileReader | None:
        if self._fd < 0 or not self._held.take():
            return None
        try:
            fd = os.dup(self._fd)
        except OSError:  # out of descriptors
            self._held.give()
            return None
        try:
            st = os.fstat(fd)
        except OSError:
            os.close(fd)
            self._held.give()
            return None
        return _FileReader(self.key, fd, st, self._held)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            self._held.give()


class _UnheldReader(KeyReader):
    """An open past the budget of held descriptors (see HeldDescriptors): each read borrows a kept
    descriptor of the key, and reads only the file the open found; once that file is
    replaced or removed, ESTALE (a held descriptor would read on the old file)."""

    def __init__(self, store: DirectoryStore, key: str, st: os.stat_result) -> None:
        self.key = key
        self.size = st.st_size
        self.mtime_ns = st.st_mtime_ns
        self.version = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        self._ident = (st.st_dev, st.st_ino)
        self._store = store

    @contextmanager
    def _fd(self) -> Iterator[int]:
        try:
            entry, _st = self._store._borrow(self.key)
        except KeyNotFound:
            raise Stale(f"{self.key}: removed since it was opened") from None
        try:
            if entry.ident != self._ident:
                raise Stale(f"{self.key}: replaced since it was opened")
            yield entry.fd
        finally:
            self._store._files.give_back(entry)

    def read(self, offset: int, length: int) -> bytes:
        with self._fd() as fd:
            return pread_all(fd, offset, length, self.key)

    def sync(self) -> None:
        with self._fd() as fd:
            try:
                os.fsync(fd)
            except OSError as e:
                raise _refused(self.key, e) from None

    def again(self) -> _UnheldReader:
        return copy.copy(self)

    def close(self) -> None:
        pass


def _copy_into_place(source: int, parent: int, name: str) -> KeyInfo:
    """A copy of ``source`` made unnamed (O_TMPFILE; a hidden temporary name on a file system
    without it), then linked as ``name`` in ``parent``: it appears whole, and only if the
    name is free (EEXIST). Returns the copy's size and mtime."""
    temp = None
    try:
        copy = os.open(".", os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, NEW_FILE_MODE, dir_fd=parent)
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            raise
        temp = f".zvfs-link-{os.getpid()}-{time.monotonic_ns()}"
        copy = os.open(temp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW,
                       NEW_FILE_MODE, dir_fd=parent)
    try:
        _copy_bytes(source, copy)
        made = os.fstat(copy)
        if temp is None:
            os.link(f"/proc/self/fd/{copy}", name, dst_dir_fd=parent, follow_symlinks=True)
        else:
            os.link(temp, name, src_dir_fd=parent, dst_dir_fd=parent, follow_symlinks=False)
    finally:
        os.close(copy)
        if temp is not None:
            os.unlink(temp, dir_fd=parent)
    return KeyInfo(made.st_size, made.st_mtime_ns)


def _copy_bytes(source: int, target: int) -> None:
    """All of ``source`` into ``target``, holes kept holes (a 2 GiB sparse file was written
    out whole), the data in the kernel (shared extents where the file system has them)."""
    size = os.fstat(source).st_size
    for start, end in _data_extents(source, size):
        _copy_range(source, target, start, end)
    os.ftruncate(target, size)


def _data_extents(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """[start, end) of each stretch of ``fd`` that holds data (all of it where the file
    system cannot tell holes)."""
    offset = 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
            end = os.lseek(fd, start, os.SEEK_HOLE)
        except OSError as e:
            if e.errno == errno.ENXIO:  # nothing but a hole to the end
                return
            yield offset, size  # SEEK_DATA not supported here: all of it
            return
        yield start, min(end, size)
        offset = end


def _copy_range(source: int, target: int, offset: int, end: int) -> None:
    try:
        while offset < end and (n := os.copy_file_range(source, target, end - offset, offset, offset)):
            offset += n
        return
    except OSError as e:  # not between these file systems, or not on this kernel
        if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
            raise
    while offset < end and (data := os.pread(source, min(1 << 20, end - offset), offset)):
        offset += pwrite_all(target, data, offset)


class _FileWriter(KeyWriter):
    """A file of the directory open for writing: every call is the plain POSIX call."""

    def __init__(self, store: DirectoryStore, key: str, fd: int, held: HeldDescriptors) -> None:
        self.key = key
        self._fd = fd
        self._store = store
        self._held = held  # given back at close

    @property
    def size(self) -> int:
        return os.fstat(self._fd).st_size

    @property
    def mtime_ns(self) -> int | None:
        return os.fstat(self._fd).st_mtime_ns

    def write(self, offset: int, data: bytes) -> int:
        try:
            # all of it or none: the kernel takes a short count for done when it writes back
            # mmap'd pages, and pages a filling disk could not hold were lost with no error
            # anywhere; an ENOSPC there is kept by the kernel and told by msync and fsync
            reserve(self._fd, offset, len(data))
            return pwrite_all(self._fd, data, offset, short=True)
        except OSError as e:
            raise _refused(self.key, e) from None

    def append(self, data: bytes) -> int:
        try:  # short, as write(2) is: an append is never a write-back of pages
            return pwrite_all(self._fd, data, 0, append=True, short=True)
        except OSError as e:
            if e.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # no RWF_APPEND (Linux < 4.16)
                return self.write(self.size, data)
            raise _refused(self.key, e) from None

    def read(self, offset: int, length: int) -> bytes:
        return pread_all(self._fd, offset, length, self.key)

    def read_at_once(self, offset: int, length: int) -> memoryview | None:
        """The bytes when the page cache holds them all: a program that reads back what it
        wrote through an open for writing (SQLite's pages) pays no thread hop for them."""
        if self._fd < 0:
            return None
        # the size its writes give it is not asked (an fstat could wait, on a network file
        # system): a read that reaches the end goes to the worker
        return pread_at_once(self._fd, offset, length, offset + length)

    def truncate(self, size: int) -> None:
        try:
            os.ftruncate(self._fd, size)
        except OSError as e:
            raise _refused(self.key, e) from None

    def commit(self, durable: bool = False) -> KeyInfo | None:
        try:
            if durable:
                os.fsync(self._fd)
            st = os.fstat(self._fd)
        except OSError as e:
            raise _refused(self.key, e) from None
        if st.st_nlink == 0:  # its name was removed behind the mount: what does the key hold now?
            try:
                return self._store.info(self.key)
            except StoreError:  # absent (or unreadable: listed again when next asked)
                return GONE
        return KeyInfo(st.st_size, st.st_mtime_ns)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            self._held.give()
