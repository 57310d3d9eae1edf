"""Open the store a :class:`~zvfs.stores.url.SourceSpec` names.

Above every backend: each is imported only when a source of its kind is opened (boto3
and botocore cost a mount of a local store nothing)."""

from __future__ import annotations

import os

from zvfs.stats import Counters
from zvfs.stores.base import SourceError, Store
from zvfs.stores.retry import RetryPolicy
from zvfs.stores.url import S3_BLOCK_SIZE, SourceSpec


def open_store(spec: SourceSpec, retry: RetryPolicy | None = None, *, allow_empty: bool = False,
               counters: Counters | None = None, pending: bool = False) -> Store:
    """Open the store a spec names; raises SourceError if it cannot be opened at all
    (an S3 prefix with no keys too, unless ``allow_empty``).

    ``retry`` bounds the requests of a remote store (local stores do not retry).
    ``counters`` are the mount's: what the store counts itself (retries, errors, uploads,
    inflated bytes) lands there; without them, each store counts into a private set.
    ``pending``: an S3 store or a zip comes as a :class:`PendingStore` whose ``open()`` the
    caller runs later (S3: it imports botocore and asks the server; a zip: its central
    directory is parsed, which grows with its members); a directory opens at once, as
    that costs a stat."""
    store: Store
    if pending and spec.kind in ("s3", "zip"):
        from zvfs.stores.pending import PendingStore

        s3 = spec.kind == "s3"
        if s3:
            def opener() -> Store:
                return open_store(spec, retry, allow_empty=allow_empty, counters=counters)
            abandon = None
        else:
            # the archive is opened now, the central directory read later: the mount may
            # cover the archive's own path (mounted over its own directory)
            from zvfs.stores.zip import ZipStore, open_fd

            fd = open_fd(str(spec.path))

            def opener() -> Store:
                store = ZipStore(str(spec.path), counters=counters, fd=fd)
                store.description = spec.describe()
                return store

            def abandon() -> None:
                os.close(fd)
        return PendingStore(opener, description=spec.describe(), block_size=S3_BLOCK_SIZE if s3 else 0,
                            flat_listing=s3, can_write=s3, implicit_dirs=s3, stages_writes=s3,
                            local=not s3, abandon=abandon)
    if spec.kind == "directory":
        from zvfs.stores.directory import DirectoryStore

        store = DirectoryStore(str(spec.path))
    elif spec.kind == "zip":
        from zvfs.stores.zip import ZipStore

        store = ZipStore(str(spec.path), counters=counters)
    elif spec.kind == "s3":
        from zvfs.stores.s3 import S3Store  # boto3 is imported only for S3 sources

        store = S3Store(
            str(spec.bucket), spec.prefix, endpoint_url=spec.endpoint_url, region=spec.region,
            profile=spec.profile, no_sign_request=spec.no_sign_request,
            requester_pays=spec.requester_pays, retry=retry,
            block_size=S3_BLOCK_SIZE, allow_empty=allow_empty, counters=counters,
        )
    else:  # pragma: no cover - Kind is closed
        raise SourceError(f"unknown source kind {spec.kind!r}")
    store.description = spec.describe()
    return store
