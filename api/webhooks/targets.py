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

from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from runplane.basics.addresses import Address, AddressPolicy, Unresolvable, literal
from runplane.basics.errors import InvalidArgument


class TargetRefused(Exception):
    """A delivery's host resolves to an address webhooks may not reach."""


@dataclass(frozen=True)
class Target:
    """A checked delivery: the URL with the checked address in place of the host, and what to send."""

    url: str
    host_header: str
    server_name: str | None


class TargetPolicy:
    """Webhooks' use of the one address rule (``runplane.basics.addresses``)."""

    def __init__(self, allowed_networks: Iterable[str] = ()) -> None:
        self._addresses = AddressPolicy(allowed_networks)

    def refusal(self, address: Address) -> str | None:
        """Why ``address`` may not be reached, or None when it may."""
        reason = self._addresses.refusal(address)
        if reason is None:
            return None
        return f"{reason}; webhooks go only to public addresses (webhooks.allowed_networks names exceptions)"

    def check_url(self, url: str) -> None:
        """Refuse, when it is saved, a URL whose host is a literal address or ``localhost`` that may not be reached."""
        named = literal(urlsplit(url).hostname or "")
        if named is None:
            return  # a name: checked on every delivery, against what it resolves to then
        reason = self.refusal(named)
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
            addresses = await self._addresses.resolve(host, port)
        except Unresolvable as exc:
            raise TargetRefused(str(exc)) from exc
        for address in addresses:
            reason = self.refusal(address)
            if reason is not None:
                raise TargetRefused(f"{host} resolves to {reason}")
        chosen = addresses[0]
        netloc = f"[{chosen}]:{port}" if chosen.version == 6 else f"{chosen}:{port}"
        host_header = parts.netloc.rsplit("@", 1)[-1]
        server_name = host if parts.scheme == "https" else None
        return Target(urlunsplit((parts.scheme, netloc, parts.path, parts.query, "")), host_header, server_name)
