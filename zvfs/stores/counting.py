"""A store wrapper that counts requests and bytes into :mod:`zvfs.stats`."""

from __future__ import annotations

from collections.abc import Iterator

from zvfs.stats import Counters
from zvfs.stores.base import KeyInfo, Listing, Store


class CountingStore(Store):
    """Delegates to ``inner`` and counts every call, so stats.json shows store traffic."""

    def __init__(self, inner: Store, counters: Counters) -> None:
        self.inner = inner
        self.counters = counters
        self.description = inner.description
        self.block_size = inner.block_size
        self.flat_listing = inner.flat_listing

    def get(self, key: str) -> bytes:
        self.counters.add("store_requests")
        data = self.inner.get(key)
        self.counters.add("store_bytes", len(data))
        return data

    def get_range(self, key: str, start: int, length: int) -> bytes:
        self.counters.add("store_requests")
        data = self.inner.get_range(key, start, length)
        self.counters.add("store_bytes", len(data))
        return data

    def info(self, key: str) -> KeyInfo:
        self.counters.add("store_requests")
        return self.inner.info(key)

    def list_dir(self, prefix: str) -> Listing:
        self.counters.add("store_list_requests")
        return self.inner.list_dir(prefix)

    def list_prefix(self, prefix: str) -> Iterator[str]:
        self.counters.add("store_list_requests")
        return self.inner.list_prefix(prefix)

    def list_tree(self, prefix: str) -> Iterator[tuple[str, KeyInfo]]:
        self.counters.add("store_list_requests")
        return self.inner.list_tree(prefix)

    def close(self) -> None:
        self.inner.close()
