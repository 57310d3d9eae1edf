"""The one exception the ZV decoder raises for data it cannot understand."""

from __future__ import annotations

try:  # share the formats layer's base class when it is there, so callers catch one type
    from zvfs.formats.meta import FormatError as _Base
except ImportError:  # pragma: no cover - the formats base is being written concurrently
    _Base = Exception  # type: ignore[misc,assignment]


class ZVError(_Base):  # type: ignore[valid-type,misc]
    """A ZV blob or metadata document is malformed; ``key`` names the store key."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


class MissingDependency(ZVError):
    """Decoding needs an optional package (DracoPy) that is not installed."""

    def __init__(self, key: str, package: str, extra: str) -> None:
        super().__init__(key, f"needs the {package} package (pip install 'zvfs[{extra}]')")
        self.package = package
