"""dbt Cloud's response envelope: ``{"status": {...}, "data": ..., "extra": {...}}``, for answers and errors."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, TypeVar

from fastapi.responses import JSONResponse
from pydantic import BaseModel

from runplane.basics.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    RunplaneError,
    ServiceUnavailable,
    Unauthenticated,
)

T = TypeVar("T")

# The one mapping from runplane errors to HTTP status codes (gRPC's is in api.grpc.errors).
HTTP_CODES: list[tuple[type[RunplaneError], int]] = [
    (InvalidArgument, 400),
    (Unauthenticated, 401),
    (PermissionDenied, 403),
    (NotFound, 404),
    (FailedPrecondition, 409),
    (ServiceUnavailable, 503),
]


class Status(BaseModel):
    code: int
    is_success: bool
    user_message: str
    developer_message: str


class Pagination(BaseModel):
    count: int
    total_count: int


class Extra(BaseModel):
    filters: dict[str, Any]
    order_by: str
    pagination: Pagination


class Envelope(BaseModel, Generic[T]):
    status: Status
    data: T


class ListEnvelope(BaseModel, Generic[T]):
    status: Status
    data: list[T]
    extra: Extra


class ErrorEnvelope(BaseModel):
    status: Status
    data: None


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorEnvelope} for code in (400, 401, 403, 404, 409, 503)
}


def success(code: int = 200) -> Status:
    return Status(code=code, is_success=True, user_message="Success!", developer_message="")


def http_code(exc: BaseException) -> int:
    for cls, code in HTTP_CODES:
        if isinstance(exc, cls):
            return code
    return 500


def error_response(code: int, message: str, *, headers: Mapping[str, str] | None = None) -> JSONResponse:
    body = ErrorEnvelope(
        status=Status(code=code, is_success=False, user_message=message, developer_message=""), data=None
    )
    out = dict(headers or {})
    if code == 401:
        out["WWW-Authenticate"] = "Token"
    return JSONResponse(body.model_dump(mode="json"), status_code=code, headers=out or None)
