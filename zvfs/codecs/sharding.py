"""The sharding_indexed codec: a shard is inner chunks plus an index of (offset, nbytes).

The codec never does I/O. It tells the caller where the index is
(:meth:`ShardingCodec.index_range`), parses it (:meth:`decode_index`) and where
one inner chunk is (:meth:`locate`), so a reader can fetch the index and then
only the inner chunk it needs with two ranged reads. :meth:`decode` still
decodes a whole shard held in memory (for shards nested behind other codecs).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from .errors import CodecError, UnknownCodecError
from .v3 import Codec, Pipeline, register

#: the largest offset a file (or an S3 object) can have: past it no read can go
MAX_FILE_OFFSET = 2**63 - 1
#: offset/nbytes of an inner chunk that was never written
EMPTY = 2**64 - 1
#: inner chunks one shard may hold: its index (16 bytes each) is read and held whole, so a
#: shard of 2**26 one-byte chunks (metadata alone) had every reader of it fetch, check and
#: decode 1 GiB at once; real shards hold thousands
MAX_INDEX_ENTRIES = 1 << 20

_DEFAULT_INDEX_CODECS = [
    {"name": "bytes", "configuration": {"endian": "little"}},
    {"name": "crc32c"},
]


class ShardingCodec(Codec):
    kind = "ab"
    name = "sharding_indexed"

    def __init__(self, config: dict[str, Any]):
        super().__init__(config)
        chunk_shape = config.get("chunk_shape")
        if not isinstance(chunk_shape, list) or not all(
            isinstance(c, int) and c > 0 for c in chunk_shape
        ):
            raise UnknownCodecError(f"sharding_indexed: bad chunk_shape {chunk_shape!r}")
        self.chunk_shape = tuple(chunk_shape)
        # a default only for a member that is absent: 0, false or [] there once took the
        # default too, and the shards were decoded as plain little-endian bytes; null is
        # no list either (zarr-python refuses it). The pipelines refuse anything but a
        # non-empty list
        self.codecs_config = config.get("codecs", [{"name": "bytes", "configuration": {"endian": "little"}}])
        self.index_codecs_config = config.get("index_codecs", _DEFAULT_INDEX_CODECS)
        self.index_location = config.get("index_location", "end")
        if self.index_location not in ("start", "end"):
            raise UnknownCodecError(f"sharding_indexed: bad index_location {self.index_location!r}")
        self.shard_shape: tuple[int, ...] = ()
        self.inner: Pipeline | None = None

    def bind(self, shard_shape: tuple[int, ...], dtype: np.dtype, fill_value: Any = None) -> None:
        """Fix the shard shape, dtype and fill; builds the inner and index pipelines."""
        self.fill_value = fill_value
        if len(shard_shape) != len(self.chunk_shape) or any(
            s % c for s, c in zip(shard_shape, self.chunk_shape, strict=True)
        ):
            raise UnknownCodecError(
                f"sharding_indexed: shard shape {list(shard_shape)} is not a multiple of "
                f"inner chunk shape {list(self.chunk_shape)}"
            )
        self.shard_shape = tuple(shard_shape)
        self.chunks_per_shard = tuple(
            s // c for s, c in zip(shard_shape, self.chunk_shape, strict=True)
        )
        if math.prod(self.chunks_per_shard) > MAX_INDEX_ENTRIES:
            raise UnknownCodecError(
                f"sharding_indexed: {math.prod(self.chunks_per_shard)} inner chunks a shard "
                f"(an index of {16 * math.prod(self.chunks_per_shard)} bytes); zvfs reads at most "
                f"{MAX_INDEX_ENTRIES}"
            )
        self.inner = Pipeline(self.codecs_config, self.chunk_shape, dtype, fill_value)
        self.index_pipeline = Pipeline(
            self.index_codecs_config, self.chunks_per_shard + (2,), np.dtype("u8")
        )
        # fixed size: array→array codecs that keep the index's bytes (a transpose, which
        # zarr-python writes and reads there), and bytes→bytes ones of a fixed overhead
        shape, dt = self.chunks_per_shard + (2,), np.dtype("u8")
        for codec in self.index_pipeline.aa:
            out_shape, out_dt = codec.encoded_spec(shape, dt)
            if math.prod(out_shape) * out_dt.itemsize != math.prod(shape) * dt.itemsize:
                raise UnknownCodecError("sharding_indexed: index codecs must have a fixed size")
            shape, dt = out_shape, out_dt
        if any(c.overhead is None for c in self.index_pipeline.bb):
            raise UnknownCodecError("sharding_indexed: index codecs must have a fixed size")
        n = math.prod(self.chunks_per_shard)
        self.index_nbytes = 16 * n + sum(c.overhead or 0 for c in self.index_pipeline.bb)

    def decoded_dtype(self, dtype: np.dtype) -> np.dtype:
        assert self.inner is not None
        return self.inner.dtype

    @property
    def byte_order(self) -> str:
        """The inner chunks' byte order, which a sharded array is served in."""
        assert self.inner is not None
        return self.inner.byte_order

    # -- ranged access -------------------------------------------------------

    def index_range(self, shard_nbytes: int | None) -> tuple[int, int]:
        """(start, length) of the index in a shard of ``shard_nbytes`` (None: unknown, index at start)."""
        if self.index_location == "start":
            return 0, self.index_nbytes
        if shard_nbytes is None:
            raise ValueError("shard size needed for an index at the end")
        if shard_nbytes < self.index_nbytes:
            raise CodecError(f"shard of {shard_nbytes} bytes is shorter than its index")
        return shard_nbytes - self.index_nbytes, self.index_nbytes

    def decode_index(self, data: bytes | memoryview) -> np.ndarray:
        """Encoded index → uint64 array of shape chunks_per_shard + (2,)."""
        if len(data) != self.index_nbytes:
            raise CodecError(f"shard index is {len(data)} bytes, expected {self.index_nbytes}")
        return self.index_pipeline.decode(data)

    def locate(
        self, index: np.ndarray, local: tuple[int, ...], shard_nbytes: int | None = None
    ) -> tuple[int, int] | None:
        """(offset, nbytes) of inner chunk ``local`` in the shard, or None if it was not written."""
        off, n = (int(v) for v in index[local])
        if off == EMPTY and n == EMPTY:
            return None
        if shard_nbytes is not None and off + n > shard_nbytes:
            raise CodecError(
                f"inner chunk {local} at {off}+{n} lies outside the shard ({shard_nbytes} bytes)"
            )
        if off + n > MAX_FILE_OFFSET:  # the shard's size unknown (an index at its start)
            raise CodecError(f"inner chunk {local} at {off}+{n} lies past the end of any file")
        return off, n

    def inner_index(self, position: tuple[int, ...]) -> tuple[int, ...]:
        """Inner chunk holding element ``position`` (relative to the shard start)."""
        return tuple(p // c for p, c in zip(position, self.chunk_shape, strict=True))

    # -- whole shard in memory -------------------------------------------------

    def decode(
        self, data: bytes | memoryview, shape: tuple[int, ...], dtype: np.dtype
    ) -> np.ndarray:
        """Decode a whole shard held in memory; unwritten inner chunks hold the fill value."""
        assert self.inner is not None
        buf = memoryview(bytes(data))
        start, length = self.index_range(len(buf))
        index = self.decode_index(buf[start : start + length])
        if self.fill_value is None:
            out = np.zeros(self.shard_shape, dtype=self.inner.dtype)
        elif self.inner.dtype.kind == "O":
            # each element the fill itself (np.full would spread a list or take it apart);
            # these were zeros, served as "" where zarr-python reads the fill (a helper's audit)
            out = np.empty(self.shard_shape, dtype=object)
            out.fill(self.fill_value)
        else:
            out = np.full(self.shard_shape, self.fill_value, dtype=self.inner.dtype)
        for local in itertools.product(*(range(n) for n in self.chunks_per_shard)):
            where = self.locate(index, local, len(buf))
            region = tuple(
                slice(i * c, (i + 1) * c) for i, c in zip(local, self.chunk_shape, strict=True)
            )
            if where is None:
                continue
            off, n = where
            out[region] = self.inner.decode(buf[off : off + n])
        return out


register("sharding_indexed", ShardingCodec)
