"""zvfs: Zarr stores (directory, zip, S3) mounted as plain files, with decoded views."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("zvfs")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
