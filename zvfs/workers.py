"""The one way blocking work leaves the trio thread.

Every store call and every decode goes through :func:`run_blocking`, so the
number of worker threads (and thus of S3 connections and concurrent decodes)
is bounded by one limiter that the CLI sizes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import trio

T = TypeVar("T")

_limiter: trio.CapacityLimiter | None = None
_limit = 16


def set_worker_limit(n: int) -> None:
    """Set the worker-thread bound; call before the trio loop starts."""
    global _limit, _limiter
    _limit = max(1, int(n))
    _limiter = None


def worker_limit() -> int:
    return _limit


async def run_blocking(fn: Callable[..., T], *args: object) -> T:
    """Run ``fn(*args)`` in a worker thread (one hop) and return its result."""
    global _limiter
    if _limiter is None:
        _limiter = trio.CapacityLimiter(_limit)
    return await trio.to_thread.run_sync(fn, *args, limiter=_limiter)
