"""What S3's answers mean, the same to the store's reads (:mod:`zvfs.stores.s3`) and its
writes (:mod:`zvfs.stores.s3_write`): an ETag in one spelling, the error of a multipart
upload that is no longer there, and what a listing of unfinished uploads gives. Kept
apart so that the writes need not import the store for them."""

from __future__ import annotations

from typing import NamedTuple

from zvfs.stores.base import StoreError


class UploadGone(StoreError):
    """S3 says the multipart upload does not exist (NoSuchUpload): aborted, or completed
    already, as by a CompleteMultipartUpload whose answer was lost and that was tried again
    (MinIO and S3 itself, after a while, answer the second one so)."""


class Upload(NamedTuple):
    """An unfinished multipart upload: its key (below the prefix), its id, when S3 says it
    was made (epoch seconds, S3's clock) and who made it (None when the server does not say)."""

    key: str
    upload_id: str
    started: float
    initiator: str | None


def strong_etag(value: object) -> str | None:
    """An ETag in one spelling, strong and quoted (``"abc"``), whatever the server wrote: a
    listing's may lack the quotes its GET's header has (then a strict If-Match with it
    failed every read of the file: ESTALE), and a proxy may mark it weak (``W/``). None
    when there is none."""
    if not isinstance(value, str):
        return None
    tag = value.strip()
    if tag.startswith("W/"):
        tag = tag[2:]
    tag = tag.strip('"')
    return f'"{tag}"' if tag else None
