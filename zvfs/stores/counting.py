"""A store wrapper that counts requests, bytes and latency into :mod:`zvfs.stats`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

from zvfs.stats import Counters
from zvfs.stores.base import KeyInfo, KeyWriter, Listing, Store, WrappedStore


def count_request(counters: Counters, op: str) -> None:
    """One store request of ``op`` in ``counters``."""
    counters.add("store_list_requests" if op == "list" else "store_requests")
    counters.add(f"store_requests_{op}")


@contextmanager
def timed(counters: Counters, op: str) -> Iterator[None]:
    """Count one ``op`` request and time it (failures too: a slow error is latency)."""
    count_request(counters, op)
    t0 = time.perf_counter()
    try:
        yield
    finally:
        counters.observe(f"store_seconds_{op}", time.perf_counter() - t0)


def count_read(counters: Counters, op: str, data: bytes | memoryview) -> bytes | memoryview:
    """The bytes a read of ``op`` answered, counted; returned as they are."""
    counters.add("store_bytes", len(data))
    counters.add(f"store_bytes_{op}", len(data))
    return data


def count_written(counters: Counters, nbytes: int) -> None:
    """The bytes a PUT (or an upload's part) stored, counted once it has succeeded."""
    counters.add("store_bytes_put", nbytes)


class CountingStore(WrappedStore):
    """Delegates to ``inner`` and counts every call, so stats.json shows store traffic."""

    def __init__(self, inner: Store, counters: Counters) -> None:
        super().__init__(inner)
        self.counters = counters

    def _request(self, op: str) -> None:
        count_request(self.counters, op)

    def _timed(self, op: str) -> AbstractContextManager[None]:
        return timed(self.counters, op)

    def _got(self, op: str, data: bytes | memoryview) -> bytes | memoryview:
        return count_read(self.counters, op, data)

    def get(self, key: str) -> bytes:
        with self._timed("get"):
            return self._got("get", self.inner.get(key))

    def get_at_most(self, key: str, limit: int) -> bytes:
        with self._timed("get"):
            return self._got("get", self.inner.get_at_most(key, limit))

    def get_range(self, key: str, start: int, length: int) -> bytes:
        with self._timed("get_range"):
            return self._got("get_range", self.inner.get_range(key, start, length))

    def get_suffix(self, key: str, length: int) -> tuple[bytes, int]:
        with self._timed("get_range"):  # one ranged GET, where the store can
            data, size = self.inner.get_suffix(key, length)
            return self._got("get_range", data), size

    def get_version(self, key: str, start: int, length: int | None, version: str | None,
                    limit: int | None = None) -> bytes:
        op = "get" if length is None else "get_range"
        with self._timed(op):
            return self._got(op, self.inner.get_version(key, start, length, version, limit))

    def get_range_at_once(self, key: str, start: int, length: int) -> bytes | memoryview | None:
        t0 = time.perf_counter()
        data = self.inner.get_range_at_once(key, start, length)
        if data is not None:  # a request served; a refusal is none (the worker's read counts)
            self._request("get_range")
            self.counters.observe("store_seconds_get_range", time.perf_counter() - t0)
            self._got("get_range", data)
        return data

    def info(self, key: str) -> KeyInfo:
        with self._timed("info"):
            return self.inner.info(key)

    def list_dir(self, prefix: str) -> Listing:
        with self._timed("list"):
            return self.inner.list_dir(prefix)

    def list_prefix(self, prefix: str) -> Iterator[str]:
        # a generator: its requests happen as it is consumed, so only the call is timed
        with self._timed("list"):
            return self.inner.list_prefix(prefix)

    def list_tree(self, prefix: str) -> Iterator[tuple[str, KeyInfo]]:
        with self._timed("list"):
            return self.inner.list_tree(prefix)

    def open_writer(self, key: str, *, truncate: bool, create: bool, exclusive: bool = False) -> KeyWriter:
        with self._timed("open_writer"):
            return self.inner.open_writer(key, truncate=truncate, create=create,
                                          exclusive=exclusive)

    def delete(self, key: str) -> None:
        with self._timed("delete"):
            self.inner.delete(key)

    def rename(self, src: str, dst: str, replace: bool = True) -> None:
        with self._timed("rename"):
            self.inner.rename(src, dst, replace)

    def link(self, src: str, dst: str) -> KeyInfo | None:
        with self._timed("link"):
            return self.inner.link(src, dst)
