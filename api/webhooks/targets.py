"""Where outgoing webhooks may go: public addresses only, unless the operator names a network.

A webhook's URL is the account's to choose, and the API process sends to it from inside the
control plane's network; left open, a subscription to ``http://169.254.169.254/`` or to
``http://postgres:5432/`` would make runplane a proxy into that network. So every delivery resolves
the host itself, refuses the attempt when any of its addresses is not globally routable (loopback,
private, link-local, shared, reserved, multicast) and not inside ``webhooks.allowed_networks``, and
then connects to the address it checked, sending the original ``Host`` and TLS server name: a DNS
answer that changes between the check and the connection changes nothing.

A URL whose host is a literal address (or ``localhost``) is refused already when the subscription
is saved, so the mistake shows where it is made.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from runplane.basics.errors import InvalidArgument

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class TargetRefused(Exception):
    """A delivery's host resolves to an address webhooks may not reach."""


@dataclass(frozen=True)
class Target:
    """A checked delivery: the URL with the checked address in place of the host, and what to send."""

    url: str
    host_header: str
    server_name: str | None


NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # RFC 6052's well-known prefix: the last 32 bits are IPv4


def _plain(address: Address) -> Address:
    """An IPv6 address that carries an IPv4 address (IPv4-mapped, 6to4, NAT64's well-known prefix)
    as the IPv4 address it reaches: ``64:ff9b::7f00:1`` is loopback however it is written."""
    if not isinstance(address, ipaddress.IPv6Address):
        return address
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


class TargetPolicy:
    def __init__(self, allowed_networks: Iterable[str] = ()) -> None:
        self._allowed: tuple[Network, ...] = tuple(ipaddress.ip_network(n, strict=False) for n in allowed_networks)

    def refusal(self, address: Address) -> str | None:
        """Why ``address`` may not be reached, or None when it may."""
        address = _plain(address)
        if any(address in network for network in self._allowed if network.version == address.version):
            return None
        if address.is_global and not address.is_multicast:
            return None
        return (
            f"{address} is not a public address; webhooks go only to public addresses "
            "(webhooks.allowed_networks names exceptions)"
        )

    def check_url(self, url: str) -> None:
        """Refuse, when it is saved, a URL whose host is a literal address or ``localhost`` that may not be reached."""
        host = urlsplit(url).hostname or ""
        if host == "localhost" or host.endswith(".localhost"):
            literal: Address = ipaddress.ip_address("127.0.0.1")
        else:
            try:
                literal = ipaddress.ip_address(host)
            except ValueError:
                return  # a name: checked on every delivery, against what it resolves to then
        reason = self.refusal(literal)
        if reason is not None:
            raise InvalidArgument("client_url", reason)

    async def resolve(self, url: str) -> Target:
        """The address to connect to for ``url``, after checking every address its host has now."""
        parts = urlsplit(url)
        host = parts.hostname
        if not host:
            raise TargetRefused("the URL has no host")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise TargetRefused(f"{host} does not resolve: {exc.strerror}") from exc
        addresses = [_plain(ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])) for info in infos]
        for address in addresses:
            reason = self.refusal(address)
            if reason is not None:
                raise TargetRefused(f"{host} resolves to {reason}")
        chosen = addresses[0]
        netloc = f"[{chosen}]:{port}" if chosen.version == 6 else f"{chosen}:{port}"
        host_header = parts.netloc.rsplit("@", 1)[-1]
        server_name = host if parts.scheme == "https" else None
        return Target(urlunsplit((parts.scheme, netloc, parts.path, parts.query, "")), host_header, server_name)
