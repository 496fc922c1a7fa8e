"""A run's overrides of its job's settings (``RunOverrides`` on a trigger), read one way everywhere.

Overrides are stored as the JSON the trigger sent: proto field names, snake_case or camelCase.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def run_override(overrides: Mapping[str, Any], name: str) -> Any:
    """A run override by its proto field name (stored snake_case or camelCase)."""
    head, *rest = name.split("_")
    camel = head + "".join(part.title() for part in rest)
    return overrides.get(name) or overrides.get(camel)


def run_timeout(overrides: object, job_timeout: int | None) -> int:
    """The run's effective timeout in seconds (0: none): a positive override, else the job's.

    The dispatcher hands it to the launcher (a Pod's deadline) and the runner API to the runner
    (which stops the run): both must see the same number."""
    value = run_override(overrides, "timeout_seconds") if isinstance(overrides, Mapping) else None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return job_timeout or 0
