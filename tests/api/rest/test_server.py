"""The HTTP server of the REST API and the web pages: kept-alive connections are not slowed by Nagle."""

from __future__ import annotations

import socket

import httpx

from api.rest.server import RestServer


async def test_connections_are_served_with_tcp_nodelay(rest_server: RestServer) -> None:
    """Without TCP_NODELAY every answer on a kept-alive connection waited for the client's delayed ACK."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{rest_server.port}") as http:
        for _ in range(2):  # the second request reuses the connection
            assert (await http.get("/ui/login")).status_code == 200
        connections = list(rest_server.server.server_state.connections)
        assert connections
        for protocol in connections:
            sock = protocol.transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
