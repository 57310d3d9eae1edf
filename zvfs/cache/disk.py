"""An optional disk tier under the memory cache, for objects fetched from a slow store.

It wraps a store (so it sits between the views and the network) and keeps
what ``get`` and ``get_range`` returned as files under ``--cache-dir``,
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
import threading
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

from zvfs.stats import Counters
from zvfs.stores.base import KeyInfo, Listing, Store

log = logging.getLogger("zvfs")


class DiskCachedStore(Store):
    def __init__(
        self,
        inner: Store,
        directory: str | os.PathLike[str],
        max_bytes: int,
        min_free_bytes: int,
        persistent: bool,
        counters: Counters,
    ) -> None:
        self.inner = inner
        self.description = inner.description
        self.block_size = inner.block_size
        self.flat_listing = inner.flat_listing
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
    def _name(key: str, start: int = -1, length: int = -1) -> str:
        return hashlib.sha256(f"{key}\0{start}\0{length}".encode()).hexdigest()

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

    def _write(self, name: str, data: bytes) -> None:
        with self._lock:
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

    def _cached(self, name: str, fetch) -> bytes:  # type: ignore[no-untyped-def]
        data = self._read(name)
        if data is None:
            self.counters.add("disk_cache_misses")
            data = fetch()
            self._write(name, data)
        return data

    def get(self, key: str) -> bytes:
        return self._cached(self._name(key), lambda: self.inner.get(key))

    def get_range(self, key: str, start: int, length: int) -> bytes:
        return self._cached(self._name(key, start, length), lambda: self.inner.get_range(key, start, length))

    def info(self, key: str) -> KeyInfo:
        return self.inner.info(key)

    def list_dir(self, prefix: str) -> Listing:
        return self.inner.list_dir(prefix)

    def list_prefix(self, prefix: str) -> Iterator[str]:
        return self.inner.list_prefix(prefix)

    def list_tree(self, prefix: str) -> Iterator[tuple[str, KeyInfo]]:
        return self.inner.list_tree(prefix)

    def close(self) -> None:
        self.inner.close()

    @property
    def used_bytes(self) -> int:
        return self._bytes
