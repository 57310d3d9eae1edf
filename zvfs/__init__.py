"""zvfs: Zarr stores (directory, zip, S3) mounted as plain files, with decoded views."""

from __future__ import annotations

from functools import cache


@cache
def _version() -> str:
    # importlib.metadata costs ~15 ms to import: only when the version is asked for
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("zvfs")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0+unknown"


def __getattr__(name: str) -> str:
    if name == "__version__":
        return _version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
