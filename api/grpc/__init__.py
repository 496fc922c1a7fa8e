"""The public gRPC API.

- ``server``: the server with its services, health checking and reflection.
- ``auth``: the interceptor: a token per call, resolved to the account the call is scoped to.
- ``jobs`` / ``projects`` / ``runs`` / ``notifications``: JobService, ProjectService, RunService and
  NotificationService.
- ``errors``: the one mapping from runplane errors to gRPC status codes.
- ``paging``: keyset paging with opaque page tokens; ``convert``: rows to protobuf messages.
"""
