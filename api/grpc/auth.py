"""Token authentication of the public gRPC services and the account every call is scoped to.

The interceptor wraps every handler of the runplane services: it resolves ``authorization: Bearer
<token>`` to an account, makes that account the call's scope (:func:`current_account`) and runs the
handler inside the error boundary. Health checking and reflection stay open so probes and tools
need no token.
"""

from __future__ import annotations

import contextvars
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractContextManager as ContextManager
from typing import Protocol, cast

import grpc
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind

from api.auth import bearer_token
from api.grpc.errors import status_boundary
from api.scopes import TokenGrant, check_scope
from runplane.adapters import tracing
from runplane.adapters.grpc_interceptor import MethodHandler, ServerInterceptor
from runplane.basics.errors import InvalidArgument, Unauthenticated
from runplane.basics.tokens import token_hash
from runplane.basics.types import AccountId

# Services that answer without a token.
OPEN_SERVICES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)
_tracer = trace.get_tracer(__name__)

_account: contextvars.ContextVar[AccountId] = contextvars.ContextVar("runplane_account")
_who: contextvars.ContextVar[str] = contextvars.ContextVar("runplane_who", default="")


def current_account() -> AccountId:
    """The account of the call being served."""
    try:
        return _account.get()
    except LookupError:
        raise Unauthenticated("no account for this call") from None


def current_caller() -> str:
    """Who makes the call being served, in words (the token), for the notes a change keeps."""
    return _who.get()


class TokenLookup(Protocol):
    async def account_for_token(self, token_hash: bytes) -> TokenGrant | None: ...


class AuthInterceptor(ServerInterceptor):
    """Authenticates each call and maps its errors to status codes."""

    def __init__(self, tokens: TokenLookup) -> None:
        self._tokens = tokens

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[MethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> MethodHandler:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(OPEN_SERVICES):
            return handler
        if handler.request_streaming:
            raise TypeError(f"{method}: client-streaming methods are not served")
        deserializer = _tolerant(handler.request_deserializer)
        if handler.response_streaming:
            assert handler.unary_stream is not None
            return grpc.unary_stream_rpc_method_handler(
                # grpc-stubs type a handler as the sync API's (an Iterator); grpc.aio's is an async generator.
                self._wrap_stream(method, cast("Callable[..., AsyncIterator[object]]", handler.unary_stream)),
                request_deserializer=deserializer,
                response_serializer=handler.response_serializer,
            )
        assert handler.unary_unary is not None
        return grpc.unary_unary_rpc_method_handler(
            self._wrap_unary(method, handler.unary_unary),
            request_deserializer=deserializer,
            response_serializer=handler.response_serializer,
        )

    async def _authenticate(self, context: grpc.aio.ServicerContext[object, object], method: str) -> AccountId:
        token = bearer_token(context.invocation_metadata())
        grant = await self._tokens.account_for_token(token_hash(token))
        if grant is None:
            raise Unauthenticated("unknown, expired or revoked token")
        check_scope(grant, method)
        _who.set(grant.who)
        return grant.account_id

    def _wrap_unary(self, method: str, behavior: Callable[..., Awaitable[object]]) -> Callable[..., Awaitable[object]]:
        async def unary(request: object, context: grpc.aio.ServicerContext[object, object]) -> object:
            with _server_span(method, context):
                async with status_boundary(context, method):
                    _account.set(await self._authenticate(context, method))
                    _check_decoded(request)
                    return await behavior(request, context)
            raise AssertionError("unreachable: the boundary aborts")

        return unary

    def _wrap_stream(
        self, method: str, behavior: Callable[..., AsyncIterator[object]]
    ) -> Callable[..., AsyncIterator[object]]:
        async def stream(request: object, context: grpc.aio.ServicerContext[object, object]) -> AsyncIterator[object]:
            with _server_span(method, context):
                async with status_boundary(context, method):
                    _account.set(await self._authenticate(context, method))
                    _check_decoded(request)
                    async for item in behavior(request, context):
                        yield item

        return stream


class _Malformed:
    """What a request that does not decode becomes, so the handler's boundary answers INVALID_ARGUMENT
    (grpc answers UNKNOWN for a deserializer that raises)."""

    def __init__(self, error: str) -> None:
        self.error = error


def _tolerant(deserialize: Callable[[bytes], object] | None) -> Callable[[bytes], object] | None:
    if deserialize is None:
        return None

    def tolerant(data: bytes) -> object:
        try:
            return deserialize(data)
        except Exception as exc:  # DecodeError and whatever else bad bytes make a parser raise
            return _Malformed(type(exc).__name__)

    return tolerant


def _check_decoded(request: object) -> None:
    if isinstance(request, _Malformed):
        raise InvalidArgument("request", f"malformed request: the body does not decode ({request.error})")


def _server_span(method: str, context: grpc.aio.ServicerContext[object, object]) -> ContextManager[Span]:
    """A server span per call, continuing the caller's trace when its metadata carries one."""
    metadata = {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
    return _tracer.start_as_current_span(
        method.rsplit("/", 1)[-1], context=tracing.extract(metadata), kind=SpanKind.SERVER,
        attributes={"rpc.system": "grpc", "rpc.method": method},
    )  # fmt: skip
