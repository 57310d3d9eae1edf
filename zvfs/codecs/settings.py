"""Which settings of a codec chain the decoder depends on.

An array's layout digest (``ArrayMeta.layout_digest``) tells a rewrite that changes how its
bytes are read from one that does not. Whether a setting matters is the codec's business,
not the format's: it lives here, beside the decoders that ignore those settings.
"""

from __future__ import annotations

from typing import Any

#: compressors whose stream says how to undo it (zstd's checksum flag, blosc's header): their
#: settings only tune the encoder
SELF_DESCRIBING = frozenset({"zstd", "gzip", "blosc", "lz4", "zlib", "bz2", "lzma"})
ENCODER_ONLY = frozenset({"level", "clevel", "checksum", "acceleration", "blocksize", "cname",
                          "shuffle", "typesize"})


def decoding_settings(codecs: Any) -> Any:
    """A codec chain (v2 ``compressor``/``filters`` or v3 ``codecs``, as JSON) as far as
    decoding goes: without the encoder-only settings of self-describing compressors, and
    with sharding's default index location, so that zarr-python rewriting a zarr.json for
    an attribute (it fills in ``"checksum": false``, ``"index_location": "end"``, ...)
    changes nothing (it made open files read ESTALE)."""
    if isinstance(codecs, list):
        return [decoding_settings(c) for c in codecs]
    if not isinstance(codecs, dict):
        return codecs
    name = str(codecs.get("name", codecs.get("id", ""))).removeprefix("numcodecs.")
    out = {k: decoding_settings(v) for k, v in codecs.items()}
    config = out.get("configuration")
    if name in SELF_DESCRIBING:
        out = {k: v for k, v in out.items() if k not in ENCODER_ONLY}  # v2: settings beside "id"
        if isinstance(config, dict):
            out["configuration"] = {k: v for k, v in config.items() if k not in ENCODER_ONLY}
    elif name == "sharding_indexed" and isinstance(config, dict):
        out["configuration"] = {"index_location": "end", **config}
    return out
