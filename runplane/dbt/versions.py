"""Which dbt versions runs can use: the one rule every door that sets a ``dbt_version`` asks.

The runners find dbt by version in ``runner.dbt_versions`` (a local launcher's host) or pick an image by
version in ``kubernetes.dbt_images``; the API process reads the same settings (``make run`` and the
chart give every process the same variables), so a version no runner has is refused when it is set —
on an environment, a job or a run's override — instead of failing the run at its profile step. With
neither setting (an API that is not told), every well-formed version is accepted, as before.
"""

from __future__ import annotations

from dataclasses import dataclass

from runplane.basics.errors import InvalidArgument
from runplane.basics.settings import Settings


@dataclass(frozen=True)
class InstalledDbtVersions:
    versions: frozenset[str] = frozenset()

    @classmethod
    def of(cls, settings: Settings) -> InstalledDbtVersions:
        """The versions of the launcher the dispatchers use (the Kubernetes images, or the local installs)."""
        if settings.dispatcher.launcher == "kubernetes":
            return cls(frozenset(settings.kubernetes.dbt_images))
        return cls(frozenset(settings.runner.dbt_versions))

    def check(self, version: str | None, field: str) -> None:
        """Refuse ``version`` when it is set and not installed, naming the installed ones."""
        if not version or not self.versions or version in self.versions:
            return
        installed = ", ".join(sorted(self.versions))
        raise InvalidArgument(field, f"dbt {version[:60]!r} is not installed on the runners (installed: {installed})")
