"""Which addresses a URL an account chooses may reach: public ones, unless the operator names a network.

The one home of that rule for every part that connects where an account says: webhook deliveries
(``api.webhooks.targets``) and clones of a project's repository (``runplane.basics.repository_urls``).
An address is refused when it is not globally routable (loopback, private, link-local, shared,
reserved, multicast) and not inside one of the operator's networks; an IPv6 address that carries an
IPv4 one is judged as the IPv4 address it reaches.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # RFC 6052's well-known prefix: the last 32 bits are IPv4
LOOPBACK = ipaddress.IPv4Address("127.0.0.1")


class Unresolvable(Exception):
    """A host name that does not resolve (now)."""


def plain(address: Address) -> Address:
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


def literal(host: str) -> Address | None:
    """The address a host names without asking DNS: an IP literal, or loopback for ``localhost`` and
    its subdomains (RFC 6761); None for any other name."""
    host = host.strip("[]").lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return LOOPBACK
    try:
        return plain(ipaddress.ip_address(host.split("%", 1)[0]))
    except ValueError:
        return None


class AddressPolicy:
    """Public addresses, and those inside ``allowed_networks`` (CIDR)."""

    def __init__(self, allowed_networks: Iterable[str] = ()) -> None:
        self._allowed: tuple[Network, ...] = tuple(ipaddress.ip_network(n, strict=False) for n in allowed_networks)

    def refusal(self, address: Address) -> str | None:
        """Why ``address`` may not be reached (``"… is not a public address"``), or None when it may."""
        address = plain(address)
        if any(address in network for network in self._allowed if network.version == address.version):
            return None
        if address.is_global and not address.is_multicast:
            return None
        return f"{address} is not a public address"

    async def resolve(self, host: str, port: int) -> list[Address]:
        """Every address ``host`` has now (a literal without asking DNS), first the one to connect to.

        Raises :class:`Unresolvable` when it has none; the caller checks each with :meth:`refusal`.
        """
        named = literal(host)
        if named is not None:
            return [named]
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as exc:
            raise Unresolvable(f"{host} does not resolve: {getattr(exc, 'strerror', None) or exc}") from exc
        return [plain(ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])) for info in infos]
