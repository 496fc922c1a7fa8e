"""What one token may ask of the runner API at once and per second, so no run starves the others.

The runner API shares its process (event loop, database pool) with the public APIs, and a run's
steps can reach it with whatever they find of their run. :class:`CallLimitInterceptor` therefore
counts every call by the token it carries (the sha256 of its bearer, before any database is read):
at most ``in_flight`` calls of one token are served at once, and calls are taken from a token bucket
that refills ``per_second`` and holds ``burst``. A call over either is answered RESOURCE_EXHAUSTED
at once, without waiting and without touching Postgres; the runner's client retries those within its
lease like an outage.

A run's lease calls (``RenewLease``, ``ReadCancel``, and a pool Pod's ``WaitForRun``) count apart
from its writes, with limits of their own: a run that floods the API with its log or artifact calls
can exhaust its writes, never its own heartbeat. A call without a token is left to the door check
(``api.runner.run_token``), which refuses it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from api.auth import bearer_token
from runplane.adapters.grpc_interceptor import MethodHandler, ServerInterceptor
from runplane.basics.errors import Unauthenticated
from runplane.basics.settings import RunnerApiLimits
from runplane.basics.tokens import token_hash

Handler = Callable[..., Awaitable[Any]]

LEASE_METHODS = frozenset({"RenewLease", "ReadCancel", "WaitForRun"})
MAX_TRACKED = 100_000  # budgets kept at most; idle full ones are forgotten first


@dataclass
class _Budget:
    in_flight: int
    tokens: float
    refilled_at: float


@dataclass(frozen=True)
class _Rule:
    in_flight: int
    per_second: float
    burst: int


class CallBudgets:
    """Per token and kind of call (lease or write): calls in flight and a token bucket."""

    def __init__(self, limits: RunnerApiLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self._rules = {
            True: _Rule(limits.lease_calls_in_flight, limits.lease_calls_per_second, limits.lease_calls_burst),
            False: _Rule(limits.calls_in_flight, limits.calls_per_second, limits.calls_burst),
        }
        self._clock = clock
        self._budgets: dict[tuple[bytes, bool], _Budget] = {}

    def take(self, token: bytes, lease: bool) -> str:
        """Take one call from the budget; "" when it may go on, else why not (then nothing is taken)."""
        rule = self._rules[lease]
        now = self._clock()
        key = (token, lease)
        budget = self._budgets.get(key)
        if budget is None:
            if len(self._budgets) >= MAX_TRACKED:
                self._forget_idle(now)
            budget = self._budgets[key] = _Budget(0, float(rule.burst), now)
        budget.tokens = min(float(rule.burst), budget.tokens + (now - budget.refilled_at) * rule.per_second)
        budget.refilled_at = now
        if budget.in_flight >= rule.in_flight:
            return f"more than {rule.in_flight} calls of this token at once"
        if budget.tokens < 1.0:
            return f"more than {rule.per_second:g} calls a second of this token"
        budget.tokens -= 1.0
        budget.in_flight += 1
        return ""

    def exhausted(self, token: bytes, lease: bool) -> bool:
        """Whether a call of ``token`` would be refused now (nothing is taken)."""
        budget = self._budgets.get((token, lease))
        if budget is None:
            return False
        rule = self._rules[lease]
        tokens = budget.tokens + (self._clock() - budget.refilled_at) * rule.per_second
        return budget.in_flight >= rule.in_flight or tokens < 1.0

    def release(self, token: bytes, lease: bool) -> None:
        budget = self._budgets.get((token, lease))
        if budget is not None:
            budget.in_flight -= 1

    def _forget_idle(self, now: float) -> None:
        """Drop the budgets of tokens with nothing in flight whose bucket has refilled: they start full again."""
        for key, budget in list(self._budgets.items()):
            rule = self._rules[key[1]]
            refilled = budget.tokens + (now - budget.refilled_at) * rule.per_second >= rule.burst
            if budget.in_flight == 0 and refilled:
                del self._budgets[key]


class CallLimitInterceptor(ServerInterceptor):
    """Refuses a token's calls beyond its budget (RESOURCE_EXHAUSTED) before they are served."""

    def __init__(self, limits: RunnerApiLimits) -> None:
        self._budgets = CallBudgets(limits)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[MethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> MethodHandler:
        method = handler_call_details.method
        lease = method.rsplit("/", 1)[-1] in LEASE_METHODS
        token = _token_of(handler_call_details.invocation_metadata)
        if token is not None and self._budgets.exhausted(token, lease):
            # Refused before the call reaches the door check or its request is parsed: a flood
            # costs as little as it can. (Every method of the runner API is unary.)
            return grpc.unary_unary_rpc_method_handler(_refuse, request_deserializer=_unparsed)
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler  # the door check refuses what is not a unary call
        return grpc.unary_unary_rpc_method_handler(
            self._limited(handler.unary_unary, lease),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _limited(self, behavior: Handler, lease: bool) -> Handler:
        budgets = self._budgets

        async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            token = _token_of(context.invocation_metadata())
            if token is None:
                return await behavior(request, context)  # refused there, with its reason
            refusal = budgets.take(token, lease)
            if refusal:
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refusal)
            try:
                return await behavior(request, context)
            finally:
                budgets.release(token, lease)

        return unary


def _token_of(metadata: Any) -> bytes | None:
    try:
        return token_hash(bearer_token(metadata))
    except Unauthenticated:
        return None


def _unparsed(data: bytes) -> bytes:
    return data


async def _refuse(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> None:
    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "over this token's budget of calls")
