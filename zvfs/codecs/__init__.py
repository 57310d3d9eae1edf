"""Decode pipelines: pure functions from stored bytes to bytes or ndarrays.

Nothing here does I/O or imports other zvfs layers. Formats build a pipeline
once per array from its metadata (so an unknown codec is found early) and call
``decode`` per chunk from a worker thread.
"""

from __future__ import annotations

from .blosc import decompress as blosc_decompress
from .errors import CodecError, UnknownCodecError
from .settings import decoding_settings

# importing sharding registers it among the v3 codecs (it builds pipelines of them)
from .sharding import EMPTY as SHARD_EMPTY
from .sharding import ShardingCodec
from .v2 import VLEN_FILTER_IDS, V2Pipeline, decode_blosc_chunk, v1_compressor
from .v3 import REGISTRY as V3_REGISTRY
from .v3 import Pipeline, build_pipeline, make_codec
from .vlen import decode_vlen

__all__ = [
    "CodecError",
    "UnknownCodecError",
    "Pipeline",
    "build_pipeline",
    "make_codec",
    "V3_REGISTRY",
    "ShardingCodec",
    "SHARD_EMPTY",
    "V2Pipeline",
    "VLEN_FILTER_IDS",
    "decode_blosc_chunk",
    "v1_compressor",
    "blosc_decompress",
    "decode_vlen",
    "decoding_settings",
]
