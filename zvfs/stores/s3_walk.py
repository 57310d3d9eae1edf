"""Listing a big bucket directory by directory, several directories at once.

A flat listing costs one request per 1,000 keys, and each request waits for the one
before it (its continuation token). A chunk grid puts hundreds of keys in each
directory, so for such a store the same listing can be asked directory by directory
(``Delimiter='/'``), ``THREADS`` requests in flight: about as many requests, side by
side instead of in a row. S3-compatible servers that sort every key under a prefix for
each page (moto, some small servers) are also spared most of that work, as each request
then covers one directory, not the whole store.

For directories of fewer keys the walk would cost a request per directory, many more
than the flat pages; it is taken only when the flat listing's first page shows
directories of at least half a page of keys on average (:func:`walk_pays`), so that it
asks at most about twice the requests. On S3 itself smaller directories would still
gain (16 requests at once), but each request also costs the server work of its own: on
moto, which scans the whole bucket for each, a 20,000-key bucket of 100-key directories
took 5.9 s walked against 4.9 s flat.
The walk yields exactly what the flat listing would, in the same order, after the
first page's last key: a caller cannot tell them apart.
"""

from __future__ import annotations

import queue
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")

#: directory listings in flight at once (each on its own connection of the client's pool)
THREADS = 16

#: one directory: its keys (sorted, with a payload each) and its subdirectories (sorted,
#: each ending in '/'), all spelled from the store's root
DirListing = tuple[list[tuple[str, T]], list[str]]


def walk_pays(keys: Sequence[str], page_keys: int) -> bool:
    """Whether a flat listing whose first page (truncated, in order) held ``keys`` is
    better finished directory by directory: its complete directories (those the page
    left, not the ones its last key is still in) hold half a page of keys or more on
    average, so the walk asks at most about twice the requests the pages would."""
    if not keys:
        return False
    last = keys[-1]
    sizes = Counter(k[: k.rfind("/") + 1] for k in keys)
    complete = [n for d, n in sizes.items() if not last.startswith(d)]
    return bool(complete) and sum(complete) * 2 >= page_keys * len(complete)


def walk(list_dir: Callable[[str], DirListing[T]], root: str, after: str,
         threads: int = THREADS) -> Iterator[tuple[str, T]]:
    """Every key below ``root`` ('' or ending in '/') that sorts after ``after``, with its
    payload, in flat-listing order, listing ``threads`` directories at a time.

    A directory whose every key sorts before ``after`` (the flat page had it whole) is not
    listed. Each listing, once back, queues its subdirectories' at once, so the threads
    stay busy however slowly the caller takes the keys. An error from ``list_dir`` is
    raised here when the walk reaches that directory. Closing the iterator stops the
    threads after their current request.
    """
    jobs: queue.SimpleQueue[tuple[str, Future] | None] = queue.SimpleQueue()
    pending: dict[str, Future] = {}
    stopped = threading.Event()

    def covered(prefix: str) -> bool:
        return prefix < after and not after.startswith(prefix)

    def submit(prefix: str) -> None:
        fut: Future = Future()
        pending[prefix] = fut
        jobs.put((prefix, fut))

    def work() -> None:
        while not stopped.is_set():
            job = jobs.get()
            if job is None:
                return
            prefix, fut = job
            if stopped.is_set() or not fut.set_running_or_notify_cancel():
                continue
            try:
                keys, subdirs = list_dir(prefix)
                subdirs = [s for s in subdirs if not covered(s)]
                for sub in subdirs:  # before the result: the caller reaches them only after it
                    submit(sub)
                fut.set_result((keys, subdirs))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller with the result
                fut.set_exception(exc)

    def emit(prefix: str) -> Iterator[tuple[str, T]]:
        """The keys below ``prefix`` in order: a stack of the directories on the way, not a
        generator each (a key a thousand directories deep was Python's RecursionError, and
        every listing of the mount failed; a helper's audit)."""
        stack = [(*pending.pop(prefix).result(), 0, 0)]  # keys, subdirs, next key, next subdir
        while stack:
            keys, subdirs, i, s = stack.pop()
            if s < len(subdirs):  # a subdirectory's keys sort together, where its name + '/' does
                sub = subdirs[s]
                while i < len(keys) and keys[i][0] < sub:
                    if keys[i][0] > after:
                        yield keys[i]
                    i += 1
                stack.append((keys, subdirs, i, s + 1))
                stack.append((*pending.pop(sub).result(), 0, 0))
                continue
            for item in keys[i:]:
                if item[0] > after:
                    yield item

    workers = [threading.Thread(target=work, name="zvfs-list", daemon=True) for _ in range(threads)]
    submit(root)
    for t in workers:
        t.start()
    try:
        yield from emit(root)
    finally:
        stopped.set()
        for _ in workers:
            jobs.put(None)
