"""Channel and server options shared by the two ends of runplane's gRPC connections.

Runners reach the runner API across networks that can drop a connection without closing it (a Pod's
NAT, a load balancer, a node's conntrack table). Without keepalive pings a call on such a connection
waits out its deadline, and every call after it, until the lease is gone; with them the client
notices within ``KEEPALIVE_TIME_MS + KEEPALIVE_TIMEOUT_MS`` and connects again.
"""

from __future__ import annotations

MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # artifacts travel whole

KEEPALIVE_TIME_MS = 5_000
KEEPALIVE_TIMEOUT_MS = 5_000

Options = list[tuple[str, int]]

# A runner's channel: pings while calls are open or not, and a reconnect soon after an outage (the
# default backoff grows to minutes, past any lease).
RUNNER_CHANNEL: Options = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    # How long any ping waits for its ack (gRPC core's default is a minute once keepalive is on).
    ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]

# The runner API's server: accepts those pings (by default it answers pings more often than every
# five minutes without data with GOAWAY, which would cut the runners' calls).
RUNNER_SERVER: Options = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", KEEPALIVE_TIME_MS // 2),
    ("grpc.http2.max_ping_strikes", 0),
]
