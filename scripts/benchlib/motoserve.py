"""moto's S3 server, with buckets seeded in-process before it starts serving.

  motoserve.py HOST PORT [BUCKET=ROWSxCOLS ...]

Each BUCKET gets the keys of corpus.v2_items((ROWS, COLS)), put straight into moto's
backend (the same objects a PUT makes) and not over HTTP: moto serves about 200 PUTs a
second here, so 200,000 keys would take a quarter of an hour to upload, against seconds
this way. Then it runs ``moto.server.main``, the server ``python -m moto.server`` runs.
Prints "seeded N keys in S s" before serving.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def seed(specs: list[str]) -> None:
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    from benchlib.corpus import v2_items

    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    t0 = time.monotonic()
    n = 0
    for spec in specs:
        name, grid = spec.split("=")
        rows, cols = (int(x) for x in grid.split("x"))
        backend.create_bucket(name, "us-east-1")
        for key, data in v2_items((rows, cols)):
            backend.put_object(name, key, data)
            n += 1
    print(f"seeded {n} keys in {time.monotonic() - t0:.1f} s", flush=True)


def main(argv: list[str]) -> None:
    host, port, specs = argv[0], argv[1], argv[2:]
    if specs:
        seed(specs)
    from moto.server import main as moto_main

    moto_main(["-H", host, "-p", port])


if __name__ == "__main__":
    main(sys.argv[1:])
