"""One root exception for runplane. Third-party errors become these at the adapter edge."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class RunplaneError(Exception):
    """Root of every error runplane raises on purpose."""


class InvalidArgument(RunplaneError):
    """The caller sent something malformed; ``field`` names what."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class InvalidArguments(InvalidArgument):
    """Several fields refused at once; named by the first, every one in ``problems``."""

    def __init__(self, problems: list[InvalidArgument]) -> None:
        first, others = problems[0], problems[1:]
        super().__init__(first.field, str(first).removeprefix(f"{first.field}: "))
        self.args = (f"{first}; also {'; '.join(str(p) for p in others)}",)
        self.problems = problems


class Problems:
    """Checks run one after another with every refusal kept, so that one answer names every invalid
    field: :meth:`check` returns the check's value, or ``fallback`` when it refused."""

    def __init__(self) -> None:
        self.found: list[InvalidArgument] = []

    def check(self, run: Callable[[], T], fallback: T) -> T:
        try:
            return run()
        except InvalidArguments as exc:
            self.found.extend(exc.problems)
        except InvalidArgument as exc:
            self.found.append(exc)
        return fallback

    def raise_any(self) -> None:
        if len(self.found) == 1:
            raise self.found[0]
        if self.found:
            raise InvalidArguments(list(self.found))


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
