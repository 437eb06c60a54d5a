"""botocore's failures as one-line BackendErrors, and retry accounting.

Retries are botocore's (``standard`` mode); two event hooks count every attempt, and every
retried one by reason (throttle, server, connection, other), into the process's counters
(:meth:`S3Backend.stats`, recorded per rank).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from ckptbench.errors import BackendError
from ckptbench.redact import public_url

THROTTLE = {"SlowDown", "Throttling", "ThrottlingException", "RequestThrottled",
            "RequestThrottledException", "TooManyRequestsException", "RequestLimitExceeded",
            "ProvisionedThroughputExceededException", "BandwidthLimitExceeded"}
CHAIN = ("credentials from boto3's standard chain (AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY, "
         "AWS_PROFILE, ~/.aws/credentials, an instance or container role)")
ENDPOINT_HINT = "a reachable endpoint from --endpoint-url or AWS_ENDPOINT_URL_S3"
NATIVE_HINT = "a reachable endpoint, the standard credential chain, an existing bucket"
NOT_LOAD = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken",
            "ExpiredToken", "NoSuchBucket", "NoSuchKey", "InvalidBucketName", "NoSuchUpload"}


def native_allowed(code: str | None, status: int | None, limits: str) -> str:
    """The `allowed:` of a crt or obstore failure (after the engine's own retries): the
    options that size the load first, unless the endpoint said no for another reason
    (credentials, a missing bucket or key: a 4xx other than 429)."""
    if code in NOT_LOAD or (status is not None and 400 <= status < 500 and status != 429):
        return NATIVE_HINT
    return f"{limits} (an endpoint overloaded), or {NATIVE_HINT}"


def public_endpoint(url: str | None) -> str | None:
    """The endpoint without user:password@ (never recorded, even if someone put it there)."""
    return public_url(url) if url else url


def translate(exc: BaseException, where: str, endpoint: str, bucket: str,
              action: str, read_timeout: float, limits: str = "") -> BackendError:
    """One line for the usual ways S3 says no (never a key, never a traceback); `where`
    is 'target: action', `endpoint` already public. `limits`: the options that size the
    load (named when the endpoint gave up under it: throttling, connections lost)."""
    from botocore.exceptions import (
        ClientError,
        ConnectTimeoutError,
        EndpointConnectionError,
        NoCredentialsError,
        PartialCredentialsError,
        ReadTimeoutError,
    )

    if isinstance(exc, BackendError):
        return exc
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        code = str(err.get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken",
                    "ExpiredToken", "InvalidClientTokenId"):
            what = {"InvalidAccessKeyId": "the access key is not known to the endpoint",
                    "SignatureDoesNotMatch": "the secret key does not match the access key"
                    }.get(code, "the session token is not valid")
            return BackendError(f"{where}: wrong credentials ({code}: {what}); allowed: {CHAIN}")
        if code in ("AccessDenied", "403", "Forbidden", "AllAccessDisabled"):
            return BackendError(f"{where}: access denied ({code}); allowed: credentials that may "
                                f"list, read, write and delete under the prefix, from {CHAIN}")
        if code in ("NoSuchBucket",) or (code == "404" and action.startswith("check")):
            return BackendError(f"{where}: bucket {bucket!r} does not exist at {endpoint}; "
                                "allowed: an existing bucket: add --create-bucket to make it "
                                f"(kept afterwards), or `aws s3 mb s3://{bucket}` / "
                                f"`mc mb ALIAS/{bucket}`")
        if code in THROTTLE or status == 429:
            return BackendError(f"{where}: the endpoint kept throttling ({code or status}) on "
                                f"every attempt; allowed: fewer ranks/threads"
                                + (f", {limits}" if limits else ""))
        if status and status >= 500:  # e.g. 503 RequestTimeout: a body that stopped moving
            return BackendError(f"{where}: server error {status} {code} on every attempt at "
                                f"{endpoint}" + (f"; allowed: {limits}" if limits else ""))
        message = str(err.get("Message", ""))[:200]
        return BackendError(f"{where}: {code or status}: {message}".rstrip(": "))
    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return BackendError(f"{where}: no usable credentials found; allowed: {CHAIN}")
    if isinstance(exc, EndpointConnectionError | ConnectTimeoutError):
        return BackendError(f"{where}: cannot reach the endpoint {endpoint} "
                            f"({type(exc).__name__}); allowed: {ENDPOINT_HINT}")
    if isinstance(exc, ReadTimeoutError):
        return BackendError(f"{where}: the endpoint {endpoint} did not answer within "
                            f"{read_timeout} s")
    name = type(exc).__name__
    if is_connection_error(exc):
        return BackendError(f"{where}: connection to {endpoint} lost ({name}) on every "
                            "attempt (an endpoint overloaded, or one that went away)"
                            + (f"; allowed: {limits}" if limits else ""))
    return BackendError(f"{where}: {name}: {str(exc)[:200]}")


def is_boto_error(exc: BaseException) -> bool:
    mod = type(exc).__module__
    return mod.startswith(("botocore", "urllib3", "boto3", "http.client"))


def is_connection_error(exc: BaseException) -> bool:
    import http.client

    from botocore.exceptions import ConnectionError as BotoConnectionError
    from botocore.exceptions import HTTPClientError, ResponseStreamingError

    if isinstance(exc, BotoConnectionError | HTTPClientError | ResponseStreamingError
                  | http.client.HTTPException | ConnectionError | TimeoutError):
        return True
    return type(exc).__module__.startswith("urllib3")


def backoff(attempt: int) -> None:
    """Full-jitter exponential backoff before retry `attempt` + 1 (as botocore's standard)."""
    time.sleep(min(20.0, random.random() * (2 ** (attempt - 1))))


# --- retry accounting (botocore events) ---
def note_retry_reason(response: Any = None, caught_exception: Any = None,
                      request_dict: Any = None, **_: Any) -> None:
    """needs-retry: remember why this attempt failed; the next attempt (if any) counts it."""
    if request_dict is None:
        return
    reason = None
    if caught_exception is not None:
        reason = "connection" if is_connection_error(caught_exception) else "other"
    elif response is not None:
        http, parsed = response
        code = (parsed or {}).get("Error", {}).get("Code", "")
        status = getattr(http, "status_code", 0)
        if code in THROTTLE or status == 429:
            reason = "throttle"
        elif status >= 500:
            reason = "server"
        elif status >= 400:
            reason = "other"
    request_dict.setdefault("context", {})["ckptbench_retry"] = reason


def count_attempt(count: Callable[..., None], request: Any) -> str | None:
    """request-created: once per attempt; attempt > 1 is a retry (counted by reason).
    Returns the reason of a retry (None for a first attempt)."""
    context = getattr(request, "context", {}) or {}
    attempt = context.get("retries", {}).get("attempt", 1)
    if attempt <= 1:
        count("requests")
        return None
    reason = str(context.get("ckptbench_retry") or "other")
    count("retries", f"retries_{reason}")
    return reason
