"""moto's S3 server, with buckets seeded in-process before it starts serving.

  motoserve.py HOST PORT [BUCKET=ROWSxCOLS ...]   (PORT 0: any free one)

Each BUCKET gets the keys of corpus.v2_items((ROWS, COLS)), put straight into moto's
backend (the objects a PUT from boto3 makes, its CRC32 too) and not over HTTP: moto serves about 200 PUTs a
second here, so 200,000 keys would take a quarter of an hour to upload, against seconds
this way. Then it serves the application ``python -m moto.server`` serves.
Prints "seeded N keys in S s", then "ready PORT" once listening.

While it serves, ``POST /_zvfs/seed/BUCKET`` with a body of :func:`pack`'s frames puts
those objects into BUCKET the same way (the tests' put_many and upload_tree): 2,500 PUTs
of the test suite took 38 s on a loaded machine, most of it moto's request handling,
which every other request of the suite waits behind.
"""

from __future__ import annotations

import struct
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


#: where a running server takes objects to seed (see the module's docstring)
SEED_PATH = "/_zvfs/seed/"
_FRAME = struct.Struct("<IQ")  # a key's length in bytes, then its value's


def pack(items: Iterable[tuple[str, bytes]]) -> bytes:
    """The body of a seeding request: each object a frame (lengths, key, value)."""
    out = bytearray()
    for key, value in items:
        name = key.encode("utf-8", "surrogateescape")
        out += _FRAME.pack(len(name), len(value))
        out += name
        out += value
    return bytes(out)


def unpack(body: bytes) -> Iterator[tuple[str, bytes]]:
    view, at = memoryview(body), 0
    while at < len(view):
        klen, vlen = _FRAME.unpack_from(view, at)
        at += _FRAME.size
        key = bytes(view[at:at + klen]).decode("utf-8", "surrogateescape")
        at += klen
        if at + vlen > len(view):
            raise ValueError(f"the frame of {key!r} runs past the body")
        yield key, bytes(view[at:at + vlen])
        at += vlen


def _backend() -> Any:
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    return s3_backends[DEFAULT_ACCOUNT_ID]["aws"]


def put(backend: Any, bucket: str, key: str, value: bytes) -> None:
    """One object, as moto keeps a PUT from boto3 (1.36 on, which sends a CRC32): with
    that checksum, which a GET asking for checksums gets back."""
    from moto.s3.utils import compute_checksum

    made = backend.put_object(bucket, key, value,
                              checksum_value=compute_checksum(value, algorithm="CRC32").decode())
    made.checksum_algorithm = "CRC32"


class Seeding:
    """WSGI around moto's application: answers ``POST SEED_PATH + BUCKET`` by putting the
    body's objects into moto's backend (a 404 names a bucket moto does not have), and
    hands every other request to moto."""

    def __init__(self, app: Callable[..., Any]) -> None:
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        path = environ.get("PATH_INFO", "")
        if environ.get("REQUEST_METHOD") != "POST" or not path.startswith(SEED_PATH):
            return self.app(environ, start_response)
        bucket = path[len(SEED_PATH):]
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        backend = _backend()
        try:
            backend.get_bucket(bucket)
            n = 0
            for key, value in unpack(body):
                put(backend, bucket, key, value)
                n += 1
        except Exception as exc:  # noqa: BLE001 - told to the caller, who fails its test
            start_response("404 Not Found" if "Bucket" in type(exc).__name__ else "400 Bad Request",
                           [("Content-Type", "text/plain")])
            return [f"{type(exc).__name__}: {exc}".encode()]
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"%d" % n]


def seed(specs: list[str]) -> None:
    from benchlib.corpus import v2_items

    backend = _backend()
    t0 = time.monotonic()
    n = 0
    for spec in specs:
        name, grid = spec.split("=")
        rows, cols = (int(x) for x in grid.split("x"))
        backend.create_bucket(name, "us-east-1")
        for key, data in v2_items((rows, cols)):
            put(backend, name, key, data)
            n += 1
    print(f"seeded {n} keys in {time.monotonic() - t0:.1f} s", flush=True)


def _spare_moto_needless_work() -> None:
    """Two costs moto pays on every request for nothing, taken out; no answer changes.

    - Its dispatcher lists its own package directory and stats each of its ~150 entries
      (``moto.backends.list_of_moto_modules``), holding a lock: a third of a HEAD's CPU
      and nearly half of a GET's. The list cannot change while the server runs.
    - Its serializer turns each timestamp it keeps as an ISO 8601 string back into a
      datetime with dateutil's general parser: about 0.2 ms a key of every listing.
      Python's own parser reads the form moto writes; any other value still goes to
      moto's.

    With both out, the server's CPU a HEAD went from 4.7-5.7 ms to 2.4-3.3, a GET of
    100 kB from 4.8-5.3 to 2.6-3.8, a LIST of 50 keys from 22-23 to 12.6-14.4.

    Each is left alone where moto is not laid out as expected."""
    from datetime import datetime

    from moto import backends

    if callable(getattr(backends, "list_of_moto_modules", None)):
        modules = tuple(backends.list_of_moto_modules())
        backends.list_of_moto_modules = lambda: modules
    try:
        from moto.core import serialize
    except ImportError:
        return
    slow = getattr(serialize, "parse_to_aware_datetime", None)
    if slow is None:
        return

    def parse(value: Any) -> Any:
        if isinstance(value, str) and value.endswith("Z"):
            try:
                return datetime.fromisoformat(value)
            except ValueError:
                pass
        return slow(value)

    serialize.parse_to_aware_datetime = parse


def main(argv: list[str]) -> None:
    host, port, specs = argv[0], int(argv[1]), argv[2:]
    if specs:
        seed(specs)
    import os

    from moto.server import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    _spare_moto_needless_work()

    # moto's own main (python -m moto.server) with the server made here: port 0 binds one
    # the kernel picks, told on stdout, where a port found free beforehand may be taken by
    # someone's outgoing connection before moto binds it
    app = DomainDispatcherApplication(create_backend_app)
    app.debug = True  # as moto's main has it
    server = make_server(host, port, Seeding(app), threaded=True)
    os.environ["MOTO_PORT"] = str(server.port)  # as moto's main sets it: its URLs name it
    print("ready", server.port, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
