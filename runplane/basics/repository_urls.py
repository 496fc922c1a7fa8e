"""Which git repositories a project may name: the one rule for every door that saves a project, for
``runplane migrate`` (the projects stored before the rule), and for the runner host, which applies it
again just before each clone.

The repository is cloned by the runner host's own processes (root's, when runs have uids of their
own), so a URL an account chooses must not make them read what the account could not:

- remote transports only: ``https://``, ``ssh://`` and scp-like ``user@host:path``; ``git://`` and
  ``http://`` only when the operator allows them (``repositories.plain_schemes``);
- a host whose addresses are public, or inside ``repositories.allowed_networks``: the address rule
  webhooks use (``runplane.basics.addresses``), so no project reaches the host's loopback ports or
  its private network. A literal address or ``localhost`` is judged from the URL alone; a name is
  resolved when the project is saved and again when the clone connects;
- a local repository (an absolute path or ``file://``) only inside ``repositories.local_roots``,
  judged on the path with its symbolic links and ``..`` resolved.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

from runplane.basics.addresses import Address, AddressPolicy, Unresolvable, literal
from runplane.basics.errors import RunplaneError
from runplane.basics.settings import RepositorySettings

MAX_URL = 2048
_SCP_LIKE = re.compile(r"(?P<user>[A-Za-z0-9._-]+)@(?P<host>[A-Za-z0-9.-]+):(?P<path>[^\s]+)")
_DEFAULT_PORTS = {"https": 443, "http": 80, "ssh": 22, "git": 9418}
_ALWAYS = ("https", "ssh")
_PLAIN = ("git", "http")


class RepositoryUrlRefused(RunplaneError):
    """A repository URL the rule refuses; the message says why, in words for the account."""


@dataclass(frozen=True)
class RepositoryLocation:
    """A checked repository URL: how git reaches it."""

    url: str  # as the project names it
    scheme: str  # https, ssh (scp-like too), git, http or file (an absolute path too)
    host: str  # empty for a local repository
    port: int  # 0 for a local repository
    path: str  # a local repository's resolved path; the remote path otherwise

    @property
    def local(self) -> bool:
        return self.scheme == "file"


@dataclass(frozen=True)
class ReachableRepository:
    """A repository URL checked against what its host resolves to now."""

    location: RepositoryLocation
    addresses: tuple[Address, ...]  # empty: a local repository, or a name that does not resolve now


class RepositoryRule:
    """The rule, with the operator's exceptions (``repositories`` settings)."""

    def __init__(self, settings: RepositorySettings) -> None:
        self._settings = settings
        self._addresses = AddressPolicy(settings.allowed_networks)
        self._roots = tuple(Path(os.path.realpath(root)) for root in settings.local_roots if root.strip())

    def check(self, url: str) -> RepositoryLocation:
        """Everything the URL alone decides: its form, its scheme, a local path's root, a literal host."""
        location = self._location(url)
        if location.local:
            self._check_local(location)
        else:
            named = literal(location.host)
            if named is not None:
                self._check_address(location, named)
        return location

    async def reachable(self, url: str) -> ReachableRepository:
        """:meth:`check`, then every address the host resolves to now. A name that does not resolve
        passes: nothing can be reached through it, and git says so when it clones."""
        location = self.check(url)
        if location.local:
            return ReachableRepository(location, ())
        try:
            addresses = await self._addresses.resolve(location.host, location.port)
        except Unresolvable:
            return ReachableRepository(location, ())
        for address in addresses:
            self._check_address(location, address)
        return ReachableRepository(location, tuple(addresses))

    def _location(self, url: str) -> RepositoryLocation:
        if not url or len(url) > MAX_URL:
            raise RepositoryUrlRefused(f"must be 1 to {MAX_URL} characters")
        if url.startswith("-"):
            raise RepositoryUrlRefused("must not start with '-'")
        if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
            raise RepositoryUrlRefused("must not hold spaces or control characters")
        if url.startswith("/"):
            return RepositoryLocation(url, "file", "", 0, url)
        scp = _SCP_LIKE.fullmatch(url)
        if scp is not None and "://" not in url:
            return RepositoryLocation(url, "ssh", scp["host"], _DEFAULT_PORTS["ssh"], scp["path"])
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        allowed = _ALWAYS + (_PLAIN if self._settings.plain_schemes else ())
        if scheme == "file":
            if parts.netloc not in ("", "localhost"):
                raise RepositoryUrlRefused("a file:// URL names a path on this host: file:///path")
            return RepositoryLocation(url, "file", "", 0, unquote(parts.path))
        if scheme not in allowed:
            plain = ", git:// and http:// (allowed by the operator)" if self._settings.plain_schemes else ""
            raise RepositoryUrlRefused(
                f"must be an https://, ssh:// or git@host:path URL{plain}, or a local path this host allows"
            )
        if parts.password:
            raise RepositoryUrlRefused("must not hold a password or token: send it as git_credential")
        if not parts.hostname:
            raise RepositoryUrlRefused("names no host")
        try:
            port = parts.port or _DEFAULT_PORTS[scheme]
        except ValueError as exc:
            raise RepositoryUrlRefused("has a port that is not a number from 1 to 65535") from exc
        return RepositoryLocation(url, scheme, parts.hostname, port, parts.path)

    def _check_local(self, location: RepositoryLocation) -> None:
        path = location.path
        if not path.startswith("/"):
            raise RepositoryUrlRefused("a local repository must be an absolute path")
        resolved = Path(os.path.realpath(path))
        if not any(resolved == root or root in resolved.parents for root in self._roots):
            raise RepositoryUrlRefused(
                f"{path} is a local path outside the directories this host allows repositories in "
                "(repositories.local_roots): name a remote repository (https:// or ssh://)"
            )

    def _check_address(self, location: RepositoryLocation, address: Address) -> None:
        reason = self._addresses.refusal(address)
        if reason is not None:
            shown = location.host if str(address) == location.host else f"{location.host} resolves to {address}"
            raise RepositoryUrlRefused(
                f"{shown}, which is not a public address: repositories are cloned from public hosts only "
                "(repositories.allowed_networks names exceptions)"
            )


def repository_environment(settings: RepositorySettings) -> dict[str, str]:
    """The ``RUNPLANE_REPOSITORIES__*`` variables that give a runner process these settings (a runner's
    environment is an allow-list: the rule it applies before a clone is the dispatcher's)."""
    return {
        "RUNPLANE_REPOSITORIES__PLAIN_SCHEMES": json.dumps(settings.plain_schemes),
        "RUNPLANE_REPOSITORIES__ALLOWED_NETWORKS": json.dumps(settings.allowed_networks),
        "RUNPLANE_REPOSITORIES__LOCAL_ROOTS": json.dumps(settings.local_roots),
    }


def without_credentials(url: str) -> str:
    """``url`` with any user name and password left out (what a run's checkout shows as its remote)."""
    if url.startswith("/") or "://" not in url:
        return url
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit((parts.scheme, parts.netloc.rsplit("@", 1)[1], parts.path, parts.query, parts.fragment))
