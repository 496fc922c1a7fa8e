"""One root exception for runplane. Third-party errors become these at the adapter edge."""

from __future__ import annotations


class RunplaneError(Exception):
    """Root of every error runplane raises on purpose."""


class InvalidArgument(RunplaneError):
    """The caller sent something malformed; ``field`` names what."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class NotFound(RunplaneError):
    """The object does not exist, or belongs to another account (the two look the same)."""


class Unauthenticated(RunplaneError):
    pass


class PermissionDenied(RunplaneError):
    pass


class FailedPrecondition(RunplaneError):
    """The request is well formed but the object's state forbids it."""


class VersionConflict(FailedPrecondition):
    """An update named the version it was read at, and another save came in between: nothing changed."""

    def __init__(self, what: str, current_version: int, expected_version: int) -> None:
        super().__init__(
            f"{what} is at version {current_version}, not {expected_version}: "
            "someone else saved it since; read it again and reapply the change"
        )
        self.what = what
        self.current_version = current_version
        self.expected_version = expected_version


class ServiceUnavailable(RunplaneError):
    """An outside system (Postgres, Redis, RabbitMQ, Kubernetes) did not answer."""


class Contention(ServiceUnavailable):
    """Postgres answered, but a concurrent transaction was in the way (a lock not available within the
    lock timeout, a deadlock, a serialization failure). Nothing was changed; trying again may succeed."""


class DatabaseError(RunplaneError):
    """Postgres refused a statement for another reason (a constraint, a bug in a query)."""


class LaunchError(RunplaneError):
    """A launcher could not start a runner. ``retryable`` says whether trying again may help."""

    def __init__(self, message: str, *, retryable: bool, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after
