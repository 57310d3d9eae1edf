"""Stores: keys and bytes (directory, zip, S3) plus source URL parsing.

Only the contract is re-exported here, so importing the package stays cheap
(boto3 is imported by :mod:`zvfs.stores.s3` alone, when an S3 source is opened).
"""

from zvfs.stores.base import KeyInfo, KeyNotFound, Listing, SourceError, Store, StoreError

__all__ = ["KeyInfo", "KeyNotFound", "Listing", "SourceError", "Store", "StoreError"]
