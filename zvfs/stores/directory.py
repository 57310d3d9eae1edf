"""A store backed by a local directory: key ``a/b/c`` is the file ``root/a/b/c``.

Nothing escapes the base directory: every key is checked with
:func:`zvfs.stores.keys.bad_segment` before it becomes a path, and the resolved
path must stay below the (resolved) root. A symlink to a *file* inside the root
is followed; one pointing outside is treated as absent and logged once.

Symlinks to *directories* are never followed, even inside the root (as find,
cp -r and rsync do by default): a link such as ``sub/up -> ..`` would otherwise
make the tree endless, and discovery with it. Such a link is absent from the
listings and logged once.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from collections.abc import Iterator

from zvfs.stores._util import LogOnce, check_key, check_prefix, pread_all, pwrite_all, safe_name
from zvfs.stores.base import (
    KeyInfo,
    KeyNotFound,
    KeyReader,
    KeyWriter,
    Listing,
    SourceError,
    Store,
    StoreError,
    WriteRefused,
)

log = logging.getLogger(__name__)

# O_NONBLOCK so that opening a FIFO planted in the tree cannot hang a worker thread;
# O_NOFOLLOW so that a last component swapped for a symlink after we resolved it is refused.
_OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW

# errors that mean "this key is not a regular file here"
_ABSENT = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EISDIR, errno.ENAMETOOLONG)


class DirectoryStore(Store):
    """Store over a directory tree (the Zarr file-system store layout).

    Writes pass straight through to the directory (POSIX semantics, atomic rename),
    under the same escape rules as reads: a key is written only where its parent
    directory is a real directory below the root, reached through no symlink.
    """

    can_write = True
    opens_readers = True

    def __init__(self, root: str | os.PathLike[str]) -> None:
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
        real = os.path.realpath(path)
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
        real = self._resolve(key)
        if real is None:
            raise KeyNotFound(key)
        try:
            fd = os.open(real, _OPEN_FLAGS)
        except OSError as e:
            if e.errno in _ABSENT:
                raise KeyNotFound(key) from None
            raise StoreError(f"{key}: cannot open: {e.strerror}") from e
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

    def get(self, key: str) -> bytes:
        fd, st = self._open(key)
        try:
            return pread_all(fd, 0, max(st.st_size, 0), key, until_eof=True)
        finally:
            os.close(fd)

    def get_at_most(self, key: str, limit: int) -> bytes:
        fd, st = self._open(key)
        try:
            if st.st_size > limit:
                raise StoreError(f"{key}: file holds {st.st_size} bytes, more than the {limit} it may")
            data = pread_all(fd, 0, limit + 1, key)
        finally:
            os.close(fd)
        if len(data) > limit:  # grew since fstat
            raise StoreError(f"{key}: file holds more than the {limit} bytes it may")
        return data

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if start < 0 or length < 0:
            raise StoreError(f"{key}: bad range start={start} length={length}")
        fd, _st = self._open(key)
        try:
            return pread_all(fd, start, length, key)
        finally:
            os.close(fd)

    def get_suffix(self, key: str, length: int) -> tuple[bytes, int]:
        if length < 0:
            raise StoreError(f"{key}: bad suffix length {length}")
        fd, st = self._open(key)
        try:
            start = max(0, st.st_size - length)
            return pread_all(fd, start, st.st_size - start, key), st.st_size
        finally:
            os.close(fd)

    def open_reader(self, key: str) -> KeyReader:
        fd, st = self._open(key)
        return _FileReader(key, fd, st)

    def info(self, key: str) -> KeyInfo:
        check_key(key)
        real = self._resolve(key)
        if real is None:
            raise KeyNotFound(key)
        try:
            st = os.stat(real)
        except OSError as e:
            if e.errno in _ABSENT:
                raise KeyNotFound(key) from None
            raise StoreError(f"{key}: cannot stat: {e.strerror}") from e
        if not stat.S_ISREG(st.st_mode):
            raise KeyNotFound(key)
        return KeyInfo(st.st_size, st.st_mtime)

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
                    yield pre + name, KeyInfo(st.st_size, st.st_mtime)
                else:
                    subdirs.append((pre + name + "/", target, ancestors | {ident}))
            stack.extend(reversed(subdirs))

    # -- writing -----------------------------------------------------------------------------

    def _writable_path(self, key: str) -> str:
        """Path of ``key`` for a write: its parent is a real directory below the root with
        no symlink on the way (ENOENT otherwise), so nothing is created outside the store."""
        check_key(key)
        parent, _, name = key.rpartition("/")
        parent_path = os.path.join(self.root, parent) if parent else self.root
        if os.path.realpath(parent_path) != parent_path:
            raise WriteRefused(errno.ENOENT, f"{key}: its directory is missing or is a symlink")
        return os.path.join(parent_path, name)

    def open_writer(self, key: str, *, truncate: bool, create: bool, exclusive: bool = False,
                    mode: int = 0o644) -> KeyWriter:
        path = self._writable_path(key)
        flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
        flags |= (os.O_CREAT if create else 0) | (os.O_EXCL if exclusive else 0)
        flags |= os.O_TRUNC if truncate else 0
        try:
            fd = os.open(path, flags, mode & 0o777 or 0o644)
        except OSError as e:
            raise _refused(key, e) from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise WriteRefused(errno.EPERM, f"{key}: not a regular file")
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return _FileWriter(key, fd)

    def delete(self, key: str) -> None:
        path = self._writable_path(key)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                raise WriteRefused(errno.EISDIR, f"{key}: is a directory")
            os.unlink(path)
        except OSError as e:
            raise _refused(key, e) from None

    def rename(self, src: str, dst: str) -> None:
        a, b = self._writable_path(src), self._writable_path(dst)
        try:
            os.rename(a, b)
        except OSError as e:
            raise _refused(src, e) from None

    def rename_dir(self, src: str, dst: str) -> None:
        self.rename(src.rstrip("/"), dst.rstrip("/"))

    def link(self, src: str, dst: str) -> None:
        a, b = self._writable_path(src), self._writable_path(dst)
        try:
            os.link(a, b, follow_symlinks=False)
        except OSError as e:
            raise _refused(dst, e) from None

    def make_dir(self, prefix: str) -> None:
        path = self._writable_path(prefix.rstrip("/"))
        try:
            os.mkdir(path, 0o755)
        except OSError as e:
            raise _refused(prefix, e) from None

    def remove_dir(self, prefix: str) -> None:
        path = self._writable_path(prefix.rstrip("/"))
        if os.path.islink(path):
            raise WriteRefused(errno.ENOTDIR, f"{prefix}: a symlink, not a directory")
        try:
            os.rmdir(path)
        except OSError as e:
            raise _refused(prefix, e) from None

    def set_mtime(self, key: str, mtime: float) -> None:
        path = self._writable_path(key.rstrip("/")) if key else self.root
        try:
            os.utime(path, ns=(time.time_ns(), int(mtime * 1e9)), follow_symlinks=False)
        except OSError as e:
            raise _refused(key, e) from None

    # -- internals ---------------------------------------------------------------------------

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
        names = sorted(set(listing.keys) | listing.prefixes)
        for name in names:
            if name in listing.keys:
                yield prefix + name
            if name in dirs:
                yield from self._walk(prefix + name + "/", dirs[name], inner)

    def _scan(self, prefix: str, real: str) -> tuple[Listing, dict[str, str]]:
        """One directory level: the listing and the real path of every subdirectory."""
        listing = Listing()
        dirs: dict[str, str] = {}
        for name, target, st in self._entries(prefix, real):
            if stat.S_ISREG(st.st_mode):
                listing.keys[name] = KeyInfo(st.st_size, st.st_mtime)
            else:
                listing.prefixes.add(name)
                dirs[name] = target
        return listing, dirs

    def _entries(self, prefix: str, real: str) -> Iterator[tuple[str, str, os.stat_result]]:
        """The regular files and directories of one level, as read: (name, real path, stat).

        A symlink to a file inside the root is followed; one to a directory is left out
        (and logged once), as is anything that is neither a file nor a directory.
        """
        try:
            it = os.scandir(real)
        except OSError as e:
            if e.errno in _ABSENT:
                return
            raise StoreError(f"{prefix or '/'}: cannot list: {e.strerror}") from e
        with it:
            for entry in it:
                name = entry.name
                if not safe_name(name):
                    continue
                try:
                    if entry.is_symlink():
                        target = self._resolve(prefix + name)
                        if target is None:
                            continue
                        st = os.stat(target)
                        if stat.S_ISDIR(st.st_mode):
                            self._escapes.warning(
                                prefix + name,
                                "%s: %r is a symlink to a directory; not followed (it could loop)",
                                self.description, prefix + name,
                            )
                            continue
                    else:
                        target = entry.path
                        st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue  # vanished or dangling: absent
                if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
                    yield name, target, st


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

    def __init__(self, key: str, fd: int, st: os.stat_result) -> None:
        self.key = key
        self.size = st.st_size
        self.version = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        self._fd = fd

    def read(self, offset: int, length: int) -> bytes:
        return pread_all(self._fd, offset, length, self.key)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class _FileWriter(KeyWriter):
    """A file of the directory open for writing: every call is the plain POSIX call."""

    def __init__(self, key: str, fd: int) -> None:
        self.key = key
        self._fd = fd

    @property
    def size(self) -> int:
        return os.fstat(self._fd).st_size

    def write(self, offset: int, data: bytes) -> int:
        try:
            return pwrite_all(self._fd, data, offset)
        except OSError as e:
            raise _refused(self.key, e) from None

    def read(self, offset: int, length: int) -> bytes:
        return pread_all(self._fd, offset, length, self.key)

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
        return KeyInfo(st.st_size, st.st_mtime)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
