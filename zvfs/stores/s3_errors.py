"""What a failed S3 request is: its kind, which decides whether it is tried again, and the
error it becomes, whose message is the one line the user reads.

S3 and its look-alikes (moto, MinIO, Ceph) say what went wrong in an error code, a status,
or only by how the connection broke; botocore wraps each in its own exceptions, and the
read loop of :mod:`zvfs.stores.s3` adds its own (a body cut short, an answer from another
version of the object, a deadline passed). :func:`fault_kind` sorts them all into the kinds
the retry policy knows (zvfs.stores.retry); :func:`failure` words the error once the tries
are spent: the key, the request, S3's reason, and the fix (credentials, a policy, the clock,
an archived object).
"""

from __future__ import annotations

# first, before botocore is imported: it keeps botocore from importing pyOpenSSL
from zvfs.stores import s3_client  # noqa: F401

# isort: split
import errno
import http.client
import logging
from collections.abc import Callable

import botocore.exceptions as bce
import urllib3.exceptions as u3e

from zvfs.stores._util import NO_DESCRIPTORS, no_descriptors_hint
from zvfs.stores.base import KeyNotFound, StoreError, WriteRefused
from zvfs.stores.retry import TRANSIENT_KINDS
from zvfs.stores.s3_wire import UploadGone
from zvfs.stores.watchdog import AnswerTooLarge

# S3's error codes (and the statuses some servers send without a code), by what they mean
_MISSING = {"NoSuchKey", "404", "NotFound"}
REFUSED = {
    "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
    "InvalidToken", "TokenRefreshRequired", "AllAccessDisabled", "InvalidClientTokenId",
    "403", "Forbidden",
}
WRONG_REGION = {"PermanentRedirect", "AuthorizationHeaderMalformed", "301", "IllegalLocationConstraintException"}
_EXPIRED = {"ExpiredToken", "TokenRefreshRequired", "RequestExpired", "ExpiredTokenException"}
#: refusals of the credentials themselves (a key deleted or deactivated, a secret or token
#: that is wrong), not of one object: new credentials in the chain (a credentials file
#: rewritten, a profile's keys rotated) may mend them, so the chain is read again
BAD_CREDENTIALS = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "InvalidClientTokenId"}
#: a 403 without an error document (a HEAD's: S3 sends it no body), which may be either
UNSAID_REFUSAL = {"403", "Forbidden"}
#: refusals of one request whose credentials S3 accepted: a policy, an ACL or a KMS key
#: does not allow it (new credentials are not looked for: it may be one object of many)
POLICY_REFUSALS = {"AccessDenied", "AllAccessDisabled"}
_THROTTLED = {"SlowDown", "Throttling", "ThrottlingException", "TooManyRequests",
              "RequestLimitExceeded", "RequestThrottled", "ServiceUnavailable"}
_SERVER = {"InternalError", "RequestTimeout", "BadGateway", "GatewayTimeout"}
#: S3's answer (a 403) to a request signed with a clock 15 minutes off its own: no credential
#: is wrong, and trying again with the same clock cannot help
SKEWED = "RequestTimeTooSkewed"
#: S3's answer (a 403) to a GET of an object archived in Glacier Flexible Retrieval, Deep
#: Archive or an Intelligent-Tiering archive tier: readable once restored, by any credentials
_ARCHIVED = "InvalidObjectState"
SKEW_HINT = ("this machine's clock differs from the S3 server's by more than S3 allows (15 minutes), "
             "and every request is signed with it: set the clock (e.g. enable NTP); the credentials are fine")
#: what a failed request can raise: botocore's errors, and urllib3's and the socket's when a
#: response breaks while botocore parses it
REQUEST_ERRORS = (bce.BotoCoreError, bce.ClientError, u3e.HTTPError, OSError)
UNREACHABLE = (bce.EndpointConnectionError, bce.ConnectTimeoutError, bce.ConnectionClosedError)
#: writes that may carry a condition (If-None-Match): a refused condition means EEXIST
_CONDITIONAL_WRITES = frozenset({"PutObject", "CompleteMultipartUpload"})
#: the operations that store bytes: a 404 without an error document is no missing key there
_WRITES = frozenset({"PutObject", "UploadPart", "CreateMultipartUpload", "CompleteMultipartUpload"})


class ShortBody(Exception):
    """The body ended before its Content-Length (the server closed the connection), or a
    range came back shorter than asked though the object goes on: resumed where it stopped."""


class Replaced(Exception):
    """The answer came from another version of the object than the one asked for (its ETag
    is not the pinned one): a server that ignores If-Match would otherwise mix two objects
    in one read."""


class ExpiredCredentials(bce.BotoCoreError):
    """The credentials the AWS chain gives are expired already (a credential_process or an
    SSO cache that answers so): botocore refuses to sign with them, and no request is sent."""

    fmt = "{msg}"


#: what botocore raises (a RuntimeError), and logs as a warning too, for such credentials
_STILL_EXPIRED = "refreshed credentials are still expired"


def request_error(exc: BaseException) -> BaseException:
    """``exc`` as a failed request's error: botocore's RuntimeError for credentials that are
    expired when given (before any request) reached the log bare, naming no key nor fix."""
    if isinstance(exc, RuntimeError) and _STILL_EXPIRED in str(exc):
        return ExpiredCredentials(msg=str(exc))
    return exc


class _NotTwice(logging.Filter):
    """Drops botocore's own warning of credentials still expired: the failed request's line
    (naming the key and what to fix) says it, once."""

    def filter(self, record: logging.LogRecord) -> bool:
        return _STILL_EXPIRED not in record.getMessage()


logging.getLogger("botocore.credentials").addFilter(_NotTwice())


class Overdue(TimeoutError):
    """The answer still coming when the request's deadline passed (a server trickling it a
    byte at a time never trips the timeout between bytes)."""

    def __init__(self, deadline: float) -> None:
        super().__init__(f"no whole answer within the {deadline:g} s deadline")


class Refused(StoreError):
    """S3 refused the request (a 403): its credentials, or a policy that does not allow it."""


def fault_kind(exc: BaseException) -> str:
    """The kind of a failed S3 request: decides retry, and labels the error counters."""
    if isinstance(exc, ExpiredCredentials):
        return "expired"
    if isinstance(exc, bce.ClientError):
        code, status = error_code(exc), http_status(exc)
        if code in _MISSING:
            return "not_found"
        if code in _EXPIRED:
            return "expired"
        if code in (SKEWED, _ARCHIVED):
            return "other"  # a 403, but no refused credential (the message says what to fix)
        if code in REFUSED or status == 403:
            return "denied"
        if code in _THROTTLED or status in (429, 503):
            return "throttled"
        if code == "NotImplemented" or status == 501:
            # the server lacks the feature (a conditional PUT): asking again cannot help, and
            # each create-if-absent waited out the retries' backoff (3 s) before its fallback
            return "other"
        if code in _SERVER or status >= 500:
            return "server"
        return "other"
    if isinstance(exc, bce.FlexibleChecksumError):
        return "checksum"
    if isinstance(exc, bce.ReadTimeoutError | bce.ConnectTimeoutError | TimeoutError
                  | u3e.TimeoutError):
        return "timeout"
    if isinstance(exc, bce.IncompleteReadError | ShortBody) or "IncompleteRead" in str(exc):
        return "truncated"
    if isinstance(exc, bce.ConnectionError | bce.HTTPClientError | bce.ResponseStreamingError
                  | ConnectionError | u3e.HTTPError):
        return "reset"
    if isinstance(exc, OSError):  # urllib3's protocol errors are OSErrors too
        return "reset"
    return "other"


def error_code(e: bce.ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


def http_status(e: bce.ClientError) -> int:
    return int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def failure(key: str, op: str, exc: BaseException, kind: str, attempts: int, description: str,
            anonymous: bool) -> StoreError:
    """The error request ``op`` of ``key`` becomes, having failed with ``exc`` of ``kind``
    (fault_kind) after ``attempts`` tries, on the store ``description`` names (``anonymous``:
    mounted --no-sign-request). Its message is the one log line the user reads: what failed,
    why, and what to do about it."""
    if kind == "not_found" and not (op in _WRITES and error_code(exc) == "404"):
        return KeyNotFound(key)
    if isinstance(exc, bce.ClientError) and op in _CONDITIONAL_WRITES:
        if error_code(exc) == "PreconditionFailed" or http_status(exc) == 412:  # If-None-Match: *
            return WriteRefused(errno.EEXIST, f"{key}: exists already")
        if error_code(exc) == "NotImplemented" or http_status(exc) == 501:
            return WriteRefused(errno.ENOTSUP, f"{key}: S3 {op}: the server does not implement it")
    if isinstance(exc, bce.ClientError) and error_code(exc) == SKEWED:
        return StoreError(f"{key}: S3 {op} failed: {SKEWED}: {SKEW_HINT}")
    if isinstance(exc, bce.ClientError) and error_code(exc) == _ARCHIVED:
        error = exc.response.get("Error", {})
        tier = " ".join(str(error[f]) for f in ("StorageClass", "AccessTier") if error.get(f))
        return StoreError(f"{key}: S3 {op} failed: {_ARCHIVED}: the object is archived"
                          f"{f' ({tier})' if tier else ''} and cannot be read until it is "
                          "restored: restore it (aws s3api restore-object, or the console), "
                          "then read it again")
    if isinstance(exc, bce.ClientError) and error_code(exc) == "NoSuchUpload":
        return UploadGone(f"{key}: S3 {op} failed: NoSuchUpload "
                          f"{exc.response.get('Error', {}).get('Message', '')}".rstrip())
    if isinstance(exc, bce.ClientError):
        code = error_code(exc) or str(http_status(exc))
        msg = exc.response.get("Error", {}).get("Message", "")
        if not msg and code == str(http_status(exc)):
            # no error document: botocore calls it by its status, which says little alone
            # (a 404 to a write: a server or proxy that does not serve this bucket or name)
            msg = http.client.responses.get(http_status(exc), "")
        what = f"{code} {msg}".rstrip()
    else:
        what = f"{type(exc).__name__}: {exc}"
        cause = _out_of_descriptors(exc)
        if cause is not None:  # "Could not connect to the endpoint URL": no socket to connect
            what += no_descriptors_hint(cause)
    what = what.rstrip(".")  # S3's messages end in one: the line goes on after it
    code = error_code(exc) if isinstance(exc, bce.ClientError) else ""
    if kind == "denied" and code in POLICY_REFUSALS:
        # the credentials were accepted (else S3 names them: InvalidAccessKeyId...), and
        # this request is not allowed them: no new credentials are looked for
        if anonymous:
            return Refused(f"{key}: S3 {op} refused: {what}. Anonymous access "
                           f"(--no-sign-request) to it in {description} is not allowed: "
                           "it is not public")
        return Refused(
            f"{key}: S3 {op} refused: {what}. The credentials were accepted, but a policy "
            f"(the bucket's or the user's IAM policy), an ACL or a KMS key does not allow them "
            f"this request in {description}; grant it, or mount with credentials allowed it"
        )
    if kind == "denied" and code in UNSAID_REFUSAL:
        return Refused(
            f"{key}: S3 {op} refused: {what} (S3 gives this answer no reason): the credentials "
            f"were rejected, or a policy (the bucket's or the user's IAM policy) does not allow "
            f"them this request in {description}; new credentials in the AWS chain are "
            "picked up without a remount"
        )
    if isinstance(exc, ExpiredCredentials):
        return Refused(
            f"{key}: S3 {op} not sent: the AWS credential chain gives credentials for "
            f"{description} that are already expired ({what}); mend what gives them (the "
            "--profile's credential_process or SSO login, e.g. `aws sso login`, or the "
            "environment's AWS_SESSION_TOKEN) - zvfs picks up new ones without a remount"
        )
    if kind in ("denied", "expired"):
        return Refused(
            f"{key}: S3 {op} refused: {what}. The credentials were rejected for "
            f"{description}; fix them (--profile, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
            "or a credential_process that renews them) - zvfs picks up new ones without a remount"
        )
    if kind in TRANSIENT_KINDS:
        return StoreError(f"{key}: S3 {op} failed after {attempts} attempts: {what}")
    return StoreError(f"{key}: S3 {op} failed: {what}")


def too_large_behind(exc: BaseException) -> AnswerTooLarge | None:
    """The AnswerTooLarge behind ``exc``: botocore reads an answer's body inside its send,
    and wraps what that raises as an HTTPClientError (which would be retried as a reset)."""
    found = _behind(exc, lambda e: isinstance(e, AnswerTooLarge))
    return found if isinstance(found, AnswerTooLarge) else None


def _out_of_descriptors(exc: BaseException) -> OSError | None:
    """The EMFILE (or ENFILE) behind ``exc``, if that is what it comes from: botocore tells
    a socket that could not be made as an endpoint it could not connect to."""
    found = _behind(exc, lambda e: isinstance(e, OSError) and e.errno in NO_DESCRIPTORS)
    return found if isinstance(found, OSError) else None


def _behind(exc: BaseException, wanted: Callable[[BaseException], bool]) -> BaseException | None:
    """The first error ``wanted`` takes among ``exc`` and what it wraps: its cause, its
    context, the errors among its arguments, and botocore's ``kwargs["error"]``."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if wanted(e):
            return e
        todo += [e.__cause__, e.__context__, *(a for a in e.args if isinstance(a, BaseException))]
        kwargs = getattr(e, "kwargs", None)
        if isinstance(kwargs, dict) and isinstance(kwargs.get("error"), BaseException):
            todo.append(kwargs["error"])
    return None
