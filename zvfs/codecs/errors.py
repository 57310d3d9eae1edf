"""Codec errors. Codecs raise these; formats add the key and re-raise FormatError."""

from __future__ import annotations


class CodecError(Exception):
    """Encoded bytes could not be decoded (corrupt, truncated, wrong size)."""


class UnknownCodecError(CodecError):
    """The metadata names a codec, or a codec configuration, that zvfs cannot decode."""
