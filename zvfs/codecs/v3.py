"""Zarr v3 codec pipelines: array→array, one array→bytes, then bytes→bytes codecs.

``REGISTRY`` maps a v3 codec name to a factory; :func:`build_pipeline` checks a
whole ``codecs`` list once (so an unknown codec is reported when metadata is
read, not at the first chunk) and returns a :class:`Pipeline` whose
``decode(bytes)`` yields the chunk as a C-ordered ndarray.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import Any

import crc32c as _crc32c
import numpy as np
from numcodecs.zstd import Zstd

from . import blosc as _blosc
from . import bounded
from .errors import CodecError, UnknownCodecError
from .v2 import decode_bounded
from .v2 import get_codec as _numcodecs_codec
from .vlen import decode_vlen

#: numcodecs ids that zarr-python 3 wraps as array→array codecs ("numcodecs.<id>")
_NUMCODECS_FILTERS = {"delta", "fixedscaleoffset", "quantize", "bitround", "astype", "packbits"}


class Codec:
    """Base: ``kind`` is 'aa' (array→array), 'ab' (array→bytes) or 'bb' (bytes→bytes)."""

    kind = "bb"
    name = ""

    def __init__(self, config: dict[str, Any]):
        self.config = config

    # array→array codecs transform the shape/dtype the next codec sees
    def encoded_spec(
        self, shape: tuple[int, ...], dtype: np.dtype
    ) -> tuple[tuple[int, ...], np.dtype]:
        return shape, dtype

    # array→bytes: the dtype decoded arrays come out in (byte order from the codec)
    def decoded_dtype(self, dtype: np.dtype) -> np.dtype:
        return dtype

    #: array→bytes: the byte order multi-byte numbers are stored in ('=': none declared)
    byte_order = "="

    #: fixed number of bytes a bytes→bytes codec adds (None if data-dependent)
    overhead: int | None = None


# -- array → bytes -------------------------------------------------------------


class BytesCodec(Codec):
    kind = "ab"
    name = "bytes"

    def __init__(self, config: dict[str, Any]):
        super().__init__(config)
        endian = config.get("endian")
        if endian not in (None, "little", "big"):
            raise UnknownCodecError(f"bytes codec: unknown endian {endian!r}")
        self.endian = endian
        self.byte_order = {"little": "<", "big": ">"}.get(endian, "=")

    def decoded_dtype(self, dtype: np.dtype) -> np.dtype:
        if dtype.kind == "O":
            raise UnknownCodecError("bytes codec cannot hold a variable-length data type")
        if self.endian is None:
            if dtype.itemsize > 1 and dtype.kind not in "SV" and dtype.fields is None:
                raise UnknownCodecError(f"bytes codec needs 'endian' for {dtype}")
            return dtype
        return dtype.newbyteorder("<" if self.endian == "little" else ">")

    def decode(
        self, data: bytes | memoryview, shape: tuple[int, ...], dtype: np.dtype
    ) -> np.ndarray:
        expected = math.prod(shape) * dtype.itemsize
        if len(data) != expected:
            raise CodecError(f"bytes codec: got {len(data)} bytes, expected {expected}")
        return np.frombuffer(data, dtype=dtype).reshape(shape)


class VlenCodec(Codec):
    kind = "ab"

    def __init__(self, config: dict[str, Any], utf8: bool):
        super().__init__(config)
        self.utf8 = utf8
        self.name = "vlen-utf8" if utf8 else "vlen-bytes"

    def decoded_dtype(self, dtype: np.dtype) -> np.dtype:
        if dtype.kind != "O":
            raise UnknownCodecError(f"{self.name} codec needs a variable-length data type")
        return dtype

    def decode(
        self, data: bytes | memoryview, shape: tuple[int, ...], dtype: np.dtype
    ) -> np.ndarray:
        return decode_vlen(data, math.prod(shape), self.utf8).reshape(shape)


# -- array → array -------------------------------------------------------------


class TransposeCodec(Codec):
    kind = "aa"
    name = "transpose"

    def __init__(self, config: dict[str, Any]):
        super().__init__(config)
        self.order = config.get("order")

    def _perm(self, ndim: int) -> tuple[int, ...]:
        order = self.order
        if order == "C":
            return tuple(range(ndim))
        if order == "F":
            return tuple(reversed(range(ndim)))
        if (
            not isinstance(order, list)
            or sorted(order) != list(range(ndim))
            or not all(isinstance(i, int) for i in order)
        ):
            raise UnknownCodecError(f"transpose: bad order {order!r} for {ndim} dimensions")
        return tuple(order)

    def encoded_spec(self, shape, dtype):
        perm = self._perm(len(shape))
        return tuple(shape[i] for i in perm), dtype

    def decode(self, arr: np.ndarray, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        perm = self._perm(len(shape))
        return arr.transpose(np.argsort(perm))


class NumcodecsFilter(Codec):
    """zarr-python 3's "numcodecs.<id>" array→array wrappers (delta, fixedscaleoffset, ...).

    Read as zarr-python reads them: the next codec decodes the chunk to the dtype the
    filter encodes to (its ``astype``, ``encode_dtype``, u1 for packbits; the chunk's
    own dtype otherwise), numcodecs decodes that, and the result is cast by value to the
    chunk's dtype, as zarr-python assigns it into the array. A filter dtype left null
    (or out) is the array's, as zarr-python fills it in; a delta's stays numcodecs' own
    default (float64), as zarr-python leaves it.
    """

    kind = "aa"
    #: the member zarr-python fills in from the array's dtype when it is null or absent
    _UNSET_DTYPE = {"fixedscaleoffset": "dtype", "quantize": "dtype", "astype": "decode_dtype"}

    def __init__(self, config: dict[str, Any], codec_id: str):
        super().__init__(config)
        self.codec_id = codec_id
        self.name = "numcodecs." + codec_id
        self.codec: Any = None  # made once the chunk's dtype is known (encoded_spec)
        self._encoded = np.dtype(bool)

    def encoded_spec(
        self, shape: tuple[int, ...], dtype: np.dtype
    ) -> tuple[tuple[int, ...], np.dtype]:
        config = {"id": self.codec_id, **self.config}
        unset = self._UNSET_DTYPE.get(self.codec_id)
        if unset is not None and config.get(unset) is None:
            config[unset] = dtype.newbyteorder("=").str
        self.codec = _numcodecs_codec(config)
        c = self.codec
        if self.codec_id == "packbits":
            if dtype != np.dtype(bool):
                raise UnknownCodecError(f"{self.name} needs a bool array, not {dtype}")
            self._encoded = np.dtype("u1")
            return (1 + math.ceil(math.prod(shape) / 8),), self._encoded
        if self.codec_id == "astype":
            encoded = np.dtype(c.encode_dtype)
        elif self.codec_id in ("delta", "fixedscaleoffset") and self.config.get("astype"):
            encoded = np.dtype(self.config["astype"])
        else:  # the chunk's own dtype, as zarr-python's chunk spec keeps it
            encoded = dtype
        if self.codec_id in ("delta", "fixedscaleoffset", "quantize"):
            view = np.dtype(c.astype)
            if view.itemsize != encoded.itemsize:
                # numcodecs views the chunk as its astype: no chunk has the array's shape
                # then, and zarr-python fails every read; an error in the metadata here
                raise UnknownCodecError(f"{self.name}: would view {encoded} chunks as {view}")
        self._encoded = encoded.newbyteorder("=")
        return shape, self._encoded

    def decode(self, arr: np.ndarray, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        out = np.asarray(self.codec.decode(arr.astype(self._encoded, copy=False)))
        # a NaN or too big a value cast into an integer array is what zarr-python's cast
        # makes of it, without numpy's warning in the daemon's log
        with np.errstate(invalid="ignore", over="ignore"):
            return out.reshape(shape).astype(dtype, copy=False)


# -- bytes → bytes -------------------------------------------------------------


class GzipCodec(Codec):
    name = "gzip"

    def decode(self, data: bytes | memoryview, limit: int | None = None) -> bytes:
        return bounded.inflate(data, bounded.GZIP, limit, "gzip")


class ZstdCodec(Codec):
    name = "zstd"

    def __init__(self, config: dict[str, Any]):
        super().__init__(config)
        self._zstd = Zstd()

    def decode(self, data: bytes | memoryview, limit: int | None = None) -> bytes:
        bounded.check_zstd(data, limit, "zstd")
        try:
            return bytes(self._zstd.decode(bytes(data)))
        except Exception as exc:
            raise CodecError(f"zstd: {exc}") from exc


class BloscCodec(Codec):
    name = "blosc"

    def decode(self, data: bytes | memoryview, limit: int | None = None) -> bytes:
        return _blosc.decompress(data, max_nbytes=limit)


class Crc32cCodec(Codec):
    name = "crc32c"
    overhead = 4

    def decode(self, data: bytes | memoryview, limit: int | None = None) -> bytes:
        if len(data) < 4:
            raise CodecError("crc32c: data shorter than its checksum")
        body = bytes(data[:-4])
        (stored,) = struct.unpack("<I", bytes(data[-4:]))
        if _crc32c.crc32c(body) != stored:
            raise CodecError("crc32c checksum mismatch")
        return body


class NumcodecsCompressor(Codec):
    """zarr-python 3's "numcodecs.<id>" bytes→bytes wrappers (lz4, bz2, lzma, zlib, ...)."""

    def __init__(self, config: dict[str, Any], codec_id: str):
        super().__init__(config)
        self.name = "numcodecs." + codec_id
        self.codec = _numcodecs_codec({"id": codec_id, **config})

    def bind_itemsize(self, itemsize: int) -> None:
        """zarr-python fills an unset shuffle's elementsize in with the item size of the
        array its bytes hold (Shuffle.evolve_from_array_spec): numcodecs' own default of 4
        read 8-byte items wrong, and null failed every chunk (a helper's audit)."""
        if self.name == "numcodecs.shuffle" and self.config.get("elementsize") is None:
            self.codec = _numcodecs_codec({"id": "shuffle", **self.config, "elementsize": itemsize})

    def decode(self, data: bytes | memoryview, limit: int | None = None) -> bytes:
        try:
            out = decode_bounded(self.codec, self.name.split(".", 1)[1], data, limit)
            return bytes(memoryview(out).cast("B"))
        except CodecError:
            raise
        except Exception as exc:
            raise CodecError(f"{self.name}: {exc}") from exc


REGISTRY: dict[str, Callable[[dict[str, Any]], Codec]] = {
    "bytes": BytesCodec,
    "endian": BytesCodec,  # name used by early v3 drafts
    "vlen-utf8": lambda c: VlenCodec(c, True),
    "vlen-bytes": lambda c: VlenCodec(c, False),
    "transpose": TransposeCodec,
    "gzip": GzipCodec,
    "zstd": ZstdCodec,
    "blosc": BloscCodec,
    "crc32c": Crc32cCodec,
}


def register(name: str, make: Callable[[dict[str, Any]], Codec]) -> None:
    """Add a codec to :data:`REGISTRY`. A codec that builds pipelines of its own
    (sharding's inner chunks) imports this module, so it registers itself rather than
    being imported here: each module then imports only what lies below it."""
    REGISTRY[name] = make


def _int_in(low: int, high: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and low <= v <= high


def _one_of(*names: str) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, str) and v in names


def _any(_v: Any) -> bool:
    return True


def _or_null(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """A setting zarr-python also takes as null: its own "unset", which it fills in from
    the array's dtype (blosc's typesize and shuffle). Decoding needs neither."""
    return lambda v: v is None or check(v)


#: the configuration members each codec of the spec defines, and the values each may take
#: (as zarr-python checks them). A member it does not define, or a value it cannot take, is
#: a codec zvfs does not know: zarr-python refuses such an array, and zvfs served it.
CONFIG_MEMBERS: dict[str, dict[str, Callable[[Any], bool]]] = {
    "bytes": {"endian": _any},  # checked by the codec itself
    "vlen-utf8": {},  # no settings: zarr-python refuses any member (hostile fuzz, seed 4304)
    "vlen-bytes": {},
    "transpose": {"order": _any},  # checked against the shape by the codec
    "gzip": {"level": _int_in(0, 9)},
    "zstd": {"level": _int_in(-(1 << 17), 22), "checksum": lambda v: isinstance(v, bool)},
    "blosc": {"cname": _one_of("lz4", "lz4hc", "blosclz", "zstd", "snappy", "zlib"),
              "clevel": lambda v: isinstance(v, int),
              "shuffle": _or_null(_one_of("noshuffle", "shuffle", "bitshuffle")),
              "typesize": _or_null(lambda v: isinstance(v, int) and v >= 1),
              "blocksize": lambda v: isinstance(v, int)},
    "sharding_indexed": {"chunk_shape": _any, "codecs": _any, "index_codecs": _any,
                         "index_location": _any},  # checked by the sharding codec
}  # fmt: skip


#: codecs whose spec gives them settings, so a configuration (zarr-python refuses them without)
NEED_CONFIGURATION = frozenset({"gzip", "zstd", "blosc", "transpose", "sharding_indexed"})


def _check_configuration(name: str, config: dict[str, Any]) -> None:
    members = CONFIG_MEMBERS.get(name)
    if members is None:
        return
    for member, value in config.items():
        if member not in members:
            raise UnknownCodecError(f"codec {name!r}: unknown configuration member {member!r}")
        if not members[member](value):
            raise UnknownCodecError(f"codec {name!r}: bad {member} {value!r}")


def make_codec(spec: Any) -> Codec:
    """One codec from its JSON form ({"name", "configuration"} or a bare name)."""
    if isinstance(spec, str):
        name, config = spec, {}
    elif isinstance(spec, dict) and isinstance(spec.get("name"), str):
        # only absent is no configuration: null, 0, false or "" is no object, and
        # zarr-python refuses each ("Expected dict")
        name, config = spec["name"], spec.get("configuration", {})
        if "configuration" not in spec and name in NEED_CONFIGURATION:
            raise UnknownCodecError(f"codec {name!r} without its configuration")
    else:
        raise UnknownCodecError(f"malformed codec entry {spec!r}")
    if not isinstance(config, dict):
        raise UnknownCodecError(f"codec {name!r}: configuration is not an object")
    _check_configuration(name, config)
    if name in REGISTRY:
        return REGISTRY[name](config)
    if name.startswith("numcodecs."):
        codec_id = name.split(".", 1)[1]
        if codec_id in _NUMCODECS_FILTERS:
            return NumcodecsFilter(config, codec_id)
        return NumcodecsCompressor(config, codec_id)
    raise UnknownCodecError(f"unsupported codec {name!r}")


class Pipeline:
    """A validated v3 codec chain for chunks of ``shape`` and logical ``dtype``.

    ``dtype`` is the dtype decoded chunks come out in: the logical data type
    with the byte order the bytes codec declares.
    """

    def __init__(
        self, codecs: Any, shape: tuple[int, ...], dtype: np.dtype, fill_value: Any = None
    ):
        if not isinstance(codecs, list) or not codecs:
            raise UnknownCodecError("codecs must be a non-empty list")
        parsed = [make_codec(c) for c in codecs]
        kinds = [c.kind for c in parsed]
        if kinds.count("ab") != 1:
            raise UnknownCodecError("codecs need exactly one array→bytes codec (e.g. bytes)")
        ab = kinds.index("ab")
        if any(k != "aa" for k in kinds[:ab]) or any(k != "bb" for k in kinds[ab + 1 :]):
            raise UnknownCodecError(
                "codecs are out of order (array→array, array→bytes, bytes→bytes)"
            )
        self.shape = tuple(shape)
        self.aa = parsed[:ab]
        self.ab = parsed[ab]
        self.bb = parsed[ab + 1 :]
        # shapes/dtypes each array→array codec encodes from (and decodes back to)
        self._aa_specs: list[tuple[tuple[int, ...], np.dtype]] = []
        spec_shape, spec_dtype = self.shape, dtype
        for codec in self.aa:
            self._aa_specs.append((spec_shape, spec_dtype))
            spec_shape, spec_dtype = codec.encoded_spec(spec_shape, spec_dtype)
        self._ab_shape = spec_shape
        if hasattr(self.ab, "bind"):
            self.ab.bind(spec_shape, spec_dtype, fill_value)
        self._ab_dtype = self.ab.decoded_dtype(spec_dtype)
        for codec in self.bb:
            if isinstance(codec, NumcodecsCompressor):
                codec.bind_itemsize(self._ab_dtype.itemsize)
        # the byte order declared by the bytes codec is the one chunks are served in
        self.byte_order = self.ab.byte_order
        self.dtype = self._ab_dtype if spec_dtype == dtype else dtype.newbyteorder(self.byte_order)
        # each array→array codec decodes to the spec it encoded from, in that byte order
        self._aa_specs = [
            (s, self.dtype if d == dtype else d.newbyteorder(self.byte_order))
            for s, d in self._aa_specs
        ]
        #: most bytes a bytes→bytes codec may yield: a chunk's bytes, or a shard's (its
        #: chunks, however encoded, and its index); a chunk of variable-length items,
        #: VLEN_CEILING; a shard of them, unbounded (each of its chunks is, by its own)
        nbytes = math.prod(self._ab_shape) * self._ab_dtype.itemsize
        if isinstance(self.ab, BytesCodec):
            self._limit: int | None = bounded.ceiling(nbytes)
        elif self.ab.name == "sharding_indexed":
            self._limit = None if self._ab_dtype.kind == "O" else bounded.ceiling(nbytes) + self.ab.index_nbytes
        else:
            self._limit = bounded.VLEN_CEILING

    @property
    def chunk_limit(self) -> int | None:
        """Most bytes a stored chunk (or whole shard) of this pipeline can legitimately hold
        (None: unbounded, for a shard of variable-length elements)."""
        return self._limit

    @property
    def sharding(self) -> Any:
        """The sharding codec if inner chunks can be read with ranged reads, else None."""
        if self.ab.name == "sharding_indexed" and not self.aa and not self.bb:
            return self.ab
        return None

    def decode_bytes(self, data: bytes | memoryview) -> bytes | memoryview:
        """Undo the bytes→bytes codecs only, none of them past the chunk's ceiling."""
        for codec in reversed(self.bb):
            data = codec.decode(data, self._limit)
        return data

    def decode(self, data: bytes | memoryview) -> np.ndarray:
        """Encoded chunk → C-ordered ndarray of ``self.shape`` and ``self.dtype``."""
        try:
            arr = self.ab.decode(self.decode_bytes(data), self._ab_shape, self._ab_dtype)
            for codec, (shape, dtype) in zip(
                reversed(self.aa), reversed(self._aa_specs), strict=True
            ):
                arr = codec.decode(arr, shape, dtype)
        except CodecError:
            raise
        except Exception as exc:  # numpy reshape/view errors on corrupt data
            raise CodecError(f"decode failed: {exc}") from exc
        if arr.shape != self.shape:
            raise CodecError(f"decoded shape {arr.shape}, expected {self.shape}")
        if arr.dtype != self.dtype and arr.dtype.kind != "O":
            arr = arr.astype(self.dtype)
        return np.require(arr, requirements="C")


def build_pipeline(
    codecs: Any, shape: tuple[int, ...], dtype: np.dtype, fill_value: Any = None
) -> Pipeline:
    """Validate ``codecs`` for chunks of ``shape``/``dtype``; raises UnknownCodecError."""
    return Pipeline(codecs, tuple(shape), dtype, fill_value)
