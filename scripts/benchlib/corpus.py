"""The benchmark's corpus: one big Zarr v3 array, two Zarr v2 groups of many small keys, zips.

Layout under WORK/corpus:
  big/           Zarr v3 group; big/arr is an int32 array with 1 MiB blosc-zstd chunks
  keys-small/    Zarr v2 group; keys-small/a holds N_SMALL tiny chunks ("/" separator)
  keys-large/    the same with N_LARGE chunks
  zip/<name>.zip each of the above, made with `zip -0 -r` from inside the store
A manifest records the parameters, so an unchanged corpus is reused.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .procs import log

CHUNK_ROWS, COLS = 256, 1024  # int32 -> 256*1024*4 = 1 MiB per chunk
BIG_ARRAY = "arr"
SMALL_ARRAY = "a"
STORES = ("big", "keys-small", "keys-large")


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


def params(size_bytes: int, tiny: bool) -> Params:
    if tiny:
        return Params(size_bytes, (10, 10), (20, 50))  # 100 and 1,000 keys
    return Params(size_bytes, (40, 50), (200, 100))  # 2,000 and 20,000 keys


@dataclass
class Corpus:
    root: Path
    params: Params

    def store(self, name: str) -> Path:
        return self.root / name

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
