"""Read-ahead through real mounts: it must fetch what readers use next, once, and change no byte."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import zarr
from conftest import store_files


def _stats(mnt: Path) -> dict:
    return json.loads((mnt / ".zvfs" / "stats.json").read_text())


def _files_in_find_order(root: Path) -> list[Path]:
    out = []
    for dirpath, dirs, files in os.walk(root):
        dirs.sort()
        out.extend(Path(dirpath) / f for f in sorted(files))
    return out


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


def test_a_random_reader_gets_no_read_ahead(mount, moto, s3_env, zarr_s3, zarr_dir):
    m = mount(zarr_s3, "--endpoint-url", moto.endpoint, env=s3_env)
    files = _files_in_find_order(m.path)
    rng = np.random.default_rng(5)
    for i in rng.permutation(len(files))[:10]:
        files[i].read_bytes()
    assert _stats(m.path).get("prefetch_requests", 0) <= 8


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
