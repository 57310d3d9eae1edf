"""ZV groups and levels over a store: both on-disk layouts behind one blocking API.

``open_group(store, path)`` reads the root ``zarr.json``, branches on
``zarr_vectors.zv_version`` and returns a :class:`ZVGroup`; ``group.level(n)`` gives
a :class:`Level` whose methods decode one chunk's vertices, attributes, fragment
index or links, one object's manifest, or a small table. The 0.7 layout keeps one
uint8 child array per chunk (``vertices/1.0.0/``); 0.9 keeps one vlen cell per chunk
(``vertices/c/1/0/0`` after subtracting ``chunk_grid_origin``). Callers never see
the difference.

Everything here blocks: call it from a worker thread.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from zvfs.formats._common import attributes_of, join
from zvfs.stores.base import KeyNotFound, Store, StoreError

from . import cells
from .blobs import (
    MAX_CHUNK_ROWS,
    FragmentIndex,
    ManifestBlock,
    chunk_name,
    parse_chunk_name,
    parse_fragment_index,
    parse_manifest,
    parse_offsets_segment,
    parse_ragged,
    rows_of,
    unpermute_gather,
)
from .errors import MissingDependency, ZVError

#: grid cells looked through, one read each, for the chunks of a ZV 0.9 array that does
#: not list them (``nonempty_chunks``): metadata may declare a grid of 10**17
MAX_GRID_WALK = 1_000_000
#: columns one attribute may have (a row_shape of 2**26 built a PLY header of 22 GB)
MAX_COLUMNS = 1 << 16

Chunk = tuple[int, ...]
SUPPORTED = ("0.7", "0.9")
#: fragment indexes kept per level (they are small: a header, a bitmap, a few ranges)
FRAGMENT_CACHE = 8192


def layout_of(version: Any, key: str) -> str:
    """'0.7' or '0.9' from a zv_version string; ZVError for anything else."""
    if not isinstance(version, str):
        raise ZVError(key, f"zarr_vectors.zv_version {version!r} is not a version string")
    parts = version.split(".")
    try:
        major, minor = int(parts[0]), int(parts[1])
    except (ValueError, IndexError) as exc:
        raise ZVError(key, f"unparseable zv_version {version!r}") from exc
    if major == 0 and 6 <= minor <= 8:
        return "0.7"
    if major == 0 and minor == 9:
        return "0.9"
    raise ZVError(key, f"unknown zv_version {version!r} (zvfs reads 0.7.x and 0.9.x)")


def _ls(store: Store, prefix: str) -> tuple[set[str], set[str]]:
    """(keys, prefixes) directly below ``prefix`` (a path without trailing slash)."""
    try:
        listing = store.list_dir(prefix + "/" if prefix else "")
    except KeyNotFound:
        return set(), set()
    except StoreError as exc:
        raise ZVError(prefix, str(exc)) from exc
    return set(listing.keys), set(listing.prefixes)


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def is_zv_root(doc: dict[str, Any] | None) -> bool:
    return bool(doc) and isinstance(attributes_of(doc).get("zarr_vectors"), dict)


def find_groups(store: Store, path: str = "", depth: int = 6,
                known: Mapping[str, dict[str, Any] | None] | None = None) -> list[str]:
    """Paths of ZV groups at or below ``path``; descends Zarr groups only, never arrays.
    A node whose zarr.json is no JSON object is no ZV group (the arrays view reports it);
    only a store's failure to read one fails the search.

    ``known``: node path -> its zarr.json as a discovery just read it (None: it has none),
    for the nodes a discovery read: only the others are read here. Each node's was read
    again, one after the other, every time the vectors view was built (each metadata TTL):
    2,001 GETs, 17-26 s, for an S3 store of 2,000 arrays."""
    try:
        doc = known[path] if known is not None and path in known else cells.load_node(store, path)
    except ZVError as exc:
        if isinstance(exc.__cause__, StoreError):
            raise
        return []
    if doc is None and path:
        return []
    if is_zv_root(doc):
        return [path]
    if depth == 0 or (doc is not None and doc.get("node_type") != "group"):
        return []
    out: list[str] = []
    _keys, prefixes = _ls(store, path)
    for name in sorted(prefixes):
        out.extend(find_groups(store, join(path, name), depth - 1, known))
    return out


class ZVGroup:
    """One ZV store (root attributes ``zarr_vectors`` + ``multiscales``) and its levels."""

    def __init__(self, store: Store, path: str, doc: dict[str, Any]) -> None:
        self.store = store
        self.path = path
        key = join(path, "zarr.json")
        attrs = attributes_of(doc)
        self.zv: dict[str, Any] = attrs.get("zarr_vectors") or {}
        self.zv_version: str = str(self.zv.get("zv_version"))
        self.layout = layout_of(self.zv.get("zv_version"), key)
        ms = _list(attrs.get("multiscales"))
        first = ms[0] if ms and isinstance(ms[0], dict) else {}
        self.axes: list[dict[str, Any]] = list(_list(first.get("axes")))
        space = [a for a in self.axes if isinstance(a, dict) and a.get("type") == "space"]
        self.ndim = len(space) or len(_list(self.zv.get("chunk_shape"))) or 3
        self.space_axes = space
        self.geometry_types: list[str] = [str(g) for g in _list(self.zv.get("geometry_types"))]
        self.geometry = self.geometry_types[0] if self.geometry_types else "unknown"
        self.links_convention: str = str(self.zv.get("links_convention") or "")
        self.datasets = list(_list(first.get("datasets")))
        _keys, prefixes = _ls(store, path)
        self.level_names = sorted((p for p in prefixes if p.isdigit()), key=int)

    def level_path(self, name: str) -> str:
        """Store path of level ``name`` (its directory key)."""
        return join(self.path, name)

    def level(self, name: str) -> Level:
        if name not in self.level_names:
            raise ZVError(self.level_path(name), "no such level")
        return Level(self, name)


def open_group(store: Store, path: str = "") -> ZVGroup | None:
    """The ZV group at ``path``, or None when that node is not a ZV group."""
    doc = cells.load_node(store, path)
    if not is_zv_root(doc):
        return None
    assert doc is not None
    return ZVGroup(store, path, doc)


@dataclass(slots=True)
class AttrInfo:
    """A per-vertex, per-link or per-object attribute: how its rows look."""

    name: str
    dtype: np.dtype
    ncols: int  # 1 means rows are scalars (an (N,) array)
    categories: list[Any] | None = None
    channel_names: list[str] | None = None
    #: the column count was read off the data: the metadata gave none but one
    columns_from_data: bool = False

    @property
    def row_shape(self) -> tuple[int, ...]:
        return () if self.ncols == 1 and not self.channel_names else (self.ncols,)


@dataclass(slots=True)
class LinkFamily:
    """One ``links/<delta>`` family: width and its cells (0.9 segments or 0.7 parts)."""

    delta: str
    width: int
    dtype: np.dtype
    directed: bool


def _dtype(value: Any, key: str) -> np.dtype:
    try:
        return np.dtype(value).newbyteorder("<")
    except TypeError as exc:
        raise ZVError(key, f"bad dtype {value!r}") from exc


class Level:
    """One resolution level: chunks, vertices, fragments, links, attributes, objects, groups."""

    def __init__(self, group: ZVGroup, name: str) -> None:
        self.group = group
        self.store = group.store
        self.name = name
        self.path = group.level_path(name)
        self.new = group.layout == "0.9"
        self.ndim = group.ndim
        self._docs: dict[str, dict[str, Any] | None] = {}
        self._children: dict[str, list[str]] = {}
        self._arrays: dict[str, cells.Array] = {}
        self._lock = threading.Lock()
        doc = self.doc("") or {}
        self.meta: dict[str, Any] = attributes_of(doc).get("zarr_vectors_level") or {}
        _keys, self.members = _ls(self.store, self.path)
        vdoc = self.doc("vertices")
        vattrs = attributes_of(vdoc)
        self.dtype = _dtype(vattrs.get("dtype", "float32"), self.key("vertices/zarr.json"))
        self.encoding = str(vattrs.get("encoding", "raw"))
        self._chunks: list[Chunk] | None = None
        self._counts: dict[Chunk, int] = {}
        self._draco_cache: dict[Chunk, tuple[np.ndarray, np.ndarray]] = {}
        self._fragments: dict[tuple[str, Chunk], FragmentIndex | None] = {}
        self._vattr_infos: dict[str, AttrInfo] = {}

    # -- nodes ------------------------------------------------------------------------------

    def key(self, rel: str) -> str:
        return join(self.path, rel)

    def doc(self, rel: str) -> dict[str, Any] | None:
        """zarr.json of the node ``rel`` below the level (cached; None if absent)."""
        if rel not in self._docs:
            self._docs[rel] = cells.load_node(self.store, self.key(rel))
        return self._docs[rel]

    def attrs(self, rel: str) -> dict[str, Any]:
        return attributes_of(self.doc(rel))

    def array(self, rel: str) -> cells.Array:
        arr = self._arrays.get(rel)
        if arr is None:
            arr = cells.open_array(self.store, self.key(rel), self.doc(rel))
            self._arrays[rel] = arr
        return arr

    def has(self, rel: str) -> bool:
        return self.doc(rel) is not None

    def children(self, rel: str) -> list[str]:
        """Sub-node names below ``rel`` (listing, not metadata; kept, like the zarr.json docs).
        ``c`` is left out below an array only, where it holds the chunks: below a group it is
        a node (an attribute named ``c`` was missing from every view)."""
        hit = self._children.get(rel)
        if hit is None:
            _keys, prefixes = _ls(self.store, self.key(rel))
            if (self.doc(rel) or {}).get("node_type") == "array":
                prefixes -= {"c"}
            hit = sorted(prefixes)
            self._children[rel] = hit
        return list(hit)

    # -- cells ------------------------------------------------------------------------------

    def cell(self, rel: str, chunk: Chunk) -> bytes | None:
        """The decoded bytes of chunk ``chunk`` of the per-chunk array ``rel``; None if empty."""
        if not self.new:
            return cells.read_blob(self.store, self.key(f"{rel}/{chunk_name(chunk)}"))
        arr = self.array(rel)
        origin = arr.attributes.get("chunk_grid_origin") or [0] * len(chunk)
        if len(origin) != len(chunk):
            raise ZVError(self.key(rel), f"chunk {chunk_name(chunk)} has the wrong rank")
        idx = tuple(c - o for c, o in zip(chunk, origin, strict=False))
        data = cells.read_cell(self.store, arr, idx)
        return data if data else None

    def cell_chunks(self, rel: str) -> list[Chunk]:
        """Chunks that hold a cell of ``rel``, sorted."""
        if not self.new:
            out = []
            for name in self.children(rel):
                try:
                    out.append(parse_chunk_name(name))
                except ValueError:
                    continue
            return sorted(out)
        arr = self.array(rel)
        listed = arr.attributes.get("nonempty_chunks")
        if isinstance(listed, list):
            # once each: a chunk listed twice had its vertices served twice (15 rows of 14)
            try:
                return sorted({parse_chunk_name(str(n)) for n in listed})
            except ValueError as exc:  # a bare ValueError named no key in the log
                raise ZVError(join(self.key(rel), "zarr.json"), f"bad nonempty_chunks entry ({exc})") from None
        origin = arr.attributes.get("chunk_grid_origin") or [0] * len(arr.shape)
        cells_count = math.prod(arr.shape)
        if cells_count > MAX_GRID_WALK:
            raise ZVError(join(self.key(rel), "zarr.json"),
                          f"a grid of {cells_count} cells and no nonempty_chunks attribute: "
                          f"too many to look through (at most {MAX_GRID_WALK})")
        found = []
        for idx in np.ndindex(*arr.shape):
            if cells.read_cell(self.store, arr, idx):
                found.append(tuple(int(i) + int(o) for i, o in zip(idx, origin, strict=False)))
        return sorted(found)

    # -- vertices ---------------------------------------------------------------------------

    def chunks(self) -> list[Chunk]:
        """Every chunk with vertices, sorted: the order rows appear in vertices.npy."""
        if self._chunks is None:
            self._chunks = self.cell_chunks("vertices") if self.has("vertices") else []
        return self._chunks

    def fragments(self, chunk: Chunk, kind: str = "vertex") -> FragmentIndex | None:
        """A chunk's fragment index (kept: objects touching the chunk all need it)."""
        hit = self._fragments.get((kind, chunk), False)
        if hit is not False:
            return hit  # type: ignore[return-value]
        fi = self._read_fragments(chunk, kind)
        with self._lock:  # worker threads share a level while sizing it
            if len(self._fragments) >= FRAGMENT_CACHE:
                self._fragments.pop(next(iter(self._fragments)), None)
            self._fragments[(kind, chunk)] = fi
        return fi

    def _read_fragments(self, chunk: Chunk, kind: str) -> FragmentIndex | None:
        rel = f"{kind}_fragments"
        if not self.has(rel) and not self.children(rel):
            return None
        raw = self.cell(rel, chunk)
        if raw is None:
            return None
        return parse_fragment_index(raw, self.key(f"{rel}/{chunk_name(chunk)}"))

    def vertex_count(self, chunk: Chunk) -> int:
        """Rows in one chunk, from metadata or the fragment index, never the vertices."""
        n = self._counts.get(chunk)
        if n is not None:
            return n
        n = None
        if not self.new and self.encoding == "raw":
            doc = self.doc(f"vertices/{chunk_name(chunk)}")
            if doc is not None and len(doc.get("shape") or []) == 1:
                nbytes = int(doc["shape"][0])
                row = self.dtype.itemsize * self.ndim
                if nbytes < 0:  # counted as -1 vertices: the level's files were cut short
                    raise ZVError(self.key(f"vertices/{chunk_name(chunk)}"), f"a shape of {nbytes} bytes")
                if nbytes % row:
                    raise ZVError(self.key(f"vertices/{chunk_name(chunk)}"),
                                  f"{nbytes} bytes is not a whole number of {row}-byte vertices")
                n = nbytes // row
        if n is None and self.encoding == "draco":
            # Draco drops vertices no intra-chunk face uses, so only the bitstream knows
            n = len(self.vertices(chunk))
        if n is None:
            fi = self.fragments(chunk)
            n = fi.extent if fi is not None else len(self.vertices(chunk))
        self._counts[chunk] = n
        return n

    def vertex_counts(self, chunks: list[Chunk] | None = None, workers: int = 8) -> list[int]:
        """Row counts of many chunks; the small index reads overlap (S3 latency), in order."""
        chunks = self.chunks() if chunks is None else chunks
        todo = [c for c in chunks if c not in self._counts]
        if len(todo) > 4 and workers > 1:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(max_workers=min(workers, len(todo))) as pool:
                for c, n in zip(todo, pool.map(self.vertex_count, todo), strict=True):
                    self._counts[c] = n
        return [self.vertex_count(c) for c in chunks]

    def offsets(self) -> dict[Chunk, int]:
        """First row of every chunk in the level-wide concatenation."""
        out: dict[Chunk, int] = {}
        run = 0
        for c, n in zip(self.chunks(), self.vertex_counts(), strict=True):
            out[c] = run
            run += n
        return out

    def vertices(self, chunk: Chunk) -> np.ndarray:
        """(N, D) vertices of one chunk in the store's dtype."""
        key = self.key(f"vertices/{chunk_name(chunk)}")
        raw = self.cell("vertices", chunk)
        if raw is None:
            return np.empty((0, self.ndim), self.dtype)
        if self.encoding == "draco":
            pts, _faces = self._draco(chunk, raw, key)
            return pts.astype(self.dtype, copy=False).reshape(-1, self.ndim)
        return rows_of(raw, self.ndim, self.dtype, key)

    def draco_faces(self, chunk: Chunk) -> np.ndarray:
        """Faces kept inside a chunk's Draco bitstream (chunk-local indices)."""
        raw = self.cell("vertices", chunk)
        if raw is None or self.encoding != "draco":
            return np.empty((0, 3), np.int64)
        return self._draco(chunk, raw, self.key(f"vertices/{chunk_name(chunk)}"))[1]

    def _draco(self, chunk: Chunk, raw: bytes, key: str) -> tuple[np.ndarray, np.ndarray]:
        """Decode a Draco cell once per level object (points and faces are both wanted)."""
        hit = self._draco_cache.get(chunk)
        if hit is None:
            hit = decode_draco(raw, key)
            with self._lock:
                if len(self._draco_cache) >= 16:
                    self._draco_cache.pop(next(iter(self._draco_cache)), None)
                self._draco_cache[chunk] = hit
        return hit

    # -- attributes ---------------------------------------------------------------------------

    def _attr_info(self, name: str, a: dict[str, Any], key: str) -> AttrInfo:
        dt = _dtype(a.get("dtype", "float32"), key)
        ch = a.get("channel_names")
        try:
            if a.get("row_shape"):
                ncols = int(np.prod([int(d) for d in a["row_shape"]]))
            elif ch:
                ncols = len(ch)
            else:
                ncols = int(a.get("num_channels") or 1)
        except (TypeError, ValueError) as exc:
            raise ZVError(key, f"attribute {name!r}: bad row_shape or num_channels ({exc})") from None
        if not 1 <= ncols <= MAX_COLUMNS:  # level.ply's header has a line a column
            raise ZVError(key, f"attribute {name!r} has {ncols} columns (at most {MAX_COLUMNS:,})")
        cats = a.get("categories") if a.get("encoding") == "dictionary" else None
        info = AttrInfo(name, dt, ncols, cats, list(ch) if ch else None)
        if a.get("row_shape"):
            info.channel_names = info.channel_names or [f"ch{i}" for i in range(ncols)]
        return info

    def vertex_attribute_names(self) -> list[str]:
        return self.children("vertex_attributes") if "vertex_attributes" in self.members else []

    def vertex_attribute_info(self, name: str) -> AttrInfo:
        """How the attribute's rows look; a width the metadata leaves at one column is
        checked against the data (``_columns_from_data``). Kept: every chunk asks."""
        hit = self._vattr_infos.get(name)
        if hit is None:
            rel = f"vertex_attributes/{name}"
            a = self.attrs(rel)
            hit = self._attr_info(name, a, self.key(rel + "/zarr.json"))
            if hit.ncols == 1 and not a.get("row_shape") and not a.get("channel_names") \
                    and a.get("num_channels") is None and self.encoding != "draco":
                hit = self._columns_from_data(hit)
            self._vattr_infos[name] = hit
        return hit

    #: chunks with no cell of an attribute passed over while looking for one to measure
    WIDTH_PROBES = 8

    def _columns_from_data(self, info: AttrInfo) -> AttrInfo:
        """The attribute's width from one cell's bytes: zarr-vectors (0.2.0 and 0.9.2)
        writes ``row_shape: []`` for the multi-column attributes of write_polylines and
        write_mesh too, and taken at its word the metadata failed every read of that
        attribute and all of level.ply with it. A cell of ``n`` vertices and ``k * n``
        values has ``k`` columns; bytes that are no whole number of columns fail the
        attribute, naming the cell."""
        rel = f"vertex_attributes/{info.name}"
        empty = 0
        for c in self.chunks():
            n = self.vertex_count(c)
            size = self._cell_size(rel, c) if n else None
            if not size:
                empty += 1
                if empty >= self.WIDTH_PROBES:
                    break
                continue
            row = n * info.dtype.itemsize
            key = self.key(f"{rel}/{chunk_name(c)}")
            if size % row:
                raise ZVError(key, f"{size} bytes for {n} vertices of {info.dtype}: no whole "
                                   f"number of columns (the metadata gives none)")
            k = size // row
            if k == 1:
                return info
            if not 1 <= k <= MAX_COLUMNS:
                raise ZVError(key, f"attribute {info.name!r} has {k} columns (at most {MAX_COLUMNS:,})")
            return AttrInfo(info.name, info.dtype, k, info.categories, None, columns_from_data=True)
        return info

    def vertex_attribute(self, name: str, chunk: Chunk) -> np.ndarray:
        """Rows of one attribute in one chunk, aligned with :meth:`vertices`."""
        info = self.vertex_attribute_info(name)
        rel = f"vertex_attributes/{name}"
        raw = self.cell(rel, chunk)
        n = self.vertex_count(chunk)
        key = self.key(f"{rel}/{chunk_name(chunk)}")
        if raw is None:
            # a cell never written is zeros, as many rows as the chunk's vertices: n is the
            # fragment index's word (2**24 from 44 bytes) and the columns the metadata's, so
            # a 4 KiB read built 2 GiB of zeros; the vertices cell has to hold n rows, and
            # the zeros, backed by no stored byte, are bounded as a level-wide table is
            have = len(self.vertices(chunk))
            if have != n:
                raise ZVError(self.key(f"vertices/{chunk_name(chunk)}"),
                              f"decoded {have} vertices, the fragment index says {n}")
            if n * info.ncols * info.dtype.itemsize > cells.MAX_TABLE_BYTES:
                raise ZVError(key, f"absent: {n:,} rows of {info.ncols:,} {info.dtype} zeros would take "
                                   f"{n * info.ncols * info.dtype.itemsize:,} bytes; zvfs fills at most "
                                   f"{cells.MAX_TABLE_BYTES >> 20} MiB")
            rows = np.zeros((n, info.ncols), info.dtype)
        else:
            rows = rows_of(raw, info.ncols, info.dtype, key)
        if len(rows) != n:
            raise ZVError(key, f"{len(rows)} attribute rows for {n} vertices")
        return rows.reshape((n, *info.row_shape))

    def _cell_size(self, rel: str, chunk: Chunk) -> int | None:
        """Bytes of one chunk's cell of ``rel``: a 0.7 child array's shape says it without a
        read of the data; a 0.9 vlen cell is read. None where there is none."""
        if not self.new:
            doc = self.doc(f"{rel}/{chunk_name(chunk)}")
            if doc is None:
                return None
            shape = doc.get("shape") or []
            if len(shape) == 1 and isinstance(shape[0], int):
                return shape[0]
        raw = self.cell(rel, chunk)
        return None if raw is None else len(raw)

    # -- links ----------------------------------------------------------------------------------

    def link_deltas(self) -> list[str]:
        names = set(self.children("links")) if "links" in self.members else set()
        if not self.new and "cross_chunk_links" in self.members:
            names |= set(self.children("cross_chunk_links"))
        return sorted(names, key=lambda d: int(d))

    def link_family(self, delta: str) -> LinkFamily:
        a = dict(self.attrs(f"links/{delta}"))
        if not a and not self.new:
            a = dict(self.attrs(f"cross_chunk_links/{delta}"))
        if "link_width" not in a and not self.new:
            a.setdefault("link_width", self.attrs(f"cross_chunk_links/{delta}").get("link_width", 2))
        key = self.key(f"links/{delta}/zarr.json")
        try:
            width = int(a.get("link_width", 2))
        except (TypeError, ValueError) as exc:
            raise ZVError(key, f"bad link_width {a.get('link_width')!r}") from exc
        return LinkFamily(delta, width, _dtype(a.get("dtype", "int64"), key), bool(a.get("directed", False)))

    def link_parts(self, delta: str) -> list[tuple[str, Chunk]]:
        """Every link cell in reading order: (part, source chunk).

        0.9: part is the offsets segment under ``links/<delta>/``. 0.7: part is
        ``""`` for the per-chunk intra arrays and ``"cross"`` for the
        ``cross_chunk_links`` records (source chunk ``()``).
        """
        out: list[tuple[str, Chunk]] = []
        if self.new:
            for seg in self.children(f"links/{delta}"):
                # cells in the order of their keys' text, as zarr-vectors reads them
                # (read_link_arrays): "-1.0.0" after "-2.0.0", "10.0.0" before "2.0.0"
                cells_ = sorted(self.cell_chunks(f"links/{delta}/{seg}"), key=chunk_name)
                out.extend((seg, c) for c in cells_)
            return out
        if "links" in self.members and delta in self.children("links"):
            out.extend(("", c) for c in self.cell_chunks(f"links/{delta}"))
        if "cross_chunk_links" in self.members and delta in self.children("cross_chunk_links"):
            out.append(("cross", ()))
        return out

    def link_cell(self, delta: str, part: str, chunk: Chunk) -> tuple[np.ndarray, np.ndarray]:
        """One cell's records: (endpoint chunks (M, L, D), local vertex indices (M, L))."""
        fam = self.link_family(delta)
        width, d = fam.width, self.ndim
        if not self.new:
            if part == "cross":
                key = self.key(f"cross_chunk_links/{delta}/data")
                raw = cells.read_blob(self.store, key) or b""
                recs = rows_of(raw, width * (d + 1), np.dtype("<i8"), key).reshape(-1, width, d + 1)
                return recs[:, :, :d].astype(np.int64), recs[:, :, d].astype(np.int64)
            rel = f"links/{delta}"
            key = self.key(f"{rel}/{chunk_name(chunk)}")
            raw = self.cell(rel, chunk) or b""
            rows = parse_ragged(raw, width, fam.dtype, key) if delta != "0" else rows_of(raw, width, fam.dtype, key)
            ends = np.broadcast_to(np.asarray(chunk, np.int64), (len(rows), width, d))
            return ends, rows.astype(np.int64)
        rel = f"links/{delta}/{part}"
        a = self.attrs(rel)
        key = self.key(f"{rel}/{chunk_name(chunk)}")
        offs = a.get("offsets")
        offsets = [tuple(int(v) for v in o) for o in offs] if offs is not None else parse_offsets_segment(part)
        has_perm = bool(a.get("has_perm", False))
        intra = delta == "0" and all(not any(o) for o in offsets)
        ncols = width + (1 if has_perm else 0)
        raw = self.cell(rel, chunk) or b""
        cell_dtype = _dtype(a.get("dtype", "int64"), key)
        rows = rows_of(raw, ncols, cell_dtype, key) if intra else parse_ragged(raw, ncols, cell_dtype, key)
        rows = rows.astype(np.int64)
        vi = rows[:, 1 : 1 + width] if has_perm else rows[:, :width]
        # endpoint 0 is the source cell; endpoint k sits at source + offset k (offsets name k>0)
        rel_chunks = [tuple([0] * d)] + offsets if len(offsets) == width - 1 else offsets
        if len(rel_chunks) != width:
            raise ZVError(key, f"{len(offsets)} offsets for link width {width}")
        base = np.asarray(chunk, np.int64) + np.asarray(rel_chunks, np.int64)  # (L, D)
        placed = np.broadcast_to(base, (len(rows), width, d))
        if has_perm:  # stored endpoint order is canonical; perm_idx restores the written order
            gather = unpermute_gather(rows[:, 0], width, key)
            vi = np.take_along_axis(vi, gather, axis=1)
            placed = np.take_along_axis(placed, gather[:, :, None], axis=1)
        return np.ascontiguousarray(placed), np.ascontiguousarray(vi)

    def link_attribute_names(self, delta: str) -> list[str]:
        if "link_attributes" not in self.members:
            return []
        return [n for n in self.children("link_attributes") if delta in self.children(f"link_attributes/{n}")]

    def link_attribute_info(self, name: str, delta: str) -> AttrInfo:
        rel = f"link_attributes/{name}/{delta}"
        a = dict(self.attrs(rel))
        if self.new and "dtype" not in a:
            for seg in self.children(rel):
                a = dict(self.attrs(f"{rel}/{seg}"))
                break
        a.setdefault("name", name)
        return self._attr_info(name, a, self.key(rel + "/zarr.json"))

    def link_attribute_cell(self, name: str, delta: str, part: str, chunk: Chunk, count: int) -> np.ndarray:
        """Attribute rows aligned with :meth:`link_cell` of the same cell (NaN/0 where unwritten)."""
        info = self.link_attribute_info(name, delta)
        if not self.new and part == "cross":
            key = self.key(f"cross_chunk_link_attributes/{name}/{delta}/data")
            raw = cells.read_blob(self.store, key)
        elif not self.new:
            rel = f"link_attributes/{name}/{delta}"
            key = self.key(f"{rel}/{chunk_name(chunk)}")
            raw = self.cell(rel, chunk) if chunk_name(chunk) in self.children(rel) else None
        else:
            rel = f"link_attributes/{name}/{delta}/{part}"
            key = self.key(f"{rel}/{chunk_name(chunk)}")
            raw = self.cell(rel, chunk) if self.has(rel) else None
        if raw is None:
            fill = np.nan if info.dtype.kind == "f" else 0
            return np.full((count, *info.row_shape), fill, info.dtype)
        rows = rows_of(raw, info.ncols, info.dtype, key)
        if len(rows) != count:
            raise ZVError(key, f"{len(rows)} link attribute rows for {count} links")
        return rows.reshape((count, *info.row_shape))

    # -- objects ---------------------------------------------------------------------------------

    def object_ids(self) -> Sequence[int]:
        """Object ids with a manifest, in manifest-row order (a range when the ids are the
        rows: ``num_objects`` may say anything, and a list of 3e7 took 2.3 GB)."""
        if "object_index" not in self.members:
            return []
        if self.has("object_index/object_ids"):
            ids = cells.read_all(self.store, self.array("object_index/object_ids"))
            return [int(i) for i in ids.reshape(-1)]
        a = self.attrs("object_index")
        n = a.get("num_objects")
        if n is None and self.has("object_index/manifests"):
            n = self.array("object_index/manifests").shape[0]
        return range(int(n or 0))

    def _manifest_blobs(self) -> list[bytes]:
        if self.has("object_index/manifests"):
            arr = cells.read_all(self.store, self.array("object_index/manifests"))
            return [bytes(b) if b is not None else b"" for b in arr.reshape(-1)]
        # oldest layout: object_index/data (bytes) + object_index/offsets (int64 starts)
        data = cells.read_blob(self.store, self.key("object_index/data")) or b""
        offs = np.frombuffer(cells.read_blob(self.store, self.key("object_index/offsets")) or b"", "<i8")
        bounds = list(offs) + [len(data)] if len(offs) and offs[-1] != len(data) else list(offs)
        return [data[int(a) : int(b)] for a, b in zip(bounds[:-1], bounds[1:], strict=False)]

    def manifests(self) -> dict[int, list[ManifestBlock]]:
        """Every object's manifest, keyed by object id."""
        ids = self.object_ids()
        blobs = self._manifest_blobs()
        sid = int(self.attrs("object_index").get("sid_ndim") or self.ndim)
        key = self.key("object_index/manifests")
        if len(blobs) < len(ids):
            raise ZVError(key, f"{len(blobs)} manifests for {len(ids)} objects")
        out: dict[int, list[ManifestBlock]] = {}
        named = 0  # fragments named so far, all objects together: one bound for the level
        for row, oid in enumerate(ids):
            if blobs[row]:
                out[oid] = parse_manifest(blobs[row], sid, f"{key}[{row}]", named)
                named += sum(len(b.fragments) for b in out[oid])
        return out

    def object_size(self, blocks: list[ManifestBlock], offsets: dict[Chunk, int], oid: int) -> int:
        """The rows :meth:`object_rows` gives for one object, counted from the fragment indexes
        without building them (the checks are its own): listing a level sized each object by
        building its rows, 2**26 of them for four 44-byte fragment indexes claiming 2**24."""
        self._check_rows_named(blocks, offsets, oid)
        return sum(self.block_rows(b, oid) for b in blocks)

    def _check_rows_named(self, blocks: list[ManifestBlock], offsets: dict[Chunk, int], oid: int) -> None:
        """Refuse, before a row is built, an object naming more than MAX_CHUNK_ROWS rows of one
        chunk, the most a chunk may hold: a 100-byte manifest naming one fragment of 2**24 rows
        8 times had the daemon build 2**27 row numbers (2.2 GB peak RSS) as the level was listed.
        A chunk named again is no error (zarr-vectors' coarser levels name a vertex once a
        visit of the polyline), so the bound is the limit, not the chunk's count. Draco cells
        are one span each, counted by decoding: left be."""
        if self.encoding == "draco":
            return
        key = self.key("object_index/manifests")
        named: dict[Chunk, int] = {}
        for b in blocks:
            if b.chunk not in offsets:
                raise ZVError(key, f"object {oid} names chunk {chunk_name(b.chunk)} which has no vertices")
            named[b.chunk] = named.get(b.chunk, 0) + self.block_rows(b, oid)
            if named[b.chunk] > MAX_CHUNK_ROWS:
                raise ZVError(key, f"object {oid} names {named[b.chunk]:,} rows of chunk {chunk_name(b.chunk)}; "
                                   f"no chunk has more than {MAX_CHUNK_ROWS:,}")

    def block_rows(self, block: ManifestBlock, oid: int) -> int:
        """Rows one manifest block names, from the fragment index (no row is built): as many
        as :meth:`object_rows` gives for it."""
        fi = None if self.encoding == "draco" else self.fragments(block.chunk)
        if fi is None:
            return self.vertex_count(block.chunk) * len(block.fragments)
        try:
            return fi.count_rows(block.fragments)
        except ZVError as exc:
            raise ZVError(self.key("object_index/manifests"), f"object {oid}: {exc}") from None

    def object_rows(self, blocks: list[ManifestBlock], offsets: dict[Chunk, int], oid: int) -> np.ndarray:
        """Level-wide vertex rows of one object, in manifest order."""
        self._check_rows_named(blocks, offsets, oid)
        parts = []
        for b in blocks:
            if b.chunk not in offsets:
                raise ZVError(self.key("object_index/manifests"),
                              f"object {oid} names chunk {chunk_name(b.chunk)} which has no vertices")
            # a Draco cell is one span: its fragment index counts vertices Draco may have dropped
            fi = None if self.encoding == "draco" else self.fragments(b.chunk)
            n = self.vertex_count(b.chunk)
            for f in b.fragments:
                if fi is None and self.encoding == "draco":
                    rows = np.arange(n, dtype=np.int64)
                elif fi is None:
                    if int(f) != 0:
                        raise ZVError(self.key("object_index/manifests"),
                                      f"object {oid}: fragment {int(f)} in chunk {chunk_name(b.chunk)} without a fragment index")
                    rows = np.arange(n, dtype=np.int64)
                else:
                    try:
                        rows = fi.rows(int(f), n)
                    except ZVError as exc:
                        raise ZVError(self.key("object_index/manifests"), f"object {oid}: {exc}") from exc
                if len(rows) and (rows.min() < 0 or rows.max() >= n):
                    raise ZVError(self.key("object_index/manifests"),
                                  f"object {oid} points past the end of chunk {chunk_name(b.chunk)} ({n} vertices)")
                parts.append(rows + offsets[b.chunk])
        return np.concatenate(parts) if parts else np.empty(0, np.int64)

    def object_attribute_names(self) -> list[str]:
        return self.children("object_attributes") if "object_attributes" in self.members else []

    def object_attribute(self, name: str) -> np.ndarray:
        """Dense (O,) or (O, C) table; absent values keep the writer's fill (NaN)."""
        rel = f"object_attributes/{name}"
        doc = self.doc(rel) or {}
        if doc.get("node_type") == "array":
            return cells.read_all(self.store, self.array(rel))
        a = self.attrs(rel)
        info = self._attr_info(name, a, self.key(rel + "/zarr.json"))
        raw = cells.read_blob(self.store, self.key(f"{rel}/data")) or b""
        rows = rows_of(raw, info.ncols, info.dtype, self.key(f"{rel}/data"))
        if a.get("has_present_mask") and self.has(f"{rel}/present_mask"):
            mask = np.frombuffer(cells.read_blob(self.store, self.key(f"{rel}/present_mask")) or b"", np.uint8)
            if info.dtype.kind == "f" and len(mask) == len(rows):
                rows = rows.copy()
                rows[mask == 0] = np.nan
        return rows.reshape(-1) if info.ncols == 1 else rows

    # -- groups -------------------------------------------------------------------------------------

    def groups(self) -> dict[int, np.ndarray]:
        """Group id -> member object ids (int64)."""
        if "groups" not in self.members:
            return {}
        doc = self.doc("groups") or {}
        if doc.get("node_type") == "array":
            arr = cells.read_all(self.store, self.array("groups")).reshape(-1)
            ranges = attributes_of(doc).get("group_ranges") or {}
            out = {}
            for gid, blob in enumerate(arr):
                rng = ranges.get(str(gid))
                if rng is not None:
                    lo, hi = int(rng[0]), int(rng[1])
                    if not 0 <= lo <= hi or hi - lo > cells.MAX_TABLE_BYTES // 8:
                        raise ZVError(self.key("groups/zarr.json"), f"group {gid} has the range {[lo, hi]}")
                    out[gid] = np.arange(lo, hi, dtype=np.int64)
                else:
                    out[gid] = np.frombuffer(bytes(blob or b""), "<i8").astype(np.int64)
            return out
        key = self.key("groups/data")
        raw = cells.read_blob(self.store, key) or b""
        offs = np.frombuffer(cells.read_blob(self.store, self.key("groups/offsets")) or b"", "<i8")
        n = int(self.attrs("groups").get("num_groups") or len(offs))
        # offsets are byte starts into data; the last group runs to the end
        bounds = [int(o) for o in offs[: n + 1]]
        ends = bounds[1:] if len(bounds) == n + 1 else bounds[1:] + [len(raw)]
        out = {}
        for gid, (a, b) in enumerate(zip(bounds, ends, strict=False)):
            if a < 0 or b > len(raw) or a > b or (b - a) % 8:
                raise ZVError(key, f"group {gid} byte range [{a}, {b}) out of range")
            out[gid] = np.frombuffer(raw[a:b], "<i8").astype(np.int64)
        return out


# --- Draco ------------------------------------------------------------------------------------------

_draco: Callable[[bytes], Any] | None = None


def decode_draco(raw: bytes, key: str) -> tuple[np.ndarray, np.ndarray]:
    """(points (N, 3) float32, faces (F, 3) int64) of a Draco bitstream; needs DracoPy."""
    global _draco
    if not raw.startswith(b"DRACO"):
        raise ZVError(key, "draco-encoded cell does not start with 'DRACO'")
    if _draco is None:
        try:
            import DracoPy
        except ImportError as exc:
            raise MissingDependency(key, "DracoPy", "draco") from exc
        _draco = DracoPy.decode
    try:
        obj = _draco(raw)
    except Exception as exc:
        raise ZVError(key, f"Draco decode failed ({exc})") from exc
    pts = np.asarray(obj.points, dtype=np.float32).reshape(-1, 3)
    faces = np.asarray(getattr(obj, "faces", None) if getattr(obj, "faces", None) is not None else [], dtype=np.int64)
    return pts, faces.reshape(-1, 3)


def draco_available() -> bool:
    try:
        import DracoPy  # noqa: F401
    except ImportError:
        return False
    return True
