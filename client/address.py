"""Where the client finds the API: the variables the server reads for where it listens.

The client is installed and run apart from the server, so it reads them itself rather than importing
the server's settings; the defaults are the server's.
"""

from __future__ import annotations

import os

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 50051
DEFAULT_REST_PORT = 8000


def grpc_target() -> str:
    """``host:port`` of the gRPC API (``RUNPLANE_API__HOST``, ``RUNPLANE_API__PORT``)."""
    return f"{_host()}:{os.environ.get('RUNPLANE_API__PORT', DEFAULT_PORT)}"


def rest_url() -> str:
    """The REST API's base URL: ``RUNPLANE_REST_URL``, else ``http://HOST:RUNPLANE_API__REST_PORT``."""
    default = f"http://{_host()}:{os.environ.get('RUNPLANE_API__REST_PORT', DEFAULT_REST_PORT)}"
    return os.environ.get("RUNPLANE_REST_URL", default).rstrip("/")


def _host() -> str:
    return os.environ.get("RUNPLANE_API__HOST", DEFAULT_HOST)
