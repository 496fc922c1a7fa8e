"""The base class of runplane's gRPC server interceptors, typed.

grpc-stubs make ``grpc.aio.ServerInterceptor`` and ``grpc.RpcMethodHandler`` generic in the request and
response types, but at run time they are plain classes that cannot be subscripted: mypy sees the
subscripted base, Python the plain one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc

if TYPE_CHECKING:
    ServerInterceptor = grpc.aio.ServerInterceptor[Any, Any]
    MethodHandler = grpc.RpcMethodHandler[Any, Any]
else:
    ServerInterceptor = grpc.aio.ServerInterceptor
    MethodHandler = grpc.RpcMethodHandler
