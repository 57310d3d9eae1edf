"""moto's S3 server on 127.0.0.1, the latency proxy in front of it, and the upload."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import procs
from .procs import log

BUCKET_PREFIX = "zvfs-bench-"


def bucket(store: str) -> str:
    """One bucket per store: moto's LIST scans every key of a bucket, real S3's does not."""
    return BUCKET_PREFIX + store

CREDS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "benchsecret",
         "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}


def _wait_ready(proc, log_path: Path, start: int, timeout: float) -> list[int]:
    """The ports ``proc`` bound, from the "ready PORT ..." line it prints to ``log_path``
    (past byte ``start``: the log is appended to by every run) once it listens. The ports
    are asked as 0 and the kernel picks them: a port found free beforehand may be taken by
    someone's outgoing connection before the server binds it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(log_path, "rb") as f:
            f.seek(start)
            for line in f.read().decode(errors="replace").splitlines():
                if line.startswith("ready "):
                    return [int(x) for x in line.split()[1:]]
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening "
                               f"(see {log_path})")
        time.sleep(0.05)
    raise RuntimeError(f"not listening after {timeout}s (see {log_path})")


class S3Env:
    """A running moto server and latency proxy; ``url`` is the proxy (what clients use)."""

    def __init__(self, work: Path, latency_ms: float) -> None:
        self.work = work
        self.latency_ms = latency_ms
        self.moto_port = self.proxy_port = self.stats_port = 0  # bound by start()
        self.moto = None
        self.uploaded: set[str] = set()
        self.proxy = None
        self.seed_seconds: float | None = None  # seeding the big-key buckets (start(seed=...))
        self.seeded: dict[str, tuple[int, int]] = {}

    @property
    def direct_url(self) -> str:
        return f"http://127.0.0.1:{self.moto_port}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.proxy_port}"

    def env(self) -> dict[str, str]:
        e = dict(os.environ)
        e.update(CREDS)
        # plain http on 127.0.0.1: a CA bundle only trips rclone ("unsupported transport")
        for k in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_CA_BUNDLE"):
            e.pop(k, None)
        return e

    def start(self, seed: dict[str, tuple[int, int]] | None = None) -> None:
        """Start moto and the proxy; ``seed``: store name -> chunk grid of the buckets put
        into moto's backend before it serves (motoserve.py), far faster than PUTs."""
        logs = self.work / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        specs = [f"{bucket(name)}={g[0]}x{g[1]}" for name, g in (seed or {}).items()]
        t0 = time.monotonic()
        moto_log, proxy_log = logs / "moto.log", logs / "proxy.log"
        at = moto_log.stat().st_size if moto_log.exists() else 0
        self.moto = procs.start([sys.executable, str(Path(__file__).with_name("motoserve.py")),
                                 "127.0.0.1", "0", *specs], log_path=moto_log, env=self.env())
        (self.moto_port,) = _wait_ready(self.moto, moto_log, at, timeout=120 + 2e-3 * sum(
            g[0] * g[1] for g in (seed or {}).values()))
        if seed:
            self.seed_seconds = time.monotonic() - t0
            self.uploaded.update(seed)
            self.seeded = dict(seed)
            log(f"moto seeded with {', '.join(specs)} in {self.seed_seconds:.1f}s")
        proxy_py = Path(__file__).with_name("proxy.py")
        at = proxy_log.stat().st_size if proxy_log.exists() else 0
        self.proxy = procs.start([sys.executable, str(proxy_py), "0", str(self.moto_port),
                                  str(self.latency_ms), "0"], log_path=proxy_log)
        self.proxy_port, self.stats_port = _wait_ready(self.proxy, proxy_log, at, timeout=30)
        log(f"moto on :{self.moto_port} (pid {self.moto.pid}), "
            f"+{self.latency_ms:g} ms proxy on :{self.proxy_port} (pid {self.proxy.pid})")

    def counters(self) -> tuple[int, int]:
        """(requests, bytes sent to clients) through the proxy so far."""
        with socket.create_connection(("127.0.0.1", self.stats_port), timeout=5) as c:
            data = b""
            while not data.endswith(b"\n"):
                chunk = c.recv(100)
                if not chunk:
                    break
                data += chunk
        req, down, _up = (int(x) for x in data.split())
        return req, down

    def stop(self) -> None:
        for p in (self.proxy, self.moto):
            if p is not None:
                procs.stop(p)

    def client(self, direct: bool = True):
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3", endpoint_url=self.direct_url if direct else self.url, region_name="us-east-1",
            aws_access_key_id=CREDS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDS["AWS_SECRET_ACCESS_KEY"],
            config=Config(max_pool_connections=32, s3={"addressing_style": "path"}))

    def upload(self, corpus, stores) -> None:
        """Upload each store to the root of its bucket, straight to moto (not through the proxy)."""
        s3 = self.client()
        jobs = []
        for name in stores:
            s3.create_bucket(Bucket=bucket(name))
            base = corpus.store(name)
            for rel, _size in corpus.files(name):
                jobs.append((bucket(name), rel, base / rel))
        t0 = time.monotonic()

        def put(job):
            bkt, key, path = job
            s3.put_object(Bucket=bkt, Key=key, Body=path.read_bytes())

        with ThreadPoolExecutor(16) as ex:
            list(ex.map(put, jobs))
        self.uploaded.update(stores)
        log(f"uploaded {len(jobs)} objects to s3://{BUCKET_PREFIX}* in {time.monotonic() - t0:.1f}s")

    def calibrate(self, corpus) -> dict[str, float]:
        """moto's own service time, straight and through the proxy: the floor under every
        S3 number (medians of a few requests, in milliseconds)."""
        import statistics

        out: dict[str, float] = {}
        files = corpus.files("big")
        chunk, _size = max(files, key=lambda f: f[1])
        body = (corpus.store("big") / chunk).read_bytes()
        calib = BUCKET_PREFIX + "calibrate"
        self.fresh_bucket(calib)
        for direct in (True, False):
            c = self.client(direct=direct)
            via = "direct" if direct else "proxy"
            for label, needs, fn in (
                    ("GET of the largest chunk object", "big", lambda c=c: c.get_object(
                        Bucket=bucket("big"), Key=chunk)["Body"].read()),
                    *[(f"LIST one level of the {n_keys:,}-key bucket", name,
                       lambda c=c, n=name: c.list_objects_v2(
                           Bucket=bucket(n), Prefix="a/0/", Delimiter="/"))
                      for name, n_keys in [("keys-large", corpus.params.n_large)] + [
                          (name, g[0] * g[1]) for name, g in self.seeded.items()
                          if g[0] * g[1] > 1000]],
                    ("HEAD", "big", lambda c=c: c.head_object(Bucket=bucket("big"), Key=chunk)),
                    ("PUT of the largest chunk object", None, lambda c=c: c.put_object(
                        Bucket=calib, Key=chunk, Body=body))):
                if needs is not None and needs not in self.uploaded:
                    continue
                times = []
                for _ in range(5):
                    t0 = time.perf_counter()
                    fn()
                    times.append((time.perf_counter() - t0) * 1000)
                out[f"{label} ({via})"] = statistics.median(times)
        self.drop_bucket(calib)
        return out

    # -- the write rows: a fresh, empty bucket per measurement --------------------------------

    def fresh_bucket(self, name: str) -> None:
        """Create bucket ``name`` empty (emptying it first if a crashed run left it)."""
        s3 = self.client()
        try:
            s3.create_bucket(Bucket=name)
        except s3.exceptions.BucketAlreadyOwnedByYou:
            self.drop_bucket(name)
            s3.create_bucket(Bucket=name)

    def objects(self, name: str, client=None) -> dict[str, tuple[int, str]]:
        """key -> (size, ETag) of every object of bucket ``name``, listed straight from moto."""
        s3 = client or self.client()
        out: dict[str, tuple[int, str]] = {}
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=name):
            for o in page.get("Contents", []):
                out[o["Key"]] = (int(o["Size"]), str(o["ETag"]).strip('"'))
        return out

    def drop_bucket(self, name: str) -> None:
        """Delete every object, unfinished multipart upload and then the bucket itself."""
        s3 = self.client()
        with contextlib.suppress(s3.exceptions.NoSuchBucket):
            for up in s3.list_multipart_uploads(Bucket=name).get("Uploads", []):
                s3.abort_multipart_upload(Bucket=name, Key=up["Key"], UploadId=up["UploadId"])
            keys = list(self.objects(name, s3))
            for i in range(0, len(keys), 1000):
                s3.delete_objects(Bucket=name, Delete={
                    "Objects": [{"Key": k} for k in keys[i:i + 1000]], "Quiet": True})
            s3.delete_bucket(Bucket=name)
