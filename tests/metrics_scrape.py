"""Reading a mount's Prometheus endpoint (``--metrics-addr``) from tests.

The endpoint is served over TCP by the daemon, not through the mount: a test that must not
add FUSE requests to the counts it asserts (a read of stats.json is a READ) watches the
daemon here.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

from conftest import run, zvfs_cmd


def metrics_url(mnt: Path) -> str:
    """Where the mount serves its metrics, as `zvfs status` reports it: a mount asked for
    port 0 is found there (a port picked by the test and handed over could be taken first)."""
    res = run([*zvfs_cmd(), "status", "--json", str(mnt)], timeout=90)
    assert res.returncode == 0, res.stderr
    (info,) = json.loads(res.stdout)
    assert info["metrics"], info
    return info["metrics"]


def scrape_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """Every sample: (name, sorted labels) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(scrape_text(url)):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(samples: dict, name: str, **labels: str) -> float:
    return sum(v for (n, lab), v in samples.items()
               if n == name and all(dict(lab).get(k) == want for k, want in labels.items()))


def _store_requests(samples: dict) -> tuple[float, float, float]:
    """(store requests begun, store requests ended, chunk cache entries). A request is
    counted as it begins (``zvfs_store_requests_total``, by operation, listings too) and
    timed as it ends (the count of ``zvfs_store_request_seconds``)."""
    return (total(samples, "zvfs_store_requests_total"),
            total(samples, "zvfs_store_request_seconds_count"),
            total(samples, "zvfs_cache_entries", cache="chunk"))


def wait_store_settled(url: str, timeout: float = 60.0, quiet: float = 0.05) -> None:
    """Wait until the daemon has no store request under way and none began or ended, nor
    the chunk cache changed, for ``quiet`` seconds: what it fetches ahead in the background
    has landed. A wait on the event, so a slow server (moto under CI's load) only makes it
    longer; fails after ``timeout``."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        now = _store_requests(scrape(url))
        if now == last and now[0] == now[1]:
            return
        last = now
        time.sleep(quiet)
    raise AssertionError(f"the store did not settle in {timeout} s: {last}")
