"""Read-ahead through real mounts: it must fetch what readers use next, once, and change no byte."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import zarr
from conftest import run, store_files, tool


def _stats(mnt: Path) -> dict:
    return json.loads((mnt / ".zvfs" / "stats.json").read_text())


def _files_in_find_order(root: Path) -> list[Path]:
    """The order find(1) meets the files: readdir order, descending into directories in place."""
    out = run([tool("find"), root, "-type", "f"], check=True).stdout.splitlines()
    return [Path(p) for p in out]


def test_tree_walk_is_fetched_ahead_once(mount, moto, s3_env, zarr_s3, zarr_dir):
    m = mount(zarr_s3, "--endpoint-url", moto.endpoint, env=s3_env)
    files = _files_in_find_order(m.path)
    ref = store_files(zarr_dir)
    assert len(files) == len(ref)
    for p in files:
        assert p.read_bytes() == ref[p.relative_to(m.path).as_posix()].read_bytes(), p
    s = _stats(m.path)
    assert s["prefetch_hits"] > len(files) // 2, s
    # every object fetched once: ahead of the reader or by it, never both
    blocks = sum(-(-p.stat().st_size // (4 << 20)) or 0 for p in files)
    assert s["store_requests"] <= blocks + 1, s


def test_a_reader_going_backwards_gets_no_read_ahead(mount, moto, s3_env, zarr_s3, zarr_dir):
    m = mount(zarr_s3, "--endpoint-url", moto.endpoint, env=s3_env)
    files = _files_in_find_order(m.path)
    ref = store_files(zarr_dir)
    for p in reversed(files):
        assert p.read_bytes() == ref[p.relative_to(m.path).as_posix()].read_bytes(), p
    assert _stats(m.path).get("prefetch_requests", 0) == 0


def test_decoded_sequential_read_is_decoded_ahead(mount, tmp_path):
    src = tmp_path / "seq.zarr"
    a = zarr.create_array(str(src), shape=(64, 4096), chunks=(4, 4096), dtype="float64")
    ref = np.random.default_rng(9).standard_normal((64, 4096))
    a[:] = ref
    m = mount(src)
    raw = m.path / ".zvfs" / "arrays" / "data.raw"
    with open(raw, "rb", buffering=0) as f:
        got = b"".join(iter(lambda: f.read(1 << 17), b""))
    assert got == ref.tobytes()
    s = _stats(m.path)
    assert s["prefetch_hits"] > 0 and s["chunks_decoded"] == 16, s


def test_concurrent_readers_of_one_decoded_file_each_get_their_bytes(mount, tmp_path):
    """Three opens of one data.raw read it at once, forwards, backwards and at random:
    every byte is zarr-python's, and the forward reader is read ahead although the
    others seek all the time (each open has its own read-ahead)."""
    import random
    import threading

    src = tmp_path / "conc.zarr"
    a = zarr.create_array(str(src), shape=(256, 8192), chunks=(8, 8192), dtype="<i4")
    a[:] = np.random.default_rng(3).integers(-(2**31), 2**31 - 1, size=(256, 8192), dtype="<i4")
    ref = zarr.open_array(str(src), mode="r")[:].tobytes()
    m = mount(src)
    raw = m.path / ".zvfs" / "arrays" / "data.raw"
    step = 1 << 17
    offsets = {
        "forward": list(range(0, len(ref), step)),
        "backward": list(reversed(range(0, len(ref), step))),
        "random": random.Random(5).sample(range(0, len(ref), step // 2), 64),
    }
    errors: list[str] = []

    def reader(name: str) -> None:
        with open(raw, "rb", buffering=0) as f:
            for off in offsets[name]:
                f.seek(off)
                got = f.read(step)
                if got != ref[off : off + step]:
                    errors.append(f"{name}: wrong bytes at {off}")
                    return

    threads = [threading.Thread(target=reader, args=(n,)) for n in offsets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    s = _stats(m.path)
    assert s["prefetch_hits"] > 0, s
