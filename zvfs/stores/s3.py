"""A store backed by an S3 bucket (AWS or any S3-compatible endpoint such as moto or MinIO).

Key ``a/b`` of the store is the S3 object ``prefix + 'a/b'``. One boto3 client
serves every thread (boto3 clients are thread safe); its connection pool is
sized for the parallel chunk fetches the layers above make. The source is
probed once at open so that a missing bucket, refused credentials or an
unreachable endpoint stop the mount with a message that says how to fix it,
instead of turning into EIO on every file later.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import boto3
import botocore.exceptions as bce
from botocore import UNSIGNED
from botocore.config import Config

from zvfs.stores._util import LogOnce, check_key, check_prefix, safe_name
from zvfs.stores.base import KeyInfo, KeyNotFound, Listing, SourceError, Store, StoreError
from zvfs.stores.keys import bad_segment, is_safe_key

log = logging.getLogger(__name__)

_MISSING = {"NoSuchKey", "404", "NotFound"}
_REFUSED = {
    "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
    "InvalidToken", "TokenRefreshRequired", "AllAccessDisabled", "InvalidClientTokenId",
    "403", "Forbidden",
}
_WRONG_REGION = {"PermanentRedirect", "AuthorizationHeaderMalformed", "301", "IllegalLocationConstraintException"}
_UNREACHABLE = (bce.EndpointConnectionError, bce.ConnectTimeoutError, bce.ConnectionClosedError)
# errors of a response body that broke off mid-stream: worth one more try
_STREAM_ERRORS = (bce.ReadTimeoutError, bce.IncompleteReadError, bce.ResponseStreamingError)


def _code(e: bce.ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


def _status(e: bce.ClientError) -> int:
    return int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


class S3Store(Store):
    """Read-only store over ``s3://bucket/prefix``; credentials come from the AWS chain."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str | None = None,
        profile: str | None = None,
        no_sign_request: bool = False,
        max_pool: int = 32,
        max_attempts: int = 5,
        retry_mode: str = "standard",
        block_size: int = 4 << 20,
        allow_empty: bool = False,
    ) -> None:
        if not bucket:
            raise SourceError("S3 source needs a bucket name: s3://bucket[/prefix]")
        prefix = prefix.lstrip("/")
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        self.bucket = bucket
        self.prefix = prefix
        self.no_sign_request = no_sign_request
        self.allow_empty = allow_empty
        self.block_size = block_size  # one GET serves many FUSE reads of the raw view
        self.description = f"s3://{bucket}/{prefix.rstrip('/')}" if prefix else f"s3://{bucket}"
        self._skipped = LogOnce(log)
        self.flat_listing = True
        try:
            session = boto3.session.Session(profile_name=profile)
        except bce.ProfileNotFound:
            raise SourceError(
                f"AWS profile '{profile}' is not configured (see ~/.aws/config or AWS_CONFIG_FILE)"
            ) from None
        if endpoint_url and "://" not in endpoint_url:
            raise SourceError(
                f"the S3 endpoint URL {endpoint_url!r} has no scheme: "
                f"use --endpoint-url http://{endpoint_url} (or https://)"
            )
        extra: dict[str, Any] = {}
        if no_sign_request:
            extra["signature_version"] = UNSIGNED
        if endpoint_url:
            extra["s3"] = {"addressing_style": "path"}  # S3-compatible servers rarely do vhosts

        def make(attempts: int, timeout: float) -> Any:
            cfg = Config(
                retries={"max_attempts": attempts, "mode": retry_mode},
                max_pool_connections=max_pool,
                connect_timeout=timeout,
                read_timeout=max(timeout, 30.0),
                **extra,
            )
            return session.client("s3", endpoint_url=endpoint_url, region_name=region, config=cfg)

        try:
            self._client = make(max_attempts, 10.0)
            probe = make(2, 5.0)  # fail fast at open on an unreachable endpoint
        except ValueError as e:  # e.g. a malformed endpoint URL
            raise SourceError(f"bad S3 settings for {self.description}: {e}") from e
        self.endpoint = str(self._client.meta.endpoint_url)
        try:
            self._probe(probe)
        finally:
            probe.close()

    # -- open-time validation ---------------------------------------------------------------

    def _probe(self, client: Any) -> None:
        """One small ListObjectsV2 that turns every way of failing into a SourceError
        (SourceUnavailable for what may pass), and refuses a prefix with no keys."""
        from zvfs.stores.base import SourceUnavailable  # local: leaves the import block to others

        where = f"at endpoint {self.endpoint}"
        try:
            page = client.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix, Delimiter="/", MaxKeys=1)
        except bce.ClientError as e:
            code, status = _code(e), _status(e)
            msg = e.response.get("Error", {}).get("Message", "")
            headers = e.response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
            if (not code or code.isdigit()) and not any(h.startswith("x-amz-") for h in headers):
                # S3 always names its error (NoSuchBucket...) and stamps x-amz-request-id
                raise SourceError(
                    f"the endpoint {self.endpoint} answered HTTP {status} without an S3 error: "
                    "it does not look like an S3 server; check --endpoint-url"
                ) from None
            if code == "NoSuchBucket" or (status == 404 and code in ("404", "NotFound")):
                raise SourceError(f"S3 bucket '{self.bucket}' does not exist ({where})") from None
            if code in _WRONG_REGION or status == 301:
                region = e.response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get(
                    "x-amz-bucket-region"
                )
                hint = f"pass --region {region}" if region else "pass the bucket's --region"
                raise SourceError(
                    f"S3 bucket '{self.bucket}' is in another region ({where}): {hint}"
                ) from None
            if code in _REFUSED or status == 403:
                if self.no_sign_request:
                    raise SourceError(
                        f"anonymous access to S3 bucket '{self.bucket}' was refused ({code}, {where}); "
                        "the bucket is not public: drop --no-sign-request and configure credentials "
                        "(--profile NAME, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"
                    ) from None
                raise SourceError(
                    f"S3 credentials were refused for bucket '{self.bucket}' ({code}: {msg}; {where}). "
                    "Fix the credentials: pass --profile NAME, or set AWS_ACCESS_KEY_ID and "
                    "AWS_SECRET_ACCESS_KEY; for a public bucket use --no-sign-request"
                ) from None
            error = SourceUnavailable if status >= 500 or code in ("SlowDown", "Throttling") else SourceError
            raise error(
                f"cannot open {self.description} ({where}): {code or status} {msg}".rstrip()
            ) from None
        except (bce.NoCredentialsError, bce.PartialCredentialsError) as e:
            raise SourceError(
                f"no AWS credentials found for {self.description} ({e}). For a public bucket use "
                "--no-sign-request; otherwise configure credentials: --profile NAME, "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or ~/.aws/credentials"
            ) from None
        except _UNREACHABLE as e:
            raise SourceUnavailable(f"cannot reach the S3 endpoint {self.endpoint}: {e}") from None
        except bce.ParamValidationError:
            raise SourceError(
                f"'{self.bucket}' is not a valid S3 bucket name: use 3-63 lowercase letters, digits, "
                "dots and hyphens, e.g. s3://my-bucket/prefix"
            ) from None
        except bce.BotoCoreError as e:
            raise SourceUnavailable(f"cannot open {self.description} ({where}): {e}") from None
        if not self.allow_empty and not page.get("KeyCount") and not page.get("Contents") \
                and not page.get("CommonPrefixes"):
            raise SourceError(
                f"{self.description} holds no keys ({where}); check the bucket and prefix for a typo, "
                "or pass --allow-empty (-o allow_empty) to mount it empty"
            )

    # -- Store API ---------------------------------------------------------------------------

    def get(self, key: str) -> bytes:
        return self._get(key, None)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if start < 0 or length < 0:
            raise StoreError(f"{key}: bad range start={start} length={length}")
        if length == 0:
            check_key(key)
            self.info(key)  # still report a missing key
            return b""
        return self._get(key, f"bytes={start}-{start + length - 1}")

    def info(self, key: str) -> KeyInfo:
        check_key(key)
        try:
            r = self._client.head_object(Bucket=self.bucket, Key=self.prefix + key)
        except bce.ClientError as e:
            raise self._error(key, e) from None
        except bce.BotoCoreError as e:
            raise StoreError(f"{key}: S3 HeadObject failed: {e}") from e
        return KeyInfo(int(r["ContentLength"]), r["LastModified"].timestamp())

    def list_dir(self, prefix: str) -> Listing:
        check_prefix(prefix)
        full = self.prefix + prefix
        listing = Listing()
        for page in self._pages(prefix, Prefix=full, Delimiter="/"):
            for obj in page.get("Contents", ()):
                name = obj["Key"][len(full):]
                if safe_name(name):
                    listing.keys[name] = KeyInfo(int(obj["Size"]), obj["LastModified"].timestamp())
                elif name:  # '' is a folder marker object ("dir/"): normal, not worth a line
                    self._skip(prefix + name)
            for cp in page.get("CommonPrefixes", ()):
                name = cp["Prefix"][len(full):-1]
                if safe_name(name):
                    listing.prefixes.add(name)
                else:
                    self._skip(prefix + name)
        return listing

    def _skip(self, key: str) -> None:
        why = bad_segment(key) or "not a path segment"
        self._skipped.warning(key, "skipping store key %r: cannot be a POSIX path (%s)", key, why)

    def list_prefix(self, prefix: str) -> Iterator[str]:
        """Every key below ``prefix`` in one flat paginated listing (no per-level requests)."""
        if prefix:
            check_prefix(prefix)
        full = self.prefix + prefix
        skip = len(self.prefix)
        for page in self._pages(prefix, Prefix=full):
            for obj in page.get("Contents", ()):
                key = obj["Key"][skip:]
                if not key.endswith("/") and is_safe_key(key):
                    yield key

    def list_tree(self, prefix: str) -> Iterator[tuple[str, KeyInfo]]:
        """Every key below ``prefix`` with size and mtime, from one flat paginated listing."""
        if prefix:
            check_prefix(prefix)
        skip = len(self.prefix)
        for page in self._pages(prefix, Prefix=self.prefix + prefix):
            for obj in page.get("Contents", ()):
                yield obj["Key"][skip:], KeyInfo(int(obj["Size"]), obj["LastModified"].timestamp())

    def close(self) -> None:
        self._client.close()

    # -- internals ---------------------------------------------------------------------------

    def _pages(self, prefix: str, **kw: Any) -> Iterator[dict[str, Any]]:
        try:
            yield from self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, **kw)
        except bce.ClientError as e:
            raise StoreError(f"{prefix or '/'}: S3 listing failed: {_code(e)} {e}") from None
        except bce.BotoCoreError as e:
            raise StoreError(f"{prefix or '/'}: S3 listing failed: {e}") from e

    def _get(self, key: str, byte_range: str | None) -> bytes:
        check_key(key)
        kw: dict[str, Any] = {"Bucket": self.bucket, "Key": self.prefix + key}
        if byte_range:
            kw["Range"] = byte_range
        for attempt in (1, 2):
            try:
                resp = self._client.get_object(**kw)
                with resp["Body"] as body:
                    return body.read()
            except bce.ClientError as e:
                if byte_range and _code(e) == "InvalidRange":
                    return b""  # start at or past the end: fewer (zero) bytes, like pread
                raise self._error(key, e) from None
            except _STREAM_ERRORS as e:
                if attempt == 2:
                    raise StoreError(f"{key}: S3 read broke off: {e}") from e
                log.info("%s: S3 read broke off (%s); retrying once", key, e)
            except bce.BotoCoreError as e:
                raise StoreError(f"{key}: S3 GetObject failed: {e}") from e
            except OSError as e:  # urllib3 protocol errors surface as OSError subclasses
                raise StoreError(f"{key}: S3 GetObject failed: {e}") from e
        raise AssertionError("unreachable")

    def _error(self, key: str, e: bce.ClientError) -> StoreError:
        code = _code(e)
        if code in _MISSING:
            return KeyNotFound(key)
        msg = e.response.get("Error", {}).get("Message", "")
        return StoreError(f"{key}: S3 error {code or _status(e)} {msg}".rstrip())
