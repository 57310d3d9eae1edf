"""The one exception the ZV decoder raises for data it cannot understand."""

from __future__ import annotations

from zvfs.formats.meta import FormatError


class ZVError(FormatError):
    """A ZV blob or metadata document is malformed; ``key`` names the store key.

    A subclass of the formats layer's FormatError, so callers that handle Zarr
    decode errors handle these too.
    """

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


class MissingDependency(ZVError):
    """Decoding needs an optional package (DracoPy) that is not installed."""

    def __init__(self, key: str, package: str, extra: str) -> None:
        super().__init__(key, f"needs the {package} package (pip install 'zvfs[{extra}]')")
        self.package = package
