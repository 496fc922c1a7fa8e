"""The gRPC API: accounts, tokens, jobs and runs.

- ``server``: the grpc.aio server (JobService, RunService, health checking, reflection) and its drain.
- ``auth``: bearer tokens (stored as sha256) and the account every call is scoped to.
- ``errors``: the one mapping from runplane errors to gRPC status codes.
- ``validation`` / ``paging``: what clients send, checked before anything is written.
- ``jobs`` / ``runs``: the two services; ``pickup_publisher``: the Pickup hint to dispatchers after a trigger.
- ``store`` + ``queries.sql``: every read and write of Postgres; ``convert``: rows to messages.
- ``admin``: ``runplane admin`` and the demo seed; ``client``: ``python -m api.client``.
"""
