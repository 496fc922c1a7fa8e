"""The one place where runplane errors become gRPC status codes.

Every RPC handler runs inside :func:`status_boundary` (installed by the interceptors in
``api.grpc.auth`` and, for the runner API, ``api.runner.run_token``): a ``RunplaneError`` aborts
the call with its code and message; anything else is a bug, logged with its traceback and answered
INTERNAL, and the server keeps serving.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

import grpc

from runplane.basics.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    RunplaneError,
    ServiceUnavailable,
    Unauthenticated,
)

log = logging.getLogger(__name__)

_CODES: list[tuple[type[RunplaneError], grpc.StatusCode]] = [
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (ServiceUnavailable, grpc.StatusCode.UNAVAILABLE),
]


# Status details travel in a trailer: a long one fails the whole call (RESOURCE_EXHAUSTED on the
# client). Messages quote at most a short start of what was sent; this bound backs that up.
MAX_DETAILS = 1000


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and message a client sees for ``exc``."""
    for cls, code in _CODES:
        if isinstance(exc, cls):
            message = str(exc)
            return code, message if len(message) <= MAX_DETAILS else message[: MAX_DETAILS - 1] + "…"
    return grpc.StatusCode.INTERNAL, "internal error"


@contextlib.asynccontextmanager
async def status_boundary(context: grpc.aio.ServicerContext[object, object], method: str) -> AsyncIterator[None]:
    """Turn what the handler raises into a gRPC status (an abort of ``context``)."""
    try:
        yield
    except grpc.aio.AbortError:
        raise  # already a status
    except Exception as exc:
        code, message = status_of(exc)
        if code is grpc.StatusCode.INTERNAL:
            log.exception("unexpected error in %s", method, extra={"method": method})
        elif code is grpc.StatusCode.UNAVAILABLE:
            log.warning("%s: %s", method, exc, extra={"method": method})
        await context.abort(code, message)
