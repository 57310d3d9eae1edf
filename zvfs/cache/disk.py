"""An optional disk tier under the memory cache, for objects fetched from a slow store.

It wraps a store (so it sits between the views and the network) and keeps
what ``get``, ``get_range`` and ``get_suffix`` returned as files under ``--cache-dir``,
bounded by ``--cache-max-size`` and by a floor of free space on that disk.
Entries are named by a hash of (key, range). They are only trusted for the
life of one mount, unless the mount declares the data immutable
(``metadata_ttl=indefinite``): then they are kept and reused by later mounts
of the same source, as rclone's VFS cache is.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from zvfs.stats import Counters
from zvfs.stores.base import KeyInfo, KeyWriter, Store, WrappedStore

log = logging.getLogger("zvfs")

#: the key's size after a cached tail (get_suffix)
_SIZE = struct.Struct("<Q")


class DiskCachedStore(WrappedStore):
    def __init__(
        self,
        inner: Store,
        directory: str | os.PathLike[str],
        max_bytes: int,
        min_free_bytes: int,
        persistent: bool,
        counters: Counters,
    ) -> None:
        super().__init__(inner)
        self.max_bytes = max_bytes
        self.min_free = min_free_bytes
        self.counters = counters
        tag = hashlib.sha256(inner.description.encode()).hexdigest()[:16]
        self.dir = Path(directory) / tag
        if not persistent and self.dir.exists():
            shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, int] = OrderedDict()
        #: key -> the names cached for it this mount, so a write through the mount drops them
        self._names_of: dict[str, set[str]] = {}
        #: key -> how many times it was written through the mount: bytes fetched before a
        #: write, and returned after it, are the old content and must not be kept
        self._writes: dict[str, int] = {}
        self._bytes = 0
        self._load_index()

    def _load_index(self) -> None:
        """Pick up what an earlier mount left, least recently used first."""
        found = []
        for entry in os.scandir(self.dir):
            if entry.name.endswith(".tmp"):
                os.unlink(entry.path)
            elif entry.is_file():
                st = entry.stat()
                found.append((st.st_atime, entry.name, st.st_size))
        for _, name, size in sorted(found):
            self._entries[name] = size
            self._bytes += size
        self._shrink(0)

    @staticmethod
    def _name(key: str, start: int = -1, length: int = -1, version: str | None = None) -> str:
        """An entry's file name. Bytes read from one version of the key are named for it:
        an open file pinned to the old content reads on after a write through the mount,
        and what it reads must not be served to those that open the new one."""
        text = f"{key}\0{start}\0{length}" + ("" if version is None else f"\0{version}")
        return hashlib.sha256(text.encode()).hexdigest()

    def _read(self, name: str) -> bytes | None:
        with self._lock:
            if name not in self._entries:
                return None
            self._entries.move_to_end(name)
        try:
            with open(self.dir / name, "rb") as f:
                data = f.read()
        except OSError:
            with self._lock:
                self._bytes -= self._entries.pop(name, 0)
            return None
        self.counters.add("disk_cache_hits")
        return data

    def _shrink(self, incoming: int) -> bool:
        """Evict until ``incoming`` more bytes fit both bounds; False if they never can."""
        if incoming > self.max_bytes:
            return False
        while self._entries:
            free = shutil.disk_usage(self.dir).free
            if self._bytes + incoming <= self.max_bytes and free - incoming >= self.min_free:
                return True
            name, size = self._entries.popitem(last=False)
            self._bytes -= size
            self.counters.add("disk_cache_evictions")
            try:
                os.unlink(self.dir / name)
            except OSError:
                pass
        return shutil.disk_usage(self.dir).free - incoming >= self.min_free

    def _write(self, key: str, name: str, data: bytes, writes: int) -> None:
        """Keep ``data`` as ``name``, unless ``key`` was written through the mount since
        its fetch began (``writes`` is the count then)."""
        with self._lock:
            if self._writes.get(key, 0) != writes:
                return
            self._names_of.setdefault(key, set()).add(name)
            if name in self._entries or not self._shrink(len(data)):
                return
            self._entries[name] = len(data)
            self._bytes += len(data)
        tmp = self.dir / f"{name}.{threading.get_ident()}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, self.dir / name)
            with self._lock:
                if name not in self._entries:
                    # evicted by a concurrent _shrink while it was written: an untracked
                    # file would hold space the bound does not see
                    (self.dir / name).unlink(missing_ok=True)
        except OSError as exc:  # a full or failing cache disk must not fail the read
            log.warning("disk cache: cannot write %s: %s", self.dir, exc)
            with self._lock:
                self._bytes -= self._entries.pop(name, 0)
            tmp.unlink(missing_ok=True)

    def _cached(self, key: str, name: str, fetch, keep=None) -> bytes:  # type: ignore[no-untyped-def]
        """``fetch()`` unless ``name`` is on disk; what it fetched is kept there unless
        ``keep(data)`` says it is not what ``name`` names."""
        data = self._read(name)
        if data is None:
            self.counters.add("disk_cache_misses")
            with self._lock:
                writes = self._writes.get(key, 0)
            data = fetch()
            if keep is None or keep(data):
                self._write(key, name, data, writes)
        return data

    def get(self, key: str) -> bytes:
        return self._cached(key, self._name(key), lambda: self.inner.get(key))

    def get_range(self, key: str, start: int, length: int) -> bytes:
        return self._cached(key, self._name(key, start, length),
                            lambda: self.inner.get_range(key, start, length))

    def get_suffix(self, key: str, length: int) -> tuple[bytes, int]:
        """Kept as the tail followed by the key's size (8 bytes), so a hit needs no request."""

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

    def _forget(self, key: str) -> None:
        """Drop what is cached of ``key``: it is being written through the mount. (A
        persistent cache is only for stores that never change, so nothing of an earlier
        mount can be stale; only this mount's names are tracked.)"""
        with self._lock:
            self._writes[key] = self._writes.get(key, 0) + 1
            names = self._names_of.pop(key, set()) | {self._name(key)}
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

    def delete(self, key: str) -> None:
        self._forget(key)
        self.inner.delete(key)

    def rename(self, src: str, dst: str) -> None:
        self._forget(src)
        self._forget(dst)
        self.inner.rename(src, dst)

    def link(self, src: str, dst: str) -> None:
        self._forget(dst)
        self.inner.link(src, dst)

    def rename_dir(self, src: str, dst: str) -> None:
        self._forget_prefix(src)
        self._forget_prefix(dst)
        self.inner.rename_dir(src, dst)

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

    def write(self, offset: int, data: bytes) -> int:
        return self._inner.write(offset, data)

    def read(self, offset: int, length: int) -> bytes:
        return self._inner.read(offset, length)

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
