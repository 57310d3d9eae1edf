"""Caches between views and stores: byte-bounded LRU with single-flight loads."""

from zvfs.cache.lru import Cache

__all__ = ["Cache"]
