"""The benchmark's corpus: one big Zarr v3 array, two Zarr v2 groups of many small keys, zips.

Layout under WORK/corpus:
  big/           Zarr v3 group; big/arr is an int32 array with 1 MiB blosc-zstd chunks
  keys-small/    Zarr v2 group; keys-small/a holds N_SMALL tiny chunks ("/" separator)
  keys-large/    the same with N_LARGE chunks
  zip/<name>.zip each of the above, made with `zip -0 -r` from inside the store
A manifest records the parameters, so an unchanged corpus is reused.

The many-key stores of the big-key rows live apart, under WORK/corpus-keys/<name>, each with
its own manifest (a 1,000,000-key store outlives a change of --size). They are written by
a plain loop (see v2_items), not by zarr-python key by key, and the same items seed the
S3 bucket of the same name.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .procs import log

CHUNK_ROWS, COLS = 256, 1024  # int32 -> 256*1024*4 = 1 MiB per chunk
BIG_ARRAY = "arr"
SMALL_ARRAY = "a"
STORES = ("big", "keys-small", "keys-large")
KEYS_IDLE = "keys-idle"  # a 4-key store: the daemon's idle RSS after the same first listing
KEYS_DIR = "keys-dir"  # the big-key directory store
KEYS_S3 = "keys-s3"  # the big-key bucket (only in moto, never on disk)
KEY_CHUNK = (8, 8)  # int32, uncompressed: 256 bytes per chunk key


@dataclass(frozen=True)
class Params:
    size_bytes: int
    small_grid: tuple[int, int]
    large_grid: tuple[int, int]
    version: int = 2

    @property
    def n_small(self) -> int:
        return self.small_grid[0] * self.small_grid[1]

    @property
    def n_large(self) -> int:
        return self.large_grid[0] * self.large_grid[1]


#: the big decoded array's size: scripts/bench's and the floors' default, and --tiny's
DEFAULT_SIZE, TINY_SIZE = "256M", "8M"


def params_for(size: str | None, tiny: bool) -> Params:
    """The corpus of a --size (None: the default, which --tiny makes small) and --tiny."""
    from zvfs.options import parse_size

    return params(parse_size(size or (TINY_SIZE if tiny else DEFAULT_SIZE)), tiny)


def params(size_bytes: int, tiny: bool) -> Params:
    if tiny:
        return Params(size_bytes, (10, 10), (10, 40))  # 100 and 400 keys
    return Params(size_bytes, (40, 50), (200, 100))  # 2,000 and 20,000 keys


def key_grid(n: int) -> tuple[int, int]:
    """The chunk grid of an ``n``-key store: rows of 500 keys (50 below 10,000 keys)."""
    cols = 50 if n < 10_000 else 500
    return max(1, n // cols), cols


def key_grids(n_dir: int, n_s3: int) -> dict[str, tuple[int, int]]:
    """Chunk grids of the big-key rows' stores (scripts/bench --keys: 1,000,000 keys on disk
    and 200,000 in S3; --tiny: 2,000 and 400), and the 4-key store that gives the idle
    RSS."""
    return {KEYS_DIR: key_grid(n_dir), KEYS_S3: key_grid(n_s3), KEYS_IDLE: (2, 2)}


def v2_items(grid: tuple[int, int]) -> Iterator[tuple[str, bytes]]:
    """(key, bytes) of a Zarr v2 group holding one int32 array ``a`` of ``grid`` chunks
    (uncompressed, "/" separator), chunk (i, j) filled with i * grid[1] + j: a real store
    that zarr-python reads, made a thousand times faster than by writing it through zarr."""
    rows, cols = grid
    yield ".zgroup", json.dumps({"zarr_format": 2}).encode()
    yield f"{SMALL_ARRAY}/.zarray", json.dumps({
        "shape": [rows * KEY_CHUNK[0], cols * KEY_CHUNK[1]], "chunks": list(KEY_CHUNK),
        "dtype": "<i4", "fill_value": 0, "order": "C", "filters": None,
        "dimension_separator": "/", "compressor": None, "zarr_format": 2}).encode()
    n = KEY_CHUNK[0] * KEY_CHUNK[1]
    for i in range(rows):
        for j in range(cols):
            yield f"{SMALL_ARRAY}/{i}/{j}", (i * cols + j).to_bytes(4, "little", signed=True) * n


def n_items(grid: tuple[int, int]) -> int:
    """How many keys v2_items(grid) yields (chunks and the two metadata keys)."""
    return grid[0] * grid[1] + 2


def build_keys(work: Path, name: str, grid: tuple[int, int]) -> tuple[Path, float]:
    """The directory store ``name`` of ``grid`` chunk keys, reused when its manifest matches:
    (path, seconds spent writing it, 0 when reused)."""
    root = work / "corpus-keys" / name
    manifest = root.with_name(name + ".json")
    want = json.dumps({"grid": list(grid), "chunk": list(KEY_CHUNK), "version": 1})
    if manifest.exists() and manifest.read_text() == want and root.is_dir():
        return root, 0.0
    manifest.unlink(missing_ok=True)
    if root.exists():
        shutil.rmtree(root)
    log(f"writing {grid[0] * grid[1]:,} chunk keys to {root}")
    t0 = time.monotonic()
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    cur, dfd = None, -1
    try:
        for key, data in v2_items(grid):  # keys come directory by directory
            parent, _, leaf = key.rpartition("/")
            if parent != cur:  # open each directory once: no path walk per file
                if dfd >= 0:
                    os.close(dfd)
                    dfd = -1
                os.makedirs(root / parent, exist_ok=True)
                dfd, cur = os.open(root / parent, os.O_RDONLY | os.O_DIRECTORY), parent
            fd = os.open(leaf, flags, 0o644, dir_fd=dfd)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
    finally:
        if dfd >= 0:
            os.close(dfd)
    took = time.monotonic() - t0
    manifest.write_text(want)
    log(f"wrote {grid[0] * grid[1]:,} chunk keys in {took:.1f}s")
    return root, took


@dataclass
class Corpus:
    root: Path
    params: Params
    extra: dict[str, Path] = field(default_factory=dict)  # stores kept outside root

    def store(self, name: str) -> Path:
        return self.extra.get(name) or self.root / name

    def zip(self, name: str) -> Path:
        return self.root / "zip" / f"{name}.zip"

    def files(self, name: str) -> list[tuple[str, int]]:
        """(relative path, size) of every file of a store, in a stable order."""
        base = self.store(name)
        out = []
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames.sort()
            for fn in sorted(filenames):
                p = Path(dirpath) / fn
                out.append((str(p.relative_to(base)), p.stat().st_size))
        return out

    @property
    def big_shape(self) -> tuple[int, int]:
        rows = max(CHUNK_ROWS, self.params.size_bytes // (COLS * 4) // CHUNK_ROWS * CHUNK_ROWS)
        return (rows, COLS)

    @property
    def big_nbytes(self) -> int:
        r, c = self.big_shape
        return r * c * 4


def _write_big(path: Path, shape: tuple[int, int]) -> None:
    import zarr
    from zarr.codecs import BloscCodec

    root = zarr.open_group(str(path), mode="w", zarr_format=3)
    arr = root.create_array(
        BIG_ARRAY, shape=shape, chunks=(CHUNK_ROWS, COLS), dtype="int32",
        compressors=[BloscCodec(cname="zstd", clevel=3, shuffle="shuffle")], fill_value=0,
        dimension_names=["y", "x"])
    rng = np.random.default_rng(0)
    step = CHUNK_ROWS * 32
    for r0 in range(0, shape[0], step):
        r1 = min(shape[0], r0 + step)
        # a smooth ramp plus 12 bits of noise: compresses to about half, like real data
        base = (np.arange(r0, r1, dtype=np.int32)[:, None] * 7 + np.arange(COLS, dtype=np.int32))
        arr[r0:r1] = base + rng.integers(0, 1 << 12, size=(r1 - r0, COLS), dtype=np.int32)


def _write_keys(path: Path, grid: tuple[int, int]) -> None:
    import zarr

    root = zarr.open_group(str(path), mode="w", zarr_format=2)
    arr = root.create_array(
        SMALL_ARRAY, shape=(grid[0] * 8, grid[1] * 8), chunks=(8, 8), dtype="int32",
        chunk_key_encoding={"name": "v2", "separator": "/"}, fill_value=0)
    rng = np.random.default_rng(1)
    arr[:] = rng.integers(1, 1000, size=arr.shape, dtype=np.int32)


def _zip(store: Path, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():
        out.unlink()
    subprocess.run(["zip", "-0", "-r", "-q", str(out), "."], cwd=store, check=True)


def build(work: Path, p: Params) -> Corpus:
    root = work / "corpus"
    manifest = root / "manifest.json"
    c = Corpus(root, p)
    want = json.dumps(asdict(p), sort_keys=True)
    if manifest.exists() and manifest.read_text() == want and all(
            c.zip(n).exists() for n in STORES):
        log(f"reusing corpus in {root}")
        return c
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    log(f"writing corpus to {root}: big array {c.big_nbytes / 2**20:.0f} MiB, "
        f"{p.n_small} and {p.n_large} small keys")
    _write_big(c.store("big"), c.big_shape)
    _write_keys(c.store("keys-small"), p.small_grid)
    _write_keys(c.store("keys-large"), p.large_grid)
    for n in STORES:
        _zip(c.store(n), c.zip(n))
    manifest.write_text(want)
    return c
