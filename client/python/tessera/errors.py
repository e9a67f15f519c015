"""Exceptions raised by the Tessera client, one per gRPC status code.

Every exception carries the server's message (``str(e)`` and ``e.message``) and the gRPC
code (``e.code``). Example::

    try:
        client.tensor("no-such-handle").numpy()
    except tessera.NotFound as e:
        print(e.message)
"""
from __future__ import annotations

from typing import Optional

import grpc


class TesseraError(Exception):
    """Base class of every error the client raises."""

    code: Optional[grpc.StatusCode] = None

    def __init__(self, message: str, code: Optional[grpc.StatusCode] = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class InvalidArgument(TesseraError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(TesseraError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(TesseraError):
    code = grpc.StatusCode.ALREADY_EXISTS


class QuotaExceeded(TesseraError):
    """RESOURCE_EXHAUSTED: a memory quota, queue depth, kernel count, or the tenant's calls in
    flight or per second; the message names the numbers the server sent. ``retry_after`` is
    the server's hint in seconds (its ``grpc-retry-pushback-ms`` trailer) when it sent one,
    else ``None``::

        try:
            client.run("add", a, b)
        except tessera.QuotaExceeded as e:
            time.sleep(e.retry_after or 0.1)
    """

    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    retry_after: Optional[float] = None


class FailedPrecondition(TesseraError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Unauthenticated(TesseraError):
    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(TesseraError):
    code = grpc.StatusCode.PERMISSION_DENIED


class Unavailable(TesseraError):
    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(TesseraError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Cancelled(TesseraError):
    code = grpc.StatusCode.CANCELLED


class Internal(TesseraError):
    code = grpc.StatusCode.INTERNAL


class DataLoss(TesseraError):
    code = grpc.StatusCode.DATA_LOSS


class JobFailed(TesseraError):
    """A job ended JOB_STATE_FAILED. ``step`` is the failing program step when the server
    names one (``None`` otherwise), ``job_id`` the job and ``message`` the server's text."""

    def __init__(self, message: str, job_id: str = "", step: Optional[int] = None,
                 code: Optional[grpc.StatusCode] = None) -> None:
        super().__init__(message, code)
        self.job_id = job_id
        self.step = step


_BY_CODE = {cls.code: cls for cls in (
    InvalidArgument, NotFound, AlreadyExists, QuotaExceeded, FailedPrecondition,
    Unauthenticated, PermissionDenied, Unavailable, DeadlineExceeded, Cancelled, Internal,
    DataLoss)}


def from_code(code: grpc.StatusCode, message: str) -> TesseraError:
    """The exception for a gRPC status code (TesseraError for codes without a class)."""
    cls = _BY_CODE.get(code)
    if cls is None:
        return TesseraError(message, code)
    return cls(message)


def from_rpc_error(error: grpc.RpcError) -> TesseraError:
    """Converts a grpc.RpcError into the matching TesseraError."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else str(error)
    converted = from_code(code, details or str(code))
    if isinstance(converted, QuotaExceeded) and hasattr(error, "trailing_metadata"):
        for key, value in error.trailing_metadata() or ():
            if key == "grpc-retry-pushback-ms":
                try:
                    converted.retry_after = int(value) / 1000.0
                except ValueError:
                    pass
    return converted
