"""moto's S3 server, with buckets seeded in-process before it starts serving.

  motoserve.py HOST PORT [BUCKET=ROWSxCOLS ...]   (PORT 0: any free one)

Each BUCKET gets the keys of corpus.v2_items((ROWS, COLS)), put straight into moto's
backend (the same objects a PUT makes) and not over HTTP: moto serves about 200 PUTs a
second here, so 200,000 keys would take a quarter of an hour to upload, against seconds
this way. Then it serves the application ``python -m moto.server`` serves.
Prints "seeded N keys in S s", then "ready PORT" once listening.
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
    host, port, specs = argv[0], int(argv[1]), argv[2:]
    if specs:
        seed(specs)
    import os

    from moto.server import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    # moto's own main (python -m moto.server) with the server made here: port 0 binds one
    # the kernel picks, told on stdout, where a port found free beforehand may be taken by
    # someone's outgoing connection before moto binds it
    app = DomainDispatcherApplication(create_backend_app)
    app.debug = True  # as moto's main has it
    server = make_server(host, port, app, threaded=True)
    os.environ["MOTO_PORT"] = str(server.port)  # as moto's main sets it: its URLs name it
    print("ready", server.port, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
