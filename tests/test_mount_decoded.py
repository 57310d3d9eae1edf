"""Decoded views (issue 3) through real mounts of every backend, against the reference library.

The corpus is one directory tree holding
  * every store of the committed reference corpus (tests/fixtures/zarr, manifest.json),
    whose reference is the ``.npy`` the writing library produced, and
  * ``gen/``, written here with zarr-python 3 (v2 and v3; blosc, zstd, gzip; sharding
    with the index at the end and at the start; big-endian; F order; edge and missing
    chunks; 0-d; bool; complex), whose reference is zarr-python reading that directory.

That tree is mounted once per backend for the whole session: the directory itself, a
zip written by zarr-python's ZipStore, one written by the ``zip`` command, and an S3
copy in moto. For every array and every backend, data.npy, data.raw (random reads)
and every file under chunks/ must equal the reference byte for byte; sizes must come
from metadata alone; netCDF's ncdump and GDAL read the uncompressed v2 mirror; and bad
input fails one read cleanly, with one log line, while the rest keeps working.
"""

from __future__ import annotations

import errno
import json
import math
import os
import random
import re
import shutil
import stat
import struct
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    Mounted,
    daemon_pids,
    drop_page_cache,
    is_mounted,
    numcodecs_filter_cases,
    run,
    s3_client,
    tool,
    upload_tree,
    wait_until,
    write_arrays,
    write_numcodecs_filter_array,
    zip_with_cmd,
    zip_with_zarr,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "zarr"
MANIFEST = FIXTURES / "manifest.json"
BACKENDS = ["dir", "zip-zarrpy", "zip-cmd", "s3"]
BUCKET = "zvfs-decoded"


# --------------------------------------------------------------------------- the corpus


@dataclass(frozen=True)
class Case:
    """One array of the corpus: where it is below the corpus root, and how to get its reference."""

    path: str  # below the corpus root (= below MNT/.zvfs/arrays and MNT/.zvfs/v2)
    store: str  # top directory of the corpus
    ref_npy: str | None = None  # committed reference (fixtures)
    chunks: tuple[int, ...] | None = None  # expected decoded chunk unit (None: from meta.json)
    vlen: bool = False


def _fixture_cases() -> list[Case]:
    if not MANIFEST.is_file():
        return []
    manifest = json.loads(MANIFEST.read_text())
    cases = []
    for store, sdoc in sorted(manifest["stores"].items()):
        if store.startswith("bad"):
            continue  # bad input has its own tests below
        for apath, adoc in sorted(sdoc["arrays"].items()):
            if adoc.get("error"):
                continue
            path = f"{store}/{apath}" if apath else store
            if "ref" in adoc:
                cases.append(Case(path, store, adoc["ref"], tuple(adoc["chunks"])))
            elif "ref_json" in adoc:
                cases.append(Case(path, store, vlen=True))
    return cases


def _gen_specs() -> dict[str, dict]:
    """``gen/`` arrays: path -> how zarr-python writes it (declared = dtype the views must serve)."""
    from zarr.codecs import BloscCodec, BytesCodec, GzipCodec, ShardingCodec, ZstdCodec

    blosc = BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")
    s = {
        # v3
        "v3/blosc_f4": dict(fmt=3, shape=(37, 23), chunks=(8, 5), dtype="<f4",
                            compressors=[blosc], dimension_names=["y", "x"]),
        "v3/zstd_be_i4": dict(fmt=3, shape=(31, 17), chunks=(10, 6), dtype=">i4",
                              serializer=BytesCodec(endian="big"), compressors=[ZstdCodec(level=3)]),
        "v3/gzip_missing_f8": dict(fmt=3, shape=(20, 20), chunks=(6, 6), dtype="<f8",
                                   compressors=[GzipCodec(level=5)], fill_value=-9999.5,
                                   write=[(slice(0, 6), slice(0, 6)), (slice(12, 20), slice(7, 13))]),
        "v3/shard_end_i2": dict(fmt=3, shape=(47, 33), chunks=(5, 5), shards=(20, 15), dtype="<i2",
                                compressors=[BloscCodec(cname="zstd", clevel=3, shuffle="bitshuffle")]),
        "v3/shard_start_u2": dict(fmt=3, shape=(30, 25), chunks=(8, 10), dtype="<u2", fill_value=7,
                                  serializer=ShardingCodec(chunk_shape=(4, 5), codecs=[
                                      BytesCodec(endian="little"), ZstdCodec(level=1)],
                                      index_location="start"),
                                  compressors=None,
                                  write=[(slice(0, 8), slice(0, 10)), (slice(9, 14), slice(12, 25))]),
        "v3/shard_start_be_f8": dict(fmt=3, shape=(13, 11), chunks=(6, 6), dtype=">f8",
                                     serializer=ShardingCodec(chunk_shape=(3, 2), codecs=[
                                         BytesCodec(endian="big"), GzipCodec(level=1)],
                                         index_location="start"),
                                     compressors=None),
        # bigger than FUSE's 1 MiB max_read: np.load streams it, read-ahead kicks in
        "v3/big_shard_f8": dict(fmt=3, shape=(600, 700), chunks=(50, 64), shards=(200, 320),
                                dtype="<f8", compressors=[blosc], write=[(slice(0, 550), slice(0, 700))]),
        "v3/bool": dict(fmt=3, shape=(9, 7), chunks=(4, 4), dtype="|b1"),
        "v3/complex64": dict(fmt=3, shape=(6, 5), chunks=(4, 2), dtype="<c8", compressors=[blosc]),
        "v3/u1_3d": dict(fmt=3, shape=(5, 6, 7), chunks=(2, 4, 3), dtype="|u1"),
        "v3/scalar": dict(fmt=3, shape=(), chunks=(), dtype="<f8"),
        "v3/scalar_be_f8": dict(fmt=3, shape=(), chunks=(), dtype=">f8",
                                serializer=BytesCodec(endian="big")),
        # v2
        "v2/blosc_F_be_f8": dict(fmt=2, shape=(19, 13), chunks=(7, 5), dtype=">f8", order="F",
                                 compressors="blosc"),
        "v2/zstd_be_i8": dict(fmt=2, shape=(15, 11), chunks=(4, 4), dtype=">i8", compressors="zstd"),
        "v2/gzip_missing_u2": dict(fmt=2, shape=(16, 9), chunks=(5, 4), dtype="<u2", fill_value=3,
                                   compressors="gzip", write=[(slice(5, 10), slice(0, 4))]),
        "v2/F_3d_i4": dict(fmt=2, shape=(6, 5, 4), chunks=(4, 2, 3), dtype="<i4", order="F",
                           compressors="zstd"),
        "v2/bool": dict(fmt=2, shape=(9, 7), chunks=(4, 4), dtype="|b1", compressors="blosc"),
        "v2/complex128_be": dict(fmt=2, shape=(7, 3), chunks=(3, 2), dtype=">c16", compressors="gzip"),
        "v2/scalar_be_i2": dict(fmt=2, shape=(), chunks=(), dtype=">i2"),
        # fill_value null, as zarr-python 3 writes v2 by default: it reads NaT where unwritten
        "v2/datetime_null_fill": dict(fmt=2, shape=(7,), chunks=(3,), dtype="<M8[s]", fill_value=None,
                                      compressors="zlib", write=[(slice(0, 3),)]),
        # fixed-width text shorter than its width: the trailing NULs are bytes of the chunk
        "v2/scalar_S5": dict(fmt=2, shape=(), chunks=(), dtype="|S5"),
        "v2/scalar_U3": dict(fmt=2, shape=(), chunks=(), dtype="<U3"),
        # netCDF-friendly groups (only types netCDF-C has): v3 compressed + sharded, and v2
        "nc/temp": dict(fmt=3, shape=(12, 10), chunks=(3, 5), shards=(6, 10), dtype="<f4",
                        compressors=[blosc], dimension_names=["lat", "lon"]),
        "nc/count": dict(fmt=3, shape=(12,), chunks=(5,), dtype="<i4", compressors=[ZstdCodec(level=1)],
                         dimension_names=["lat"]),
        "nc/noname": dict(fmt=3, shape=(5, 7), chunks=(2, 3), dtype="<f8", compressors=[GzipCodec()]),
        "nc/be_start": dict(fmt=3, shape=(4, 12), chunks=(4, 6), dtype=">u2",
                            serializer=ShardingCodec(chunk_shape=(2, 3), codecs=[
                                BytesCodec(endian="big"), ZstdCodec(level=1)], index_location="start"),
                            compressors=None, dimension_names=["t", "lat"]),
        # one dimension name, two sizes (v3 allows it): the mirror must keep every value;
        # "n_5", the name r's n of size 5 would be renamed to, is o's own name of size 4
        # (the rename took it, and netCDF-C read r cut to 4 values, silently)
        "nc3/o": dict(fmt=3, shape=(4,), chunks=(3,), dtype="<i2", dimension_names=["n_5"]),
        "nc3/p": dict(fmt=3, shape=(3,), chunks=(2,), dtype="<i2", dimension_names=["n"]),
        "nc3/r": dict(fmt=3, shape=(5,), chunks=(2,), dtype="<i2", dimension_names=["n"]),
        "nc3/sub/q": dict(fmt=3, shape=(5, 3), chunks=(2, 2), dtype="<f8", dimension_names=["n", "m"],
                          compressors=[ZstdCodec(level=1)]),
        "nc2/a": dict(fmt=2, shape=(9, 8), chunks=(4, 3), dtype=">f8", order="F", compressors="blosc",
                      dimension_names=["row", "col"]),
        "nc2/b": dict(fmt=2, shape=(9,), chunks=(4,), dtype="<i2", compressors="zlib", fill_value=-1,
                      dimension_names=["row"], write=[(slice(0, 4),)]),
    }
    return s


def _sample(dtype: np.dtype, shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = math.prod(shape)
    if dtype.kind in "SU":  # shorter than the width, so trailing NULs are part of the data
        return np.array([f"v{i}" for i in rng.integers(0, 9, n)], dtype=dtype).reshape(shape)
    if dtype.kind == "b":
        a = rng.integers(0, 2, n).astype(bool)
    elif dtype.kind == "M":
        a = rng.integers(-(2**40), 2**40, n).astype(dtype)
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        a = rng.integers(max(info.min, -30000), min(info.max, 60000), n, endpoint=True).astype(dtype)
    elif dtype.kind == "c":
        a = (rng.standard_normal(n) * 100 + 1j * rng.standard_normal(n) * 100).astype(dtype)
    else:
        a = (rng.standard_normal(n) * 100).astype(dtype)
    return a.reshape(shape)


def _v2_compressor(name: str):
    import numcodecs

    return {
        "blosc": numcodecs.Blosc(cname="zstd", clevel=3, shuffle=numcodecs.Blosc.BITSHUFFLE),
        "zstd": numcodecs.Zstd(level=3),
        "gzip": numcodecs.GZip(level=4),
        "zlib": numcodecs.Zlib(level=4),
    }[name]


def build_gen_corpus(root: Path) -> dict[str, tuple[np.ndarray, np.dtype]]:
    """Write ``gen/`` with zarr-python 3; return path -> (zarr-python's read of it, declared dtype)."""
    import zarr

    store = zarr.storage.LocalStore(str(root))
    zarr.open_group(store, mode="w", zarr_format=3, attributes={"title": "zvfs decoded corpus"})
    specs = _gen_specs()
    groups = sorted({p.rsplit("/", 1)[0] for p in specs})
    for g in groups:
        fmt = specs[next(p for p in specs if p.startswith(g + "/"))]["fmt"]
        zarr.open_group(store, path=g, mode="a", zarr_format=fmt, attributes={"group": g})
    made = {}
    for path, spec in specs.items():
        spec = dict(spec)
        comp = spec.get("compressors")
        if spec["fmt"] == 2 and isinstance(comp, str):
            spec["compressors"] = _v2_compressor(comp)
        if spec["fmt"] == 2 and "dimension_names" in spec:  # v2 spells them as xarray does
            spec["attributes"] = {"_ARRAY_DIMENSIONS": spec.pop("dimension_names")}
        made[path] = spec
    write_arrays(store, made, _sample)
    refs = {}
    for path in specs:
        arr = zarr.open_array(store, path=path, mode="r")
        ref = np.asarray(arr[...])
        if ref.ndim == 0 and ref.dtype.kind in "SU":  # a 0-d read is a numpy scalar, which
            ref = ref.astype(arr.dtype)  # trims its trailing NULs: padded back, nothing lost
        refs[path] = (ref, np.dtype(specs[path]["dtype"]), arr.metadata.fill_value)
    return refs


FIXTURE_CASES = _fixture_cases()
GEN_CASES = [Case(f"gen/{p}", "gen") for p in sorted(_gen_specs())]
CASES = FIXTURE_CASES + GEN_CASES


@dataclass
class Corpus:
    root: Path
    refs: dict[str, np.ndarray]  # case path -> reference in the declared dtype and byte order
    fills: dict[str, object]  # case path -> fill value as zarr-python reads it (gen/ only)

    def ref(self, case: Case) -> np.ndarray:
        return self.refs[case.path]


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Corpus:
    root = tmp_path_factory.mktemp("decoded") / "corpus"
    root.mkdir()
    refs: dict[str, np.ndarray] = {}
    for store in sorted({c.store for c in FIXTURE_CASES}):
        shutil.copytree(FIXTURES / store, root / store)
    for c in FIXTURE_CASES:
        if c.ref_npy:
            refs[c.path] = np.load(FIXTURES / c.ref_npy)
    fills: dict[str, object] = {}
    for path, (ref, declared, fill) in build_gen_corpus(root / "gen").items():
        assert ref.dtype == declared or ref.dtype == declared.newbyteorder("="), (path, ref.dtype)
        refs[f"gen/{path}"] = ref.astype(declared)
        fills[f"gen/{path}"] = fill
    return Corpus(root, refs, fills)


@dataclass
class Backend:
    name: str
    mnt: Mounted

    @property
    def arrays(self) -> Path:
        return self.mnt.path / ".zvfs" / "arrays"

    @property
    def v2(self) -> Path:
        return self.mnt.path / ".zvfs" / "v2"


def _source(name: str, corpus: Corpus, request) -> tuple[str, list[str], dict | None]:
    """(SOURCE, extra mount flags, env) of the corpus for one backend."""
    if name == "dir":
        return str(corpus.root), [], None
    zips = corpus.root.parent
    if name == "zip-zarrpy":
        dest = zips / "corpus-zarrpy.zip"
        if not dest.exists():
            zip_with_zarr(corpus.root, dest)
        return str(dest), [], None
    if name == "zip-cmd":
        dest = zips / "corpus-cmd.zip"
        if not dest.exists():
            zip_with_cmd(corpus.root, dest)
        return str(dest), [], None
    moto = request.getfixturevalue("moto")
    env = request.getfixturevalue("s3_env")
    client = s3_client(moto.endpoint)
    existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
    if BUCKET not in existing:
        client.create_bucket(Bucket=BUCKET)
        upload_tree(client, corpus.root, BUCKET, "corpus")
    return f"s3://{BUCKET}/corpus", ["--endpoint-url", moto.endpoint], env


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request, corpus, session_mount) -> Backend:
    """The corpus mounted through one backend, once per session."""
    source, extra, env = _source(request.param, corpus, request)
    m = session_mount(source, *extra, env=env)
    return Backend(request.param, m)


# --------------------------------------------------------------------------- helpers


def read_range(path: Path, offset: int, length: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(length)


def chunk_region(idx: tuple[int, ...], chunks: list[int]) -> tuple[slice, ...]:
    return tuple(slice(i * c, (i + 1) * c) for i, c in zip(idx, chunks, strict=True))


def stats(mnt: Mounted) -> dict:
    return json.loads((mnt.path / ".zvfs" / "stats.json").read_text())


def json_fill(value, dtype: np.dtype):
    """A Zarr-style JSON fill value ("NaN", [re, im], ...) as a numpy scalar of ``dtype``."""
    special = {"NaN": np.nan, "Infinity": np.inf, "-Infinity": -np.inf}
    if dtype.kind == "c":
        re_, im = (special.get(v, v) for v in value)
        return dtype.type(complex(re_, im))
    return dtype.type(special.get(value, value))


def same_value(a, b) -> bool:
    return bool(a == b) or bool(np.isnan(a) and np.isnan(b)) if np.asarray(a).dtype.kind in "fc" \
        else bool(a == b)


def fill_matches(meta_fill, ref: np.ndarray, want=None) -> None:
    """meta.json's fill value is a Zarr-style JSON scalar of the array's type (and == ``want``)."""
    if want is not None:
        assert meta_fill is not None
        assert same_value(json_fill(meta_fill, ref.dtype), ref.dtype.type(want)), (meta_fill, want)
    if meta_fill is None:
        return
    if ref.dtype.kind == "f":
        assert meta_fill in ("NaN", "Infinity", "-Infinity") or isinstance(meta_fill, int | float)
    elif ref.dtype.kind == "c":
        assert isinstance(meta_fill, list) and len(meta_fill) == 2
    elif ref.dtype.kind == "b":
        assert isinstance(meta_fill, bool)
    elif ref.dtype.kind in "iu":
        assert isinstance(meta_fill, int) and not isinstance(meta_fill, bool)


# --------------------------------------------------------------------------- 1. arrays/


def vlen_reference(case: Case) -> tuple[str, np.ndarray]:
    """A variable-length array's kind and zarr-python's values (committed as JSON)."""
    info = json.loads(MANIFEST.read_text())["stores"][case.store]["arrays"][case.path[len(case.store) + 1 :]]
    ref = json.loads((FIXTURES / info["ref_json"]).read_text())
    return info["vlen"], np.array(ref["values"], dtype=object).reshape(ref["shape"])


def assert_vlen_views(base: Path, meta: dict, case: Case) -> None:
    """Variable-length text: data.npy is zarr-python's values as fixed-width Unicode, as
    wide as the longest, and data.raw its bytes (no chunks/, no ENVI header). Bytes values
    have no data files (fixed width would lose their trailing NULs)."""
    kind, values = vlen_reference(case)
    assert meta["vlen"] == kind, meta
    if kind != "vlen-utf8":
        assert sorted(os.listdir(base)) == ["meta.json"]
        return
    assert sorted(os.listdir(base)) == ["data.npy", "data.raw", "meta.json"]
    got = np.load(base / "data.npy")
    width = max(1, max(map(len, values.reshape(-1).tolist())))
    assert got.dtype == np.dtype(f"<U{width}") and got.shape == values.shape
    assert got.tolist() == values.tolist()
    assert (base / "data.raw").read_bytes() == got.tobytes()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.path)
def test_array_views(backend: Backend, corpus: Corpus, case: Case) -> None:
    """meta.json, data.npy, data.raw at random ranges, and every chunks/ file equal the reference."""
    base = backend.arrays / case.path
    meta = json.loads((base / "meta.json").read_text())
    assert meta["error"] is None, meta["error"]
    if case.vlen:
        assert_vlen_views(base, meta, case)
        return
    ref = corpus.ref(case)
    expected = ref.tobytes()
    assert meta["shape"] == list(ref.shape)
    # a structured dtype is its descr list (Zarr's spelling), any other its explicit typestr
    assert meta["dtype"] == (json.loads(json.dumps(ref.dtype.descr)) if ref.dtype.fields else ref.dtype.str)
    if case.chunks is not None:
        assert tuple(meta["chunks"]) == case.chunks
    fill_matches(meta["fill_value"], ref, corpus.fills.get(case.path))
    assert meta["nbytes"] == len(expected)

    # data.npy, memory-mapped, as a user would
    a = np.load(base / "data.npy", mmap_mode="r")
    assert a.dtype.str == ref.dtype.str and a.shape == ref.shape
    assert a.tobytes() == expected
    del a

    # data.raw: its size, the whole file, and seeded random ranges with plain open().read()
    raw = base / "data.raw"
    assert raw.stat().st_size == len(expected)
    rng = random.Random(case.path)
    n = len(expected)
    ranges = [(0, n), (max(0, n - 3), 10), (n, 5)]
    for _ in range(6):  # small reads
        off = rng.randrange(0, max(1, n))
        ranges.append((off, rng.randint(1, max(1, min(n, 3 * ref.dtype.itemsize * 17)))))
    for _ in range(2):  # large ones (several FUSE requests for big arrays)
        off = rng.randrange(0, max(1, n))
        ranges.append((off, rng.randint(1, max(1, n - off))))
    for off, length in ranges:
        assert read_range(raw, off, length) == expected[off : off + length], (off, length)

    # chunks/: one file per decoded chunk, clipped at the edges
    chunks = meta["chunks"]
    names = sorted(os.listdir(base / "chunks"))
    grid = [-(-s // c) for s, c in zip(ref.shape, chunks, strict=True)]
    assert len(names) == math.prod(grid)
    for name in names:
        idx = tuple(int(x) for x in name.split(".")) if ref.ndim else ()
        # the Ellipsis keeps a 0-d reference an array in its byte order (ref[()] is a native
        # scalar, which let a 0-d chunk file served byte-swapped pass)
        want = np.ascontiguousarray(ref[(..., *chunk_region(idx, chunks))]).tobytes()
        assert (base / "chunks" / name).read_bytes() == want, name

    # data.hdr: an ENVI header describing data.raw, for numeric 1-3-d arrays ENVI has a type for
    hdr = base / "data.hdr"
    code = ENVI_ALL.get(f"{ref.dtype.kind}{ref.dtype.itemsize}")
    if 1 <= ref.ndim <= 3 and code is not None:
        fields = dict(
            (k.strip(), v.strip()) for k, _, v in
            (ln.partition("=") for ln in hdr.read_text().splitlines()[1:]) if _
        )
        bands, lines, samples = (1,) * (3 - ref.ndim) + ref.shape
        assert (int(fields["samples"]), int(fields["lines"]), int(fields["bands"])) == (
            samples, lines, bands)
        assert int(fields["data type"]) == code and fields["interleave"] == "bsq"
        assert int(fields["byte order"]) == (1 if ref.dtype.byteorder == ">" else 0)
        assert int(fields["header offset"]) == 0
    else:
        assert not hdr.exists()

    if _has_subarray_field(ref.dtype):
        # zarr-python 3 reads no such dtype (zarr 2.18, the writer, is not installed for
        # the tests): the mirror's chunk files hold the reference's bytes, padded at the edge
        zarray = json.loads((backend.v2 / case.path / ".zarray").read_text())
        le = ref.dtype.newbyteorder("<")  # every field's too
        assert zarray["dtype"] == json.loads(json.dumps(le.descr))
        (size,), (step,) = ref.shape, zarray["chunks"]
        for i in range(-(-size // step)):
            piece = np.zeros(step, dtype=le)
            piece[: min(step, size - i * step)] = ref[i * step:(i + 1) * step]
            assert (backend.v2 / case.path / str(i)).read_bytes() == piece.tobytes(), i
        return
    # the v2 mirror, read back by zarr-python: the same values, little-endian, 0-d as [1]
    mirror = _zarr_open_mirror(backend.v2, case.path)
    got = mirror[...]
    le = ref.dtype.newbyteorder("<")  # a structured dtype's fields too (they stayed big-endian)
    assert json.loads((backend.v2 / case.path / ".zarray").read_text())["dtype"] == (
        json.loads(json.dumps(le.descr)) if le.fields else le.str)
    assert mirror.metadata.zarr_format == 2 and mirror.shape == (ref.shape or (1,))
    assert np.asarray(got).astype(le).tobytes() == ref.astype(le).tobytes()


def _has_subarray_field(dtype: np.dtype) -> bool:
    return dtype.fields is not None and any(
        sub.shape or _has_subarray_field(sub.base) for sub, *_ in dtype.fields.values())


def _zarr_open_mirror(v2: Path, path: str):
    import zarr

    return zarr.open_array(zarr.storage.LocalStore(str(v2), read_only=True), path=path, mode="r")


def test_mirror_keeps_a_fixed_width_string_fill_xarray_masks_with(mount, tmp_path) -> None:
    """A v2 array of fixed-width bytes or text, with a fill_value, as zarr-python writes it:
    xarray masks that value on the source, and the mirror's fill_value was null, so its
    values were not masked (a helper's audit). The mirror keeps the source's fill now, and
    xarray reads the same from both; a number's fill was kept already."""
    import xarray as xr
    import zarr

    root = tmp_path / "strings.zarr"
    g = zarr.open_group(str(root), mode="w", zarr_format=2)
    cases = {"s": ("S2", b"zz", [b"ab", b"zz", b"c"]), "u": ("<U2", "zz", ["ab", "zz", "c"]),
             "f": ("<f4", 9.0, [1.0, 9.0, 2.0])}
    for name, (dt, fill, values) in cases.items():
        a = g.create_array(name, shape=(3,), chunks=(3,), dtype=dt, fill_value=fill,
                           attributes={"_ARRAY_DIMENSIONS": ["x"]})
        a[:] = np.array(values, dtype=dt)
    m = mount(root)
    v2 = m.path / ".zvfs" / "v2"
    source = xr.open_zarr(str(root), consolidated=False)
    mirror = xr.open_zarr(str(v2), consolidated=True)
    for name in cases:
        assert _zarr_open_mirror(v2, name).fill_value == zarr.open_array(str(root), path=name, mode="r").fill_value
        want, got = source[name].values, mirror[name].values
        assert pd_isnull(want).tolist() == pd_isnull(got).tolist() == [False, True, False], (name, want, got)
        assert want[0] == got[0] and want[2] == got[2], (name, want, got)


def pd_isnull(values: np.ndarray) -> np.ndarray:
    """NaN where xarray masked, in an object array of strings too."""
    import pandas as pd

    return np.asarray(pd.isnull(values))


def test_root_level_stores(corpus: Corpus, session_mount) -> None:
    """Stores mounted at their own root: a root array, v2 .zmetadata and v3 consolidated metadata."""
    for case in CASES:
        if "/" in case.path or case.vlen:
            continue
        # a root array (the whole store is one array): arrays/ holds its files directly
        m = session_mount(corpus.root / case.store)
        ref = corpus.ref(case)
        assert np.load(m.path / ".zvfs/arrays/data.npy").tobytes() == ref.tobytes()
        assert json.loads((m.path / ".zvfs/v2/.zarray").read_text())["shape"] == list(ref.shape)
    for store in ("zarr2_v2.zarr", "zarr3_consolidated.zarr"):
        cases = [c for c in FIXTURE_CASES if c.store == store and not c.vlen]
        if not cases:
            continue
        m = session_mount(corpus.root / store)
        for case in cases:
            rel = case.path[len(store) + 1 :]
            got = np.load(m.path / ".zvfs/arrays" / rel / "data.npy", mmap_mode="r")
            assert got.tobytes() == corpus.ref(case).tobytes(), rel


@pytest.mark.parametrize("fmt", [2, 3])
def test_variable_length_text_reads_from_data_npy_as_zarr_python_reads_it(mount, tmp_path: Path, fmt: int) -> None:
    """zarr-python's variable-length str (v2 vlen-utf8, v3 string), written in part (the
    rest is its fill), with non-ASCII and empty values: data.npy loads as fixed-width
    Unicode as wide as the longest value's characters, each value as zarr-python reads it,
    and data.raw is its bytes, whatever the range read. A store that is one such array
    serves it at the top of arrays/. Bytes values get no data files (their trailing NULs
    would be lost to the padding)."""
    import warnings

    import zarr

    store, top = tmp_path / f"t{fmt}.zarr", tmp_path / f"root{fmt}.zarr"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = zarr.open_group(str(store), mode="w", zarr_format=fmt)
        t = g.create_array("g/text", shape=(5, 4), chunks=(2, 3), dtype=str, fill_value="–")
        t[0:2, :] = np.array([["a", "ÄÖÜ", "", "long value, with 日本語"], ["x", "y", "z", "w"]], dtype=object)
        t[4, 3] = "corner"
        b = g.create_array("blobs", shape=(3,), chunks=(2,), dtype=zarr.dtype.VariableLengthBytes())
        b[:] = np.array([b"\x01\x00", b"", b"xyz"], dtype=object)
        r = zarr.create_array(str(top), shape=(3,), chunks=(2,), dtype=str, zarr_format=fmt)
        r[:] = np.array(["only", "", "ü"], dtype=object)
        want = zarr.open_array(str(store), path="g/text", mode="r")[:]
        want_top = zarr.open_array(str(top), mode="r")[:].tolist()
    assert want[3, 0] == "–" and want[4, 3] == "corner"  # a never-written chunk: the fill
    width = max(map(len, want.reshape(-1).tolist()))
    m = mount(store)
    base = m.path / ".zvfs/arrays/g/text"
    assert sorted(os.listdir(base)) == ["data.npy", "data.raw", "meta.json"]
    a = np.load(base / "data.npy", mmap_mode="r")
    assert a.dtype == np.dtype(f"<U{width}") and a.shape == (5, 4)
    assert a.tolist() == want.tolist()
    expected = np.asarray(want.tolist(), dtype=f"<U{width}").tobytes()
    raw = base / "data.raw"
    assert raw.stat().st_size == len(expected) == 5 * 4 * 4 * width
    rng = random.Random(fmt)
    for _ in range(12):  # ranges that start and end inside values and chunks
        off = rng.randrange(len(expected))
        n = rng.randint(1, len(expected) - off)
        assert read_range(raw, off, n) == expected[off : off + n], (off, n)
    assert os.listdir(m.path / ".zvfs/arrays/blobs") == ["meta.json"]
    top_mount = mount(top)
    assert np.load(top_mount.path / ".zvfs/arrays/data.npy").tolist() == want_top


def test_sharded_text_under_a_compressor_reads_its_fill_as_zarr_python_does(mount, tmp_path: Path) -> None:
    """A sharded string array with a codec outside the shard (gzip here) is decoded a whole
    shard at a time, and that path laid never-written inner chunks as 0, not the fill:
    data.npy held "" where zarr-python reads "FILL", and was two characters wide instead of
    four (a helper's audit)."""
    import warnings

    import zarr
    from zarr.codecs import GzipCodec, ShardingCodec, VLenUTF8Codec

    store = tmp_path / "sharded_text.zarr"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = zarr.create_array(str(store), name="t", shape=(6,), chunks=(6,), dtype=str, fill_value="FILL",
                              serializer=ShardingCodec(chunk_shape=(2,), codecs=[VLenUTF8Codec()]),
                              compressors=[GzipCodec()])
        a[0:2] = np.array(["a", "bb"], dtype=object)
        want = zarr.open_array(str(store), path="t", mode="r")[:].tolist()
    assert want == ["a", "bb", "FILL", "FILL", "FILL", "FILL"]
    m = mount(store)
    got = np.load(m.path / ".zvfs/arrays/t/data.npy")
    assert got.dtype == np.dtype("<U4") and got.tolist() == want


def _walk_files(top: Path) -> list[tuple[Path, int]]:
    out = []
    for dirpath, _dirs, files in os.walk(top):
        for f in files:
            p = Path(dirpath) / f
            st = os.lstat(p)
            assert stat.S_ISREG(st.st_mode)
            out.append((p, st.st_size))
    return out


@pytest.mark.parametrize("name", BACKENDS)
def test_sizes_decode_nothing(name: str, corpus: Corpus, mount, request) -> None:
    """`ls -l` and stat() of every decoded file take sizes from metadata: no chunk is decoded.
    (Variable-length text is read for its width, outside the decoded chunks and their count.)"""
    source, extra, env = _source(name, corpus, request)
    m = mount(source, *extra, env=env)
    assert stats(m).get("chunks_decoded", 0) == 0
    ls = run([tool("ls"), "-lR", m.path / ".zvfs/arrays", m.path / ".zvfs/v2"], check=True)
    assert "data.npy" in ls.stdout
    sizes = dict(_walk_files(m.path / ".zvfs/arrays"))
    v2 = _walk_files(m.path / ".zvfs/v2")
    assert v2
    for case in CASES:
        if case.vlen:
            continue
        ref = corpus.ref(case)
        base = m.path / ".zvfs/arrays" / case.path
        assert sizes[base / "data.raw"] == ref.nbytes
        assert sizes[base / "data.npy"] > ref.nbytes
        meta = json.loads((base / "meta.json").read_text())
        chunks = meta["chunks"]
        for name_ in os.listdir(base / "chunks"):
            idx = tuple(int(x) for x in name_.split(".")) if ref.ndim else ()
            assert sizes[base / "chunks" / name_] == ref[(..., *chunk_region(idx, chunks))].nbytes
    s = stats(m)
    assert s.get("chunks_decoded", 0) == 0, s


# --------------------------------------------------------------------------- 2. legacy readers


def parse_ncdump(text: str) -> dict[str, list[str]]:
    """``{group/var: [value tokens]}`` from ncdump's data sections ('_' is the fill value)."""
    out: dict[str, list[str]] = {}
    groups: list[str] = []
    in_data = False
    current: str | None = None
    buf: list[str] = []
    for line in text.splitlines():
        s = line.strip()
        m = re.match(r"^group: (\S+) \{$", s)
        if m:
            groups.append(m.group(1))
            in_data = False
            continue
        if s.startswith("} // group"):
            groups.pop()
            in_data = False
            continue
        if s == "data:":
            in_data = True
            continue
        if not in_data or not s:
            continue
        if current is None:
            m = re.match(r"^(\S+) =\s*(.*)$", s)
            if not m:
                continue
            current = "/".join([*groups, m.group(1)])
            s = m.group(2)
        buf.append(s)
        if s.endswith(";"):
            joined = " ".join(buf)[:-1]
            out[current] = [t.strip() for t in joined.split(",") if t.strip()]
            current, buf = None, []
    return out


def ncdump_values(tokens: list[str], ref: np.ndarray, fill) -> None:
    """ncdump's printed values equal the reference (floats printed with full precision)."""
    flat = ref.reshape(-1)
    assert len(tokens) == flat.size, (len(tokens), flat.size)
    for i, (tok, want) in enumerate(zip(tokens, flat, strict=True)):
        if tok == "_":  # netCDF prints _FillValue as '_'
            assert fill is not None and (want == fill or (np.isnan(want) and np.isnan(fill))), (i, want)
            continue
        if ref.dtype.kind == "f":
            got = {"NaN": np.nan, "nan": np.nan, "Infinity": np.inf, "-Infinity": -np.inf}.get(tok)
            got = ref.dtype.type(float(tok) if got is None else got)
            assert got == want or (np.isnan(got) and np.isnan(want)), (i, tok, want)
        else:
            assert int(tok) == int(want), (i, tok, want)


NC_TYPES = set("iuf")


def _group_cases(group: str) -> list[Case]:
    return [c for c in CASES if c.path.startswith(group + "/") and not c.vlen]


#: groups whose every array has a netCDF type: v3, compressed, sharded, v2, NCZarr, v1
NC_GROUPS = ["gen/nc", "gen/nc2", "gen/nc3"] + [
    g for g in ("zarr3_v3.zarr/codecs", "zarr3_v3.zarr/shards", "zarr3_v3.zarr/keys",
                "zarr2_v2.zarr/compressors", "zarr3_v2.zarr/compressors", "v1.zarr",
                "nczarr.file")
    if _group_cases(g)
]


def ncdump(mnt: Path, group: str) -> str:
    url = f"file://{mnt}/.zvfs/v2/{group}#mode=zarr,file"
    res = run([tool("ncdump"), "-p", "9,17", url], timeout=120)
    assert res.returncode == 0, f"ncdump {url} failed: {res.stderr}"
    return res.stdout


@pytest.mark.parametrize("group", NC_GROUPS)
def test_ncdump_through_v2_mirror(backend: Backend, corpus: Corpus, group: str) -> None:
    """netCDF-C's pure-Zarr reader prints the reference values through .zvfs/v2."""
    if backend.name != "dir" and not group.startswith("gen/"):
        group_ok = group in ("zarr3_v3.zarr/shards",)
        if not group_ok:
            return  # fixtures' groups through the other backends: one is enough (runtime)
    values = parse_ncdump(ncdump(backend.mnt.path, group))
    checked = 0
    for case in _group_cases(group):
        ref = corpus.ref(case)
        if ref.dtype.kind not in NC_TYPES:
            continue
        var = case.path[len(group) + 1 :]
        assert var in values, (var, sorted(values))
        fill = json.loads((backend.arrays / case.path / "meta.json").read_text())["fill_value"]
        if isinstance(fill, str):
            fill = float(fill)
        ncdump_values(values[var], ref, fill)
        checked += 1
    assert checked


def gdal_checksum(target: str) -> int:
    res = run([tool("gdalinfo"), "-checksum", target], timeout=120)
    assert res.returncode == 0, f"gdalinfo {target}: {res.stderr}"
    sums = re.findall(r"Checksum=(\d+)", res.stdout)
    assert len(sums) == 1, res.stdout
    return int(sums[0])


#: ENVI data types GDAL 3.6's ENVI driver opens (not 14/15, 64-bit integers: it refuses them)
ENVI_CODES = {"u1": 1, "b1": 1, "i2": 2, "i4": 3, "f4": 4, "f8": 5, "c8": 6, "c16": 9,
              "u2": 12, "u4": 13}


#: every ENVI data type (what data.hdr may use)
ENVI_ALL = {**ENVI_CODES, "i8": 14, "u8": 15}


def _envi_code(dt: np.dtype) -> int | None:
    return ENVI_CODES.get(f"{dt.kind}{dt.itemsize}")


_reference_sums: dict[str, int] = {}


def reference_checksum(ref: np.ndarray, tmp: Path, key: str) -> int:
    """gdalinfo's checksum of ``ref`` written by numpy as an ENVI raw file (our own header)."""
    if key not in _reference_sums:
        tmp.mkdir(parents=True, exist_ok=True)
        raw = tmp / "ref.raw"
        ref.astype(ref.dtype.newbyteorder("<")).tofile(raw)
        lines, samples = ref.shape
        (tmp / "ref.hdr").write_text(
            f"ENVI\nsamples = {samples}\nlines = {lines}\nbands = 1\nheader offset = 0\n"
            f"file type = ENVI Standard\ndata type = {_envi_code(ref.dtype)}\ninterleave = bsq\n"
            "byte order = 0\n"
        )
        _reference_sums[key] = gdal_checksum(str(raw))
    return _reference_sums[key]


GDAL_CASES = [c for c in CASES if not c.vlen]


def _gdal_ok(ref: np.ndarray) -> bool:
    return ref.ndim == 2 and _envi_code(ref.dtype) is not None


@pytest.mark.parametrize("case", GDAL_CASES, ids=lambda c: c.path)
def test_gdal_checksum(backend: Backend, corpus: Corpus, case: Case, tmp_path_factory) -> None:
    """GDAL's Zarr driver through .zvfs/v2, and its ENVI driver on data.raw + data.hdr,
    give the checksum of the same data written with numpy as ENVI."""
    if backend.name != "dir" and case.store != "gen":
        return  # the fixtures through one backend, our corpus through all (runtime)
    ref = corpus.ref(case)
    if not _gdal_ok(ref):
        return
    want = reference_checksum(ref, tmp_path_factory.mktemp("envi"), case.path)
    group, _, name = case.path.rpartition("/")
    mirror = f'ZARR:"{backend.v2 / group}":/{name}'
    assert gdal_checksum(mirror) == want, mirror
    raw = backend.arrays / case.path / "data.raw"
    assert (raw.parent / "data.hdr").is_file()
    assert gdal_checksum(str(raw)) == want, raw


def test_envi_header_only_where_gdal_can_hold_the_dimensions(mount, tmp_path) -> None:
    """GDAL holds samples, lines and bands in a signed 32-bit int: a header of an array with
    2**31 lines was served and gdalinfo refused it ("Invalid dataset dimensions"). Such an
    array has no data.hdr; one of 2**31 - 1 lines keeps it, and GDAL opens it."""
    import zarr

    store = tmp_path / "big.zarr"
    zarr.open_group(str(store), mode="w", zarr_format=3)
    for name, rows in (("past", 2**31), ("at", 2**31 - 1)):  # sparse: no chunk written
        zarr.create_array(str(store), name=name, shape=(rows, 2), chunks=(2**20, 2), dtype="u1", fill_value=7)
    m = mount(store)
    assert not (m.path / ".zvfs/arrays/past/data.hdr").exists()
    assert (m.path / ".zvfs/arrays/past/data.raw").stat().st_size == 2**32
    raw = m.path / ".zvfs/arrays/at/data.raw"
    res = run(["gdalinfo", str(raw)])
    assert res.returncode == 0 and f"Size is 2, {2**31 - 1}" in res.stdout, res.stdout + res.stderr


# --------------------------------------------------------------------------- 4. done when


def test_done_when_sharded_blosc_on_moto(moto, s3_env, mount, tmp_path) -> None:
    """Issue 3's "done when": a v3 sharded blosc array in a moto bucket, read three ways."""
    import zarr
    from zarr.codecs import BloscCodec

    src = tmp_path / "x-store"
    store = zarr.storage.LocalStore(str(src))
    zarr.open_group(store, mode="w", zarr_format=3)
    x = zarr.create_array(store, name="x", shape=(150, 130), chunks=(10, 13), shards=(50, 65),
                          dtype="float32", compressors=[BloscCodec(cname="zstd", shuffle="shuffle")],
                          dimension_names=["y", "x"])
    data = _sample(np.dtype("<f4"), (150, 130), 99)
    x[:] = data
    ref = np.asarray(zarr.open_array(store, path="x", mode="r")[...])
    client = s3_client(moto.endpoint)
    client.create_bucket(Bucket="zvfs-done-when")
    upload_tree(client, src, "zvfs-done-when", "store")
    m = mount("s3://zvfs-done-when/store", "--endpoint-url", moto.endpoint, env=s3_env)

    # 1. numpy in a fresh process
    npy = m.path / ".zvfs/arrays/x/data.npy"
    res = run([tool("python3"), "-c", f'import numpy as np; print(repr(np.load("{npy}").sum()))'],
              check=True)
    assert res.stdout.strip() == repr(ref.sum()), (res.stdout, ref.sum())
    # 2. ncdump through the v2 mirror
    values = parse_ncdump(ncdump(m.path, ""))
    ncdump_values(values["x"], ref, 0.0)
    # 3. gdalinfo -checksum through the v2 mirror (and data.raw + data.hdr)
    want = reference_checksum(ref, tmp_path / "envi", "done-when x")
    assert gdal_checksum(f'ZARR:"{m.path / ".zvfs/v2"}":/x') == want
    assert gdal_checksum(str(m.path / ".zvfs/v2/x")) == want
    assert gdal_checksum(str(m.path / ".zvfs/arrays/x/data.raw")) == want


# --------------------------------------------------------------------------- 3. bad input


def build_bad_store(root: Path) -> dict[str, str]:
    """A v2/v3 store with one good array and broken ones; returns name -> key that is broken."""
    import numcodecs
    import zarr

    store = zarr.storage.LocalStore(str(root))
    zarr.open_group(store, mode="w", zarr_format=3)
    good = zarr.create_array(store, name="good", shape=(8, 8), chunks=(4, 4), dtype="<i4")
    good[:] = np.arange(64, dtype="<i4").reshape(8, 8)
    v2 = zarr.open_group(store, path="v2", mode="w", zarr_format=2)
    c = v2.create_array("corrupt", shape=(8, 8), chunks=(4, 4), dtype="<f8",
                        compressors=numcodecs.Blosc(cname="lz4"))
    c[:] = np.arange(64, dtype="<f8").reshape(8, 8)
    t = v2.create_array("truncated", shape=(8,), chunks=(4,), dtype="<i2")
    t[:] = 1
    u = v2.create_array("unknown", shape=(8,), chunks=(4,), dtype="<i2")
    u[:] = 2
    t3 = zarr.create_array(store, name="truncated3", shape=(8,), chunks=(4,), dtype="<i2")
    t3[:] = 3
    u3 = zarr.create_array(store, name="unknown3", shape=(8,), chunks=(4,), dtype="<i2")
    u3[:] = 4
    o = zarr.create_array(store, name="overflow", shape=(8,), chunks=(4,), dtype="<i8")
    o[:] = 5
    cs = zarr.create_array(store, name="corrupt_shard", shape=(8, 8), chunks=(2, 2), shards=(4, 4),
                           dtype="<u2")
    cs[:] = 6
    garbage = np.random.default_rng(7)
    # garbage bytes in one blosc chunk
    key = root / "v2/corrupt/0.1"
    key.write_bytes(garbage.bytes(key.stat().st_size))
    # garbage in a whole shard (its index included)
    shard = root / "corrupt_shard/c/1/0"
    shard.write_bytes(garbage.bytes(shard.stat().st_size))
    # truncated metadata
    for rel in ("v2/truncated/.zarray", "truncated3/zarr.json"):
        p = root / rel
        p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2])
    # unknown codecs
    doc = json.loads((root / "v2/unknown/.zarray").read_text())
    doc["compressor"] = {"id": "no-such-codec-v2"}
    (root / "v2/unknown/.zarray").write_text(json.dumps(doc))
    doc = json.loads((root / "unknown3/zarr.json").read_text())
    doc["codecs"].append({"name": "no-such-codec-v3", "configuration": {}})
    (root / "unknown3/zarr.json").write_text(json.dumps(doc))
    # an absurd shape: the product overflows 64 bits
    doc = json.loads((root / "overflow/zarr.json").read_text())
    doc["shape"] = [2**40, 2**40, 2**40]
    doc["chunk_grid"]["configuration"]["chunk_shape"] = [4, 4, 4]
    (root / "overflow/zarr.json").write_text(json.dumps(doc))
    return {
        "v2/corrupt": "v2/corrupt/0.1",
        "corrupt_shard": "corrupt_shard/c/1/0",
        "v2/truncated": "v2/truncated/.zarray",
        "truncated3": "truncated3/zarr.json",
        "v2/unknown": "v2/unknown/.zarray",
        "unknown3": "unknown3/zarr.json",
        "overflow": "overflow/zarr.json",
    }


@pytest.fixture(scope="session")
def bad_store(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("bad") / "bad.zarr"
    return root, build_bad_store(root)


def _lines_naming(log: str, key: str) -> list[str]:
    return [ln for ln in log.splitlines() if key in ln]


@pytest.mark.parametrize("name", ["dir", "s3"])
def test_bad_input(name: str, bad_store, mount, request) -> None:
    root, broken = bad_store
    if name == "dir":
        m = mount(root)
    else:
        moto = request.getfixturevalue("moto")
        env = request.getfixturevalue("s3_env")
        client = s3_client(moto.endpoint)
        client.create_bucket(Bucket="zvfs-bad")
        upload_tree(client, root, "zvfs-bad", "bad")
        m = mount("s3://zvfs-bad/bad", "--endpoint-url", moto.endpoint, env=env)
    arrays = m.path / ".zvfs/arrays"
    pids = daemon_pids(m.path)
    assert pids

    # metadata errors: in meta.json, no data files, left out of the v2 mirror
    for path in ("v2/truncated", "truncated3", "v2/unknown", "unknown3", "overflow"):
        meta = json.loads((arrays / path / "meta.json").read_text())
        assert meta["error"], (path, meta)
        assert broken[path].split("/")[-1] in meta["error"] or path in meta["error"], meta["error"]
        data = arrays / path / "data.raw"
        if data.exists():
            with pytest.raises(OSError) as ei:
                data.read_bytes()
            assert ei.value.errno == 5
    # read errors: that chunk fails with EIO (again and again, through every view of it);
    # the array's other chunks still read
    for path, bad_chunks, good_chunk in (("v2/corrupt", ["0.1"], "0.0"),
                                         ("corrupt_shard", ["2.0", "3.1", "2.1"], "0.0")):
        for _ in range(2):
            for target in [arrays / path / "chunks" / c for c in bad_chunks] + [
                arrays / path / "data.raw",
                arrays / path / "data.npy",
                m.path / ".zvfs/v2" / path / bad_chunks[0],
            ]:
                with pytest.raises(OSError) as ei:
                    target.read_bytes()
                assert ei.value.errno == 5, target
        assert (arrays / path / "chunks" / good_chunk).read_bytes()
        assert (m.path / ".zvfs/v2" / path / good_chunk).read_bytes()
    # the good array and the mirror still work; the daemon is still up
    good = np.load(arrays / "good/data.npy")
    assert good.tolist() == np.arange(64).reshape(8, 8).tolist()
    assert (m.path / ".zvfs/v2/good/.zarray").is_file()
    assert not (m.path / ".zvfs/v2/overflow").exists()
    assert is_mounted(m.path) and all(os.path.exists(f"/proc/{p}") for p in pids)

    # one log line per broken key, naming it, however often it was read
    log = m.log_text()
    for key in broken.values():
        lines = _lines_naming(log, key)
        assert len(lines) == 1, (key, lines, log[-3000:])


def test_bad_fixtures(mount, tmp_path) -> None:
    """The committed bad store (tests/fixtures/zarr/bad.zarr) as its manifest describes it."""
    if not MANIFEST.is_file():
        pytest.fail("tests/fixtures/zarr/manifest.json is missing (scripts/make_fixtures)")
    manifest = json.loads(MANIFEST.read_text())
    bad = {k: v for k, v in manifest["stores"].items() if k.startswith("bad")}
    assert bad
    for store, sdoc in bad.items():
        src = tmp_path / store
        shutil.copytree(FIXTURES / store, src)
        m = mount(src)
        arrays = m.path / ".zvfs/arrays"
        for apath, adoc in sdoc["arrays"].items():
            meta = json.loads((arrays / apath / "meta.json").read_text())
            if adoc.get("error") == "meta":
                assert meta["error"], (apath, meta)
                assert not (arrays / apath / "data.raw").exists()
                continue
            ref = np.load(FIXTURES / adoc["ref"]) if "ref" in adoc else None
            chunks = meta["chunks"]
            for idx in adoc.get("bad_chunks", []):
                with pytest.raises(OSError) as ei:
                    (arrays / apath / "chunks" / ".".join(map(str, idx))).read_bytes()
                assert ei.value.errno == 5, (apath, idx)
            if adoc.get("error") == "read":
                with pytest.raises(OSError) as ei:
                    (arrays / apath / "data.raw").read_bytes()
                assert ei.value.errno == 5, apath
            for idx in adoc.get("good_chunks", []):
                got = (arrays / apath / "chunks" / ".".join(map(str, idx))).read_bytes()
                assert ref is not None
                assert got == np.ascontiguousarray(ref[(..., *chunk_region(tuple(idx), chunks))]).tobytes()
            if not adoc.get("error"):
                assert (arrays / apath / "data.raw").read_bytes() == ref.tobytes()
        assert is_mounted(m.path)


def test_rediscoveries_do_not_keep_the_old_views(mount, tmp_path) -> None:
    """Each discovery (once per metadata TTL while .zvfs/ is used, and after every write)
    builds the view families anew; the cache kept each old family under its discovery's
    number, never asked for again, so a mount grew by every copy (a helper: 60 -> 315 MB
    over 62 rediscoveries of 400 arrays). Now the listing cache holds one of each, however
    many discoveries are made, and the views still read as zarr-python reads them."""
    import time

    import zarr

    root = tmp_path / "s.zarr"
    group = zarr.open_group(str(root), mode="w", zarr_format=3)
    data = np.arange(64, dtype="<i4").reshape(8, 8)
    for name in ("a", "b", "c"):
        group.create_array(name, shape=(8, 8), chunks=(4, 4), dtype="<i4")[:] = data
    m = mount(root, "--metadata-ttl", "0.2")

    def use() -> dict:
        (m.path / ".zvfs/arrays/a/data.raw").stat()
        os.listdir(m.path / ".zvfs/netcdf")
        os.listdir(m.path / ".zvfs/v2")
        with open(m.path / ".zvfs/netcdf/root.nc", "rb") as f:
            f.read(100)
        return json.loads((m.path / ".zvfs/stats.json").read_text())["listing_cache"]

    first = use()
    for i in range(12):
        group["c"].attrs["round"] = i  # behind the mount: a discovery that found no change keeps its views
        time.sleep(0.3)  # past the TTL: the next use discovers again
        last = use()
        assert zarr.open_array(str(root), path="c", mode="r").attrs["round"] == \
            json.loads((m.path / ".zvfs/arrays/c/meta.json").read_text())["attributes"]["round"] == i
    assert last["misses"] - first["misses"] >= 12 * 3, (first, last)  # a discovery and its families each time
    assert last["entries"] <= first["entries"] + 2, (first, last)
    ref = zarr.open_array(str(root), path="b", mode="r")[...]
    assert (m.path / ".zvfs/arrays/b/data.raw").read_bytes() == ref.tobytes()


def test_v3_numcodecs_filters_through_the_mount(mount, tmp_path) -> None:
    """v3 arrays behind every ``numcodecs.*`` filter zarr-python 3 writes, before a little-
    and a big-endian bytes codec, plain and inside shards: meta.json has no error, and
    data.npy, data.raw, every chunks/ file and the v2 mirror hold the array given to
    zarr-python to write. That array is the reference, not zarr-python's read, which is
    wrong for a filter before a big-endian bytes codec (test_formats' test of the same
    arrays decodes their stored chunks by hand with numcodecs: they hold what was
    written). Before, the filters that change the dtype or shape failed every read with
    EIO, and delta and fixedscaleoffset before big-endian bytes served wrong values."""
    root = tmp_path / "filters.zarr"
    written = {}
    for name in sorted(numcodecs_filter_cases()):
        for endian in ("little", "big"):
            written[f"{endian}/{name}"] = write_numcodecs_filter_array(root, name, endian)
            written[f"{endian}-sharded/{name}"] = write_numcodecs_filter_array(
                root, name, endian, shards=(4, 2))
    m = mount(root)
    for path, ref in written.items():
        base = m.path / ".zvfs/arrays" / path
        meta = json.loads((base / "meta.json").read_text())
        assert meta["error"] is None, (path, meta["error"])
        assert meta["dtype"] == ref.dtype.str and meta["shape"] == list(ref.shape), path
        a = np.load(base / "data.npy")
        assert a.dtype.str == ref.dtype.str and a.tobytes() == ref.tobytes(), (path, a, ref)
        raw = base / "data.raw"
        assert raw.read_bytes() == ref.tobytes(), path
        n = len(ref.tobytes())
        assert read_range(raw, n // 3, n // 2) == ref.tobytes()[n // 3 : n // 3 + n // 2], path
        for name in os.listdir(base / "chunks"):
            idx = tuple(int(x) for x in name.split("."))
            want = np.ascontiguousarray(ref[(..., *chunk_region(idx, meta["chunks"]))]).tobytes()
            assert (base / "chunks" / name).read_bytes() == want, (path, name)
        mirror = _zarr_open_mirror(m.path / ".zvfs/v2", path)[...]
        assert (mirror == ref).all(), (path, mirror, ref)
    assert "ERROR" not in m.log_text()


def test_the_mirror_s_documents_are_pushed_with_their_first_open(mount, tmp_path) -> None:
    """The v2 mirror's metadata documents are built in memory: each is stored in the
    kernel's pages with its first open (zvfs.fs.push), so zarr-python reading the mirror
    reads them with no READ request, and gets the array zarr-python wrote."""
    import zarr

    root = tmp_path / "docs.zarr"
    group = zarr.open_group(str(root), mode="w", zarr_format=3)
    written = {}
    for i in range(4):
        ref = np.arange(60 * (i + 1), dtype="f4").reshape(6, -1) * (i + 1)
        a = group.create_array(f"a{i}", shape=ref.shape, chunks=(3, 5), dtype=ref.dtype)
        a[...] = ref
        a.attrs["units"] = f"unit {i}"
        written[f"a{i}"] = ref
    m = mount(root)
    for path, ref in written.items():
        assert (_zarr_open_mirror(m.path / ".zvfs/v2", path)[...] == ref).all(), path
    stats = json.loads((m.path / ".zvfs/stats.json").read_text())
    assert stats["fuse_opens_pushed"] >= len(written), stats  # a .zarray each at least
    for path in written:
        doc = m.path / ".zvfs/v2" / path / ".zarray"
        assert json.loads(doc.read_text())["shape"] == list(written[path].shape)
    again = json.loads((m.path / ".zvfs/stats.json").read_text())
    assert again["fuse_opens_pushed"] == stats["fuse_opens_pushed"], again  # the kernel had them


def test_npy_header_sizes() -> None:
    """The NPY header keeps data 64-byte aligned, so mmap'ed loads see aligned data, and
    numpy's reader finds the shape and dtype in it (numpy integers in the shape too)."""
    from zarr_model import parse_npy_header

    from zvfs.views.npy import npy_header

    for shape in [(), (3,), (2**40, 3), tuple(range(1, 30)), (np.int64(7), np.int32(2))]:
        h = npy_header(np.dtype(">f8"), shape)
        assert len(h) % 64 == 0
        assert h[:6] == b"\x93NUMPY"
        hl = struct.unpack("<H", h[8:10])[0] if h[6] == 1 else struct.unpack("<I", h[8:12])[0]
        assert len(h) == hl + (10 if h[6] == 1 else 12)
        assert parse_npy_header(h) == (len(h), tuple(map(int, shape)), False, np.dtype(">f8"))


def test_npy_long_header_loads_by_default(mount, tmp_path) -> None:
    """A structured dtype of 400 fields, as zarr-python writes it: its NPY header text is
    about 9 KB, which data.npy's page alignment padded to 12 KiB, past numpy's default
    ``max_header_size`` (10,000), so a plain ``np.load`` refused the file that numpy's own
    ``np.save`` of the same array leaves loadable. The header is now padded to 64 there,
    and np.load, mmap'ed too, reads zarr-python's values from it."""
    import zarr

    dt = np.dtype([(f"field_{i:04d}", "<f4") for i in range(400)])
    root = tmp_path / "wide.zarr"
    a = zarr.create_array(str(root), name="wide", shape=(3,), chunks=(2,), dtype=dt, zarr_format=2)
    values = np.zeros(3, dt)
    values["field_0001"], values["field_0399"] = [1, 2, 3], [-1, -2, -3]
    a[...] = values
    ref = zarr.open_array(str(root), path="wide", mode="r")[...]
    m = mount(root)
    npy = m.path / ".zvfs/arrays/wide/data.npy"
    for got in (np.load(npy), np.load(npy, mmap_mode="r")):
        assert got.dtype == ref.dtype and got.tobytes() == ref.tobytes()
    hlen = os.stat(npy).st_size - ref.nbytes
    assert hlen % 64 == 0 and hlen - 10 <= 10000, hlen


def test_structured_field_names_beyond_latin1(mount, tmp_path) -> None:
    """A structured array whose field names latin-1 cannot hold (``温度``, ``Δt``), as
    zarr-python writes them: data.npy is NPY format 3.0 (UTF-8), as numpy writes such a
    header, and np.load reads zarr-python's values from it; the other arrays are served.
    Before, the header's latin-1 encoding raised in the lookup, and since the arrays
    directory is built whole, every array of the store (and its listing) was EIO."""
    import zarr

    dt = np.dtype([("温度", "<f4"), ("Δt", ">i2")])
    root = tmp_path / "fields.zarr"
    a = zarr.create_array(str(root), name="cjk", shape=(5,), chunks=(2,), dtype=dt, zarr_format=2)
    values = np.zeros(5, dt)
    values["温度"], values["Δt"] = np.arange(5) / 2, -np.arange(5)
    a[...] = values
    b = zarr.create_array(str(root), name="plain", shape=(3,), chunks=(2,), dtype="<i4", zarr_format=2)
    b[...] = [7, 8, 9]
    m = mount(root)
    arrays = m.path / ".zvfs/arrays"
    assert sorted(os.listdir(arrays)) == ["cjk", "plain"]
    for name in ("cjk", "plain"):
        ref = zarr.open_array(str(root), path=name, mode="r")[...]
        got = np.load(arrays / name / "data.npy")
        assert got.dtype == ref.dtype and got.tobytes() == ref.tobytes(), (name, got, ref)
        assert (arrays / name / "data.raw").read_bytes() == ref.tobytes(), name
    assert (arrays / "cjk/data.npy").read_bytes()[6:8] == b"\x03\x00"
    assert "ERROR" not in m.log_text()


def test_a_listing_across_a_metadata_change_leaves_new_opens_reading(mount, tmp_path) -> None:
    """A listing of chunks/ under way while the metadata is rewritten behind the mount: its
    later readdir pages put the nodes of its snapshot (the old array) back over those a
    fresh lookup made meanwhile, and a new open of such a chunk read ESTALE for as long as
    the kernel kept the entry (a review). A node the table has already stays."""
    import time

    import zarr

    root = tmp_path / "s.zarr"
    zarr.create_array(str(root / "a"), shape=(100, 100), chunks=(1, 1), dtype="<i4", fill_value=7, zarr_format=3)
    m = mount(root, "--metadata-ttl", "1")
    chunks = m.path / ".zvfs/arrays/a/chunks"
    listing = os.scandir(chunks)
    try:
        next(listing)  # opendir, and the first page
        zarr.create_array(str(root / "a"), shape=(100, 100), chunks=(1, 1), dtype="<f4", fill_value=1.5,
                          zarr_format=3, overwrite=True)
        time.sleep(1.5)  # past the TTL
        name = "99.99"  # on a later page
        assert (chunks / name).read_bytes() == np.float32(1.5).tobytes()
        rest = [e.name for e in listing]
    finally:
        listing.close()
    assert name in rest
    fd = os.open(chunks / name, os.O_RDONLY)  # a new open, its pages asked of the daemon
    try:
        assert drop_page_cache(fd)
        assert os.pread(fd, 64, 0) == np.float32(1.5).tobytes()
    finally:
        os.close(fd)


@pytest.mark.parametrize(("backend", "zarr_format", "change"), [
    *(("dir", f, c) for f in (2, 3) for c in ("dtype", "chunks", "attributes")),
    ("s3", 3, "dtype"), ("s3", 2, "chunks")])
def test_open_decoded_files_after_a_metadata_change_behind_the_mount(
        backend: str, zarr_format: int, change: str, mount, tmp_path, request) -> None:
    """Another process (zarr-python, the reference writer) rewrites an array's metadata in the
    store, not through the mount. Once the metadata TTL has passed, a decoded file opened
    before (data.raw, data.npy, a chunks/ file, the v2 mirror's chunk, the group's netCDF
    file) reads ESTALE, as after a rewrite through the mount: before, data.npy served its old
    '<i4' header over the new float32 bytes (np.load read wrong values, unsaid), and a
    chunk-shape change read EIO logged as a corrupt chunk (a helper's audit). The old open
    notices by itself, with no lookup meanwhile: a read more than a TTL after the mount last
    read the metadata reads it again. (What the kernel kept of the old open's pages, it
    still serves: the old version's bytes.) An attribute change alone leaves the bytes as
    they were, and the old opens reading; so does the array beside it. New opens read what
    zarr-python reads, and the log says it once, not as an error. On S3 the store is
    rewritten by another client: zarr-python writes a local copy, uploaded over the prefix."""
    import time

    import zarr

    root = tmp_path / "s.zarr"
    group = zarr.open_group(str(root), mode="w", zarr_format=zarr_format)
    sub = group.create_group("g")
    shape = (256, 1024)  # 1 MiB in chunks of 256 KiB: far reads miss the kernel's read-ahead
    before = np.arange(math.prod(shape), dtype="<i4").reshape(shape)
    sub.create_array("a", shape=shape, chunks=(64, 1024), dtype="<i4", fill_value=-1)[:] = before
    sub.create_array("b", shape=(4,), chunks=(4,), dtype="<i4", fill_value=-1)[:] = 7
    if zarr_format == 3 and change == "attributes":
        # the zstd codec as other writers have it (no "checksum"): zarr-python's rewrite for
        # an attribute fills the default in, which made the old opens read ESTALE (a review)
        meta = root / "g/a/zarr.json"
        doc = json.loads(meta.read_text())
        for codec in doc["codecs"]:
            if codec["name"] == "zstd":
                codec["configuration"] = {"level": 1}
        meta.write_text(json.dumps(doc))
    ttl = 1.0
    if backend == "s3":
        moto, s3_env = request.getfixturevalue("moto"), request.getfixturevalue("s3_env")
        client = s3_client(moto.endpoint)
        bucket = f"zvfs-behind-{zarr_format}-{change}"
        client.create_bucket(Bucket=bucket)
        upload_tree(client, root, bucket, "store")
        m = mount(f"s3://{bucket}/store", "--endpoint-url", moto.endpoint, "--metadata-ttl", str(ttl),
                  env=s3_env)
    else:
        m = mount(root, "--metadata-ttl", str(ttl))
    views = m.path / ".zvfs"
    old = {
        "data.raw": views / "arrays/g/a/data.raw",
        "data.npy": views / "arrays/g/a/data.npy",
        "chunk": views / "arrays/g/a/chunks/3.0",
        "mirror": views / "v2/g/a/3.0",
        "netcdf": views / "netcdf/g.nc",
    }
    fds = {name: os.open(path, os.O_RDONLY) for name, path in old.items()}
    beside = os.open(views / "arrays/g/b/data.raw", os.O_RDONLY)
    npy_head = os.stat(old["data.npy"]).st_size - before.nbytes
    far = before.nbytes - (64 << 10)  # the last 64 KiB: in chunk 3.0

    def far_read(name: str) -> bytes:
        """A read of the last chunk's bytes (the whole file, for files not read before)."""
        fd = fds[name]
        if name == "data.raw":
            return os.pread(fd, 64 << 10, far)
        if name == "data.npy":
            return os.pread(fd, 64 << 10, npy_head + far)
        out, pos = [], 0  # read to the end, as cat does (a read may come back short)
        while part := os.pread(fd, 1 << 20, pos):
            out.append(part)
            pos += len(part)
        return b"".join(out)

    try:
        # a reader that has begun: the first bytes of data.raw and data.npy
        assert os.pread(fds["data.raw"], 4096, 0) == before.tobytes()[:4096]
        assert os.pread(fds["data.npy"], npy_head + 4096, 0)[npy_head:] == before.tobytes()[:4096]
        g = zarr.open_group(str(root), mode="a")
        if change == "attributes":
            g["g/a"].attrs["units"] = "K"
            want, chunks = before, (64, 1024)
            if zarr_format == 3:
                assert '"checksum"' in (root / "g/a/zarr.json").read_text()  # what this is about
        else:
            dtype, chunks = {"dtype": ("<f4", (64, 1024)), "chunks": ("<i4", (64, 512))}[change]
            want = (100 + np.arange(math.prod(shape))).reshape(shape).astype(dtype)
            g["g"].create_array("a", shape=shape, chunks=chunks, dtype=dtype, fill_value=-1,
                                overwrite=True)[:] = want
        if backend == "s3":
            upload_tree(client, root, bucket, "store")
        ref = zarr.open_array(str(root), path="g/a", mode="r")[...]
        np.testing.assert_array_equal(ref, want)
        time.sleep(ttl * 1.5)  # past the TTL, with margin; no lookup meanwhile

        def estale(name: str) -> bool:
            try:
                far_read(name)
            except OSError as exc:
                assert exc.errno == errno.ESTALE, (name, exc)
                return True
            return False

        if change == "attributes":
            assert far_read("data.raw") == before.tobytes()[far:]
            assert far_read("data.npy") == before.tobytes()[far:]
            assert far_read("chunk") == far_read("mirror") == before[192:].tobytes()
            assert len(far_read("netcdf")) == os.stat(old["netcdf"]).st_size
        else:
            assert wait_until(lambda: estale("data.raw"), timeout=10 * ttl)
            for name in fds:
                assert estale(name), name
                assert estale(name), name  # and stays so
        assert os.pread(beside, 64, 0) == np.full(4, 7, "<i4").tobytes()
        # new opens: the array as zarr-python reads it
        got = np.load(old["data.npy"])
        assert got.dtype == ref.dtype and got.shape == ref.shape
        np.testing.assert_array_equal(got, ref)
        assert old["data.raw"].read_bytes() == ref.tobytes()
        assert old["chunk"].read_bytes() == np.ascontiguousarray(ref[chunk_region((3, 0), chunks)]).tobytes()
        np.testing.assert_array_equal(_zarr_open_mirror(views / "v2", "g/a")[...], ref)
        assert len(old["netcdf"].read_bytes()) == os.stat(old["netcdf"]).st_size
    finally:
        for fd in (*fds.values(), beside):
            os.close(fd)
    log = m.log_text()
    assert "ERROR" not in log, log
    said = [line for line in log.splitlines() if "changed in the store" in line]
    assert len(said) == (0 if change == "attributes" else 1), said


def test_a_read_past_the_ttl_reads_its_own_array_metadata_not_every_array_s(mount, tmp_path) -> None:
    """An open decoded file whose read comes a metadata TTL after the mount last read the
    metadata checks its array's metadata again (ESTALE if it changed behind the mount). It
    did so by discovering the whole hierarchy: one read of one array of a store of 100,000
    (zarr-python 3, no consolidated metadata) waited 22-32 s, every TTL. The read now gets
    its own array's metadata, a few gets, whatever the number of arrays beside it."""
    import time

    import zarr

    root = tmp_path / "many.zarr"
    group = zarr.open_group(str(root), mode="w")
    for i in range(40):
        group.create_array(f"s{i:02d}", shape=(2,), dtype="<i2")
    shape = (256, 1024)  # 1 MiB in chunks of 256 KiB: a far read misses the kernel's read-ahead
    want = np.arange(math.prod(shape), dtype="<i4").reshape(shape)
    group.create_array("big", shape=shape, chunks=(64, 1024), dtype="<i4")[:] = want
    ttl = 1.0
    m = mount(root, "--metadata-ttl", str(ttl))
    fd = os.open(m.path / ".zvfs/arrays/big/data.raw", os.O_RDONLY)
    try:
        assert os.pread(fd, 4096, 0) == want.tobytes()[:4096]
        gets = stats(m)["store_requests_get"]
        time.sleep(ttl * 1.5)  # past the TTL; no lookup meanwhile
        far = want.nbytes - (64 << 10)
        assert os.pread(fd, 64 << 10, far) == want.tobytes()[far:]
        asked = stats(m)["store_requests_get"] - gets
        assert 1 <= asked <= 4, asked  # its zarr.json and the chunk read; not the 41 arrays'
    finally:
        os.close(fd)
    assert "ERROR" not in m.log_text()


METADATA_NAMES = {"zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata"}


def _metadata_files(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every metadata key of a directory store: its bytes and mtime (ns)."""
    return {p.relative_to(root).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in root.rglob("*") if p.name in METADATA_NAMES and p.is_file()}


def _written_an_hour_ago(root: Path) -> None:
    """Date every file of ``root`` an hour back, as a store written before the mount: a
    key modified within the last moments is read again by every discovery (its size and
    mtime could stay the same across a rewrite)."""
    past = time.time() - 3600
    for p in root.rglob("*"):
        os.utime(p, (past, past))


def _behind_the_mount(backend: str, root: Path, bucket: str, client, removed: list[str]) -> None:
    """Have the S3 copy of ``root`` (prefix ``store/``) be what ``root`` is now: every file
    put again (an unchanged one keeps its ETag), the ``removed`` directories' keys deleted."""
    if backend != "s3":
        return
    upload_tree(client, root, bucket, "store")
    for prefix in removed:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"store/{prefix}/"):
            for obj in page.get("Contents", ()):
                client.delete_object(Bucket=bucket, Key=obj["Key"])


def _zarr_arrays(root: Path, *inner: str) -> dict[str, object]:
    """zarr-python's view of the store: array path -> array, from its root group's members
    and from those of the ``inner`` groups (a v2 group in a v3 hierarchy, which zarr-python
    opens by its own path only)."""
    import zarr

    out = {}
    for top in ("", *inner):
        group = zarr.open_group(str(root / top), mode="r", use_consolidated=False)
        out.update({f"{top}/{path}".lstrip("/"): node for path, node in group.members(max_depth=None)
                    if isinstance(node, zarr.Array)})
    return out


def _check_views_against_zarr(arrays_dir: Path, root: Path, *inner: str) -> None:
    """.zvfs/arrays holds exactly zarr-python's arrays, each with its shape, dtype,
    attributes and bytes."""
    want = _zarr_arrays(root, *inner)
    got = {p.parent.relative_to(arrays_dir).as_posix() for p in arrays_dir.glob("**/meta.json")}
    assert got == set(want), (sorted(got ^ set(want)))
    for path, array in want.items():
        meta = json.loads((arrays_dir / path / "meta.json").read_text())
        assert tuple(meta["shape"]) == array.shape, path
        assert np.dtype(meta["dtype"]) == array.dtype, path
        assert meta["attributes"] == dict(array.attrs), path
        assert (arrays_dir / path / "data.raw").read_bytes() == np.ascontiguousarray(array[...]).tobytes(), path


@pytest.mark.parametrize("backend", ["dir", "s3"])
def test_a_rediscovery_past_the_ttl_reads_only_the_metadata_that_changed(backend, mount, tmp_path, request) -> None:
    """Once the metadata TTL had passed, the next lookup under .zvfs/ read every node's
    metadata again: a store of 2,000 arrays on S3 (zarr-python 3) cost 2,002 GETs, 6.7 s,
    every TTL the mount was used (10,002 for 10,000 arrays), and a directory store 2,002
    reads. What the mount already lists tells a key's version (S3's ETag in a flat listing;
    a directory store's size and mtime, a stat): only new and changed metadata keys are
    read again (a node's whole metadata, a key or two), none when nothing changed, and the
    views show what zarr-python reads: a
    changed array's new dtype and attributes, a removed array gone, a new one there."""
    import zarr

    root = tmp_path / "s.zarr"
    group = zarr.open_group(str(root), mode="w", zarr_format=3, attributes={"title": "t"})
    for i in range(16):
        group.create_array(f"a{i:02d}", shape=(3,), dtype="<i2", fill_value=-1)[:] = i
    old = group.create_group("sub").create_group("deep")
    for i in range(3):
        old.create_array(f"b{i}", shape=(2, 2), dtype="<u2", fill_value=0)[:] = i
    legacy = zarr.open_group(str(root / "legacy"), mode="w", zarr_format=2)
    for i in range(3):
        legacy.create_array(f"c{i}", shape=(5,), chunks=(5,), dtype="<f8", fill_value=0.0,
                            chunk_key_encoding={"name": "v2", "separator": "."})[:] = i / 2
    legacy["c1"].attrs["units"] = "m"
    _written_an_hour_ago(root)
    ttl = 0.5
    client = bucket = None
    if backend == "s3":
        moto, s3_env = request.getfixturevalue("moto"), request.getfixturevalue("s3_env")
        client = s3_client(moto.endpoint)
        bucket = "zvfs-rediscover"
        client.create_bucket(Bucket=bucket)
        upload_tree(client, root, bucket, "store")
        m = mount(f"s3://{bucket}/store", "--endpoint-url", moto.endpoint, "--metadata-ttl", str(ttl), env=s3_env)
    else:
        m = mount(root, "--metadata-ttl", str(ttl))
    arrays = m.path / ".zvfs/arrays"
    _check_views_against_zarr(arrays, root, "legacy")
    gets = stats(m)["store_requests_get"]
    time.sleep(ttl * 1.5)  # past the TTL
    assert len(os.listdir(arrays)) == 18  # 16 arrays, sub/, legacy/
    assert stats(m)["store_requests_get"] == gets  # nothing changed: nothing read again

    before = _metadata_files(root)
    group = zarr.open_group(str(root), mode="a")
    group.create_array("a05", shape=(4,), dtype="<f4", fill_value=0.5, overwrite=True,
                       attributes={"units": "K"})[:] = [1.5, 2.5, 3.5, 4.5]
    group.create_array("new", shape=(2,), dtype="<i8", fill_value=0)[:] = [7, 8]
    shutil.rmtree(root / "a07")
    shutil.rmtree(root / "sub/deep/b2")
    zarr.open_array(str(root / "legacy/c1"), mode="a").attrs["units"] = "km"
    after = _metadata_files(root)
    # the keys that are new or changed (bytes; and on a directory store, its mtime)
    changed = {k for k, (data, mtime) in after.items()
               if k not in before or before[k][0] != data or backend == "dir" and before[k][1] != mtime}
    assert {"a05/zarr.json", "new/zarr.json", "legacy/c1/.zattrs"} <= changed, changed
    # a node whose metadata changed is read whole again: a v2 array's .zarray with its .zattrs
    nodes = {k.rpartition("/")[0] for k in changed}
    read = sorted(k for k in after if k.rpartition("/")[0] in nodes)
    _behind_the_mount(backend, root, bucket, client, ["a07", "sub/deep/b2"])
    time.sleep(ttl * 1.5)
    gets = stats(m)["store_requests_get"]
    assert sorted(os.listdir(arrays)) == sorted(["legacy", "new", "sub", *(f"a{i:02d}" for i in range(16) if i != 7)])
    assert stats(m)["store_requests_get"] - gets == len(read), read
    _check_views_against_zarr(arrays, root, "legacy")
    assert "ERROR" not in m.log_text()


@pytest.mark.parametrize("fmt", [2, 3])
def test_a_rediscovery_past_the_ttl_reads_consolidated_metadata_again_only_once_changed(fmt, mount, tmp_path) -> None:
    """A store with consolidated metadata (.zmetadata, or v3's in the root zarr.json): past
    the TTL the document was fetched again each time; now only once the root listing gives
    it another size and mtime, and then the views are the new document's, as zarr-python
    reads them (an array's new dtype and attributes, one removed, one added)."""
    import zarr

    root = tmp_path / "c.zarr"
    group = zarr.open_group(str(root), mode="w", zarr_format=fmt)
    for i in range(6):
        group.create_array(f"a{i}", shape=(3,), chunks=(3,), dtype="<i2", fill_value=0)[:] = i
    zarr.consolidate_metadata(str(root))
    _written_an_hour_ago(root)
    ttl = 0.5
    m = mount(root, "--metadata-ttl", str(ttl))
    arrays = m.path / ".zvfs/arrays"
    _check_views_against_zarr(arrays, root)
    gets = stats(m)["store_requests_get"]
    time.sleep(ttl * 1.5)  # past the TTL
    assert len(os.listdir(arrays)) == 6
    assert stats(m)["store_requests_get"] == gets
    group = zarr.open_group(str(root), mode="a", use_consolidated=False)
    group.create_array("a1", shape=(4,), chunks=(4,), dtype="<f4", fill_value=0.0, overwrite=True,
                       attributes={"units": "K"})[:] = 2.5
    group.create_array("new", shape=(2,), chunks=(2,), dtype="<u1", fill_value=0)[:] = 9
    shutil.rmtree(root / "a2")
    zarr.consolidate_metadata(str(root))
    time.sleep(ttl * 1.5)
    gets = stats(m)["store_requests_get"]
    assert sorted(os.listdir(arrays)) == ["a0", "a1", "a3", "a4", "a5", "new"]
    assert stats(m)["store_requests_get"] - gets == 1  # the consolidated document
    _check_views_against_zarr(arrays, root)


def test_a_listing_after_a_metadata_change_behind_the_mount_leaves_new_opens_reading(mount, tmp_path) -> None:
    """An array's metadata rewritten behind the mount (zarr-python, the reference writer), then,
    past the TTL, `ls -l` of the views (a readdir that tells the kernel each entry) and a new
    open: the open was given the node the mount had made before the change (a listing kept the
    node it had), whose reads were ESTALE, "open it again", though it was opened after; an
    mmap of it (np.memmap, np.load(mmap_mode="r")) died of SIGBUS. Every new open reads what
    zarr-python reads."""
    import mmap
    import time

    import zarr

    root = tmp_path / "s.zarr"
    group = zarr.open_group(str(root), mode="w", zarr_format=3)
    group.create_array("a", shape=(64,), chunks=(16,), dtype="<i4", fill_value=-1)[:] = 5
    ttl = 0.5
    m = mount(root, "--metadata-ttl", str(ttl))
    views = m.path / ".zvfs"
    files = {  # each read once, so the mount holds its node
        "data.raw": views / "arrays/a/data.raw",
        "chunk": views / "arrays/a/chunks/0",
        "mirror": views / "v2/a/0",
        "netcdf": views / "netcdf/root.nc",
    }
    for path in files.values():
        path.read_bytes()
    zarr.open_group(str(root), mode="a").create_array("a", shape=(64,), chunks=(32,), dtype="<i4",
                                                      fill_value=-1, overwrite=True)[:] = 9
    ref = zarr.open_array(str(root), path="a", mode="r")[...]
    time.sleep(ttl * 1.6)  # past the TTL
    for top in ("arrays/a", "v2/a", "netcdf"):
        [entry.stat() for entry in os.scandir(views / top)]  # ls -l
    fd = os.open(files["data.raw"], os.O_RDONLY)
    try:
        assert os.pread(fd, 1 << 20, 0) == ref.tobytes()  # first: a failed mapping is a SIGBUS
        with mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ) as view:
            assert bytes(view) == ref.tobytes()
    finally:
        os.close(fd)
    assert files["chunk"].read_bytes() == ref[:32].tobytes()
    assert files["mirror"].read_bytes() == ref[:32].tobytes()
    nc = files["netcdf"].read_bytes()
    assert len(nc) == os.stat(files["netcdf"]).st_size and ref.astype(">i4").tobytes() in nc


def test_a_walk_of_the_views_past_the_ttl_shows_each_group_as_it_is_now(mount, tmp_path) -> None:
    """Arrays removed from and added to a group behind the mount (zarr-python), then, past
    the TTL, a walk of the views (glob, find, ls -R): the listing of the views' top told the
    kernel the group's directory with the node the mount had made before, and the group went
    on listing the removed array, not the new one, for a TTL more, though the mount had read
    the new hierarchy (the removed array's files were ENOENT meanwhile). Every directory of
    arrays/ and v2/ now shows what zarr-python reads."""
    import zarr

    root = tmp_path / "s.zarr"
    deep = zarr.open_group(str(root), mode="w", zarr_format=3).create_group("sub").create_group("deep")
    for i in range(3):
        deep.create_array(f"b{i}", shape=(2,), dtype="<i2", fill_value=0)[:] = i
    ttl = 1.0
    m = mount(root, "--metadata-ttl", str(ttl))
    arrays, v2 = m.path / ".zvfs/arrays", m.path / ".zvfs/v2"
    _check_views_against_zarr(arrays, root)
    assert sorted(os.listdir(v2 / "sub/deep")) == [".zattrs", ".zgroup", ".zmetadata", "b0", "b1", "b2"]
    shutil.rmtree(root / "sub/deep/b2")
    deep.create_array("b3", shape=(3,), dtype="<f4", fill_value=0)[:] = 1.5
    time.sleep(ttl * 1.5)  # past the TTL
    assert os.listdir(arrays) == ["sub"] and "sub" in os.listdir(v2)  # listings of the tops
    _check_views_against_zarr(arrays, root)
    assert sorted(os.listdir(v2 / "sub/deep")) == [".zattrs", ".zgroup", ".zmetadata", "b0", "b1", "b3"]
    assert (v2 / "sub/deep/b3/0").read_bytes() == np.full(3, 1.5, "<f4").tobytes()


@pytest.mark.parametrize("fmt", [2, 3])
def test_a_broken_root_hides_no_array_below_it(tmp_path, mount, fmt) -> None:
    """A root group whose metadata is cut short (a write interrupted): zarr-python still
    opens each array below by its own metadata, and so does the mount now. Before, the
    broken root was taken for an array whose type could not be told and nothing below it
    was looked for: .zvfs/arrays held the root's meta.json alone."""
    import zarr

    root = tmp_path / "store"
    g = zarr.open_group(str(root), mode="w", zarr_format=fmt)
    g.create_array("a", shape=(10,), chunks=(4,), dtype="<i4", fill_value=-1)[:7] = np.arange(7)
    g.create_group("g").create_array("b", shape=(3, 2), chunks=(2, 2), dtype="<f8")[:] = 1.5
    meta = root / ("zarr.json" if fmt == 3 else ".zgroup")
    meta.write_bytes(meta.read_bytes()[:15])
    (root / ".zmetadata").unlink(missing_ok=True)  # consolidated: it would name them all
    mnt = mount(root)
    arrays = mnt.path / ".zvfs" / "arrays"
    for path in ("a", "g/b"):
        want = np.asarray(zarr.open_array(str(root), path=path, mode="r")[...])
        assert (arrays / path / "data.raw").read_bytes() == want.tobytes(), path
    # the broken document is told, by its key (v2 found the arrays before: a broken
    # .zgroup is still a group; a broken zarr.json could be either)
    assert f"/: {meta.name}: " in mnt.log_text(), mnt.log_text()
