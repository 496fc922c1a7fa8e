"""What a runner is told about its run (``runplane.v1.RunSpec``), made from the claimed run's row.

Run overrides are applied here, once, so the runner never needs the rules; secret environment
variables are decrypted here, for this runner alone, and listed in ``masked_values`` so the runner
replaces them with ``*****`` in everything it uploads. A job with an environment also gets its
``DbtContext`` (``runplane.dbt_context``), its connection secrets and git credential decrypted here
and masked the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runplane.db import Connection
from runplane.dbt_context import DbtContext, context_from_row, to_proto
from runplane.dbt_context import run_override as override
from runplane.secrets import SecretBox, SecretKeyError
from runplane.sql import load_queries
from runplane.types import JOB_TYPE_TO_PROTO, TRIGGER_TO_PROTO, JobType, Trigger
from runplane.v1 import runner_pb2

Q = load_queries("api", "runner_queries.sql")


async def load_dbt_context(conn: Connection, run_id: int, decrypt: Callable[[str], str]) -> DbtContext | None:
    """The DbtContext of a run, or None when its job has no environment (plain commands)."""
    cur = await conn.execute(Q["dbt_context"], {"run_id": run_id})
    row = await cur.fetchone()
    if row is None:
        return None
    return context_from_row(row, decrypt)


def build_run_spec(
    row: dict[str, Any],
    *,
    lease_id: str,
    lease_seconds: float,
    heartbeat_interval: float,
    box: SecretBox | None,
    dbt: DbtContext | None = None,
) -> runner_pb2.RunSpec:
    """The spec of a claimed run. ``box`` may be None only when the job has no secret. ``dbt``: the
    run's context when its job has an environment, secrets already decrypted."""
    overrides = row["overrides"] if isinstance(row["overrides"], dict) else {}
    steps = override(overrides, "steps") or row["steps"]
    environment = {str(k): str(v) for k, v in (row["environment"] or {}).items()}
    secrets = decrypt_secret_environment(row["secret_environment"] or {}, box)
    environment.update(secrets)
    masked = set(secrets.values()) | set(dbt.secrets() if dbt is not None else ())
    spec = runner_pb2.RunSpec(
        run_id=int(row["id"]),
        account_id=int(row["account_id"]),
        job_id=int(row["job_id"]),
        steps=[str(step) for step in steps],
        environment=environment,
        masked_values=sorted(masked),
        threads=int(override(overrides, "threads") or row["threads"]),
        schema=str(override(overrides, "schema") or row["schema_name"] or ""),
        target_name=str(override(overrides, "target_name") or row["target_name"] or ""),
        git_branch=str(override(overrides, "git_branch") or row["git_branch"] or ""),
        pull_request_number=int(row["pull_request_number"] or 0),
        cause=str(row["cause"] or ""),
        timeout_seconds=int(override(overrides, "timeout_seconds") or row["timeout_seconds"] or 0),
        memory_mb=int(row["memory_mb"]),
        cancel_requested=row["cancel_requested_at"] is not None,
        trace_parent=str(row["trace_parent"] or ""),
        lease_id=lease_id,
        lease_seconds=lease_seconds,
        heartbeat_interval=heartbeat_interval,
        job_type=JOB_TYPE_TO_PROTO[JobType(row["job_type"])],  # type: ignore[arg-type]
        trigger=TRIGGER_TO_PROTO[Trigger(row["trigger"])],  # type: ignore[arg-type]
    )
    if dbt is not None:
        spec.dbt.CopyFrom(to_proto(dbt))
    return spec


def decrypter(box: SecretBox | None) -> Callable[[str], str]:
    """Opens a stored secret; without keys configured, says so when a secret is there to open."""

    def decrypt(token: str) -> str:
        if box is None:
            raise SecretKeyError(
                "the run's environment or project has secrets but no RUNPLANE_SECRET_KEYS are configured"
            )
        return box.decrypt(token)

    return decrypt


def decrypt_secret_environment(stored: dict[str, Any], box: SecretBox | None) -> dict[str, str]:
    """Secret variables' plaintext from their stored ciphertext."""
    if not stored:
        return {}
    if box is None:
        raise SecretKeyError("the job has secrets but no RUNPLANE_SECRET_KEYS are configured")
    return {str(name): box.decrypt(str(token)) for name, token in stored.items()}
