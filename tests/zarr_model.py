"""The reference model for the property test: random Zarr arrays written by zarr-python.

Not a conftest and not a test module: ``tests/test_property.py`` uses it.

* :func:`array_specs` is a hypothesis strategy of JSON-able array descriptions
  (``spec``): format 2 or 3, writer zarr-python 3 or 2, shape, chunks, shards,
  dtype (bool, big-endian, ...), order, fill value (NaN too), codecs, and which
  chunks get written (all, a region, none, or all and then some keys deleted).
* :func:`write_zarr3` writes a spec with zarr-python 3 in this process;
  :class:`Zarr2Writer` does the same with zarr-python 2.18 in a throwaway venv
  (one long-lived subprocess that reads one JSON request per line).
* Either returns the reference: what zarr-python reads back from the store it
  wrote, never anything zvfs decoded.
* :func:`expected_bytes` and friends say what ``data.raw``, ``data.npy`` and
  ``chunks/<i.j.k>`` must hold.
"""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import strategies as st

ZARR2_VENV = Path("/tmp/zarr2-venv")  # the venv scripts/make_fixtures uses too

# --------------------------------------------------------------------------- dtypes

#: numpy dtype strings (with byte order); v3 takes the logical type and the byte order
#: goes into the bytes codec's ``endian``
DTYPES = [
    "|b1", "|i1", "|u1",
    "<i2", ">i2", "<u2", ">u2",
    "<i4", ">i4", "<u4",
    "<i8", ">i8", ">u8",
    "<f2", ">f2", "<f4", ">f4", "<f8", ">f8",
    "<c8", ">c16",
]  # fmt: skip

V3_NAMES = {
    "b": "bool", "i1": "int8", "u1": "uint8", "i2": "int16", "u2": "uint16", "i4": "int32",
    "u4": "uint32", "i8": "int64", "u8": "uint64", "f2": "float16", "f4": "float32",
    "f8": "float64", "c8": "complex64", "c16": "complex128",
}  # fmt: skip


def v3_logical(dtype: str) -> str:
    code = dtype[1:]
    return V3_NAMES["b" if code == "b1" else code]


def declared_dtype(spec: dict[str, Any]) -> np.dtype:
    """The dtype data.raw is in: v2's ``dtype``; v3's logical type in the bytes codec's order.

    Worked out from the spec (what was asked of zarr-python), not from zvfs.
    """
    dt = np.dtype(spec["dtype"])
    if spec["format"] == 2 or dt.itemsize == 1:
        return dt
    return dt.newbyteorder("<" if spec["endian"] == "little" else ">")


# --------------------------------------------------------------------------- strategies


def _fill_values(dtype: np.dtype, writer: str) -> st.SearchStrategy[Any]:
    if dtype.kind == "b":
        return st.booleans()
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return st.one_of(st.integers(-3, 3).filter(lambda v: info.min <= v <= info.max),
                         st.sampled_from([int(info.min), int(info.max)]),
                         st.integers(int(info.min), int(info.max)))
    width = {2: 16, 4: 32, 8: 64, 16: 64}[dtype.itemsize] if dtype.kind == "f" else 32
    if dtype.kind == "c":
        width = 32 if dtype.itemsize == 8 else 64
    floats = st.one_of(
        st.sampled_from([0.0, float("nan"), -0.0, float("inf"), float("-inf"), 1.5]),
        st.floats(width=width, allow_nan=True, allow_infinity=True),
    )
    if dtype.kind == "c":
        if writer == "zarr2":
            # zarr-python 2.18 decodes a complex fill [re, im] as ``re + 1j * im``, which turns
            # a -0.0 part into 0.0 and an infinite or NaN part into NaN in the other part
            # (zarr 3 and zvfs keep the metadata's values): zarr 2 is the reference, so give
            # it fills it reads back faithfully
            finite = st.floats(width=width, allow_nan=False, allow_infinity=False).map(lambda x: x + 0.0)
            return st.tuples(finite, finite)
        return st.tuples(floats, floats)
    return floats


@st.composite
def _grid(draw: st.DrawFn, ndim: int) -> tuple[list[int], list[int]]:
    """(shape, chunks) with few chunks: partial edge chunks and chunks bigger than the shape."""
    max_per_dim = {0: 1, 1: 16, 2: 8, 3: 4}[ndim]
    max_len = 40 if ndim < 3 else 24
    shape, chunks = [], []
    for _ in range(ndim):
        n = draw(st.integers(0, max_len))
        k = draw(st.integers(1, max_per_dim))
        c = max(1, -(-n // k)) + draw(st.integers(0, 2))  # +0..2: uneven edges, oversize chunks
        shape.append(n)
        chunks.append(c)
    return shape, chunks


V2_COMPRESSORS = st.one_of(
    st.none(),
    st.builds(lambda lv: {"id": "zlib", "level": lv}, st.integers(0, 9)),
    st.builds(lambda lv: {"id": "gzip", "level": lv}, st.integers(0, 9)),
    st.builds(lambda lv: {"id": "zstd", "level": lv}, st.integers(-1, 5)),
    st.builds(lambda cname, lv, sh: {"id": "blosc", "cname": cname, "clevel": lv, "shuffle": sh,
                                      "blocksize": 0},
              st.sampled_from(["lz4", "lz4hc", "zlib", "zstd", "blosclz"]), st.integers(0, 9),
              st.sampled_from([-1, 0, 1, 2])),
)


@st.composite
def _v2_filters(draw: st.DrawFn, dtype: np.dtype) -> list[dict[str, Any]] | None:
    options: list[dict[str, Any]] = [{"id": "shuffle", "elementsize": dtype.itemsize}]
    if dtype.kind in "iu":
        options.append({"id": "delta", "dtype": dtype.str, "astype": dtype.str})
    chain = draw(st.lists(st.sampled_from(options), max_size=2))
    return chain or None


def _v3_compressor() -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(
        st.builds(lambda lv: {"name": "gzip", "configuration": {"level": lv}}, st.integers(0, 9)),
        st.builds(lambda lv, ck: {"name": "zstd", "configuration": {"level": lv, "checksum": ck}},
                  st.integers(-1, 5), st.booleans()),
        st.builds(lambda cname, lv, sh: {"name": "blosc", "configuration": {
            "cname": cname, "clevel": lv, "shuffle": sh}},
            st.sampled_from(["lz4", "lz4hc", "zlib", "zstd", "blosclz"]), st.integers(0, 9),
            st.sampled_from(["noshuffle", "shuffle", "bitshuffle"])),
    )


@st.composite
def _v3_compressors(draw: st.DrawFn) -> list[dict[str, Any]]:
    chain = draw(st.lists(_v3_compressor(), max_size=2))
    if draw(st.booleans()):
        chain.append({"name": "crc32c"})
    return chain


@st.composite
def array_specs(draw: st.DrawFn, writers: tuple[str, ...] = ("zarr3", "zarr2")) -> dict[str, Any]:
    """A random array description; small, so that failures shrink to something readable."""
    writer = draw(st.sampled_from(writers))
    fmt = 2 if writer == "zarr2" else draw(st.sampled_from([3, 2]))
    ndim = draw(st.integers(0, 3))
    shape, chunks = draw(_grid(ndim))
    dtype = draw(st.sampled_from(DTYPES))
    dt = np.dtype(dtype)
    spec: dict[str, Any] = {
        "writer": writer, "format": fmt, "shape": shape, "chunks": chunks, "dtype": dtype,
        "fill": draw(_fill_values(dt, writer)),
        "data": draw(st.sampled_from(["random", "sparse", "fill"])),
        "seed": draw(st.integers(0, 2**16)),
        "write_empty": draw(st.booleans()),
    }  # fmt: skip
    if fmt == 2:
        spec["order"] = draw(st.sampled_from(["C", "F"]))
        spec["separator"] = draw(st.sampled_from([".", "/"]))
        spec["compressor"] = draw(V2_COMPRESSORS)
        spec["filters"] = draw(_v2_filters(dt))
    else:
        spec["endian"] = draw(st.sampled_from(["little", "big"]))
        spec["key_encoding"] = draw(st.sampled_from(
            [["default", "/"], ["default", "."], ["v2", "."], ["v2", "/"]]))
        spec["transpose"] = draw(st.permutations(range(ndim))) if ndim and draw(st.booleans()) else None
        spec["compressors"] = draw(_v3_compressors())
        if ndim and draw(st.booleans()):  # sharding: the chunks above become the inner chunks
            factors = [draw(st.integers(1, 4)) for _ in chunks]
            spec["shards"] = [c * k for c, k in zip(chunks, factors, strict=True)]
            spec["shard_index"] = draw(st.sampled_from(["end", "start"]))
            spec["shard_index_crc"] = draw(st.booleans())
            if draw(st.booleans()):  # nested: shards of shards of the inner chunks
                spec["mid_shards"] = [c * draw(st.sampled_from([d for d in (1, 2, 4) if k % d == 0]))
                                      for c, k in zip(chunks, factors, strict=True)]  # fmt: skip
    # which chunks get written
    mode = draw(st.sampled_from(["full", "region", "delete", "none"]))
    spec["write"] = mode
    if mode == "region":
        box = []
        for n in shape:
            lo = draw(st.integers(0, n))
            box.append([lo, draw(st.integers(lo, n))])
        spec["region"] = box
    elif mode == "delete":
        spec["delete"] = draw(st.lists(st.booleans(), min_size=1, max_size=64))
    return spec


def inner_chunks(spec: dict[str, Any]) -> list[int]:
    """The unit chunk of ``chunks/``: the (inner) chunk shape."""
    return list(spec["chunks"])


def grid_shape(spec: dict[str, Any]) -> tuple[int, ...]:
    return tuple(-(-n // c) for n, c in zip(spec["shape"], inner_chunks(spec), strict=True))


@st.composite
def reads_for(draw: st.DrawFn, spec: dict[str, Any], header_len: int) -> list[tuple]:
    """Random reads: (file, offset, length, O_DIRECT?) for data.raw, data.npy and chunks/."""
    nbytes = math.prod(spec["shape"]) * np.dtype(spec["dtype"]).itemsize
    grid = grid_shape(spec)
    kinds = ["raw", "npy"] + (["chunk"] if math.prod(grid) else [])
    out = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(kinds))
        if kind == "chunk":
            idx = tuple(draw(st.integers(0, g - 1)) for g in grid)
            size = chunk_nbytes(spec, idx)
            name = "chunks/" + (".".join(map(str, idx)) if idx else "0")
        else:
            size = nbytes + (header_len if kind == "npy" else 0)
            name = "data." + kind
        offset = draw(st.integers(0, size))
        length = draw(st.integers(0, size - offset + 16))
        out.append((name, offset, length, draw(st.booleans())))
    return out


# --------------------------------------------------------------------------- data


def make_data(spec: dict[str, Any]) -> np.ndarray:
    """Deterministic values for ``spec`` (NaN and inf sprinkled into floats)."""
    dt = np.dtype(spec["dtype"])
    shape = tuple(spec["shape"])
    n = math.prod(shape)
    r = np.random.default_rng(spec["seed"])
    if dt.kind == "b":
        out = r.integers(0, 2, n).astype(bool)
    elif dt.kind in "iu":
        info = np.iinfo(dt)
        out = r.integers(int(info.min), int(info.max), n, dtype=dt.newbyteorder("="), endpoint=True)
    elif dt.kind == "f":
        out = (r.standard_normal(n) * 1000).astype(dt)
        special = r.random(n)
        out[special < 0.03] = np.nan
        out[(special >= 0.03) & (special < 0.05)] = np.inf
    else:
        out = (r.standard_normal(n) + 1j * r.standard_normal(n)).astype(dt)
    out = out.astype(dt)
    fill = fill_array_value(spec)
    if spec["data"] == "fill":
        out[:] = fill
    elif spec["data"] == "sparse":
        out[r.random(n) < 0.8] = fill
    return out.reshape(shape)


def fill_array_value(spec: dict[str, Any]) -> Any:
    dt = np.dtype(spec["dtype"])
    fill = spec["fill"]
    if dt.kind == "c":
        return complex(fill[0], fill[1])
    return fill


def stored_box(spec: dict[str, Any]) -> tuple[slice, ...]:
    return tuple(slice(lo, hi) for lo, hi in spec["region"])


# --------------------------------------------------------------------------- zarr-python 3


def _v3_codec(desc: dict[str, Any]) -> Any:
    from zarr.codecs import BloscCodec, Crc32cCodec, GzipCodec, ZstdCodec

    conf = desc.get("configuration", {})
    return {"gzip": GzipCodec, "zstd": ZstdCodec, "blosc": BloscCodec,
            "crc32c": Crc32cCodec}[desc["name"]](**conf)  # fmt: skip


def _sharding(spec: dict[str, Any], codecs: list[Any]) -> Any:
    """The sharding codec of ``spec`` (nested when it has ``mid_shards``) around ``codecs``."""
    from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec

    def level(chunk_shape: list[int], inner: list[Any]) -> Any:
        index = [BytesCodec(endian="little"), *([Crc32cCodec()] if spec["shard_index_crc"] else [])]
        return ShardingCodec(chunk_shape=tuple(chunk_shape), codecs=inner, index_codecs=index,
                             index_location=spec["shard_index"])  # fmt: skip

    inner = level(spec["chunks"], codecs)
    if spec.get("mid_shards"):
        return level(spec["mid_shards"], [inner])
    return inner


def write_zarr3(spec: dict[str, Any], root: Path, path: str) -> np.ndarray:
    """Write ``spec`` at ``root/path`` with zarr-python 3; return what it reads back."""
    import numcodecs
    import zarr
    from zarr.codecs import BytesCodec, TransposeCodec

    store = zarr.storage.LocalStore(str(root))
    kw: dict[str, Any] = dict(
        shape=tuple(spec["shape"]), chunks=tuple(spec["chunks"]), fill_value=fill_array_value(spec),
        config={"write_empty_chunks": spec["write_empty"]}, zarr_format=spec["format"],
    )  # fmt: skip
    if spec["format"] == 2:
        kw["dtype"] = spec["dtype"]
        kw["order"] = spec["order"]
        kw["chunk_key_encoding"] = {"name": "v2", "separator": spec["separator"]}
        kw["compressors"] = numcodecs.get_codec(dict(spec["compressor"])) if spec["compressor"] else None
        kw["filters"] = [numcodecs.get_codec(dict(f)) for f in spec["filters"] or []] or None
    else:
        kw["dtype"] = v3_logical(spec["dtype"])
        itemsize = np.dtype(spec["dtype"]).itemsize
        kw["serializer"] = BytesCodec(endian=spec["endian"] if itemsize > 1 else None)
        kw["compressors"] = [_v3_codec(c) for c in spec["compressors"]] or None
        kw["filters"] = [TransposeCodec(order=tuple(spec["transpose"]))] if spec["transpose"] else None
        name, sep = spec["key_encoding"]
        kw["chunk_key_encoding"] = {"name": name, "separator": sep}
        if spec.get("shards"):
            plain = (spec["shard_index"], spec["shard_index_crc"], spec.get("mid_shards")) == ("end", True, None)
            if plain:  # zarr-python's own way: index at the end, crc32c on it
                kw["shards"] = tuple(spec["shards"])
            else:  # the sharding codec spelled out: index first, no index checksum, nesting
                kw["chunks"] = tuple(spec["shards"])
                kw["serializer"] = _sharding(spec, [*(kw["filters"] or []), kw["serializer"],
                                                    *(kw["compressors"] or [])])  # fmt: skip
                kw["filters"] = kw["compressors"] = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. "the v2 format is not the recommended one"
        arr = zarr.create_array(store, name=path, overwrite=True, **kw)
        data = make_data(spec)
        if spec["write"] in ("full", "delete"):
            arr[...] = data
        elif spec["write"] == "region":
            arr[stored_box(spec)] = data[stored_box(spec)]
        if spec["write"] == "delete":
            delete_chunk_keys(root / path, spec["delete"])
        return np.asarray(zarr.open_array(store, path=path, mode="r")[...])


METADATA_NAMES = {"zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata"}


def delete_chunk_keys(array_dir: Path, mask: list[bool]) -> list[str]:
    """Delete the stored chunk (shard) keys whose position in sorted order has a True in
    ``mask`` (cycled): chunks that were written, then removed from the store."""
    keys = sorted(
        p for p in array_dir.rglob("*") if p.is_file() and p.name not in METADATA_NAMES
    )
    gone = []
    for i, p in enumerate(keys):
        if mask[i % len(mask)]:
            p.unlink()
            gone.append(p.relative_to(array_dir).as_posix())
    return gone


# --------------------------------------------------------------------------- zarr-python 2

ZARR2_WORKER = r"""
import json, sys, traceback, warnings
from pathlib import Path
import numpy as np, numcodecs, zarr
warnings.simplefilter("ignore")
META = {"zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata"}
print(json.dumps({"version": zarr.__version__}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    try:
        spec, root, path = req["spec"], req["root"], req["path"]
        data = np.load(req["data"], allow_pickle=False)
        fill = spec["fill"]
        if data.dtype.kind == "c":
            fill = complex(fill[0], fill[1])
        store = zarr.DirectoryStore(root, dimension_separator=spec["separator"])
        comp = numcodecs.get_codec(dict(spec["compressor"])) if spec["compressor"] else None
        filters = [numcodecs.get_codec(dict(f)) for f in spec["filters"] or []] or None
        arr = zarr.create(shape=tuple(spec["shape"]), chunks=tuple(spec["chunks"]), dtype=spec["dtype"],
                          compressor=comp, filters=filters, order=spec["order"], fill_value=fill,
                          store=store, path=path, overwrite=True,
                          write_empty_chunks=spec["write_empty"], dimension_separator=spec["separator"])
        if spec["write"] in ("full", "delete"):
            arr[...] = data
        elif spec["write"] == "region":
            box = tuple(slice(lo, hi) for lo, hi in spec["region"])
            arr[box] = data[box]
        if spec["write"] == "delete":  # the same rule as zarr_model.delete_chunk_keys
            mask = spec["delete"]
            keys = sorted(p for p in (Path(root) / path).rglob("*") if p.is_file() and p.name not in META)
            for i, p in enumerate(keys):
                if mask[i % len(mask)]:
                    p.unlink()
        back = zarr.open_array(zarr.DirectoryStore(root, dimension_separator=spec["separator"]), path=path, mode="r")
        np.save(req["ref"], np.asarray(back[...]), allow_pickle=False)
        print(json.dumps({"ok": True}), flush=True)
    except Exception:
        print(json.dumps({"error": traceback.format_exc()}), flush=True)
"""


def ensure_zarr2_python() -> str:
    """zarr-python 2.18 in /tmp/zarr2-venv (made like scripts/make_fixtures, atomically)."""
    py = ZARR2_VENV / "bin" / "python"
    if py.exists():
        return str(py)
    tmp = ZARR2_VENV.with_name(f"{ZARR2_VENV.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(tmp)], check=True, timeout=300)
    subprocess.run([str(tmp / "bin" / "python"), "-m", "pip", "install", "-q",
                    "zarr>=2.18,<3", "numcodecs"], check=True, timeout=600)  # fmt: skip
    try:
        tmp.rename(ZARR2_VENV)  # a venv works when moved: bin/python finds its site-packages
    except OSError:  # another process made it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    return str(py)


class Zarr2Writer:
    """One zarr-python 2.18 process serving write requests; stopped by its own PID."""

    def __init__(self, python: str, scratch: Path) -> None:
        self.scratch = scratch
        self.proc = subprocess.Popen(
            [python, "-c", ZARR2_WORKER],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self._lock = threading.Lock()
        self._n = 0
        hello = self.proc.stdout.readline() if self.proc.stdout else ""
        if not hello:
            self.stop()
            raise RuntimeError("the zarr 2 writer did not start")
        self.version = json.loads(hello)["version"]

    def write(self, spec: dict[str, Any], root: Path, path: str) -> np.ndarray:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with self._lock:
            self._n += 1
            ref = self.scratch / f"ref{self._n}.npy"
            data = self.scratch / f"data{self._n}.npy"
            np.save(data, make_data(spec), allow_pickle=False)
            req = {"spec": spec, "root": str(root), "path": path, "ref": str(ref), "data": str(data)}
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"the zarr 2 writer died (exit {self.proc.poll()})")
        reply = json.loads(answer)
        if "error" in reply:
            raise RuntimeError("zarr 2 failed to write the spec:\n" + reply["error"])
        out = np.load(ref, allow_pickle=False)
        ref.unlink()
        data.unlink()
        return out

    def stop(self) -> None:
        proc = self.proc
        if proc.poll() is None:
            if proc.stdin:
                proc.stdin.close()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        if proc.stdout:
            proc.stdout.close()


# --------------------------------------------------------------------------- expectations


def expected_raw(spec: dict[str, Any], ref: np.ndarray) -> bytes:
    """data.raw: the reference in the declared dtype and byte order, C order."""
    return np.asarray(ref).astype(declared_dtype(spec)).tobytes(order="C")


def npy_header_of(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """The header np.save writes for an array of ``dtype`` and ``shape`` (C order).

    Only its length is used (to draw read ranges that reach past the header):
    np.save pads its header for in-place growth, which the NPY format does not
    require, so zvfs's header is checked by parsing it (see :func:`parse_npy_header`).
    """
    buf = io.BytesIO()
    np.save(buf, np.zeros(shape, dtype=dtype), allow_pickle=False)
    nbytes = math.prod(shape) * dtype.itemsize
    return buf.getvalue()[: len(buf.getvalue()) - nbytes]


def parse_npy_header(data: bytes) -> tuple[int, tuple[int, ...], bool, np.dtype]:
    """(header length, shape, fortran_order, dtype) of an NPY file, by numpy's own reader."""
    f = io.BytesIO(data)
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
    else:
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
    return f.tell(), tuple(shape), bool(fortran), dtype


def chunk_region(spec: dict[str, Any], idx: tuple[int, ...]) -> tuple[slice, ...]:
    return tuple(
        slice(i * c, min(n, (i + 1) * c))
        for i, c, n in zip(idx, inner_chunks(spec), spec["shape"], strict=True)
    )


def chunk_nbytes(spec: dict[str, Any], idx: tuple[int, ...]) -> int:
    n = 1
    for s in chunk_region(spec, idx):
        n *= s.stop - s.start
    return n * np.dtype(spec["dtype"]).itemsize


def expected_chunk(spec: dict[str, Any], ref: np.ndarray, idx: tuple[int, ...]) -> bytes:
    """chunks/<i.j.k>: the chunk's region of the reference, clipped at the array's edge."""
    # the Ellipsis keeps a 0-d region an array in its byte order (a numpy scalar is native:
    # the model expected a big-endian 0-d chunk little-endian, as zvfs wrongly served it)
    region = np.asarray(ref)[(..., *chunk_region(spec, idx))]
    return region.astype(declared_dtype(spec)).tobytes(order="C")


def describe(spec: dict[str, Any]) -> str:
    return json.dumps(spec, sort_keys=True)
