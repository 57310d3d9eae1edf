"""A store still being opened, so that a mount can answer the kernel first.

Opening an S3 source imports botocore and asks the server about the bucket, and
opening a zip parses its central directory (0.1 to 0.3 s for 20,000 members,
seconds for millions): time the mount need not wait for before it answers.
A :class:`PendingStore` stands in for the store from the start. It carries the
properties the layers above read at once (given by whoever knows the kind of
source, and checked against the real store once it is open), and every call
waits, in the worker thread that makes it, until :meth:`PendingStore.open` is
done; after a failed open, every call fails with that open's error.

``block_size`` and ``lists_in_memory`` are learnt, not announced: a zip reads
through blocks only when some member is compressed, which its central directory
tells, and lists from memory once that directory is parsed. Until the open they
are the announced block size and False, and the views read them at each call, so a
read made before the open simply goes unblocked, and a listing waits in a worker.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from zvfs.stores.base import KeyReader, Store, StoreError, WrappedStore

_TRAITS = ("description", "flat_listing", "can_write", "implicit_dirs",
           "stages_writes", "opens_readers", "local")


class PendingStore(WrappedStore):
    """``opener()`` makes the store when :meth:`open` is called (once, blocking)."""

    def __init__(self, opener: Callable[[], Store], *, description: str, block_size: int = 0,
                 flat_listing: bool = False, can_write: bool = False, implicit_dirs: bool = False,
                 stages_writes: bool = False, opens_readers: bool = False, local: bool = False,
                 abandon: Callable[[], None] | None = None) -> None:
        """``abandon()`` gives back what ``opener`` would have taken over (a zip's descriptor,
        opened before the mount covers its path) when the store is closed before its open began."""
        # no WrappedStore.__init__: there is no inner store to take the traits from yet
        self.description = description
        self._block_size = block_size
        self.flat_listing = flat_listing
        self.can_write = can_write
        self.implicit_dirs = implicit_dirs
        self.stages_writes = stages_writes
        self.opens_readers = opens_readers
        self.local = local
        self._opener = opener
        self._opened = threading.Event()
        self._store: Store | None = None
        self._error: BaseException | None = None
        self._writes: tuple[Any, ...] | None = None
        self._closed = False
        self._abandon = abandon
        self._began = False
        self._lock = threading.Lock()  # open's start against close: abandon() or opener(), not both

    def open(self) -> Store:
        """Open the store now; raises what opening raised (SourceError, ...)."""
        try:
            with self._lock:
                if self._closed:
                    raise StoreError(f"{self.description}: closed before it was opened")
                self._began = True
            store = self._opener()
            differ = [t for t in _TRAITS if getattr(store, t) != getattr(self, t)]
            if differ:
                store.close()
                raise StoreError(f"{self.description}: opened as a store whose {', '.join(differ)} "
                                 "differ from what was announced")
            if self._writes is not None:
                store.enable_writes(*self._writes)  # type: ignore[attr-defined]
            self._store = store
        except BaseException as exc:
            self._error = exc
            raise
        finally:
            self._opened.set()  # after _store or _error: waiters read one of them
        if self._closed:  # closed while it was opening
            store.close()
        return store

    @property  # type: ignore[override]
    def block_size(self) -> int:
        """The open store's (never waits): the announced value until it is open."""
        store = self._store
        return self._block_size if store is None else store.block_size

    def open_reader_at_once(self, key: str) -> KeyReader | None:
        """The open store's (never waits): None until it is open."""
        store = self._store
        return None if store is None else store.open_reader_at_once(key)

    def get_range_at_once(self, key: str, start: int, length: int) -> bytes | memoryview | None:
        """The open store's (never waits): None until it is open."""
        store = self._store
        return None if store is None else store.get_range_at_once(key, start, length)

    def dir_mtime_ns(self, prefix: str) -> int | None:
        """The open store's (never waits: asked on the mount's thread, for the root's
        attributes before the open too): None until it is open."""
        store = self._store
        return None if store is None else store.dir_mtime_ns(prefix)

    @property  # type: ignore[override]
    def lists_in_memory(self) -> bool:
        """The open store's (never waits): False until it is open, as a listing would wait."""
        store = self._store
        return False if store is None else store.lists_in_memory

    @property  # type: ignore[override]
    def inner(self) -> Store:
        """The store, once open (waits for it)."""
        self._opened.wait()
        if self._store is None:
            raise StoreError(f"{self.description} could not be opened: {self._error}")
        return self._store

    def enable_writes(self, staging: Any, part_size: int, rewrite_max: int,
                      upload_args: Mapping[str, str] | None = None) -> None:
        """Writes for a store that stages them (S3): passed on once it is open."""
        self._writes = (staging, part_size, rewrite_max, upload_args)
        if self._store is not None:
            self._store.enable_writes(*self._writes)  # type: ignore[attr-defined]

    def close_idle(self) -> None:
        if self._store is not None:  # never waits for the open
            self._store.close_idle()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            began = self._began
        if not began and self._abandon is not None:
            self._abandon()
            self._abandon = None
        if self._store is not None:
            self._store.close()
        elif self._opened.is_set() and self._writes is not None:
            self._writes[0].cleanup()  # never opened: the staging area is ours to remove
