"""Zarr v3: ``zarr.json`` → ArrayMeta, chunk keys, and chunk reads through sharding.

For sharded arrays the decoded chunk unit is the innermost chunk. A read fetches
the shard index with a ranged read (cached), then only the bytes of the inner
chunk it needs, level by level for nested shards.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from ..codecs import CodecError, Pipeline, ShardingCodec, UnknownCodecError, build_pipeline
from ..stores.base import KeyNotFound, Store, StoreError
from ._common import attributes_of, fill_scalar, int_tuple, join, vlen_fill
from .keys import ZARR_JSON
from .meta import ArrayMeta, FormatError, checked_dtype

_SIMPLE_TYPES = {
    "bool": "?",
    "int8": "i1",
    "int16": "i2",
    "int32": "i4",
    "int64": "i8",
    "uint8": "u1",
    "uint16": "u2",
    "uint32": "u4",
    "uint64": "u8",
    "float16": "f2",
    "float32": "f4",
    "float64": "f8",
    "complex64": "c8",
    "complex128": "c16",
}
#: variable_length_utf8: zarr-python 3.1's other name for string
_VLEN_TYPES = {"string": "vlen-utf8", "variable_length_utf8": "vlen-utf8",
               "variable_length_bytes": "vlen-bytes", "bytes": "vlen-bytes"}


def parse_data_type(value: Any, key: str) -> tuple[np.dtype, str | None]:
    """(logical numpy dtype in native order, vlen kind or None) for a v3 data_type."""
    dtype, vlen = _data_type(value, key)
    return checked_dtype(dtype, key), vlen


def _configuration(value: dict[str, Any], key: str, members: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The ``configuration`` of a named member ({} when absent). Any other JSON there (a
    string, a number, null: zarr-python refuses each) is the document's error: read as a
    dict it raised AttributeError, which the log then told without the key. With
    ``members``, one it does not name is an error too (an extension's, whose meaning zvfs
    does not know: zarr-python refuses it)."""
    conf = value.get("configuration", {})
    if not isinstance(conf, dict):
        raise FormatError(f"{key}: the configuration of {value.get('name')!r} is not a JSON object: {conf!r}")
    unknown = sorted(set(conf) - set(members)) if members is not None else []
    if unknown:
        raise FormatError(f"{key}: unknown member(s) {', '.join(map(repr, unknown))} in the configuration "
                          f"of {value.get('name')!r}")
    return conf


def _data_type(value: Any, key: str) -> tuple[np.dtype, str | None]:
    if isinstance(value, str):
        if value in _SIMPLE_TYPES:
            return np.dtype(_SIMPLE_TYPES[value]), None
        if value in _VLEN_TYPES:
            return np.dtype(object), _VLEN_TYPES[value]
        if value.startswith("r") and value[1:].isdigit() and int(value[1:]) % 8 == 0:
            try:
                return np.dtype(f"V{int(value[1:]) // 8}"), None
            except (TypeError, ValueError) as exc:  # more bytes than a numpy element holds
                raise FormatError(f"{key}: bad data_type {value!r} ({exc})") from exc
        raise FormatError(f"{key}: unsupported data_type {value!r}")
    if isinstance(value, dict) and isinstance(value.get("name"), str):
        name, conf = value["name"], _configuration(value, key)
        try:
            if name == "fixed_length_utf32":
                return np.dtype(f"U{int(conf['length_bytes']) // 4}"), None
            if name == "null_terminated_bytes":
                return np.dtype(f"S{int(conf['length_bytes'])}"), None
            if name == "raw_bytes":
                return np.dtype(f"V{int(conf['length_bytes'])}"), None
            if name in ("numpy.datetime64", "numpy.timedelta64"):
                code = "M8" if name == "numpy.datetime64" else "m8"
                scale = int(conf.get("scale_factor", 1))
                return np.dtype(f"{code}[{scale if scale != 1 else ''}{conf['unit']}]"), None
            if name == "structured":
                fields = [(f[0], _data_type(f[1], key)[0]) for f in conf["fields"]]
                return np.dtype(fields), None
            if name in _VLEN_TYPES:
                return np.dtype(object), _VLEN_TYPES[name]
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise FormatError(f"{key}: bad data_type {value!r} ({exc})") from exc
    raise FormatError(f"{key}: unsupported data_type {value!r}")


def parse_array(path: str, doc: Any, key: str | None = None) -> ArrayMeta:
    """Map an array's zarr.json onto ArrayMeta; problems land in ``error``."""
    key = key or join(path, ZARR_JSON)
    meta = ArrayMeta(path=path, format="zarr_v3", metadata_key=key, source={"doc": doc})
    try:
        _fill_meta(meta, doc, key)
    except (FormatError, UnknownCodecError) as exc:
        meta.error = str(exc) if str(exc).startswith(key) else f"{key}: {exc}"
    else:
        # the reader needs its pipeline and outer chunk shape, not the parsed document: the
        # documents of 100,000 arrays held 2.2 KB each, a third of what discovery keeps
        del meta.source["doc"]
    meta.validate()
    return meta


#: the members of an array's zarr.json the v3 spec defines
ARRAY_FIELDS = frozenset({
    "zarr_format", "node_type", "shape", "data_type", "chunk_grid", "chunk_key_encoding",
    "fill_value", "codecs", "attributes", "storage_transformers", "dimension_names",
})  # fmt: skip


#: the members of a group's zarr.json: the spec's, and zarr-python's consolidated metadata
#: (written with ``"must_understand": false``, or as null where a group has none)
GROUP_FIELDS = frozenset({"zarr_format", "node_type", "attributes", "consolidated_metadata"})


def _unknown_fields(doc: dict[str, Any], known: frozenset[str] = ARRAY_FIELDS) -> list[str]:
    """Members the spec does not define and that do not say ``"must_understand": false``: the
    spec says a node with one is not to be opened (an extension may change what the stored
    values mean; zarr-python refuses them too)."""
    return sorted(name for name, value in doc.items() if name not in known
                  and not (isinstance(value, dict) and value.get("must_understand") is False))


def _unknown_message(key: str, unknown: list[str], what: str) -> str:
    return (f"{key}: unknown extension field(s) {', '.join(map(repr, unknown))} without "
            f'"must_understand": false; the Zarr v3 spec forbids reading such {what}')


def group_error(doc: dict[str, Any], key: str) -> str | None:
    """Why a group's zarr.json must not be read, or None. Such a group still holds its
    members (each has metadata of its own); only what the group itself says is unusable."""
    unknown = _unknown_fields(doc, GROUP_FIELDS)
    return _unknown_message(key, unknown, "a group") if unknown else None


def _fill_meta(meta: ArrayMeta, doc: Any, key: str) -> None:
    if not isinstance(doc, dict):
        raise FormatError(f"{key}: expected a JSON object")
    if doc.get("zarr_format") != 3 or doc.get("node_type") != "array":
        raise FormatError(f"{key}: not a Zarr v3 array")
    unknown = _unknown_fields(doc)
    if unknown:
        raise FormatError(_unknown_message(key, unknown, "an array"))
    meta.attributes = dict(attributes_of(doc))
    for field in ("shape", "data_type", "chunk_grid", "chunk_key_encoding", "codecs"):
        if field not in doc:
            raise FormatError(f"{key}: missing {field!r}")
    if doc.get("fill_value") is None:
        # required by the spec, for every data type (zarr-python refuses it missing or null):
        # read as "none", it served zeros for every chunk never written
        raise FormatError(f"{key}: {'null' if 'fill_value' in doc else 'missing'} 'fill_value'")
    meta.shape = int_tuple(doc["shape"], "shape", key)
    names = doc.get("dimension_names")
    if names is not None and not (
        isinstance(names, list)
        and len(names) == len(meta.shape)
        and all(n is None or isinstance(n, str) for n in names)
    ):
        # the spec's list of a string or null per dimension, or nothing: zarr-python refuses
        # any other; zvfs dropped such names (or kept the strings among them) and served the
        # array with dimensions it made up
        raise FormatError(f"{key}: dimension_names must be a list of {len(meta.shape)} strings or nulls, "
                          f"got {names!r}")
    if names and any(n is not None for n in names):
        meta.dimension_names = tuple(names)
    logical, meta.vlen = parse_data_type(doc["data_type"], key)
    grid = doc["chunk_grid"]
    if not isinstance(grid, dict) or grid.get("name") != "regular":
        raise FormatError(f"{key}: unsupported chunk_grid {grid!r}")
    outer = int_tuple(_configuration(grid, key, ("chunk_shape",)).get("chunk_shape"), "chunk_shape", key)
    if len(outer) != len(meta.shape) or any(c == 0 for c in outer):
        raise FormatError(f"{key}: chunk_shape {list(outer)} does not fit shape {list(meta.shape)}")
    meta.chunk_key_encoding = parse_key_encoding(doc["chunk_key_encoding"], key)
    transformers = doc.get("storage_transformers")
    if isinstance(transformers, int | float):  # false and 0 included: zarr-python refuses them
        raise FormatError(f"{key}: storage_transformers must be a list, got {transformers!r}")
    if transformers:
        raise FormatError(f"{key}: storage_transformers are not supported")
    meta.codecs = doc["codecs"] if isinstance(doc["codecs"], list) else []
    fill = (vlen_fill(doc["fill_value"], meta.vlen, key) if meta.vlen is not None
            else fill_scalar(doc["fill_value"], logical, key))
    pipeline = build_pipeline(doc["codecs"], outer, logical, fill)
    meta.source["pipeline"] = pipeline  # the reader decodes with it: built once per array
    meta.source["outer"] = outer
    levels, leaf = sharding_levels(pipeline)
    meta.dtype = pipeline.dtype
    meta.fill_value = fill if fill is None or meta.vlen else np.array(fill, dtype=meta.dtype)[()]
    meta.chunks = leaf.shape
    meta.shard_shape = outer if levels else None


def parse_key_encoding(value: Any, key: str) -> dict[str, Any]:
    """{'name': 'default'|'v2', 'separator': '/'|'.'} with the spec defaults filled in."""
    if isinstance(value, dict):
        name, conf = value.get("name"), _configuration(value, key, ("separator",))
    else:
        name, conf = value, {}
    if name not in ("default", "v2"):
        raise FormatError(f"{key}: unsupported chunk_key_encoding {value!r}")
    sep = conf.get("separator", "/" if name == "default" else ".")
    if sep not in ("/", "."):
        raise FormatError(f"{key}: bad chunk key separator {sep!r}")
    return {"name": name, "separator": sep}


def sharding_levels(pipeline: Pipeline) -> tuple[list[ShardingCodec], Pipeline]:
    """Shard levels readable by ranged reads (outermost first) and the leaf pipeline."""
    levels: list[ShardingCodec] = []
    while pipeline.sharding is not None:
        levels.append(pipeline.sharding)
        assert pipeline.sharding.inner is not None
        pipeline = pipeline.sharding.inner
    return levels, pipeline


def chunk_key(meta: ArrayMeta, grid_idx: tuple[int, ...]) -> str:
    """Store key of the stored chunk (shard) at ``grid_idx`` of the outer grid."""
    enc = meta.chunk_key_encoding
    sep = enc.get("separator", "/")
    if enc.get("name") == "v2":
        name = sep.join(str(i) for i in grid_idx) if grid_idx else "0"
    else:
        name = sep.join(["c", *(str(i) for i in grid_idx)])
    return join(meta.path, name)


class Reader:
    """Fetch + decode v3 chunks of one array; thread-safe (the index cache is locked)."""

    INDEX_CACHE = 512
    #: bytes of decoded indexes kept, at most (an index may be 16 MiB: MAX_INDEX_ENTRIES)
    INDEX_CACHE_BYTES = 64 << 20

    def __init__(self, store: Store, meta: ArrayMeta):
        self.store = store
        self.meta = meta
        source = meta.source
        if source.get("pipeline") is None:  # a meta not made by parse_array: parse its document
            parsed = parse_array(meta.path, source["doc"], meta.metadata_key)
            if parsed.error is not None:
                raise FormatError(parsed.error)
            source = parsed.source
        self.outer: tuple[int, ...] = tuple(source["outer"])
        self.pipeline: Pipeline = source["pipeline"]
        self.levels, self.leaf = sharding_levels(self.pipeline)
        #: a unit chunk is a stored chunk: its grid index is the stored one's
        self._unsharded = self.outer == tuple(self.leaf.shape)
        self._lock = threading.Lock()
        # (key, level, start) -> (decoded index, byte length of that shard or None)
        self._indexes: OrderedDict[tuple[str, int, int], tuple[np.ndarray, int | None]] = (
            OrderedDict()
        )
        self._index_bytes = 0
        # one load of an index at a time: the threads decoding a shard's chunks all wanted
        # its index at once, and each fetched and decoded its own copy
        self._loading: dict[tuple[str, int, int], threading.Lock] = {}

    def _position(self, idx: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(outer grid index, element offset inside that stored chunk) of unit chunk ``idx``."""
        pos = [i * c for i, c in zip(idx, self.leaf.shape, strict=True)]
        grid = tuple(p // o for p, o in zip(pos, self.outer, strict=True))
        rel = tuple(p - g * o for p, g, o in zip(pos, grid, self.outer, strict=True))
        return grid, rel

    def chunk_key(self, idx: tuple[int, ...]) -> str:
        """Key of the stored object (chunk or shard) that holds unit chunk ``idx``."""
        return chunk_key(self.meta, idx if self._unsharded else self._position(idx)[0])

    def _index(
        self, key: str, level: int, codec: ShardingCodec, start: int, length: int | None
    ) -> tuple[np.ndarray, int | None]:
        """Decoded index of the shard at ``start`` (and its length), cached: one ranged
        read per shard, not per chunk. An index at the end of a whole stored shard is its
        suffix, whose read tells the shard's size too (one request, no size lookup)."""
        cache_key = (key, level, start)
        with self._lock:
            hit = self._cached_index(cache_key)
            if hit is not None:
                return hit
            gate = self._loading.setdefault(cache_key, threading.Lock())
        with gate:
            try:
                with self._lock:
                    hit = self._cached_index(cache_key)
                if hit is not None:
                    return hit
                return self._load_index(cache_key, key, codec, start, length)
            finally:
                with self._lock:
                    if self._loading.get(cache_key) is gate:
                        del self._loading[cache_key]

    def _cached_index(self, cache_key: tuple[str, int, int]) -> tuple[np.ndarray, int | None] | None:
        """The cached index (most recently used now), or None; the caller holds the lock."""
        hit = self._indexes.get(cache_key)
        if hit is not None:
            self._indexes.move_to_end(cache_key)
        return hit

    def _load_index(
        self, cache_key: tuple[str, int, int], key: str, codec: ShardingCodec, start: int, length: int | None
    ) -> tuple[np.ndarray, int | None]:
        ilen = codec.index_nbytes
        if length is None and codec.index_location == "end":
            raw, length = self.store.get_suffix(key, ilen)
            codec.index_range(length)  # refuses a shard shorter than its index
        else:
            istart, ilen = codec.index_range(length)
            raw = self.store.get_range(key, start + istart, ilen)
        if len(raw) != ilen:
            raise CodecError(f"shard index truncated ({len(raw)} of {ilen} bytes)")
        index = codec.decode_index(raw)
        with self._lock:
            old = self._indexes.pop(cache_key, None)
            if old is not None:
                self._index_bytes -= old[0].nbytes
            self._indexes[cache_key] = (index, length)
            self._index_bytes += index.nbytes
            while len(self._indexes) > 1 and (len(self._indexes) > self.INDEX_CACHE
                                              or self._index_bytes > self.INDEX_CACHE_BYTES):
                _k, (dropped, _n) = self._indexes.popitem(last=False)
                self._index_bytes -= dropped.nbytes
        return index, length

    def _locate(self, idx: tuple[int, ...]) -> tuple[str, int, int | None] | None:
        """(key, start, length) of the encoded unit chunk; None if it was never written."""
        grid, rel = self._position(idx)
        key = chunk_key(self.meta, grid)
        start, length = 0, None
        if not self.levels:
            return key, 0, None
        for level, codec in enumerate(self.levels):
            index, length = self._index(key, level, codec, start, length)
            local = codec.inner_index(rel)
            where = codec.locate(index, local, length)
            if where is None:
                return None
            off, n = where
            start, length = start + off, n
            rel = tuple(r - i * c for r, i, c in zip(rel, local, codec.chunk_shape, strict=True))
        return key, start, length

    def exists(self, idx: tuple[int, ...]) -> bool:
        try:
            return self._locate(idx) is not None
        except KeyNotFound:
            return False

    def read(self, idx: tuple[int, ...]) -> np.ndarray | None:
        """Decoded unit chunk (full chunk shape), or None if it was never written.

        A shard replaced after its index was read (a writer's rename over it) gives an
        inner chunk's range in the old shard and its bytes from the new one: the decode of
        that fails. So a failure read through an index is tried once more with the shard's
        indexes read again; a shard that is really corrupt fails the second time too."""
        try:
            return self._read(idx)
        except FormatError:
            if not self._forget_indexes(self.chunk_key(idx)):
                raise
            return self._read(idx)

    def _forget_indexes(self, key: str) -> bool:
        """Drop the cached indexes of shard ``key``; False if none were cached."""
        with self._lock:
            mine = [k for k in self._indexes if k[0] == key]
            for k in mine:
                self._index_bytes -= self._indexes.pop(k)[0].nbytes
        return bool(mine)

    def _read(self, idx: tuple[int, ...]) -> np.ndarray | None:
        key = self.chunk_key(idx)
        try:
            where = self._locate(idx)
            if where is None:
                return None
            key, start, length = where
            if length is None:
                limit = self.leaf.chunk_limit
                data = self.store.get(key) if limit is None else self.store.get_at_most(key, limit)
            else:
                limit = self.leaf.chunk_limit
                if limit is not None and length > limit:  # an index pointing at a bomb
                    raise CodecError(f"shard index gives an inner chunk {length} bytes long, "
                                     f"more than {limit}; not a chunk of this array")
                data = self.store.get_range(key, start, length)
                if len(data) != length:
                    raise CodecError(f"inner chunk truncated ({len(data)} of {length} bytes)")
            return self.leaf.decode(data)
        except KeyNotFound:
            return None
        except (CodecError, StoreError) as exc:
            raise FormatError(f"{key}: {exc}") from exc
