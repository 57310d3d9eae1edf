"""A real S3 server for tests: moto's server (benchlib/motoserve.py) in a subprocess on 127.0.0.1.

Not a conftest: fixtures decide the scope. Typical use::

    with MotoServer() as srv:            # or srv = MotoServer().start(); ...; srv.stop()
        client = s3_client(srv.endpoint)
        client.create_bucket(Bucket="b")
        upload_tree(client, "b", "data/", "/path/to/tree")
        subprocess.run([...], env={**os.environ, **srv.env})

``srv.env`` holds dummy credentials (AWS_ACCESS_KEY_ID=testing, ...), a region,
and config/credential file paths that do not exist, so a developer's ~/.aws
never leaks into a test. The server is stopped by its own PID, never by name.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from benchlib.motoserve import SEED_PATH, pack
from procs import stop

#: moto's server, with seeding while it serves (the benchmarks' too)
MOTOSERVE = Path(__file__).resolve().parents[1] / "scripts" / "benchlib" / "motoserve.py"

DUMMY_ENV: dict[str, str] = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SECURITY_TOKEN": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "AWS_CONFIG_FILE": "/nonexistent/zvfs-test/aws-config",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/zvfs-test/aws-credentials",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MotoServer:
    """``python -m moto.server`` as a separate process; ``extra_env`` tunes moto (e.g. auth)."""

    def __init__(self, extra_env: Mapping[str, str] | None = None, timeout: float = 60.0) -> None:
        self.extra_env = dict(extra_env or {})
        self.timeout = timeout
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.env: dict[str, str] = dict(DUMMY_ENV)
        self._log: Any = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> MotoServer:
        env = {**os.environ, **DUMMY_ENV, **self.extra_env}
        # moto logs every request: a file, not a pipe, so nothing can fill up or break.
        # benchlib's motoserve.py is moto's server with seeding (put_many); it binds a
        # port the kernel picks and says which ("ready PORT")
        self._log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, str(MOTOSERVE), "127.0.0.1", "0"],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            self._log.seek(0)
            said = self._log.read().decode(errors="replace")
            ready = re.search(r"^ready (\d+)$", said, re.MULTILINE)
            if ready:
                self.port = int(ready.group(1))
                if self._answers():
                    return self
            elif self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"moto server failed to start: {said[-2000:]}")
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"moto server did not answer within {self.timeout}s")

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(self.endpoint + "/moto-api/", timeout=1) as r:
                return r.status < 500
        except urllib.error.HTTPError as e:
            return e.code < 500
        except OSError:
            return False

    def reset(self) -> None:
        """Forget every bucket (moto's reset API)."""
        req = urllib.request.Request(self.endpoint + "/moto-api/reset", method="POST")
        with urllib.request.urlopen(req, timeout=10):
            pass

    def stop(self) -> None:
        """Terminate our own process (by PID), kill it if it lingers."""
        proc, self.proc = self.proc, None
        if proc is not None:
            stop(proc)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> MotoServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def s3_client(endpoint: str, **kw: Any) -> Any:
    """A boto3 S3 client for the test server, with the dummy credentials set explicitly."""
    import boto3
    from botocore.config import Config

    return boto3.session.Session(
        aws_access_key_id=DUMMY_ENV["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=DUMMY_ENV["AWS_SECRET_ACCESS_KEY"],
        region_name=DUMMY_ENV["AWS_DEFAULT_REGION"],
    ).client(
        "s3",
        endpoint_url=endpoint,
        config=Config(max_pool_connections=32, s3={"addressing_style": "path"}),
        **kw,
    )


def upload_tree(client: Any, bucket: str, prefix: str, local_dir: str | os.PathLike[str]) -> list[str]:
    """Upload every regular file below ``local_dir`` as ``prefix + relative/path``; returns the keys.

    ``prefix`` is used as given ('' or ending in '/'); the objects are seeded (see seed).
    """
    root = Path(local_dir)
    files = sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())
    keys = [prefix + p.relative_to(root).as_posix() for p in files]

    seed(client.meta.endpoint_url, bucket, ((key, p.read_bytes()) for p, key in zip(files, keys, strict=True)))
    return keys


def put_many(client: Any, bucket: str, items: Mapping[str, bytes]) -> None:
    """Put many objects (e.g. >1000 keys for pagination tests) into ``bucket`` of the
    server ``client`` talks to, a MotoServer: in one request that moto's backend takes as
    that many PUTs (motoserve.py), not thousands of requests each parsed by moto."""
    seed(client.meta.endpoint_url, bucket, items.items())


def seed(endpoint: str, bucket: str, items: Iterable[tuple[str, bytes]], batch: int = 32 << 20) -> None:
    """``items`` put into ``bucket`` of the MotoServer at ``endpoint``, in requests of
    about ``batch`` bytes; raises (the server's answer) if it refuses."""
    def post(frames: list[tuple[str, bytes]]) -> None:
        req = urllib.request.Request(f"{endpoint}{SEED_PATH}{bucket}", data=pack(frames), method="POST")
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                assert int(r.read()) == len(frames)
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"seeding {bucket} at {endpoint}: {e.code} {e.read().decode(errors='replace')}") from None

    frames: list[tuple[str, bytes]] = []
    size = 0
    for key, value in items:
        frames.append((key, value))
        size += len(key) + len(value)
        if size >= batch:
            post(frames)
            frames, size = [], 0
    if frames:
        post(frames)
