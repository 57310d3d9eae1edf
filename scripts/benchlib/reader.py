"""Workload processes, run as children so a hung mount can be ended without hanging the bench.

  reader.py files LISTFILE NREADERS        read every listed file (path<TAB>size lines)
  reader.py zarr STORE ARRAY_PATH N        zarr.open_array(...)[:] N times in one process
                                           (STORE: a directory, or a .zip read by ZipStore)
  reader.py zarrs STORE ARRAY_PATH N       the same with the zarrs codec pipeline (strict:
                                           an unsupported case fails, never falls back)
  reader.py tensorstore SPEC_JSON N        tensorstore .read() of the whole array N times
  reader.py xarray KIND PATH VAR N         xarray .load() of one variable N times: KIND zarr
                                           (open_zarr(PATH)) or netcdf (open_dataset(PATH))

Each prints one JSON line: {"bytes": ..., "seconds": [...], "errors": [...]}; only the
reads themselves are timed, not the interpreter's start or the imports.
"""

from __future__ import annotations

import json
import queue
import sys
import threading
import time

BUF = 1 << 20


def read_files(listfile: str, nreaders: int) -> dict:
    items = []
    with open(listfile) as f:
        for line in f:
            path, size = line.rstrip("\n").rsplit("\t", 1)
            items.append((path, int(size)))
    q: queue.SimpleQueue = queue.SimpleQueue()
    for it in items:
        q.put(it)
    total = [0]
    errors: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        buf = bytearray(BUF)
        view = memoryview(buf)
        got = 0
        while True:
            try:
                path, size = q.get_nowait()
            except queue.Empty:
                break
            n = 0
            try:
                with open(path, "rb", buffering=0) as fh:
                    while True:
                        k = fh.readinto(view)
                        if not k:
                            break
                        n += k
            except OSError as e:
                with lock:
                    errors.append(f"{path}: {e}")
            if n != size:
                with lock:
                    errors.append(f"{path}: read {n} bytes, expected {size}")
            got += n
        with lock:
            total[0] += got

    threads = [threading.Thread(target=worker) for _ in range(nreaders)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dt = time.perf_counter() - t0
    return {"bytes": total[0], "seconds": [dt], "errors": errors[:5], "nerrors": len(errors)}


def read_zarr(store: str, path: str, repeat: int, zarrs: bool = False) -> dict:
    import zarr

    if zarrs:
        import zarrs as _zarrs  # noqa: F401  (fails here, not later, when it is missing)

        zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline",
                         "codec_pipeline.strict": True})
    src = zarr.storage.ZipStore(store, mode="r") if store.endswith(".zip") else store
    times, nbytes = [], 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        a = zarr.open_array(src, path=path, mode="r")
        pipeline = getattr(getattr(a, "_async_array", None), "codec_pipeline", None)
        if zarrs and pipeline is not None and not type(pipeline).__module__.startswith("zarrs"):
            raise SystemExit(f"the zarrs pipeline is not in use: {type(pipeline)}")
        data = a[:]
        times.append(time.perf_counter() - t0)
        nbytes = data.nbytes
        del data
    return {"bytes": nbytes, "seconds": times, "errors": []}


def read_tensorstore(spec: str, repeat: int) -> dict:
    import tensorstore as ts

    times, nbytes = [], 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        arr = ts.open(json.loads(spec), read=True).result()
        data = arr.read().result()
        times.append(time.perf_counter() - t0)
        nbytes = data.nbytes
        del data
    return {"bytes": nbytes, "seconds": times, "errors": []}


def read_xarray(kind: str, path: str, var: str, repeat: int) -> dict:
    import warnings

    import xarray as xr

    warnings.simplefilter("ignore")
    times, nbytes = [], 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        ds = xr.open_zarr(path) if kind == "zarr" else xr.open_dataset(path, engine="netcdf4")
        with ds:
            data = ds[var].load().values
        times.append(time.perf_counter() - t0)
        nbytes = data.nbytes
        del data
    return {"bytes": nbytes, "seconds": times, "errors": []}


def main(argv: list[str]) -> None:
    cmd = argv[0]
    if cmd == "files":
        out = read_files(argv[1], int(argv[2]))
    elif cmd in ("zarr", "zarrs"):
        out = read_zarr(argv[1], argv[2], int(argv[3]), zarrs=cmd == "zarrs")
    elif cmd == "tensorstore":
        out = read_tensorstore(argv[1], int(argv[2]))
    elif cmd == "xarray":
        out = read_xarray(argv[1], argv[2], argv[3], int(argv[4]))
    else:
        raise SystemExit(f"unknown workload {cmd}")
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
