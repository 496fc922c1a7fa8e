"""Typed settings, read from RUNPLANE_* environment variables (nested groups use ``__``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class ApiSettings(BaseModel):
    host: str = Field("127.0.0.1", description="Address the gRPC API listens on.")
    port: int = Field(50051, description="Port of the gRPC API.")
    runner_port: int = Field(
        50052, description="Port of the runner API (RunnerService, run tokens), the only one runners may reach."
    )
    max_page_size: int = Field(500, description="Largest page a List call returns.")
    log_poll_interval: float = Field(0.5, description="How often StreamRunLogs polls a live run.")
    rest_port: int = Field(8000, description="Port of the REST API (dbt Cloud v2 compatible); -1 turns it off.")
    tls_certfile: str = Field(
        "", description="PEM certificate (chain) of the REST API; with tls_keyfile it serves HTTPS, else plain HTTP."
    )
    tls_keyfile: str = Field("", description="PEM private key of tls_certfile.")


class WebhookSettings(BaseModel):
    """Delivery of outgoing webhooks (a task of each API process; several processes share the work)."""

    poll_interval: float = Field(0.5, description="Seconds between looks at the outbox when it is idle.")
    batch_size: int = Field(50, description="Events one look claims.")
    timeout: float = Field(10.0, description="Seconds one delivery may take.")
    lease_seconds: float = Field(60.0, description="A claimed event not answered for this long is sent again.")
    backoff_base: float = Field(2.0, description="Seconds before the first retry; doubled per failed attempt.")
    backoff_cap: float = Field(300.0, description="Longest wait between two attempts.")
    max_attempts: int = Field(30, description="Attempts before an event is abandoned (kept, visible in the log).")


class OrchestratorSettings(BaseModel):
    heartbeat_interval: float = Field(2.0, description="Seconds between queuer-worker heartbeats.")
    dead_after_intervals: int = Field(3, description="Missed heartbeats before a worker is dead.")
    reconcile_interval: float = Field(10.0, description="Seconds between full version reconciles.")
    assign_batch_size: int = Field(2000, description="Jobs per Assign message.")
    rebalance_tolerance: float = Field(0.10, description="Allowed deviation from the mean per worker.")
    claim_timeout: float = Field(15.0, description="Seconds before an unclaimed Assign is resent.")


class QueuerSettings(BaseModel):
    prefetch: int = Field(16, description="Unacked bus messages a worker takes at once.")


class SchedulerSettings(BaseModel):
    interval: float = Field(1.0, description="Seconds between scheduler-loop passes.")
    start_timeout: float = Field(120.0, description="Seconds a run may stay starting.")
    launch_attempts: int = Field(3, description="Launches tried before a run fails.")
    launch_backoff: float = Field(2.0, description="Base seconds of the relaunch backoff.")


class DispatcherSettings(BaseModel):
    lock_ttl_ms: int = Field(10_000, description="Expiry of an account's Redis lock.")
    batch_size: int = Field(200, description="Queued runs one dispatch pass looks at per account.")
    launcher: str = Field("local", description="local, noop or kubernetes.")
    cluster: str = Field("local", description="Name recorded on each run this dispatcher starts.")
    prefetch: int = Field(32, description="Unacked pickups a dispatcher takes at once.")
    concurrency: int = Field(4, description="Accounts one dispatcher process works on at once.")
    heartbeat_interval: float = Field(5.0, description="Seconds between a dispatcher's heartbeats (its row).")
    dead_after_beats: int = Field(
        3, description="Missed heartbeats before a dispatcher counts as dead and its starting runs are reclaimed."
    )
    local_fork_server: bool = Field(
        True, description="local launcher: fork runners from a pre-loaded process; false: a fresh process per run."
    )


class KubernetesSettings(BaseModel):
    """Where and how the ``kubernetes`` launcher starts runner Pods.

    A dispatcher talks to one cluster; the name it records on each run is ``dispatcher.cluster``.
    """

    context: str = Field("", description="kubeconfig context to use; empty: the in-cluster service account.")
    kubeconfig: str = Field("", description="kubeconfig file; empty: $KUBECONFIG or ~/.kube/config.")
    namespace: str = Field("runplane-runs", description="Namespace the run Pods are created in.")
    image: str = Field("ghcr.io/runplane/runplane-runner:0.1.0", description="Runner image (dbt installed).")
    image_pull_policy: str = Field("IfNotPresent", description="Always, IfNotPresent or Never.")
    dbt_images: dict[str, str] = Field(
        default_factory=dict,
        description="Runner image per dbt version (JSON); an environment's dbt_version picks one, else `image`.",
    )
    service_account: str = Field("", description="Service account of run Pods; empty: the namespace default.")
    node_selector: dict[str, str] = Field(default_factory=dict, description="Node labels run Pods require.")
    tolerations: list[dict[str, Any]] = Field(
        default_factory=list, description="Tolerations of run Pods, as in a Pod spec (camelCase keys)."
    )
    image_pull_secrets: list[str] = Field(default_factory=list, description="Secrets used to pull the image.")
    env_from_secrets: list[str] = Field(
        default_factory=list, description="Secrets whose keys become the runner's environment (the three URLs)."
    )
    cpu_request: str = Field("250m", description="CPU request of a run Pod; memory comes from the account.")
    run_as_user: int = Field(10001, description="Non-root uid the runner container runs as.")
    deadline_slack_seconds: int = Field(
        120, description="Added to a run's timeout for activeDeadlineSeconds, so the runner ends it first."
    )
    pod_retention_seconds: float = Field(300.0, description="How long finished Pods are kept (for logs).")
    sweep_interval: float = Field(15.0, description="Seconds between retention and orphan sweeps.")
    orphan_grace_seconds: float = Field(
        60.0, description="A running Pod whose run ended less than this ago is left to exit by itself."
    )
    watch_timeout_seconds: int = Field(60, description="Server-side timeout of one watch request.")
    relist_backoff: float = Field(1.0, description="Pause before relisting after a failed watch.")
    request_timeout: float = Field(10.0, description="Seconds one API request may take.")
    api_attempts: int = Field(4, description="Tries of one API call on 429, 5xx or a dropped connection.")
    api_backoff: float = Field(0.5, description="First retry delay of an API call, doubled per retry.")
    api_backoff_cap: float = Field(8.0, description="Longest wait inside one launch; a longer Retry-After defers.")
    health_interval: float = Field(2.0, description="Seconds between probes of the cluster API (/version).")
    health_failures: int = Field(
        2, description="Failed probes in a row after which the dispatcher stops taking pickups for this cluster."
    )
    capacity: int = Field(
        0, description="Active run Pods at which the dispatcher stops taking pickups (others take them); 0: no limit."
    )


class RunnerSettings(BaseModel):
    api_address: str = Field(
        "127.0.0.1:50052",
        description="Where runners reach the runner API (host:port); their only control-plane address.",
    )
    lease_seconds: float = Field(30.0, description="A runner silent this long is lost.")
    heartbeat_interval: float = Field(5.0, description="Seconds between lease renewals.")
    interrupt_grace: float = Field(
        10.0, description="Cancel/timeout: seconds between SIGINT (dbt cancels its queries) and SIGTERM."
    )
    cancel_grace: float = Field(10.0, description="Cancel/timeout: seconds between SIGTERM and SIGKILL.")
    repository_cache: str = Field(
        "", description="Where this host keeps clones of projects' repositories; empty: ~/.cache/runplane/repositories."
    )
    dbt_versions: dict[str, str] = Field(
        default_factory=dict,
        description="Installed dbt versions on this host: version -> directory holding its dbt executable "
        '(JSON, e.g. {"1.10": "/opt/dbt-1.10/bin"}). An environment\'s dbt_version picks one.',
    )
    work_dir: str = Field("", description="Where runs execute; empty: a temporary directory.")
    local_uid: int = Field(
        -1,
        description="local launcher, started as root: the first uid (and gid) runners switch to, so a step cannot "
        "read the control plane's processes; -1 keeps the dispatcher's user (one trusted tenant only).",
    )
    local_uid_count: int = Field(
        1,
        ge=1,
        description="How many uids from local_uid runs take turns on (run id modulo this): concurrent runs of "
        "different uids cannot read each other's steps.",
    )
    retry_backoff_base: float = Field(10.0, description="First retry delay in seconds.")
    retry_backoff_cap: float = Field(600.0, description="Longest retry delay in seconds.")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RUNPLANE_", env_nested_delimiter="__")

    database_url: str = Field(
        "postgresql://postgres@127.0.0.1:5432/runplane", description="Postgres, the system of record."
    )
    redis_url: str = Field("redis://127.0.0.1:6379/0", description="Redis, for account locks.")
    amqp_url: str = Field("amqp://guest:guest@127.0.0.1:5672/", description="RabbitMQ, the bus.")
    bus_prefix: str = Field("runplane", description="Prefix of every exchange and queue name.")
    redis_prefix: str = Field("runplane", description="Prefix of every Redis key.")
    log_format: str = Field("auto", description="json, text or auto (text on a terminal).")
    log_level: str = Field("INFO")
    metrics_port: int = Field(0, description="Prometheus /metrics port; 0 turns it off.")
    probe_port: int = Field(0, description="/ready and /live port (readiness: every dependency reachable); 0: off.")
    otlp_endpoint: str = Field("", description="OTLP traces endpoint; empty turns tracing off.")
    drain_seconds: float = Field(20.0, description="Bound on shutdown after SIGTERM.")
    secret_keys: SecretStr = Field(
        SecretStr(""),
        description="Fernet keys that encrypt stored secrets, comma-separated, newest first (the newest "
        "encrypts, all decrypt). In production from a Kubernetes Secret; `runplane up` fills it from "
        "secret_key_file when empty.",
    )
    secret_key_file: str = Field(
        "~/.runplane/secret.key", description="Local key file `runplane up` and the demo read or create (0600)."
    )

    api: ApiSettings = ApiSettings()
    webhooks: WebhookSettings = WebhookSettings()
    orchestrator: OrchestratorSettings = OrchestratorSettings()
    queuer: QueuerSettings = QueuerSettings()
    scheduler: SchedulerSettings = SchedulerSettings()
    dispatcher: DispatcherSettings = DispatcherSettings()
    runner: RunnerSettings = RunnerSettings()
    kubernetes: KubernetesSettings = KubernetesSettings()
