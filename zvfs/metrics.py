"""Prometheus metrics for one mount (``--metrics-addr``), served by prometheus-client.

Nothing is counted twice: a collector turns the live registry of
:mod:`zvfs.stats` and the caches' own statistics into metric families at
each scrape. Counters named ``<prefix><label value>`` become one family with
a label (``store_errors_timeout`` -> ``zvfs_store_errors_total{kind="timeout"}``);
any other counter is exported as ``zvfs_<name>_total``, so a counter a layer
adds later shows up without a change here.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

import zvfs
from zvfs.options import join_addr, metrics_url, split_addr
from zvfs.views.context import MountContext

log = logging.getLogger("zvfs")

#: metrics connections served at once; one more is closed as soon as it is accepted
MAX_CLIENTS = 32
#: seconds a metrics client may stay silent before its connection is closed
IDLE_SECONDS = 5.0

#: counter-name prefix -> (family name, label name, help)
LABELED = (
    ("store_requests_", "zvfs_store_requests", "op", "requests to the store, by operation"),
    ("store_bytes_", "zvfs_store_bytes", "op", "bytes read from or written to the store, by operation"),
    ("store_errors_", "zvfs_store_errors", "kind", "failed store requests, by kind of failure"),
    ("s3_requests_", "zvfs_s3_requests", "op", "HTTP requests sent to S3, by S3 operation, each try included"),
    ("fuse_ops_", "zvfs_fuse_operations", "op", "FUSE operations, by type"),
    ("fuse_errors_", "zvfs_fuse_errors", "op", "FUSE operations that failed (not ENOENT), by type"),
)
#: aggregates whose parts are exported with labels above (exporting both would double-count)
#: counters that go down as well as up (processes running now): Prometheus gauges
GAUGES = {"decoder_processes", "decoder_zygote", "inodes"}
SKIPPED = {"store_requests", "store_bytes", "store_list_requests", "fuse_lookups", "fuse_getattrs",
           "fuse_readdirs", "fuse_read_requests", "uptime_seconds"}


class MountCollector(Collector):
    """Reads the counters, histograms and caches of ``ctx`` at each scrape."""

    def __init__(self, ctx: MountContext, label: str) -> None:
        self.ctx = ctx
        self.label = label

    def collect(self) -> Iterator[Any]:
        mount = [self.label]
        snap = self.ctx.counters.snapshot()
        families = {prefix: CounterMetricFamily(name, help_, labels=["mount", label])
                    for prefix, name, label, help_ in LABELED}
        for name, value in snap.items():
            for prefix, *_ in LABELED:
                if name.startswith(prefix):
                    families[prefix].add_metric([*mount, name[len(prefix):]], value)
                    break
            else:
                if name in GAUGES:
                    g = GaugeMetricFamily(f"zvfs_{name}", f"zvfs gauge {name}", labels=["mount"])
                    g.add_metric(mount, value)
                    yield g
                elif name not in SKIPPED:
                    c = CounterMetricFamily(f"zvfs_{name}", f"zvfs counter {name}", labels=["mount"])
                    c.add_metric(mount, value)
                    yield c
        yield from families.values()
        hist = HistogramMetricFamily("zvfs_store_request_seconds", "store request latency, by operation",
                                     labels=["mount", "op"])
        for name, (buckets, total, _count) in self.ctx.counters.histograms().items():
            hist.add_metric([*mount, name.removeprefix("store_seconds_")], buckets, total)
        yield hist
        yield from self._caches(mount)
        up = GaugeMetricFamily("zvfs_uptime_seconds", "seconds since the mount started", labels=["mount"])
        up.add_metric(mount, snap.get("uptime_seconds", 0))
        yield up
        info = GaugeMetricFamily("zvfs_mount_info", "1 for each mount: version and source",
                                 labels=["mount", "version", "source"])
        info.add_metric([*mount, zvfs.__version__, self.ctx.source], 1)
        yield info

    def _caches(self, mount: list[str]) -> Iterator[Any]:
        labels = ["mount", "cache"]
        hits = CounterMetricFamily("zvfs_cache_hits", "cache hits", labels=labels)
        misses = CounterMetricFamily("zvfs_cache_misses", "cache misses", labels=labels)
        evictions = CounterMetricFamily("zvfs_cache_evictions", "cache evictions", labels=labels)
        entries = GaugeMetricFamily("zvfs_cache_entries", "entries in the cache", labels=labels)
        for name, cache in (("chunk", self.ctx.chunks), ("listing", self.ctx.listings)):
            s = cache.stats
            hits.add_metric([*mount, name], s.hits)
            misses.add_metric([*mount, name], s.misses)
            evictions.add_metric([*mount, name], s.evictions)
            entries.add_metric([*mount, name], len(cache))
        fill = GaugeMetricFamily("zvfs_chunk_cache_bytes", "bytes of decoded chunks cached", labels=["mount"])
        fill.add_metric(mount, self.ctx.chunks.current_bytes)
        bound = GaugeMetricFamily("zvfs_chunk_cache_max_bytes", "the chunk cache's bound (--cache-size)",
                                  labels=["mount"])
        bound.add_metric(mount, self.ctx.chunks.max_bytes)
        yield from (hits, misses, evictions, entries, fill, bound)


class _Restricted:
    """The samples of ``registry`` named in ``names``, for ``/metrics?name[]=NAME``."""

    def __init__(self, registry: CollectorRegistry, names: set[str]) -> None:
        self._registry = registry
        self._names = names

    def collect(self) -> Iterator[Metric]:
        for metric in self._registry.collect():
            samples = [s for s in metric.samples if s.name in self._names]
            if samples:
                out = Metric(metric.name, metric.documentation, metric.type)
                out.samples = samples
                yield out


class _Registry(CollectorRegistry):
    """prometheus-client finds the collector of a ``name[]`` by the names it describes; the
    mount's collector describes none (its names appear as counters do), so every filtered
    scrape answered 200 with an empty body. This one filters the whole collection."""

    def restricted_registry(self, names: Iterable[str]) -> Any:
        return _Restricted(self, set(names))


class _Handler(WSGIRequestHandler):
    """A request whose client stays silent IDLE_SECONDS is dropped: wsgiref waits for ever.
    Requests are not logged (wsgiref writes a line to stderr for each)."""

    timeout = IDLE_SECONDS

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - wsgiref's name
        pass


class _BoundedServer(ThreadingMixIn, WSGIServer):
    """A thread-per-connection server (prometheus-client's start_http_server, built here from
    the standard library rather than from its private parts), with at most MAX_CLIENTS
    threads: idle clients each held a thread and a descriptor for as long as they stayed."""

    daemon_threads = True

    request_queue_size = 128  # socketserver's 5 made a burst of connections wait for SYN retries

    def __init__(self, *args: Any, **kw: Any) -> None:
        self._lock = threading.Lock()
        self._active = 0
        super().__init__(*args, **kw)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            full = self._active >= MAX_CLIENTS
            if not full:
                self._active += 1
        if full:
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._done()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._done()

    def _done(self) -> None:
        with self._lock:
            self._active -= 1

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that timed out or went away is no error of the daemon's (socketserver
        printed a traceback to stderr for each)."""
        log.debug("metrics client %s: connection dropped", client_address, exc_info=True)


class MetricsServer:
    """The HTTP endpoint; its thread is a daemon thread, stopped by :meth:`shutdown`.

    ``addr`` is the address bound ('HOST:PORT'): with port 0 asked, the port the OS chose."""

    def __init__(self, server: Any, host: str) -> None:
        self._server = server
        self.addr = join_addr(host, server.server_address[1])

    def shutdown(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def serve_metrics(addr: str, ctx: MountContext, label: str) -> MetricsServer:
    """Listen at ``addr`` ('HOST:PORT', port 0 for any free one); raises OSError with a
    message naming the address."""
    host, port = split_addr(addr)
    registry = _Registry(auto_describe=False)
    registry.register(MountCollector(ctx, label))
    try:
        server = _start(host, port, registry)
    except OSError as exc:
        raise OSError(f"cannot serve metrics at {addr}: {exc.strerror}; "
                      "choose another --metrics-addr") from None
    served = MetricsServer(server, host)
    log.info("serving Prometheus metrics at %s", metrics_url(served.addr))
    return served


def _routed(metrics: Any) -> Any:
    """The metrics at ``/metrics`` only, as node_exporter and mountpoint-s3's exporters serve
    them: prometheus-client's app answered every path with the metrics (a typo in a scrape
    config went unnoticed) and HEAD, which load balancers' health checks send, with 405.
    ``/`` names where the metrics are."""

    def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        path, method = environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD", "GET")
        if path == "/metrics" and method == "HEAD":
            # GET's headers, its body's length among them (RFC 9110), and no body: passed
            # through, they had none, and wsgiref said 0 for the empty answer (a helper's audit)
            got: dict[str, Any] = {}

            def keep(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
                got.update(status=status, headers=headers)
                return lambda _data: None

            body = b"".join(metrics({**environ, "REQUEST_METHOD": "GET"}, keep))
            start_response(got["status"], [*(h for h in got["headers"] if h[0].lower() != "content-length"),
                                           ("Content-Length", str(len(body)))])
            return []
        if path == "/metrics":
            return metrics(environ, start_response)
        if path == "/" and method in ("GET", "HEAD"):
            page = b'<html><head><title>zvfs</title></head><body><a href="/metrics">metrics</a></body></html>\n'
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8"),
                                      ("Content-Length", str(len(page)))])
            return [page if method == "GET" else b""]
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"not found: the metrics are at /metrics\n"]

    return app


def _start(host: str, port: int, registry: CollectorRegistry) -> _BoundedServer:
    """prometheus-client's start_http_server with :class:`_BoundedServer` and a timeout."""

    class Server(_BoundedServer):
        address_family: socket.AddressFamily

    # the family of the address the host names first (an IPv6 literal: AF_INET6), as
    # prometheus-client picks it
    family, _type, _proto, _name, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                                flags=socket.AI_PASSIVE)[0]
    Server.address_family = family
    server = make_server(str(sockaddr[0]), port, _routed(make_wsgi_app(registry)), Server,
                         handler_class=_Handler)
    thread = threading.Thread(target=server.serve_forever, name="zvfs-metrics", daemon=True)
    thread.start()
    return server
