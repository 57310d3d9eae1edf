"""Live counters and latency histograms behind ``.zvfs/stats.json`` and the metrics endpoint.

A plain registry with no dependencies, so every layer may count into it
without importing the layer that reports it. Every name a layer is known to
count is registered at 0 up front, so stats.json and the metrics keep the
same keys from the first second of a mount; a name counted that is not
listed here still shows up, once counted.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import defaultdict
from collections.abc import Callable

#: kinds of store failure the S3 layer counts as ``store_errors_<kind>``
ERROR_KINDS = ("throttled", "server", "reset", "timeout", "truncated", "checksum", "denied",
               "not_found", "other")
#: store operations counted as ``store_requests_<op>`` (and timed)
STORE_OPS = ("get", "get_range", "info", "list", "put", "open_writer", "delete", "rename", "link")
#: the S3 operations a mount sends, counted as ``s3_requests_<op>`` (each HTTP try: what S3
#: bills); one the list lacks is counted all the same, from its first request on
S3_OPS = ("GetObject", "HeadObject", "ListObjectsV2", "ListObjects", "PutObject", "UploadPart",
          "CopyObject", "UploadPartCopy", "CreateMultipartUpload", "CompleteMultipartUpload",
          "AbortMultipartUpload", "ListMultipartUploads", "DeleteObject")
#: FUSE operations counted as ``fuse_ops_<op>``; failures as ``fuse_errors_<op>``
FUSE_OPS = ("lookup", "getattr", "opendir", "readdir", "open", "read", "statfs",
            "create", "write", "flush", "fsync", "fsyncdir", "setattr", "unlink", "mkdir", "rmdir", "rename",
            "link")

KNOWN_COUNTERS: tuple[str, ...] = (
    "store_requests", "store_bytes", "store_list_requests", "store_retries", "store_failures",
    *(f"store_requests_{op}" for op in STORE_OPS),
    *(f"store_bytes_{op}" for op in ("get", "get_range", "put")),
    *(f"s3_requests_{op}" for op in S3_OPS),
    "fuse_write_bytes",
    *(f"store_errors_{kind}" for kind in ERROR_KINDS),
    "chunks_decoded", "bytes_decoded", "decode_seconds",
    # decoder processes: their parent ready to fork them (1 once its imports are done),
    # those running, those replaced after ending early, and the chunks they decoded
    "decoder_zygote", "decoder_processes", "decoder_restarts", "decoder_chunks",
    "prefetch_requests", "prefetch_hits",
    # directory listings started ahead of a walk of the tree (a directory store's find, du)
    "listings_ahead",
    "disk_cache_hits", "disk_cache_misses", "disk_cache_evictions",
    # cached copies dropped as corrupt (and read from the store instead)
    "disk_cache_corrupt",
    "fuse_lookups", "fuse_getattrs", "fuse_readdirs", "fuse_read_requests", "fuse_read_bytes",
    # opens answered with keep_cache: the kernel may serve them from the pages it has
    "fuse_opens_cached",
    # ... whose bytes were stored in the kernel's pages with the open: no READ follows
    "fuse_opens_pushed",
    # requests read as soon as the last was answered, with no wait (zvfs.fs.loop)
    "fuse_requests_queued",
    # requests that came while the daemon busy-polled for them (--busy-poll)
    "fuse_requests_polled",
    *(f"fuse_ops_{op}" for op in FUSE_OPS),
    *(f"fuse_errors_{op}" for op in FUSE_OPS),
)

#: upper bounds (seconds) of the latency histogram buckets; +Inf is implied
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
KNOWN_HISTOGRAMS: tuple[str, ...] = tuple(f"store_seconds_{op}" for op in STORE_OPS)


class Histogram:
    """Cumulative-free bucket counts (as observed) plus sum and count; read under the lock."""

    __slots__ = ("counts", "sum", "count")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(LATENCY_BUCKETS, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """Prometheus-style (upper bound, cumulative count) pairs ending with '+Inf'."""
        out, total = [], 0
        for bound, n in zip((*map(str, LATENCY_BUCKETS), "+Inf"), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out


class Counters:
    """Thread-safe named counters (worker threads and the trio thread both count)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: defaultdict[str, float] = defaultdict(float)
        self._values.update(dict.fromkeys(KNOWN_COUNTERS, 0))
        self._histograms: dict[str, Histogram] = {n: Histogram() for n in KNOWN_HISTOGRAMS}
        self.started = time.time()
        #: uptime is counted on the monotonic clock: a wall clock stepped after the mount (NTP
        #: setting it at boot, under a mount systemd started first) made it negative, or hours
        self._began = time.monotonic()
        #: (unix time, one line) of the last error a user saw as a failed operation
        self.last_error: tuple[float, str] | None = None
        #: set once the mount is announced ready (its source open and scanned): until then
        #: it answers, but a request that needs the store waits for it
        self.ready = False
        #: gauges read when a snapshot is taken: they cost their owner nothing until then
        self._readings: dict[str, Callable[[], float]] = {}

    def reading(self, name: str, read: Callable[[], float]) -> None:
        """Report ``read()`` as ``name`` in every snapshot (the size of a table, say)."""
        self._readings[name] = read

    def add(self, name: str, amount: float = 1) -> None:
        with self._lock:
            self._values[name] += amount

    def observe(self, name: str, seconds: float) -> None:
        """Record one latency in the histogram ``name``."""
        with self._lock:
            hist = self._histograms.get(name)
            if hist is None:
                hist = self._histograms[name] = Histogram()
            hist.observe(seconds)

    def note_error(self, message: str) -> None:
        self.last_error = (time.time(), message)

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            out = {k: (int(v) if float(v).is_integer() else round(v, 6)) for k, v in self._values.items()}
        out["uptime_seconds"] = round(time.monotonic() - self._began, 3)
        for name, read in list(self._readings.items()):
            out[name] = read()
        return dict(sorted(out.items()))

    def histograms(self) -> dict[str, tuple[list[tuple[str, int]], float, int]]:
        """name -> (cumulative buckets, sum, count), a consistent copy."""
        with self._lock:
            return {n: (h.cumulative(), h.sum, h.count) for n, h in sorted(self._histograms.items())}

