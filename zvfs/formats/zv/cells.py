"""Reading the Zarr v3 arrays that hold ZV cells.

ZV needs little from Zarr: the zarr.json of a node, one decoded chunk of a small
array (vlen-bytes cells, uint8 blobs, int64/float tables), possibly under zstd,
blosc, gzip, crc32c and sharding_indexed. This module does exactly that, so the
ZV decoder depends on nothing but the store. Everything is blocking.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zvfs.stores.base import KeyNotFound, Store, StoreError

from .errors import ZVError

_DTYPES = {
    "bool": "|b1", "int8": "|i1", "uint8": "|u1", "int16": "<i2", "uint16": "<u2",
    "int32": "<i4", "uint32": "<u4", "int64": "<i8", "uint64": "<u8",
    "float16": "<f2", "float32": "<f4", "float64": "<f8",
}
_VLEN = ("variable_length_bytes", "bytes", "string", "vlen-bytes", "vlen-utf8")


def join(*parts: str) -> str:
    """Store key from path parts, skipping empty ones."""
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


def load_node(store: Store, path: str) -> dict[str, Any] | None:
    """The zarr.json document at ``path`` ('' = root), or None if there is none."""
    key = join(path, "zarr.json")
    try:
        raw = store.get(key)
    except KeyNotFound:
        return None
    except StoreError as exc:
        raise ZVError(key, str(exc)) from exc
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ZVError(key, f"malformed JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise ZVError(key, "expected a JSON object")
    return doc


@dataclass(slots=True)
class Array:
    """Just enough of one Zarr v3 array's metadata to read its chunks."""

    path: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...]  # the decoded chunk unit (inner chunk when sharded)
    dtype: np.dtype | None  # None for variable-length bytes
    fill: Any
    codecs: list[dict[str, Any]]
    attributes: dict[str, Any] = field(default_factory=dict)
    separator: str = "/"
    v2_keys: bool = False
    shard: tuple[int, ...] | None = None  # outer (stored) chunk when sharded
    index_codecs: list[dict[str, Any]] = field(default_factory=list)
    index_at_end: bool = True

    @property
    def grid(self) -> tuple[int, ...]:
        return tuple(math.ceil(s / c) if c else 0 for s, c in zip(self.shape, self.chunks, strict=False))

    def stored_key(self, idx: tuple[int, ...]) -> str:
        if self.v2_keys:
            name = self.separator.join(str(i) for i in idx) if idx else "0"
        else:
            name = self.separator.join(["c", *(str(i) for i in idx)])
        return join(self.path, name)


def open_array(store: Store, path: str, doc: dict[str, Any] | None = None) -> Array:
    """Parse the array at ``path``; ZVError naming its zarr.json if it is not a readable array."""
    key = join(path, "zarr.json")
    doc = doc if doc is not None else load_node(store, path)
    if doc is None:
        raise ZVError(key, "missing")
    if doc.get("node_type") != "array":
        raise ZVError(key, "is not an array")
    try:
        shape = tuple(int(s) for s in doc["shape"])
        chunks = tuple(int(c) for c in doc["chunk_grid"]["configuration"]["chunk_shape"])
        dt = doc["data_type"]
        codecs = list(doc.get("codecs") or [])
    except (KeyError, TypeError, ValueError) as exc:
        raise ZVError(key, f"malformed array metadata ({exc})") from exc
    if isinstance(dt, str) and dt in _VLEN:
        dtype = None
    elif isinstance(dt, str) and dt in _DTYPES:
        dtype = np.dtype(_DTYPES[dt])
    else:
        raise ZVError(key, f"unsupported data_type {dt!r}")
    enc = doc.get("chunk_key_encoding") or {"name": "default"}
    sep = (enc.get("configuration") or {}).get("separator", "/" if enc.get("name") == "default" else ".")
    arr = Array(path, shape, chunks, dtype, doc.get("fill_value"), codecs,
                dict(doc.get("attributes") or {}), sep, enc.get("name") == "v2")
    if codecs and codecs[0].get("name") == "sharding_indexed":
        conf = codecs[0].get("configuration") or {}
        arr.shard = chunks
        arr.chunks = tuple(int(c) for c in conf["chunk_shape"])
        arr.codecs = list(conf.get("codecs") or [])
        arr.index_codecs = list(conf.get("index_codecs") or [])
        arr.index_at_end = conf.get("index_location", "end") == "end"
    return arr


def _bytes_codec(data: bytes, spec: dict[str, Any], key: str) -> bytes:
    """Undo one bytes->bytes codec."""
    name = spec.get("name")
    conf = spec.get("configuration") or {}
    try:
        if name == "zstd":
            from numcodecs import Zstd

            return bytes(Zstd().decode(data))
        if name == "blosc":
            from numcodecs import Blosc

            return bytes(Blosc().decode(data))
        if name == "gzip":
            import gzip

            return gzip.decompress(data)
        if name == "crc32c":
            return data[:-4]
    except Exception as exc:  # a corrupt frame: say which key
        raise ZVError(key, f"{name} decode failed ({exc})") from exc
    del conf
    raise ZVError(key, f"unsupported codec {name!r}")


def decode_chunk(arr: Array, data: bytes, key: str) -> np.ndarray:
    """Run the codec pipeline backwards over one stored chunk; returns the chunk array."""
    codecs = arr.codecs
    split = next((i for i, c in enumerate(codecs) if c.get("name") in ("bytes", "vlen-bytes", "vlen-utf8")), None)
    if split is None:
        raise ZVError(key, "no array-to-bytes codec")
    for spec in reversed(codecs[split + 1 :]):
        data = _bytes_codec(data, spec, key)
    n = math.prod(arr.chunks)
    name = codecs[split].get("name")
    if name == "bytes":
        if arr.dtype is None:
            raise ZVError(key, "bytes codec on a variable-length array")
        endian = (codecs[split].get("configuration") or {}).get("endian", "little")
        dt = arr.dtype.newbyteorder("<" if endian == "little" else ">")
        if len(data) != n * dt.itemsize:
            raise ZVError(key, f"chunk holds {len(data)} bytes, expected {n * dt.itemsize} (truncated?)")
        out = np.frombuffer(data, dt).reshape(arr.chunks)
    else:
        out = _vlen(data, n, key, utf8=name == "vlen-utf8").reshape(arr.chunks)
    for spec in reversed(codecs[:split]):
        if spec.get("name") == "transpose":
            order = (spec.get("configuration") or {}).get("order")
            out = out.transpose(np.argsort(order)) if order is not None else out
        else:
            raise ZVError(key, f"unsupported codec {spec.get('name')!r}")
    return out


def _vlen(data: bytes, n: int, key: str, utf8: bool) -> np.ndarray:
    """vlen-bytes: u32 count, then per item u32 length + bytes."""
    if len(data) < 4:
        raise ZVError(key, "vlen chunk shorter than its header")
    (count,) = struct.unpack_from("<I", data, 0)
    if count != n:
        raise ZVError(key, f"vlen chunk holds {count} items, expected {n}")
    out = np.empty(n, dtype=object)
    pos = 4
    for i in range(n):
        if pos + 4 > len(data):
            raise ZVError(key, "vlen chunk truncated")
        (ln,) = struct.unpack_from("<I", data, pos)
        pos += 4
        if pos + ln > len(data):
            raise ZVError(key, "vlen chunk truncated")
        item = data[pos : pos + ln]
        out[i] = item.decode("utf-8", "replace") if utf8 else item
        pos += ln
    return out


def _fetch(store: Store, key: str, start: int | None = None, length: int | None = None) -> bytes | None:
    try:
        if start is None:
            return store.get(key)
        return store.get_range(key, start, length or 0)
    except KeyNotFound:
        return None
    except StoreError as exc:
        raise ZVError(key, str(exc)) from exc


def read_chunk(store: Store, arr: Array, idx: tuple[int, ...]) -> np.ndarray | None:
    """One decoded chunk (the inner chunk when sharded), or None if it was never written."""
    if arr.shard is None:
        key = arr.stored_key(idx)
        data = _fetch(store, key)
        return None if data is None else decode_chunk(arr, data, key)
    per = tuple(s // c for s, c in zip(arr.shard, arr.chunks, strict=False))
    outer = tuple(i // p for i, p in zip(idx, per, strict=False))
    inner = tuple(i % p for i, p in zip(idx, per, strict=False))
    key = arr.stored_key(outer)
    n = math.prod(per)
    crc = any(c.get("name") == "crc32c" for c in arr.index_codecs)
    index_len = 16 * n + (4 if crc else 0)
    try:
        size = store.info(key).size
    except KeyNotFound:
        return None
    except StoreError as exc:
        raise ZVError(key, str(exc)) from exc
    if size < index_len:
        raise ZVError(key, f"shard of {size} bytes is shorter than its {index_len}-byte index")
    index = _fetch(store, key, size - index_len if arr.index_at_end else 0, index_len) or b""
    if len(index) != index_len:
        raise ZVError(key, "shard index truncated")
    table = np.frombuffer(index, "<u8", 2 * n).reshape(n, 2)
    slot = int(np.ravel_multi_index(inner, per))
    off, nbytes = (int(v) for v in table[slot])
    if off == 2**64 - 1 and nbytes == 2**64 - 1:
        return None
    if off + nbytes > size:
        raise ZVError(key, f"shard index points past the end of the shard (inner chunk {inner})")
    data = _fetch(store, key, off, nbytes) or b""
    if len(data) != nbytes:
        raise ZVError(key, "shard truncated")
    return decode_chunk(arr, data, f"{key}[{','.join(map(str, inner))}]")


def read_all(store: Store, arr: Array) -> np.ndarray:
    """The whole array (small tables only): chunks assembled, fill where absent."""
    if arr.dtype is None:
        out = np.empty(arr.shape, dtype=object)
        out.fill(b"")
    else:
        out = np.empty(arr.shape, dtype=arr.dtype)
        fill = arr.fill
        if isinstance(fill, str) and arr.dtype.kind == "f":
            fill = float(fill)  # "NaN", "Infinity"
        out.fill(fill if fill is not None else 0)
    for idx in np.ndindex(*arr.grid):
        chunk = read_chunk(store, arr, idx)
        if chunk is None:
            continue
        sel = tuple(slice(i * c, min((i + 1) * c, s)) for i, c, s in zip(idx, arr.chunks, arr.shape, strict=False))
        out[sel] = chunk[tuple(slice(0, s.stop - s.start) for s in sel)]
    return out


def read_blob(store: Store, path: str) -> bytes | None:
    """A 0.7-layout per-chunk child array (1-D uint8) as bytes; None if absent."""
    doc = load_node(store, path)
    if doc is None:
        return None
    arr = open_array(store, path, doc)
    if arr.dtype is None or arr.dtype.itemsize != 1 or len(arr.shape) != 1:
        raise ZVError(join(path, "zarr.json"), "expected a 1-D uint8 blob array")
    return read_all(store, arr).tobytes()


def read_cell(store: Store, arr: Array, coords: tuple[int, ...]) -> bytes | None:
    """The bytes of one vlen cell at grid index ``coords`` (chunks of one element), or None."""
    chunk_idx = tuple(c // s for c, s in zip(coords, arr.chunks, strict=False))
    within = tuple(c % s for c, s in zip(coords, arr.chunks, strict=False))
    if any(c < 0 or c >= s for c, s in zip(coords, arr.shape, strict=False)):
        return None
    chunk = read_chunk(store, arr, chunk_idx)
    if chunk is None:
        return None
    item = chunk[within]
    return bytes(item) if item is not None else None
