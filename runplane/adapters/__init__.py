"""runplane's edge to the outside systems every part uses.

- ``db``: Postgres pools and the one place psycopg errors become runplane's (queries in ``runplane/sql``).
- ``bus``: RabbitMQ topology and at-least-once delivery; ``locks``: per-account Redis locks.
- ``outages``: which errors mean a dependency is down, and riding it out; ``readiness``: is it up now?
- ``telemetry`` / ``instruments`` / ``tracing``: metrics exported for Prometheus, every metric, traces.
- ``grpc_options``: channel and server options of runplane's gRPC connections.
"""
