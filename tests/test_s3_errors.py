"""Unit tests of zvfs.stores.s3_errors: how a failed S3 request is sorted (retried or not)
and worded. The codes and statuses are S3's documented error responses; the real requests
behind them are exercised through moto and the fault proxy in test_faults and
test_hostile_s3. Here each case is an exception as botocore raises it."""

from __future__ import annotations

import errno
import http.client

import botocore.exceptions as bce
import pytest
import urllib3.exceptions as u3e

from zvfs.stores.base import KeyNotFound, StoreError, WriteRefused
from zvfs.stores.retry import TRANSIENT_KINDS
from zvfs.stores.s3_errors import (
    ExpiredCredentials,
    Overdue,
    Refused,
    ShortBody,
    failure,
    fault_kind,
    request_error,
    too_large_behind,
)
from zvfs.stores.watchdog import AnswerTooLarge


def client_error(code: str, status: int, message: str = "", **extra: str) -> bce.ClientError:
    """The error botocore raises for an answer of ``status`` with an error document; with no
    ``code``, for one without (a HEAD's, or a server's that sends none): botocore then names
    the error by its status and the status's reason."""
    if not code:
        code, message = str(status), http.client.responses[status]
    error = {"Code": code, "Message": message, **extra}
    return bce.ClientError({"Error": error, "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject")


@pytest.mark.parametrize(("exc", "kind"), [
    (client_error("NoSuchKey", 404), "not_found"),
    (client_error("", 404), "not_found"),  # a HEAD's 404: no error document
    (client_error("ExpiredToken", 400), "expired"),
    (client_error("AccessDenied", 403), "denied"),
    (client_error("", 403), "denied"),
    (client_error("RequestTimeTooSkewed", 403), "other"),  # a clock, not a credential
    (client_error("InvalidObjectState", 403), "other"),  # archived: restore it first
    (client_error("SlowDown", 503), "throttled"),
    (client_error("", 429), "throttled"),
    (client_error("NotImplemented", 501), "other"),  # asking again cannot help
    (client_error("InternalError", 500), "server"),
    (client_error("", 502), "server"),
    (client_error("InvalidArgument", 400), "other"),
    (bce.ReadTimeoutError(endpoint_url="http://127.0.0.1:1"), "timeout"),
    (Overdue(10.0), "timeout"),
    (ShortBody("body ended after 3 of 10 bytes"), "truncated"),
    (bce.EndpointConnectionError(endpoint_url="http://127.0.0.1:1"), "reset"),
    (u3e.ProtocolError("Connection aborted."), "reset"),
    (ConnectionResetError(104, "reset by peer"), "reset"),
    (ExpiredCredentials(msg="refreshed credentials are still expired"), "expired"),
    (ValueError("not a request's error"), "other"),
])
def test_fault_kind(exc: BaseException, kind: str) -> None:
    assert fault_kind(exc) == kind


def test_only_transient_kinds_are_retried() -> None:
    """What the retry loop tries again: faults of the moment, never a refusal or a miss."""
    assert {"throttled", "server", "timeout", "truncated", "reset"} <= set(TRANSIENT_KINDS)
    assert not {"not_found", "denied", "expired", "other"} & set(TRANSIENT_KINDS)


def fail(exc: BaseException, op: str = "GetObject", anonymous: bool = False, attempts: int = 5) -> StoreError:
    return failure("a/b", op, exc, fault_kind(exc), attempts, "s3://bucket/prefix", anonymous)


def test_a_missing_key_is_enoent_but_a_404_to_a_write_is_not() -> None:
    assert isinstance(fail(client_error("NoSuchKey", 404)), KeyNotFound)
    # a write answered 404 with no error document: a server that does not serve this name
    error = fail(client_error("", 404), op="PutObject")
    assert not isinstance(error, KeyNotFound) and "404 Not Found" in str(error)


def test_a_refused_condition_is_eexist_and_an_unimplemented_one_enotsup() -> None:
    exists = fail(client_error("PreconditionFailed", 412), op="PutObject")
    assert isinstance(exists, WriteRefused) and exists.errno == errno.EEXIST
    unsupported = fail(client_error("NotImplemented", 501), op="CompleteMultipartUpload")
    assert isinstance(unsupported, WriteRefused) and unsupported.errno == errno.ENOTSUP


@pytest.mark.parametrize(("exc", "anonymous", "says"), [
    (client_error("AccessDenied", 403, "Access Denied."), False, "a policy"),
    (client_error("AccessDenied", 403), True, "--no-sign-request"),
    (client_error("InvalidAccessKeyId", 403, "The key is not known."), False, "fix them (--profile"),
    (client_error("", 403), False, "S3 gives this answer no reason"),
    (ExpiredCredentials(msg="refreshed credentials are still expired"), False, "aws sso login"),
])
def test_refusals_say_what_to_fix(exc: BaseException, anonymous: bool, says: str) -> None:
    error = fail(exc, anonymous=anonymous)
    assert isinstance(error, Refused) and says in str(error) and str(error).startswith("a/b: S3 GetObject")
    assert "s3://bucket/prefix" in str(error)


def test_the_clock_and_an_archived_object_are_named() -> None:
    skewed = fail(client_error("RequestTimeTooSkewed", 403))
    assert not isinstance(skewed, Refused) and "set the clock" in str(skewed)
    archived = fail(client_error("InvalidObjectState", 403, StorageClass="GLACIER"))
    assert "archived (GLACIER)" in str(archived) and "restore-object" in str(archived)


def test_a_transient_failure_counts_its_attempts_and_ends_one_line() -> None:
    error = fail(client_error("SlowDown", 503, "Please reduce your request rate."), attempts=7)
    assert str(error) == "a/b: S3 GetObject failed after 7 attempts: SlowDown Please reduce your request rate"
    assert "\n" not in str(fail(ShortBody("body ended after 3 of 10 bytes")))


def test_out_of_descriptors_is_named_behind_botocore() -> None:
    """botocore tells a socket that could not be made (EMFILE) as an endpoint it could not
    connect to: the line says what it is."""
    cause = OSError(errno.EMFILE, "Too many open files")
    exc = bce.EndpointConnectionError(endpoint_url="http://127.0.0.1:1", error=cause)
    error = str(fail(exc))
    assert error.startswith("a/b: S3 GetObject failed after 5 attempts: EndpointConnectionError")
    assert "open-file limit" in error and "ulimit -Hn" in error
    assert "open-file limit" not in str(fail(bce.EndpointConnectionError(endpoint_url="http://127.0.0.1:1")))


def test_an_answer_too_large_is_found_behind_botocore_and_credentials_errors_are_named() -> None:
    too_large = AnswerTooLarge("an answer of 64 MiB")
    try:
        try:
            raise too_large
        except AnswerTooLarge as inner:
            raise bce.HTTPClientError(error=inner) from inner
    except bce.HTTPClientError as wrapped:
        assert too_large_behind(wrapped) is too_large
    assert too_large_behind(ValueError("x")) is None
    assert isinstance(request_error(RuntimeError("Credentials were refreshed, but the refreshed credentials are still expired.")),
                      ExpiredCredentials)
    plain = RuntimeError("something else")
    assert request_error(plain) is plain
