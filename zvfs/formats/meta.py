"""ArrayMeta: the one metadata model every Zarr flavour is mapped onto.

Views size files and lay out bytes from this model alone, so everything they
need (shape, decoded chunk unit, dtype with explicit byte order, fill) lives
here, and nothing here needs the store.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..codecs.settings import decoding_settings

FORMATS = ("zarr_v1", "zarr_v2", "zarr_v3", "nczarr")

#: arrays whose total decoded size is beyond this are refused (numpy and file offsets cannot hold them)
MAX_NBYTES = 2**62
#: one decoded chunk must fit in memory; beyond this the array is refused
MAX_CHUNK_NBYTES = 2**32
#: bytes one element may hold: fixed-length strings and raw bytes declare any length, and
#: an array keeps a fill value of that size from its discovery on (256 MiB elements in
#: four arrays held a GiB); real ones are far smaller
MAX_ITEMSIZE = 1 << 20
#: dimensions an array may have: numpy's most (an ndarray of more cannot be made, and the
#: views' range arithmetic recurses once a dimension)
MAX_NDIM = 64


def checked_dtype(dtype: np.dtype, key: str) -> np.dtype:
    """``dtype``, or FormatError if one element would hold more than MAX_ITEMSIZE bytes, or
    none at all (``|S0``, ``|V0``, ``<U0``, a structured type of no field: numpy cannot lay
    out an array of them, and a file of them would say nothing)."""
    if dtype.itemsize > MAX_ITEMSIZE:
        raise FormatError(f"{key}: elements of {dtype.itemsize} bytes; zvfs serves at most "
                          f"{MAX_ITEMSIZE} an element")
    if dtype.itemsize == 0:
        raise FormatError(f"{key}: elements of 0 bytes (dtype {dtype.str})")
    # numpy reads "(3,)<i2" as int16 with a trailing dimension of 3: a chunk file then said
    # 18 bytes and served 6. And a field of Python objects in a structured type (a bare "|O"
    # is a variable-length type, handled apart) served the daemon's pointers as a never
    # written chunk's bytes (a helper's audit)
    if dtype.subdtype is not None:
        raise FormatError(f"{key}: dtype {dtype.subdtype[0].str} with a shape of its own "
                          f"{dtype.subdtype[1]}: unsupported")
    if dtype.names is not None and dtype.hasobject:
        raise FormatError(f"{key}: a structured dtype with a field of Python objects: unsupported")
    return dtype


class FormatError(Exception):
    """Metadata or chunk data cannot be understood; the message names the key."""


@dataclass(slots=True)
class ArrayMeta:
    """Normalized metadata of one array.

    ``chunks`` is the *decoded* chunk unit (inner chunk for sharded arrays);
    ``dtype`` carries the byte order the data is stored and served in.
    ``vlen`` is set ('vlen-utf8', 'vlen-bytes', ...) for variable-length element
    types: such arrays have no fixed-size raw layout, so views expose meta.json only.
    ``error`` is set when the array cannot be read at all; other fields then hold
    whatever could be recovered.
    """

    path: str
    format: str
    shape: tuple[int, ...] = ()
    chunks: tuple[int, ...] = ()
    dtype: np.dtype = field(default_factory=lambda: np.dtype("u1"))
    fill_value: Any = None
    order: str = "C"
    dimension_names: tuple[str | None, ...] | None = None
    attributes: dict[str, Any] = field(default_factory=dict)
    codecs: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    vlen: str | None = None
    shard_shape: tuple[int, ...] | None = None
    chunk_key_encoding: dict[str, Any] = field(default_factory=dict)
    metadata_key: str = ""
    #: the raw metadata document(s) the format module needs to build a reader
    source: Any = field(default=None, repr=False, compare=False)

    # -- sizes -------------------------------------------------------------

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def has_data(self) -> bool:
        """True when views may expose data files (readable, fixed-size elements)."""
        return self.error is None and self.vlen is None

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the whole decoded array (0 for vlen arrays)."""
        if self.vlen is not None:
            return 0
        return self.size * self.dtype.itemsize

    @property
    def chunk_nbytes(self) -> int:
        """Bytes of one full decoded chunk (edge chunks are padded to this)."""
        if self.vlen is not None:
            return 0
        return math.prod(self.chunks) * self.dtype.itemsize

    # -- chunk grid --------------------------------------------------------

    @property
    def grid_shape(self) -> tuple[int, ...]:
        """Number of chunks along each dimension."""
        return tuple(-(-s // c) for s, c in zip(self.shape, self.chunks, strict=True))

    @property
    def nchunks(self) -> int:
        return math.prod(self.grid_shape)

    def chunk_indices(self) -> Iterator[tuple[int, ...]]:
        """Every chunk index in C order."""
        return itertools.product(*(range(n) for n in self.grid_shape))

    def check_index(self, idx: tuple[int, ...], grid: tuple[int, ...] | None = None) -> tuple[int, ...]:
        """Validate a chunk index against the grid (``grid``: :attr:`grid_shape`, given by a
        caller checking many indices at once); raises IndexError."""
        idx = tuple(int(i) for i in idx)
        grid = self.grid_shape if grid is None else grid
        if len(idx) != len(grid) or any(i < 0 or i >= n for i, n in zip(idx, grid, strict=True)):
            raise IndexError(f"chunk index {idx} outside grid {grid} of {self.path or '/'}")
        return idx

    def chunk_slices(self, idx: tuple[int, ...]) -> tuple[slice, ...]:
        """Region of the array covered by chunk ``idx``, clipped at the array edge."""
        return tuple(
            slice(i * c, min((i + 1) * c, s))
            for i, c, s in zip(idx, self.chunks, self.shape, strict=True)
        )

    def chunk_region_shape(self, idx: tuple[int, ...]) -> tuple[int, ...]:
        """Shape of the part of chunk ``idx`` that lies inside the array."""
        return tuple(s.stop - s.start for s in self.chunk_slices(idx))

    def fill_chunk(self, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """A chunk (full chunk shape by default) holding only fill_value; None means zeros."""
        shape = self.chunks if shape is None else shape
        if self.vlen is not None:
            out = np.empty(shape, dtype=object)
            out.fill(self.fill_value if self.fill_value is not None else _vlen_empty(self.vlen))
            return out
        if self.fill_value is None:
            return np.zeros(shape, dtype=self.dtype)
        return np.full(shape, self.fill_value, dtype=self.dtype)

    def fill_bytes(self) -> bytes:
        """The fill value as one element in the array's byte order (for views that pad)."""
        return self.fill_chunk(()).tobytes()

    # -- serialisation -----------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict for meta.json (strict JSON: no NaN literals).

        Made strict whole: a field the metadata's error is about keeps what the document
        gave, any JSON value (a v1 array's ``order`` of 1e400, an infinity), and one such
        value failed the digest of that array, which failed the whole discovery: every
        view of every array EIO (scripts/fuzz-hostile --seed 4302)."""
        return strict_json({
            "path": self.path,
            "format": self.format,
            "shape": list(self.shape),
            "chunks": list(self.chunks),
            "shard_shape": list(self.shard_shape) if self.shard_shape is not None else None,
            "dtype": self.vlen if self.vlen is not None else dtype_str(self.dtype),
            "fill_value": json_scalar(self.fill_value),
            "order": self.order,
            "dimension_names": list(self.dimension_names) if self.dimension_names else None,
            "attributes": self.attributes,
            "codecs": self.codecs,
            "chunk_key_encoding": self.chunk_key_encoding,
            "vlen": self.vlen,
            "nbytes": self.nbytes if self.error is None else None,
            "chunk_grid": list(self.grid_shape) if self.error is None else None,
            "error": self.error,
        })

    def json_bytes(self) -> bytes:
        """meta.json content: indented, strict JSON, trailing newline."""
        return (json.dumps(self.to_json(), indent=2, allow_nan=False) + "\n").encode()

    def digest(self) -> str:
        """What the normalized metadata is, in 24 hex digits: decoded chunks are known by it
        (in the cache, and to the decoder processes, which check theirs against it)."""
        return self.digests()[0]

    def layout_digest(self) -> str:
        """What the array's bytes are read by, in 24 hex digits: the digest of its metadata
        less what only describes them (attributes, dimension names) or only tunes the
        encoder (``codecs.decoding_settings``). A decoded file opened under one layout reads ESTALE
        once the store shows another (views.arrays)."""
        return self.digests()[1]

    def digests(self) -> tuple[str, str]:
        """:meth:`digest` and :meth:`layout_digest` from one ``to_json``. Both hash compact
        JSON, which the C encoder writes: meta.json's indented form goes through json's
        pure-Python encoder, and hashing it took most of a 100,000-array discovery."""
        doc = self.to_json()
        text = json.dumps(doc, allow_nan=False, separators=(",", ":")).encode()
        del doc["attributes"], doc["dimension_names"]
        doc["codecs"] = decoding_settings(doc["codecs"])
        layout = json.dumps(doc, sort_keys=True, allow_nan=False).encode()
        return (hashlib.blake2b(text, digest_size=12).hexdigest(),
                hashlib.blake2b(layout, digest_size=12).hexdigest())

    def validate(self) -> None:
        """Fill ``error`` if shape/chunks are inconsistent or absurd (never raises).

        ``attributes`` keep their non-finite floats as floats: a NaN is a number to the
        views that can say so (the v2 mirror's JSON, netCDF attributes); meta.json makes
        them strict JSON ("NaN") as it is written.
        """
        if self.error is not None:
            return
        problem = shape_problem(self.shape, self.chunks, self.dtype, self.vlen)
        if problem is not None:
            self.error = f"{self.metadata_key}: {problem}" if self.metadata_key else problem


def _vlen_empty(kind: str) -> Any:
    return "" if "utf8" in kind or kind == "string" else b""


def dtype_str(dt: np.dtype) -> str | list:
    """Explicit-byte-order dtype string ('<f4', '>i2', '|u1'); descr list for structured."""
    if dt.fields is not None:
        return [list(d) for d in dt.descr]
    return dt.str


def shape_problem(
    shape: tuple[int, ...], chunks: tuple[int, ...], dtype: np.dtype, vlen: str | None
) -> str | None:
    """Why this shape/chunk layout cannot be served, or None."""
    if len(shape) != len(chunks):
        return f"shape {list(shape)} and chunks {list(chunks)} differ in length"
    if len(shape) > MAX_NDIM:
        return f"{len(shape)} dimensions; numpy, and zvfs, hold at most {MAX_NDIM}"
    if any(s < 0 for s in shape):
        return f"negative dimension in shape {list(shape)}"
    if any(c < 1 for c in chunks):
        return f"chunk dimensions must be >= 1, got {list(chunks)}"
    itemsize = max(1, 8 if vlen is not None else dtype.itemsize)
    total = math.prod(shape) * itemsize  # python ints: no overflow, just compare
    if total > MAX_NBYTES:
        return f"array too large: shape {list(shape)} x {itemsize} bytes exceeds 2**62 bytes"
    if math.prod(chunks) * itemsize > MAX_CHUNK_NBYTES:
        return f"chunk too large: chunks {list(chunks)} x {itemsize} bytes exceeds 2**32 bytes"
    grid = math.prod(-(-s // c) for s, c in zip(shape, chunks, strict=True))
    if grid > MAX_NBYTES:
        return f"too many chunks: {grid}"
    return None


def json_scalar(value: Any) -> Any:
    """A fill value as strict JSON (Zarr's conventions: "NaN", [re, im], base64 bytes)."""
    if value is None:
        return None
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if isinstance(value, np.void):
        return base64.standard_b64encode(value.tobytes()).decode("ascii")
    if isinstance(value, bytes | np.bytes_):
        return base64.standard_b64encode(bytes(value)).decode("ascii")
    if isinstance(value, np.datetime64 | np.timedelta64):
        return int(value.astype("i8"))
    if isinstance(value, complex | np.complexfloating):
        return [json_scalar(float(value.real)), json_scalar(float(value.imag))]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
    return value


def strict_json(obj: Any) -> Any:
    """Copy of attributes/codecs where non-finite floats become Zarr-style strings."""
    if isinstance(obj, dict):
        return {str(k): strict_json(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [strict_json(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return json_scalar(obj)
    return obj
