"""The public gRPC API and the API process's root.

- ``server``: starts the API process's servers (gRPC, runner API, REST) and the webhook deliveries,
  and drains them on stop.
- ``jobs`` / ``projects`` / ``runs``: JobService, ProjectService and RunService.
- ``errors``: the one mapping from runplane errors to gRPC status codes.
- ``paging``: keyset paging with opaque page tokens; ``convert``: rows to protobuf messages.
"""
