"""Caches between views and stores: byte-bounded LRU with single-flight loads, and the
pool that lends the buffers of dropped chunks to the next decodes."""

from zvfs.cache.budget import ByteBudget
from zvfs.cache.buffers import BufferPool
from zvfs.cache.lru import Cache

__all__ = ["BufferPool", "ByteBudget", "Cache"]
