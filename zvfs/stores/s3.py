"""A store backed by an S3 bucket (AWS or any S3-compatible endpoint such as moto or MinIO).

Key ``a/b`` of the store is the S3 object ``prefix + 'a/b'``. One boto3 client
serves every thread (boto3 clients are thread safe); its connection pool is
sized for the parallel chunk fetches the layers above make. The source is
probed once at open so that a missing bucket, refused credentials or an
unreachable endpoint stop the mount with a message that says how to fix it,
instead of turning into EIO on every file later.

Every request goes through one retry loop (:mod:`zvfs.stores.retry`), not
botocore's: a throttle, a 5xx, a reset, a stall or a broken body is retried
with backoff and jitter within a bounded budget; a body that breaks off is
resumed from the byte where it stopped (pinned to the object's ETag), never
returned short; a whole-object GET is checked against S3's CRC when the server
sent one. Expired credentials make the client re-read the credential chain
once, so rotating keys need no remount.
"""

from __future__ import annotations

# first, before botocore is imported: it keeps botocore from importing pyOpenSSL
from zvfs.stores import s3_client

# isort: split
import contextlib
import errno
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any, TypeVar

import boto3
import botocore.exceptions as bce
import botocore.session
from botocore import UNSIGNED
from botocore.config import Config
from botocore.handlers import add_expect_header

from zvfs.stats import Counters
from zvfs.stores import s3_pages, s3_walk
from zvfs.stores._util import LogOnce, check_key, check_prefix
from zvfs.stores.base import (
    KeyInfo,
    KeyNotFound,
    KeyWriter,
    Listing,
    SourceError,
    Stale,
    Store,
    StoreError,
    TooLarge,
    WriteRefused,
)
from zvfs.stores.keys import is_safe_key, safe_name, skipped_key
from zvfs.stores.listing import MAX_FILE_SIZE
from zvfs.stores.retry import TRANSIENT_KINDS, Attempts, RetryPolicy
from zvfs.stores.s3_errors import (
    BAD_CREDENTIALS,
    POLICY_REFUSALS,
    REFUSED,
    REQUEST_ERRORS,
    SKEW_HINT,
    SKEWED,
    UNREACHABLE,
    UNSAID_REFUSAL,
    WRONG_REGION,
    Overdue,
    Refused,
    Replaced,
    ShortBody,
    error_code,
    failure,
    fault_kind,
    http_status,
    request_error,
    too_large_behind,
)
from zvfs.stores.s3_wire import Upload, strong_etag
from zvfs.stores.s3_write import KEPT_HEADERS, S3Writer, copy_key, link_key, part_way, rename_prefix
from zvfs.stores.url import S3_BLOCK_SIZE, check_endpoint, is_aws_endpoint
from zvfs.stores.watchdog import Watchdog, watch_pools

log = logging.getLogger(__name__)

#: requests that S3 answers once their work is done, however long it takes, sending blanks
#: meanwhile to keep the connection open (a copy of gigabytes, the assembly of a multipart
#: upload): bounded by the timeout between bytes, not cut off at the deadline
_KEPT_ALIVE = frozenset({"CopyObject", "UploadPartCopy", "CompleteMultipartUpload"})
#: the operations that make an object, which take the mount's upload settings
_MAKES_OBJECTS = frozenset({"PutObject", "CreateMultipartUpload", "CopyObject"})
#: each upload setting (the mount option's name) as the parameter S3 takes it
_UPLOAD_PARAMS = {"sse": "ServerSideEncryption", "sse_kms_key_id": "SSEKMSKeyId",
                  "storage_class": "StorageClass"}
#: the longest object key S3 takes, in bytes of UTF-8 (MinIO's and Ceph's limit too): a
#: longer one is refused (ENAMETOOLONG) before anything is staged, not by the upload at close
MAX_KEY_BYTES = 1024
#: bytes read from a response body per call: the unit a broken body is resumed at
_BODY_PIECE = 1 << 20
#: bytes at most of an answer botocore reads whole and parses (every one but a GET's body):
#: ten times a ListObjectsV2 page of 1,000 keys of 1,024 bytes each, percent-encoded
ANSWER_MAX = 32 << 20

#: "bytes FIRST-LAST/SIZE", what a ranged GET answers (SIZE may be "*": unknown)
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)$")

T = TypeVar("T")
#: how long the probe's first listing page may stand in for the first flat listing
FIRST_PAGE_TTL = 5.0

#: seconds at most one try of the check at open waits: its two tries end well within the
#: 120 s `zvfs mount` waits for a mount to be ready (cli.READY_TIMEOUT)
PROBE_TIMEOUT_MAX = 50.0


#: entries one listing may hold (a directory, or a flat listing): past it the listing fails
MAX_LISTED_KEYS = 5_000_000
#: truncated pages in a row that list nothing: past them the listing fails (a server handing
#: out a new token with each empty page listed for ever, an `ls` waiting on it)
MAX_EMPTY_PAGES = 100
#: names listed where they cannot be (not under the prefix asked) that get a line each
STRAY_LINES = 10


def _info(obj: dict[str, Any]) -> KeyInfo | None:
    """A listed object's info (its ETag names the content: pinned reads use it), or None
    when the server gave a size no file can have (negative, or past 2**63-1: one such key
    failed every listing that held it)."""
    return _key_info(obj.get("Size"), obj.get("LastModified"), obj.get("ETag"))


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _key_info(size: object, when: object, etag: object) -> KeyInfo | None:
    """A key's info from what a listing or a HEAD said, each checked, not trusted; None for
    a size no file can have. A date that is none (a small server's HEAD may give none) is 0."""
    if not isinstance(size, int) or not 0 <= size <= MAX_FILE_SIZE:
        return None
    return KeyInfo(size, _nanoseconds(when), strong_etag(etag))


def _nanoseconds(when: object) -> int:
    """A date botocore parsed, in whole nanoseconds since the epoch (exact: through float
    seconds a listing's milliseconds come out a few hundred ns off); 0 for one missing or
    unparsed."""
    if not isinstance(when, datetime):
        return 0
    if when.tzinfo is None:  # as datetime.timestamp() reads a naive time: local
        when = when.astimezone()
    return (when - _EPOCH) // _MICROSECOND * 1000


def _last_listed(page: dict[str, Any]) -> str | None:
    """Where a listing goes on after ``page`` when the server gave no token nor NextMarker
    (V1 gives one only with a delimiter): after its greatest key, or after every key below its greatest common prefix (U+10FFFF sorts
    after any character that can follow it, in S3's UTF-8 order as in Python's)."""
    keys = [o["Key"] for o in page.get("Contents", ()) if isinstance(o.get("Key"), str)]
    prefixes = [p["Prefix"] + "\U0010ffff" for p in page.get("CommonPrefixes", ())
                if isinstance(p.get("Prefix"), str)]
    return max(keys + prefixes, default=None)


def _answered_range(resp: dict[str, Any]) -> tuple[int, int, int | None] | None:
    """(first, last, size or None) of a 206 answer's Content-Range; None when the answer is
    the whole object (a 200: a server or proxy may ignore Range, as RFC 9110 allows)."""
    if resp.get("ResponseMetadata", {}).get("HTTPStatusCode") != 206:
        return None
    m = _CONTENT_RANGE.match(resp.get("ContentRange") or "")
    if m is None:
        raise ShortBody(f"a partial answer with no usable Content-Range ({resp.get('ContentRange')!r})")
    return int(m.group(1)), int(m.group(2)), None if m.group(3) == "*" else int(m.group(3))


def _credentials_of(session: Any) -> tuple[str, str, str | None] | None:
    """The credentials ``session`` (a boto3 session) signs with now (key, secret, token), or
    None without any (or when the chain fails to give them: the client reports that): what
    tells credentials the user fixed from the ones refused."""
    try:
        creds = session.get_credentials()
        if creds is None:
            return None
        frozen = creds.get_frozen_credentials()
    except (bce.BotoCoreError, RuntimeError):  # RuntimeError: given expired (request_error)
        return None
    return frozen.access_key, frozen.secret_key, frozen.token


def _checksums_configured(session: Any) -> bool:
    """Whether the user chose when botocore adds checksums to requests: the environment, or
    ``request_checksum_calculation`` in the profile of ``session`` (a boto3 session: the
    config file it read for the client, not read again)."""
    if os.environ.get("AWS_REQUEST_CHECKSUM_CALCULATION"):
        return True
    try:
        config = session._session.get_scoped_config()
    except Exception:  # noqa: BLE001 - an unreadable profile is reported when the client is made
        return False
    return "request_checksum_calculation" in config


class S3Store(Store):
    """Store over ``s3://bucket/prefix``; credentials come from the AWS chain.

    Writes (after :meth:`enable_writes`) are staged locally and uploaded at close
    (:mod:`zvfs.stores.s3_write`); directories are implicit, as S3 has none.
    """

    can_write = True
    implicit_dirs = True
    stages_writes = True
    #: set by enable_writes
    staging: Any = None
    part_size = 8 << 20
    rewrite_max = 1 << 30

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str | None = None,
        profile: str | None = None,
        no_sign_request: bool = False,
        requester_pays: bool = False,
        max_pool: int = 32,
        retry: RetryPolicy | None = None,
        block_size: int = S3_BLOCK_SIZE,
        allow_empty: bool = False,
        counters: Counters | None = None,
        page_keys: int = 1000,
    ) -> None:
        """``counters``: the mount's, which retries and errors count into (a private set by default)."""
        if not bucket:
            raise SourceError("S3 source needs a bucket name: s3://bucket[/prefix]")
        prefix = prefix.lstrip("/")
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        self.bucket = bucket
        self.prefix = prefix
        self.no_sign_request = no_sign_request
        self.requester_pays = requester_pays
        #: what every upload asks of S3 (encryption, storage class), as S3's parameters
        self.upload_args: dict[str, str] = {}
        self.retry = retry or RetryPolicy()
        self._watchdog = Watchdog()
        self.allow_empty = allow_empty
        self.counters = counters if counters is not None else Counters()
        self.block_size = block_size  # one GET serves many FUSE reads of the raw view
        self.description = f"s3://{bucket}/{prefix.rstrip('/')}" if prefix else f"s3://{bucket}"
        self._skipped = LogOnce(log)
        self._strays = 0  # lines logged of names listed where they cannot be (_belongs)
        self.flat_listing = True
        self.page_keys = page_keys  # keys a listing page asks for (S3's most, unless testing)
        self._profile = profile
        self._client_lock = threading.Lock()
        self._first_page: tuple[float, dict[str, Any]] | None = None
        if endpoint_url:
            check_endpoint(endpoint_url)
        extra: dict[str, Any] = {}
        if no_sign_request:
            extra["signature_version"] = UNSIGNED
        if endpoint_url:
            extra["s3"] = {"addressing_style": "path"}  # S3-compatible servers rarely do vhosts

        def make(attempts: int, timeout: float, session: Any = None) -> Any:
            cfg = Config(
                retries={"total_max_attempts": attempts, "mode": "standard"},
                max_pool_connections=max_pool,
                # the patient clients wait longer for an answer, never for a connection: the
                # watchdog cannot cut a socket still connecting, and a try begun just before
                # the deadline, to an endpoint that drops SYNs, waited up to a deadline more
                # (26.5 s against a bound of 18.75; a helper's audit)
                connect_timeout=min(timeout, self.retry.timeout),
                read_timeout=timeout,
                **extra,
            )
            client = (session or self._session()).client(
                "s3", endpoint_url=endpoint_url, region_name=region, config=cfg
            )
            # no "Expect: 100-continue" on uploads: it costs a round trip per PUT and part,
            # and saves nothing here (a refused upload is retried whole anyway)
            client.meta.events.unregister("before-call.s3", add_expect_header)
            client.meta.events.register("before-parameter-build.s3", self._mount_params)
            client.meta.events.register("before-send.s3", self._sending)
            s3_client.reuse_endpoints(client)
            s3_client.steady_user_agent(client)
            s3_pages.take_over(client, s3_client.fast_timestamp)  # listing pages, less CPU
            if not watch_pools(client, self._watchdog):
                log.warning("botocore's HTTP session is not laid out as zvfs expects: S3 requests "
                            "are bounded by --s3-timeout between bytes, not by --s3-deadline")
            return client

        # our retry loop is the only one, so the user's attempts and deadline are the real bounds
        self._make_client = lambda session, timeout=None: make(1, timeout or self.retry.timeout, session)
        #: clients that wait longer for the server's next bytes, by timeout (see _waiting):
        #: each with the client it was made beside, and made again once that one is replaced
        self._patient: dict[float, tuple[Any, Any]] = {}
        try:
            # one session for both: a session parses the service model once (~90 ms a client)
            session = self._session()
            if endpoint_url and not is_aws_endpoint(endpoint_url) and not _checksums_configured(session):
                # botocore (1.36 on) sends every upload over HTTPS in aws-chunked encoding, its
                # CRC32 in a trailer. S3-compatible servers that predate that encoding refuse
                # it, or store the framing as the object's bytes. So to them uploads go as
                # botocore sent them before: one plain body, signed with its SHA-256 over HTTP.
                # The user's own setting (AWS_REQUEST_CHECKSUM_CALCULATION, the profile's) wins.
                extra["request_checksum_calculation"] = "when_required"
            self._use_session(session, _credentials_of(session))
            self._chain_read = 0.0  # when the chain was last read after a refusal (_renew_refused)
            # fail soon at open on a dead endpoint: two tries, each of the user's --s3-timeout
            # (capped at 5 s, a server slower than that to answer could never be mounted), both
            # within the time `zvfs mount` waits for the mount (else it told only of its wait)
            probe = make(2, min(self.retry.timeout, PROBE_TIMEOUT_MAX), session)
        except ValueError as e:  # e.g. a malformed endpoint URL
            raise SourceError(f"bad S3 settings for {self.description}: {e}") from e
        except bce.ConfigParseError as e:  # a broken ~/.aws/config or credentials: no retry mends it
            raise SourceError(f"{e}: fix that file, or name another with AWS_CONFIG_FILE or "
                              "AWS_SHARED_CREDENTIALS_FILE") from None
        self.endpoint = str(self._client.meta.endpoint_url)
        try:
            self._probe(probe)
        finally:
            probe.close()

    def _session(self) -> Any:
        """A new session: it reads the credential chain (env, files, credential_process) afresh."""
        core = botocore.session.get_session()
        core.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=s3_client.fast_timestamp)
        try:
            session = boto3.session.Session(botocore_session=core, profile_name=self._profile)
            s3_client.quick_service_lookup(core.get_component("data_loader"))  # reads the profile's data_path
            return session
        except bce.ProfileNotFound:
            raise SourceError(
                f"AWS profile '{self._profile}' is not configured (see ~/.aws/config or "
                "AWS_CONFIG_FILE)"
            ) from None

    def _waiting(self, base: Any, timeouts: int) -> Any:
        """The client for a try after ``timeouts`` tries of one request timed out: ``base``
        (the store's client) at first, then one like it that waits 2, 4, 8... times
        --s3-timeout for the server's next bytes (a connection, --s3-timeout still), up to --s3-deadline (past which the
        watchdog cuts the request anyway). A server slow to begin an answer (a LIST over a
        large bucket on a loaded server makes the whole page first) is then waited for; each
        try waiting the same time failed such a listing at the deadline however many tries
        it had, and had the server make the page again for every try. Nothing of it is
        remembered: the request after begins with ``base``."""
        timeout = min(self.retry.timeout * 2 ** min(timeouts, 16), max(self.retry.deadline, self.retry.timeout))
        if timeout <= self.retry.timeout:
            return base
        with self._client_lock:
            made = self._patient.get(timeout)
            if made is None or made[0] is not base:
                made = self._patient[timeout] = (base, self._make_client(self._client_session, timeout))
            return made[1]

    def _renewed(self, client: Any, exc: BaseException, kind: str) -> bool:
        """Whether a request refused for its credentials is to be tried again, with a client
        that signs with what the credential chain gives now: always once they expired, and
        after a refusal of the credentials themselves only when the chain gives other ones."""
        if kind == "expired":
            self._refresh_client(client)
            return True
        return kind == "denied" and self._renew_refused(client, exc)

    def _use_session(self, session: Any, credentials: tuple[str, str, str | None] | None) -> None:
        """Sign from now on with a client of ``session``, whose credentials are those."""
        self._client = self._make_client(session)
        self._client_session = session
        self._client_credentials = credentials

    def _refresh_client(self, stale: Any) -> None:
        """Replace the client after the server said its credentials expired (once per client)."""
        with self._client_lock:
            if self._client is stale:
                log.warning("S3 credentials for %s expired; reloading them", self.description)
                session = self._session()
                self._use_session(session, _credentials_of(session))

    def _renew_refused(self, stale: Any, exc: BaseException) -> bool:
        """After the server refused the credentials themselves (InvalidAccessKeyId...): read
        the credential chain again and, when it now gives other credentials (the user fixed
        them, as the error line asks), replace the client. Whether the request should be
        tried again with the new client; False when the chain gives the same ones, which
        would be refused again."""
        if self.no_sign_request or not isinstance(exc, bce.ClientError) \
                or error_code(exc) not in BAD_CREDENTIALS | UNSAID_REFUSAL:
            return False
        refused = time.monotonic()
        with self._client_lock:
            if self._client is not stale:
                return True  # another request replaced it meanwhile
            if self._chain_read >= refused:
                # another request read the chain since this one was refused, and found the
                # same credentials: not read again for each of a read's many refused requests
                # (a credential_process run each time, in a row under the lock)
                return False
            self._chain_read = time.monotonic()
            try:
                session = self._session()
                found = _credentials_of(session)
            except Exception:  # noqa: BLE001 - a chain that cannot be read now: the refusal stands
                return False
            if found is None or found == self._client_credentials:
                return False
            log.warning("S3 credentials for %s were refused (%s); the credential chain gives "
                        "other ones now: using them", self.description, error_code(exc))
            self._use_session(session, found)
            return True

    # -- open-time validation ---------------------------------------------------------------

    def _probe(self, client: Any) -> None:
        """The first page of the store's flat listing, which turns every way of failing into a
        SourceError (SourceUnavailable for what may pass), and refuses a prefix with no keys.

        The page is kept for the first flat listing of the whole store (the mount's tree,
        made right after the open): the probe then costs no request of its own, a round trip
        off the path to the first ``ls``."""
        from zvfs.stores.base import SourceUnavailable  # local: leaves the import block to others

        where = f"at endpoint {self.endpoint}"
        # its two tries, each waiting at most the timeout between bytes; an answer trickling
        # in a byte at a time never trips that timeout, and held the open (the mount, and
        # under systemd the daemon) for as long as the server liked: cut off, as any request
        deadline = 2 * min(self.retry.timeout, PROBE_TIMEOUT_MAX) + 2
        try:
            with self._watchdog.watching(time.monotonic() + deadline) as watch, \
                    self._watchdog.bounded(ANSWER_MAX):
                try:
                    page = client.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix, MaxKeys=self.page_keys)
                except Exception as exc:
                    if watch.cut:  # it broke because it came too late
                        raise Overdue(deadline) from exc
                    raise
            if watch.cut:  # an answer cut off can parse as a whole one
                raise Overdue(deadline)
        except Overdue:
            raise SourceUnavailable(f"cannot open {self.description} ({where}): the server's answer to "
                                    f"the first listing was still coming in after {deadline:g} s") from None
        except bce.ClientError as e:
            code, status = error_code(e), http_status(e)
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
            if code in WRONG_REGION or status == 301:
                # a header on a redirect; in the document of an AuthorizationHeaderMalformed
                region = headers.get("x-amz-bucket-region") or e.response.get("Error", {}).get("Region")
                hint = f"pass --region {region}" if region else "pass the bucket's --region"
                raise SourceError(
                    f"S3 bucket '{self.bucket}' is in another region ({where}): {hint}"
                ) from None
            if code == SKEWED:
                raise SourceError(f"cannot open {self.description} ({where}): {SKEWED}: {SKEW_HINT}") from None
            if code in POLICY_REFUSALS and not self.no_sign_request:
                # accepted credentials (S3 names refused ones: InvalidAccessKeyId...) that may
                # not list: "fix the credentials" sent the user to keys that were fine
                raise SourceError(
                    f"S3 refused to list {self.description} ({code}: {msg}; {where}): the credentials "
                    "were accepted, but a policy (the bucket's or the user's IAM policy) does not "
                    "allow them s3:ListBucket there, which zvfs needs to mount it; grant it, or pass "
                    "--profile NAME of credentials that have it"
                ) from None
            if code in REFUSED or status == 403:
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
        except UNREACHABLE as e:
            raise SourceUnavailable(f"cannot reach the S3 endpoint {self.endpoint}: {e}") from None
        except bce.ParamValidationError:
            raise SourceError(
                f"'{self.bucket}' is not a valid S3 bucket name: use 3-63 lowercase letters, digits, "
                "dots and hyphens, e.g. s3://my-bucket/prefix"
            ) from None
        except (bce.BotoCoreError, ValueError) as e:
            too_large = too_large_behind(e)
            if too_large is not None or not isinstance(e, bce.BotoCoreError):
                # an answer that could not be read, or went on without end
                raise SourceError(f"cannot open {self.description} ({where}): the server's listing "
                                  f"could not be read ({too_large or e})") from None
            raise SourceUnavailable(f"cannot open {self.description} ({where}): {e}") from None
        # an empty page that says more follow (S3 may send one) is no empty store
        if not self.allow_empty and not page.get("KeyCount") and not page.get("Contents") \
                and not page.get("CommonPrefixes") and not page.get("IsTruncated"):
            raise SourceError(
                f"{self.description} holds no keys ({where}); check the bucket and prefix for a typo, "
                "or pass --allow-empty (-o allow_empty) to mount it empty"
            )
        self._first_page = (time.monotonic(), page)

    def _probed_page(self) -> dict[str, Any] | None:
        """The probe's page, once, while it is fresh (after that, listings ask the bucket)."""
        with self._client_lock:
            first, self._first_page = self._first_page, None
        if first is None or time.monotonic() - first[0] > FIRST_PAGE_TTL:
            return None
        return first[1]

    # -- Store API ---------------------------------------------------------------------------

    def get(self, key: str) -> bytes:
        check_key(key)
        return self._get(key, 0, None)[0]

    def get_at_most(self, key: str, limit: int) -> bytes:
        """Refused from the response's headers when it announces more than ``limit``, and
        never read past it whatever it announced (a body that does not end)."""
        check_key(key)
        data = self._get(key, 0, None, limit=limit + 1, strict=True)[0]
        if len(data) > limit:
            raise TooLarge(f"{key}: holds more than the {limit} bytes it may")
        return data

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if start < 0 or length < 0:
            raise StoreError(f"{key}: bad range start={start} length={length}")
        check_key(key)
        if length == 0:
            self.info(key)  # still report a missing key
            return b""
        return self._get(key, start, length)[0]

    def get_suffix(self, key: str, length: int) -> tuple[bytes, int]:
        """One GET with ``Range: bytes=-length``: its Content-Range gives the size too."""
        if length < 0:
            raise StoreError(f"{key}: bad suffix length {length}")
        check_key(key)
        if length == 0:
            return b"", self.info(key).size
        data, size = self._get(key, 0, None, suffix=length)
        assert size is not None  # a suffix read always learns it
        return data, size

    def get_version(self, key: str, start: int, length: int | None, version: str | None,
                    limit: int | None = None) -> bytes:
        check_key(key)
        if length == 0:
            return b""
        return self._get(key, start, length, pin=version, limit=limit)[0]

    def info(self, key: str) -> KeyInfo:
        return self._head(key)[0]

    def _head(self, key: str) -> tuple[KeyInfo, dict[str, Any]]:
        """``key``'s size, mtime and ETag, and what of its headers an upload of it keeps
        (:data:`KEPT_HEADERS`)."""
        check_key(key)
        r = self.request(key, "HeadObject", lambda c: c.head_object(Bucket=self.bucket, Key=self.prefix + key))
        # checked, not trusted: a HEAD without Last-Modified (a small server's) raised
        # KeyError, so every open for writing without O_TRUNC, rename and link of it failed
        found = _key_info(r.get("ContentLength"), r.get("LastModified"), r.get("ETag"))
        if found is None:
            raise StoreError(f"{key}: S3 HeadObject: the server's answer gives no size a file "
                             f"can have (Content-Length {r.get('ContentLength')!r})")
        return found, {h: r[h] for h in KEPT_HEADERS if r.get(h)}

    def list_dir(self, prefix: str) -> Listing:
        check_prefix(prefix)
        listing = Listing()
        keys, subdirs = self._dir_entries(prefix)
        for key, info in keys:
            name = key[len(prefix):]
            if safe_name(name):
                listing.keys[name] = info
            elif name:  # '' is a folder marker object ("dir/"): normal, not worth a line
                self._skip(key)
        for sub in subdirs:
            name = sub[len(prefix):-1]
            if safe_name(name):
                listing.prefixes.add(name)
            else:
                self._skip(sub[:-1], under=True)
        return listing

    def _listed(self, obj: dict[str, Any]) -> KeyInfo | None:
        """The info of a listed object, or None (logged once) when it can be no file."""
        info = _info(obj)
        if info is None:
            key = obj.get("Key", "")
            self._skipped.warning(key, "skipping store key %r: the server lists it with size %r, "
                                  "which no file can have", key, obj.get("Size"))
        elif info.size and str(obj.get("Key", "")).endswith("/"):
            key = obj["Key"]  # a folder marker is a directory, as a zip's directory entry
            self._skipped.warning(key, "store key %r is a folder marker holding %d bytes: shown as "
                                  "a directory, the bytes are not", key, info.size)
        return info

    def _skip(self, key: str, under: bool = False) -> None:
        """Log once that ``key`` (``under``: every key below the prefix ``key/``) is no path."""
        self._skipped.warning(key, "%s", skipped_key(key, under))

    def list_prefix(self, prefix: str) -> Iterator[str]:
        """Every key below ``prefix`` in one flat paginated listing (no per-level requests)."""
        if prefix:
            check_prefix(prefix)
        full = self.prefix + prefix
        skip = len(self.prefix)
        for page in self._pages(prefix, Prefix=full):
            for obj in page.get("Contents", ()):
                if not self._belongs(obj.get("Key"), full):
                    continue
                key = obj["Key"][skip:]
                if not key.endswith("/") and is_safe_key(key):
                    yield key

    def list_tree(self, prefix: str) -> Iterator[tuple[str, KeyInfo]]:
        """Every key below ``prefix`` with size and mtime, in S3's order: one flat paginated
        listing, or, when its first page shows a chunk grid's big directories, the rest of
        it directory by directory, many at once (:mod:`zvfs.stores.s3_walk`)."""
        if prefix:
            check_prefix(prefix)
        full = self.prefix + prefix
        pages = self._pages(prefix, Prefix=full)
        for n, page in enumerate(pages):
            contents = [obj for obj in page.get("Contents", ()) if self._belongs(obj.get("Key"), full)]
            yield from self._tree_items(contents)
            if n == 0 and page.get("IsTruncated") and contents:
                keys = [obj["Key"][len(self.prefix):] for obj in contents]
                # the walk goes on after the page's last key, which holds only for a server
                # that lists in order: one that does not (S3 Express directory buckets) lost
                # every key that sorts before it and came on a later page (silently: 800 of
                # 1,800 keys, a whole directory) - it is listed flat to the end
                if all(a < b for a, b in pairwise(keys)) and s3_walk.walk_pays(keys, self.page_keys):
                    pages.close()
                    yield from self._walk_tree(prefix, keys[-1])
                    return

    def _tree_items(self, contents: list[dict[str, Any]]) -> Iterator[tuple[str, KeyInfo]]:
        """The keys (below the store's prefix) and infos of a flat page's objects."""
        for obj in contents:
            info = self._listed(obj)
            if info is not None:
                yield obj["Key"][len(self.prefix):], info

    def _walk_tree(self, prefix: str, after: str) -> Iterator[tuple[str, KeyInfo]]:
        """The keys below ``prefix`` after ``after``, walked directory by directory; when a
        directory's listing is refused (a policy that denies listing below some prefix, which
        the flat listing of the whole store is allowed), the rest flat, from the last key
        walked. The walk only saves time: a refused directory failed the whole listing, so
        every lookup in the mount failed (EIO) where the flat listing served them all."""
        last = after
        try:
            for item in s3_walk.walk(self._dir_entries, prefix, after):
                yield item
                last = item[0]
            return
        except Refused as exc:
            log.warning("%s: listing %s directory by directory was refused (%s); listing it on "
                        "flat", self.description, prefix or "/", exc)
        full = self.prefix + prefix
        for page in self._pages(prefix, Prefix=full, StartAfter=self.prefix + last):
            # what a server that ignores StartAfter (one knowing only V1) lists again is left out
            yield from (item for item in self._tree_items([obj for obj in page.get("Contents", ())
                                                           if self._belongs(obj.get("Key"), full)])
                        if item[0] > last)

    def _dir_entries(self, prefix: str) -> s3_walk.DirListing[KeyInfo]:
        """One directory (``Delimiter='/'``): its keys with their infos, and its
        subdirectories, unfiltered and spelled from the store's root, as the flat listing
        has them (the walk's; list_dir filters them into a Listing)."""
        full = self.prefix + prefix
        skip = len(self.prefix)
        keys: list[tuple[str, KeyInfo]] = []
        subdirs: list[str] = []
        seen: set[str] = set()
        for page in self._pages(prefix, Prefix=full, Delimiter="/"):
            for obj in page.get("Contents", ()):
                info = self._listed(obj) if self._belongs(obj.get("Key"), full) else None
                if info is not None:
                    keys.append((obj["Key"][skip:], info))
            for cp in page.get("CommonPrefixes", ()):
                sub = cp.get("Prefix")
                # only a directory one level below this one, once: a server giving the asked
                # prefix as its own subdirectory (or one from elsewhere) made the walk list
                # it again and again, for ever; one given twice failed the walk (KeyError)
                if not self._belongs(sub, full, directory=True) or sub in seen:
                    continue
                seen.add(sub)
                subdirs.append(sub[skip:])
        return keys, subdirs

    def _belongs(self, name: object, full: str, directory: bool = False) -> bool:
        """Whether a listing of ``full`` (the bucket's prefix included) may hold ``name``:
        a key below it, or with ``directory``, a common prefix one level below it. What
        does not is left out, one line naming it: cut to the store's keys as it would be,
        a key from elsewhere became a file of another name."""
        if not isinstance(name, str) or not name.startswith(full):
            ok = False
        elif directory:
            rest = name[len(full):]
            ok = bool(rest) and rest.endswith("/") and "/" not in rest[:-1]
        else:
            ok = True  # the directory's own folder marker ("dir/") too, as S3 lists it
        if not ok and self._strays <= STRAY_LINES and self._skipped.first(f"{full}\0{name}"):
            # a server that ignores Prefix lists the whole bucket: a line for each of its
            # keys would flood the log, so the first few only
            self._strays += 1
            log.warning("skipping %r: the server lists it in the listing of %r, where it cannot be%s",
                        name, full, "" if self._strays <= STRAY_LINES else
                        "; more such names are left out without a line")
        return ok

    def close(self) -> None:
        self._client.close()
        for _base, client in self._patient.values():
            client.close()
        if self.staging is not None:
            self.staging.cleanup()

    # -- writing -------------------------------------------------------------------------------

    def enable_writes(self, staging: Any, part_size: int, rewrite_max: int,
                      upload_args: Mapping[str, str] | None = None) -> None:
        """Let this store write: files are staged in ``staging`` (a stores.staging.Staging).
        ``upload_args``: the mount's upload settings by option name (``sse``,
        ``sse_kms_key_id``, ``storage_class``), sent with every request that makes an object
        (PutObject, CreateMultipartUpload, CopyObject)."""
        self.staging = staging
        self.part_size = part_size
        self.rewrite_max = rewrite_max
        self.upload_args = {_UPLOAD_PARAMS[name]: value for name, value in (upload_args or {}).items()}

    def _sending(self, event_name: str = "", **_: Any) -> None:
        """botocore's before-send hook: every HTTP request the mount sends to S3, each try
        included, counted by S3 operation (``s3_requests_GetObject``...), as S3 bills them.
        The store's own counts are of its operations (a rename is one), and missed what a
        writer asks below the counting wrapper (its HEADs, a link's GET, the multipart
        calls); this one place sees every client and every retry loop."""
        self.counters.add("s3_requests_" + event_name.rpartition(".")[2])

    def _mount_params(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        """botocore's before-parameter-build hook: what the mount asks of every request of a
        kind, added in one place rather than at each call. A copy needs the upload settings
        too: S3 gives a copied object the bucket's defaults, not its source's (so a rename
        would otherwise drop its encryption and class)."""
        if self.requester_pays and "RequestPayer" in model.input_shape.members:
            params.setdefault("RequestPayer", "requester")
        if model.name in _MAKES_OBJECTS:
            for name, value in self.upload_args.items():
                params.setdefault(name, value)

    def open_writer(self, key: str, *, truncate: bool, create: bool, exclusive: bool = False) -> KeyWriter:
        check_key(key)
        if self.staging is None:
            raise WriteRefused(errno.EROFS, f"{key}: the mount is read-only")
        self.check_key_length(key)
        found: KeyInfo | None = None
        kept: dict[str, Any] = {}
        # an exclusive create asks nothing now: its upload is conditional (If-None-Match)
        if not create or not truncate:
            try:
                found, kept = self._head(key)
            except KeyNotFound:
                if not create:
                    raise
        if found is not None and exclusive:
            raise WriteRefused(errno.EEXIST, f"{key}: exists already")
        # without O_TRUNC nothing is fetched now: the writer fetches the bytes of the object
        # it keeps at the first operation that keeps some (truncate -s 0 keeps none)
        return S3Writer(self, key, self.staging, self.part_size,
                        fresh=found is None or truncate, exclusive=exclusive, stored=found is not None,
                        base=None if truncate else found, headers=kept)

    def delete(self, key: str) -> None:
        check_key(key)
        self.delete_listed(key)

    def delete_listed(self, key: str) -> None:
        """Delete ``key`` as the store lists it, unchecked: a folder marker ("d/"), or a key
        no path can name ("d//x"), which :meth:`delete` refuses, goes with its directory."""
        self.request(key, "DeleteObject",
                      lambda c: c.delete_object(Bucket=self.bucket, Key=self.prefix + key))

    def rename(self, src: str, dst: str, replace: bool = True) -> None:
        check_key(dst)
        self.check_key_length(dst)
        if not replace and (self.exists(dst) or self._first_keys(dst + "/")):
            # made since the mount listed it (another client): mv -n copied over it
            raise WriteRefused(errno.EEXIST, f"{dst}: exists")
        copy_key(self, src, dst, self.info(src).size)
        try:
            self.delete(src)
        except StoreError as exc:
            raise part_way(exc, f"{src} -> {dst}: copied, but {src} could not be removed; "
                                "both names hold it") from exc

    def link(self, src: str, dst: str) -> KeyInfo | None:
        check_key(src)
        check_key(dst)
        self.check_key_length(dst)
        return link_key(self, src, dst)

    def make_dir(self, prefix: str) -> None:
        check_prefix(prefix)  # implicit: the mount shows it until it is removed or filled
        self.check_key_length(prefix + "x")  # a directory that could hold no file, not even of one byte

    def check_key_length(self, key: str) -> None:
        """Refuse (ENAMETOOLONG) a key to write that is longer than S3 takes: the upload at
        close failed after the whole file was staged (EIO, the bytes left in staging)."""
        size = len((self.prefix + key).encode("utf-8", "surrogateescape"))
        if size > MAX_KEY_BYTES:
            shown = key if len(key) <= 80 else key[:80] + "..."
            raise WriteRefused(errno.ENAMETOOLONG, f"{shown}: its object key would be {size} bytes; "
                               f"S3 takes at most {MAX_KEY_BYTES}")

    def _first_keys(self, prefix: str) -> dict[str, int | None]:
        """The first two keys below ``prefix`` as the store has them now (key -> size)."""
        page = self.request(prefix, "ListObjectsV2", lambda c: c.list_objects_v2(
            Bucket=self.bucket, Prefix=self.prefix + prefix, MaxKeys=2))
        return {o["Key"]: o.get("Size") for o in page.get("Contents", ())}

    def _check_empty(self, prefix: str, what: str) -> bool:
        """ENOTEMPTY unless directory ``prefix`` holds nothing but, perhaps, an empty folder
        marker object (``dir/``, another tool's) in the store now; whether it holds one."""
        sizes = self._first_keys(prefix)
        marker = self.prefix + prefix
        if any(k != marker for k in sizes):
            raise WriteRefused(errno.ENOTEMPTY, f"{prefix}: not empty")
        if sizes.get(marker):  # bytes the mount never showed (a directory it is): kept
            raise WriteRefused(errno.ENOTEMPTY, f"{prefix}: not {what}: its folder marker object "
                               f"{marker!r} holds {sizes[marker]} bytes, which the mount does not show")
        return marker in sizes

    def remove_dir(self, prefix: str) -> None:
        check_prefix(prefix)
        if self._check_empty(prefix, "removed"):  # a folder marker object ("dir/") from another tool
            self.delete_listed(prefix)

    def rename_dir(self, src: str, dst: str, replace: bool = True) -> None:
        check_prefix(src)
        check_prefix(dst)
        # the target as the store has it now: another client may have filled it since the
        # mount listed it empty, and its keys were copied over (two directories merged)
        if not replace:
            # RENAME_NOREPLACE onto a directory made behind the mount: EEXIST, as onto one
            # it listed (ENOTEMPTY from the emptiness check before; a helper's audit). Not
            # listed again for that check: an empty target has nothing it could refuse
            if self._first_keys(dst) or self.exists(dst.rstrip("/")):
                raise WriteRefused(errno.EEXIST, f"{dst.rstrip('/')}: exists")
        else:
            self._check_empty(dst, "replaced")
        rename_prefix(self, src, dst)

    def unfinished_uploads(self, key: str | None = None) -> list[Upload]:
        """Multipart uploads under the prefix that were never completed; with ``key``, only
        those of exactly that key (the listing's Prefix matches longer keys too)."""
        out = []
        where = key or "/"
        args: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self.prefix + (key or "")}
        seen: set[tuple[str, str]] = set()
        listed = 0
        while True:
            page = self.request(where, "ListMultipartUploads",
                                 lambda c, a=dict(args): c.list_multipart_uploads(**a))
            for up in page.get("Uploads", ()):
                listed += 1
                full, upload_id, when = up.get("Key"), up.get("UploadId"), up.get("Initiated")
                if not isinstance(full, str) or not full.startswith(self.prefix) or not upload_id:
                    continue  # no upload of this store's that could be named or aborted
                name = full[len(self.prefix):]
                if key is None or name == key:
                    out.append(Upload(name, upload_id, _nanoseconds(when) / 1e9,
                                      (up.get("Initiator") or {}).get("ID")))
            if not page.get("IsTruncated"):
                return out
            # a listing that cannot end fails, as a ListObjectsV2 one does: markers handed
            # back twice (a loop held the mount, or a close(), for ever, its list growing)
            markers = (str(page.get("NextKeyMarker") or ""), str(page.get("NextUploadIdMarker") or ""))
            if listed > MAX_LISTED_KEYS:
                raise StoreError(f"{where}: the server's listing of multipart uploads goes on past "
                                 f"{MAX_LISTED_KEYS:,} uploads")
            if markers == ("", "") or markers in seen:
                raise StoreError(f"{where}: the server's listing of multipart uploads does not end "
                                 f"(a truncated page gave the markers {markers[0][:40]!r}, "
                                 f"{markers[1][:40]!r}: none, or ones it gave before)")
            seen.add(markers)
            for param, marker in zip(("KeyMarker", "UploadIdMarker"), markers, strict=True):
                if marker:
                    args[param] = marker
                else:
                    args.pop(param, None)

    def abort_upload(self, key: str, upload_id: str) -> None:
        self.request(key, "AbortMultipartUpload", lambda c: c.abort_multipart_upload(
            Bucket=self.bucket, Key=self.prefix + key, UploadId=upload_id))

    # -- internals ---------------------------------------------------------------------------

    def _pages(self, prefix: str, **kw: Any) -> Iterator[dict[str, Any]]:
        """ListObjectsV2 pages, each page its own retried request (a fault mid-listing
        resumes at that page's continuation token, never yields a partial listing).

        A listing that does not end fails (StoreError): one whose server hands back a
        continuation token it gave before (a loop, which held an ``ls`` for ever), one of
        more than MAX_EMPTY_PAGES empty pages in a row (new tokens each time: the same), or
        past MAX_LISTED_KEYS entries (a server inventing keys: memory grew 12 MB/s).

        A page said to be truncated but with no continuation token (a server that knows
        only ListObjects V1, and answers V2's request as V1) is followed by V1 pages
        (ListObjects with Marker: its NextMarker, or the page's last name), which every S3
        server knows: the listing was taken as complete, and every name past its first
        page was silently missing. A page that gives nothing to go on from fails."""
        token: str | None = None
        marker: str | None = None  # V1 paging, once a truncated page gave no token
        where = prefix or "/"
        whole = kw == {"Prefix": self.prefix}  # the whole store, flat: what the probe listed
        seen: set[str] = set()
        listed = 0
        empty = 0  # truncated pages in a row that listed nothing
        while True:
            args = dict(kw, Bucket=self.bucket, MaxKeys=self.page_keys)
            if token:
                args["ContinuationToken"] = token
            page = self._probed_page() if whole and not token and marker is None else None
            if marker is not None:  # V1 knows no StartAfter: the marker is past it anyway
                v1 = {k: v for k, v in args.items() if k != "StartAfter"}
                page = self.request(where, "ListObjects",
                                     lambda c, a=dict(v1, Marker=marker): c.list_objects(**a))
            elif page is None:
                page = self.request(where, "ListObjectsV2", lambda c, a=args: c.list_objects_v2(**a))
            entries = len(page.get("Contents", ())) + len(page.get("CommonPrefixes", ()))
            listed += entries
            if listed > MAX_LISTED_KEYS:
                raise StoreError(f"{where}: the listing goes on past {MAX_LISTED_KEYS:,} entries; "
                                 "zvfs lists no more in one directory")
            empty = 0 if entries or not page.get("IsTruncated") else empty + 1
            if empty > MAX_EMPTY_PAGES:
                raise StoreError(f"{where}: the server's listing does not end ({MAX_EMPTY_PAGES} "
                                 "pages in a row listed nothing, each saying more would come)")
            yield page
            if not page.get("IsTruncated"):
                return
            token = page.get("NextContinuationToken")
            if not token:
                nxt = (page.get("NextMarker") if marker is not None else None) or _last_listed(page)
                if not isinstance(nxt, str) or not nxt or (marker is not None and nxt <= marker):
                    raise StoreError(f"{where}: the server's listing is cut short (a page said to be "
                                     "truncated gave no continuation token, and no name to go on from "
                                     "that it had not given before)")
                self._skipped.warning("\0paging", "the S3 server gives no continuation token on a "
                                      "truncated listing page (first in %s): it may know only "
                                      "ListObjects V1; zvfs lists on with V1's markers", where)
                marker = nxt
                continue
            if token in seen:
                raise StoreError(f"{where}: the server's listing loops (it gave continuation "
                                 f"token {token[:40]!r} twice)")
            seen.add(token)

    def request(self, key: str, op: str, call: Callable[[Any], T]) -> T:
        """``call(client)`` under the retry policy; failures become StoreError naming ``key``."""
        tries = Attempts(self.retry)
        refreshed = False
        timeouts = 0
        while True:
            base = self._client
            client = self._waiting(base, timeouts)
            watching = (contextlib.nullcontext() if op in _KEPT_ALIVE
                        else self._watchdog.watching(time.monotonic() + tries.left))
            try:
                with watching as watch, self._watchdog.bounded(ANSWER_MAX):
                    try:
                        answer = call(client)
                    except Exception as exc:
                        if watch is not None and watch.cut:  # it broke because it came too late
                            raise Overdue(self.retry.deadline) from exc
                        raise
                if watch is not None and watch.cut:
                    # an answer cut off can parse as a whole one (a status line cut after
                    # "200", then no headers: a PutObject that "succeeded"): it came too late
                    raise Overdue(self.retry.deadline)
                return answer
            except (ValueError, TypeError) as exc:  # botocore's parse of a malformed answer
                raise StoreError(f"{key}: S3 {op}: the server's answer could not be read "
                                 f"({type(exc).__name__}: {exc})") from None
            except Exception as exc:  # noqa: BLE001 - classified below; anything else is re-raised
                exc = request_error(exc)
                if not isinstance(exc, REQUEST_ERRORS):
                    raise
                too_large = too_large_behind(exc)
                if too_large is not None:  # not retried: the server would send it all again
                    self.counters.add("store_failures")
                    raise StoreError(f"{key}: S3 {op}: {too_large}") from None
                kind = self._count(exc)
                if not refreshed and self._renewed(base, exc, kind):
                    refreshed = True
                    continue
                if kind not in TRANSIENT_KINDS or not tries.retry():
                    raise self._failure(key, op, exc, kind, tries) from None
                timeouts += kind == "timeout"
                self.counters.add("store_retries")

    def _get(self, key: str, start: int, length: int | None, pin: str | None = None,
             suffix: int | None = None, limit: int | None = None,
             strict: bool = False) -> tuple[bytes, int | None]:
        """Bytes [start, start+length) of ``key`` (to the end when length is None, and then
        at most ``limit`` of them), or its last ``suffix`` bytes (one ``Range: bytes=-N``
        request); with the object's size when the response told it (a suffix read always
        does). ``strict``: an object announced longer than ``limit`` is refused (TooLarge)
        before its body is read.

        A body that breaks off is resumed where it stopped, pinned to the first
        response's ETag so the pieces come from one version of the object (a suffix
        read resumes the absolute range its first response named); a checksum
        mismatch discards what was read and starts again. What the server sends is
        checked, not trusted: no more is read than was asked (whatever Content-Length it
        announces), a range answered whole (a 200) is cut to the range, one answered from
        elsewhere or short is resumed, and a body still trickling in at the deadline fails.
        """
        parts: list[bytes] = []
        got = 0
        pin = strong_etag(pin)
        etag: str | None = pin
        size: int | None = None
        tail = suffix  # still to be placed: the first response says where the suffix starts
        tries = Attempts(self.retry)
        refreshed = False
        timeouts = 0
        while True:
            kw: dict[str, Any] = {"Bucket": self.bucket, "Key": self.prefix + key}
            pos = start + got
            if tail is not None:
                kw["Range"] = f"bytes=-{tail}"
            elif length is not None:
                kw["Range"] = f"bytes={pos}-{start + length - 1}"
            elif pos:
                kw["Range"] = f"bytes={pos}-"
            if etag and (got or pin):
                kw["IfMatch"] = etag
            if "Range" not in kw:
                kw["ChecksumMode"] = "ENABLED"  # S3 sends its CRC with a whole object only
            base = self._client
            client = self._waiting(base, timeouts)
            watch = self._watchdog.start(time.monotonic() + tries.left)
            try:
                resp = client.get_object(**kw)
                answered_tag = strong_etag(resp.get("ETag"))
                expected = int(resp.get("ContentLength", -1))
                try:  # what the answer holds, against what was asked; else its body is let go
                    if "IfMatch" in kw and answered_tag is not None and answered_tag != etag:
                        # the server ignored If-Match: these bytes are another version's
                        raise Replaced(f"asked for version {etag}, answered with {answered_tag}")
                    etag = etag or answered_tag
                    answered = _answered_range(resp) if "Range" in kw else None
                    skip = 0  # bytes of the body before what was asked (a range answered whole)
                    if tail is not None:  # from now on an absolute range: a resume asks the rest
                        size = answered[2] if answered else expected
                        if size is None:
                            raise ShortBody("a suffix answered without the object's size")
                        first = max(0, size - tail)
                        start, length, tail = first, size - first, None
                        pos = start + got
                        skip = 0 if answered else first
                        if answered is not None and answered[0] != first:
                            # another range than the suffix (a whole 256 MiB object for a
                            # 16-byte shard index was read in whole): asked again, absolutely
                            raise ShortBody(f"asked for the last {size - first} bytes, answered "
                                            f"from byte {answered[0]} of {size}")
                    elif "Range" in kw:
                        if answered is None:
                            skip = pos
                        elif answered[0] != pos:
                            raise ShortBody(f"asked for bytes from {pos}, answered from {answered[0]}")
                    if length is None and "Range" not in kw:
                        size = expected if expected >= 0 else None
                        if strict and limit is not None and expected > limit:
                            raise TooLarge(f"{key}: holds {expected} bytes, more than the {limit} it may")
                except BaseException:
                    resp["Body"].close()
                    raise
                take = (start + length - pos) if length is not None else (
                    None if limit is None else limit - got)
                body = resp["Body"]
                consumed = 0
                try:
                    while take is None or take > 0:
                        piece = body.read(_BODY_PIECE if take is None else min(_BODY_PIECE, skip + take))
                        if not piece:
                            break
                        consumed += len(piece)
                        if skip:
                            cut = min(skip, len(piece))
                            piece, skip = piece[cut:], skip - cut
                        if take is not None:
                            piece = piece[:take]
                            take -= len(piece)
                        if piece:
                            parts.append(piece)
                            got += len(piece)
                finally:
                    body.close()
                if self._watchdog.end(watch):  # cut off: a read it ended may have looked whole
                    raise Overdue(self.retry.deadline)
                if (take is None or take > 0) and 0 <= consumed < expected:
                    raise ShortBody(f"body ended after {consumed} of {expected} bytes")
                if (take is None or take > 0) and answered is not None and answered[2] is not None \
                        and start + got < answered[2]:
                    raise ShortBody(f"range answered short: bytes {answered[0]}-{answered[1]} "
                                     f"of {answered[2]}")
                return b"".join(parts), size
            except Exception as exc:  # noqa: BLE001 - classified below; anything else is re-raised
                if self._watchdog.end(watch) and not isinstance(exc, Overdue):
                    exc = Overdue(self.retry.deadline)  # whatever broke, broke as it came too late
                exc = request_error(exc)
                if not isinstance(exc, (*REQUEST_ERRORS, ShortBody, Overdue, Replaced)):
                    raise
                changed = isinstance(exc, Replaced)
                if isinstance(exc, bce.ClientError):
                    code = error_code(exc)
                    if code == "InvalidRange" and tail is not None:
                        return b"", 0  # a suffix of an empty object (RFC 9110: unsatisfiable)
                    if code == "InvalidRange" and (length is not None or got):
                        return b"".join(parts), size  # at or past the end: fewer bytes, like pread
                    changed = code == "PreconditionFailed" or http_status(exc) == 412
                if changed and pin:
                    raise Stale(f"{key}: replaced since the mount listed it or it was opened; "
                                "open it again") from None
                if changed:
                    # the object changed between two pieces: start over on the new version
                    log.info("%s: object changed while it was read; reading it again", key)
                    parts, got, etag = [], 0, None
                    if suffix is not None:
                        tail = suffix
                    if tries.retry():
                        continue
                kind = self._count(exc)
                if kind == "checksum":
                    parts, got, etag = [], 0, pin
                    if suffix is not None:
                        tail = suffix
                if not refreshed and self._renewed(base, exc, kind):
                    refreshed = True
                    continue
                if kind not in TRANSIENT_KINDS or not tries.retry():
                    raise self._failure(key, "GetObject", exc, kind, tries) from None
                timeouts += kind == "timeout"
                self.counters.add("store_retries")
                if got:
                    log.debug("%s: %s after %d bytes; resuming from there", key, kind, got)
            finally:
                self._watchdog.end(watch)  # ended already, unless something else broke out

    def _count(self, exc: BaseException) -> str:
        kind = fault_kind(exc)
        self.counters.add(f"store_errors_{'denied' if kind == 'expired' else kind}")
        return kind

    def _failure(self, key: str, op: str, exc: BaseException, kind: str, tries: Attempts) -> StoreError:
        """The error a failed request becomes (s3_errors.failure), counted as a failure of
        the store unless it answers what was asked (a missing key, a create of one that exists)."""
        error = failure(key, op, exc, kind, tries.number, self.description, self.no_sign_request)
        if not isinstance(error, KeyNotFound | WriteRefused):
            self.counters.add("store_failures")
        return error
