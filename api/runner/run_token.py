"""The runner API's door check, in one place: every call carries a run token (or a pool Pod's token).

:class:`RunTokenInterceptor` wraps every RunnerService handler, as :class:`api.grpc.auth.AuthInterceptor`
wraps the public services: it reads ``authorization: Bearer <token>`` (UNAUTHENTICATED without one,
before the handler runs), makes the token's sha256 the call's (:func:`caller_token`), and runs the
handler inside the error boundary, so a handler raises runplane errors and never answers a status
itself. Whether the token is the run's and its lease the caller's is decided against the run's row,
inside the statement or transaction that uses it (``service._leased``): a check outside it could be
stale by the time the write lands.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from api.auth import bearer_token
from api.grpc.errors import status_boundary
from runplane.adapters.grpc_interceptor import MethodHandler, ServerInterceptor
from runplane.basics.errors import Unauthenticated
from runplane.basics.tokens import token_hash

_token_hash: contextvars.ContextVar[bytes] = contextvars.ContextVar("runplane_run_token_hash")

Handler = Callable[..., Awaitable[Any]]


def caller_token() -> bytes:
    """The sha256 of the token the call being served carries."""
    try:
        return _token_hash.get()
    except LookupError:
        raise Unauthenticated("no run token for this call") from None


class RunTokenInterceptor(ServerInterceptor):
    """Reads each call's token and maps what its handler raises to a status code."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[MethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> MethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        if handler.request_streaming or handler.response_streaming or handler.unary_unary is None:
            raise TypeError(f"{method}: the runner API serves unary calls only")
        return grpc.unary_unary_rpc_method_handler(
            _with_token(method, handler.unary_unary),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


def _with_token(method: str, behavior: Handler) -> Handler:
    async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        async with status_boundary(context, method):
            _token_hash.set(token_hash(bearer_token(context.invocation_metadata())))
            return await behavior(request, context)
        raise AssertionError("unreachable: the boundary aborts")

    return unary
