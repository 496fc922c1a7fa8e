"""Typed settings, read from RUNPLANE_* environment variables (nested groups use ``__``)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class RunnerApiLimits(BaseModel):
    """What one token may ask of the runner API (``api/runner/call_limits.py``); over it: RESOURCE_EXHAUSTED."""

    calls_in_flight: int = Field(8, ge=1, description="A token's calls (logs, steps, artifacts...) served at once.")
    calls_per_second: float = Field(100.0, gt=0, description="A token's calls a second, on average.")
    calls_burst: int = Field(200, ge=1, description="A token's calls at once above that average.")
    lease_calls_in_flight: int = Field(
        4, ge=1, description="A token's lease calls (RenewLease, ReadCancel, WaitForRun) served at once."
    )
    lease_calls_per_second: float = Field(10.0, gt=0, description="A token's lease calls a second, on average.")
    lease_calls_burst: int = Field(20, ge=1, description="A token's lease calls at once above that average.")


class ApiSettings(BaseModel):
    host: str = Field("127.0.0.1", description="Address the gRPC API listens on.")
    port: int = Field(50051, description="Port of the gRPC API.")
    runner_port: int = Field(
        50052, description="Port of the runner API (RunnerService, run tokens), the only one runners may reach."
    )
    runner_limits: RunnerApiLimits = RunnerApiLimits()
    max_page_size: int = Field(500, description="Largest page a List call returns.")
    log_poll_interval: float = Field(0.5, description="How often StreamRunLogs polls a live run.")
    rest_port: int = Field(8000, description="Port of the REST API (dbt Cloud v2 compatible); -1 turns it off.")
    tls_certfile: str = Field(
        "", description="PEM certificate (chain) of the REST API; with tls_keyfile it serves HTTPS, else plain HTTP."
    )
    tls_keyfile: str = Field("", description="PEM private key of tls_certfile.")
    max_body_bytes: int = Field(
        1024 * 1024,
        ge=1024,
        description="Largest HTTP request body, refused (413) while it is read, before authentication; Git "
        "webhooks take up to 25 MB (GitHub's own cap).",
    )
    public_url: str = Field(
        "",
        description="Where people reach the REST API and its pages (e.g. https://runplane.example.com): commit "
        "statuses link runs there; empty: http://<host>:<rest_port>.",
    )

    def run_page(self, run_id: int) -> str:
        """A run's page, where every message about the run (commit status, notification) links."""
        return f"{self.public_url.rstrip('/')}/ui/runs/{run_id}/"

    web_session_hours: float = Field(
        12.0,
        gt=0,
        description="How long a login to the web pages lasts at most; logging out, or revoking the API token it "
        "was made with, ends it sooner.",
    )


class WebhookSettings(BaseModel):
    """Delivery of outgoing webhooks (a task of each API process; several processes share the work)."""

    poll_interval: float = Field(0.5, description="Seconds between looks at the outbox when it is idle.")
    batch_size: int = Field(50, description="Events one look claims.")
    timeout: float = Field(10.0, description="Seconds one delivery may take.")
    lease_seconds: float = Field(60.0, description="A claimed event not answered for this long is sent again.")
    backoff_base: float = Field(2.0, description="Seconds before the first retry; doubled per failed attempt.")
    backoff_cap: float = Field(300.0, description="Longest wait between two attempts.")
    max_attempts: int = Field(30, description="Attempts before an event is abandoned (kept, visible in the log).")
    allowed_networks: list[str] = Field(
        default_factory=list,
        description="Networks (CIDR) webhooks may reach besides public addresses, e.g. an in-house receiver's; "
        "loopback, private and link-local addresses are refused unless listed here.",
    )


class NotificationSettings(BaseModel):
    """Notifications of a run's end: the install's mail server and sender, and where links point. They leave
    through the webhooks' outbox, so its poll, lease, backoff and attempts (``webhooks``) hold for them too."""

    smtp_host: str = Field("", description="Mail server for email notifications; empty: email is not sent.")
    smtp_port: int = Field(587, ge=1, le=65535, description="Port of the mail server.")
    smtp_security: str = Field(
        "starttls",
        pattern="^(starttls|tls|none)$",
        description="starttls (upgrade a plain connection), tls (TLS from the first byte), or none.",
    )
    smtp_username: str = Field("", description="Login at the mail server; empty: no authentication.")
    smtp_password: SecretStr = Field(SecretStr(""), description="Password of smtp_username (never shown).")
    smtp_ca_file: str = Field(
        "", description="PEM of the CAs the mail server's certificate may chain to; empty: the system's."
    )
    from_address: str = Field(
        "runplane@localhost", description="The From: of every notification email of this install."
    )
    slack_api_url: str = Field(
        "https://slack.com/api", description="Slack's Web API (chat.postMessage, conversations.history)."
    )
    switch_off_after: int = Field(
        5,
        ge=1,
        description="Failed attempts in a row after which a receiver (notification or webhook) is switched off.",
    )
    error_lines: int = Field(5, ge=1, description="Lines of the failing step's log a message quotes.")
    models_listed: int = Field(20, ge=1, description="Failed or warned models a message names before 'and N more'.")


class RepositorySettings(BaseModel):
    """Which git repositories projects may name: checked when a project is saved, by `runplane migrate` for
    the stored ones, and again on the runner host just before each clone."""

    plain_schemes: bool = Field(
        False,
        description="Allow git:// and http:// repositories (unencrypted, unauthenticated transports); "
        "https://, ssh:// and git@host:path are always allowed.",
    )
    allowed_networks: list[str] = Field(
        default_factory=list,
        description="Networks (CIDR) repository hosts may be in besides public addresses, e.g. an in-house Git "
        "server's; loopback, private and link-local addresses are refused unless listed here.",
    )
    local_roots: list[str] = Field(
        default_factory=list,
        description="Directories under which a project may name a local repository (an absolute path or "
        "file:// URL), JSON list; empty: none may. `runplane up --demo` adds its demo repository's.",
    )

    def environment(self) -> dict[str, str]:
        """These settings as the ``RUNPLANE_REPOSITORIES__*`` variables that give them to another
        process: a run Pod, which applies the rule again before it clones."""
        return {
            f"RUNPLANE_REPOSITORIES__{name.upper()}": json.dumps(value) for name, value in self.model_dump().items()
        }


class OrchestratorSettings(BaseModel):
    heartbeat_interval: float = Field(2.0, description="Seconds between queuer-worker heartbeats.")
    dead_after_intervals: int = Field(3, description="Missed heartbeats before a worker is dead.")
    reconcile_interval: float = Field(10.0, description="Seconds between full version reconciles.")
    assign_batch_size: int = Field(2000, description="Jobs per Assign message.")
    rebalance_tolerance: float = Field(0.10, description="Allowed deviation from the mean per worker.")
    claim_timeout: float = Field(15.0, description="Seconds before an unclaimed Assign is resent.")


class QueuerSettings(BaseModel):
    prefetch: int = Field(16, description="Unacked bus messages a worker takes at once.")
    insert_chunk: int = Field(
        10_000,
        ge=1,
        description="Runs of one tick inserted and committed together; each chunk's Pickups go out as it commits, "
        "so dispatch starts before a large tick (the top of the hour) is all queued.",
    )


class ForecastSettings(BaseModel):
    """The forecast of demand: fires due per minute over the next minutes, by runner kind."""

    interval: float = Field(5.0, gt=0, description="Seconds between two forecasts a queuer worker publishes.")
    minutes: int = Field(5, ge=1, le=60, description="Minutes ahead a forecast covers (the current one included).")
    stale_after: float = Field(
        30.0, gt=0, description="Seconds after which a worker's forecast no longer counts (the worker is gone)."
    )
    kinds_refresh: float = Field(
        300.0,
        gt=0,
        description="Seconds a worker keeps a job's runner kind (an environment's dbt version, an account's memory) "
        "before reading it again; a job's Assign or Update reads it again at once.",
    )
    api_window: float = Field(
        600.0,
        gt=0,
        description="Seconds of API-triggered runs whose rate per minute is added to every forecast minute.",
    )


class SchedulerSettings(BaseModel):
    interval: float = Field(1.0, description="Seconds between scheduler-loop passes.")
    sweep_grace: float = Field(
        5.0,
        description="Seconds after a queuer queues a cron run in which the sweep leaves it to the queuer's own "
        "Pickup; a lost one is made up after this.",
    )
    start_timeout: float = Field(120.0, description="Seconds a run may stay starting.")
    launch_attempts: int = Field(3, description="Launches tried before a run fails.")
    launch_backoff: float = Field(2.0, description="Base seconds of the relaunch backoff.")
    observe_queued_after: float = Field(
        10.0,
        description="Seconds a run waits queued before its queue event (runs queued, trigger lag) is recorded on "
        "its own; a run that starts or ends sooner has it recorded then, in one write of its row instead of two.",
    )
    behind_backlog: int = Field(
        1_000,
        description="Due runs waiting for a first dispatch decision above which dispatch counts as behind (at most "
        "a minute in a row): passes record no run metrics (they come late, never wrong) and leave cron runs to their "
        "queuers' Pickups.",
    )
    on_time_window: float = Field(3600.0, description="Seconds of runs the per-account on-time gauge looks back over.")
    on_time_interval: float = Field(60.0, description="Seconds between two readings of the per-account on-time gauge.")
    retention_interval: float = Field(
        60.0, description="Seconds between passes that delete finished runs older than their account keeps them."
    )
    pull_request_sweep_interval: float = Field(
        300.0, description="Seconds between sweeps that drop pull request schemas older than their account keeps them."
    )


class DispatcherSettings(BaseModel):
    lock_ttl_ms: int = Field(10_000, description="Expiry of an account's Redis lock.")
    batch_size: int = Field(200, description="Queued runs one dispatch pass looks at per account.")
    batch_accounts: int = Field(
        500, description="Accounts one dispatch pass takes at most (their locks, one transaction)."
    )
    batch_wait: float = Field(
        0.005, description="Seconds a consumer waits for more pickups after the first before it dispatches them."
    )
    launch_concurrency: int = Field(256, description="Launches one dispatcher process runs at once.")
    launcher: str = Field("local", description="local, noop or kubernetes.")
    cluster: str = Field("local", description="Name recorded on each run this dispatcher starts.")
    prefetch: int = Field(1000, description="Unacked pickup messages a dispatcher process takes at once.")
    concurrency: int = Field(2, description="Batches of pickups one dispatcher process works on at once.")
    heartbeat_interval: float = Field(5.0, description="Seconds between a dispatcher's heartbeats (its row).")
    dead_after_beats: int = Field(
        3, description="Missed heartbeats before a dispatcher counts as dead and its starting runs are reclaimed."
    )
    local_fork_server: bool = Field(
        True, description="local launcher: fork runners from a pre-loaded process; false: a fresh process per run."
    )
    local_spares_min: int = Field(
        1, ge=1, description="local launcher: runners the fork server keeps started and waiting when no peak is due."
    )
    local_spares_max: int = Field(
        64,
        ge=1,
        description="local launcher: most started runners waiting, however large the forecast (each holds a process "
        "and a connection to the runner API).",
    )
    local_lead_seconds: float = Field(
        20.0, ge=0, description="local launcher: the spares grow to the forecast of a minute this long before it."
    )
    local_pool_interval: float = Field(1.0, gt=0, description="local launcher: seconds between looks at the forecast.")
    local_capacity: int = Field(
        0,
        ge=0,
        description="local launcher: runners given a run that one dispatcher keeps alive at once; the runs beyond "
        "it stay queued (their start timeout not yet running) until a runner exits, or go to another dispatcher. "
        "0: 16 per CPU of this machine.",
    )


class WarmPoolSettings(BaseModel):
    """One warm pool: started runner Pods of one kind (image and memory) waiting for a run."""

    name: str = Field(
        ..., pattern=r"^[a-z0-9]([a-z0-9-]{0,18}[a-z0-9])?$", description="Names its Pods (a DNS label, 1-20)."
    )
    dbt_version: str = Field("", description="Picks the image as a run's environment would; empty: `image`.")
    memory_mb: int = Field(1024, gt=0, description="The memory of its Pods: runs of accounts with this memory fit.")
    min_size: int = Field(1, ge=0, description="Waiting Pods kept when no run is queued.")
    max_size: int = Field(4, ge=0, description="Most waiting Pods, however deep the queue.")


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
    node_cache_socket_dir: str = Field(
        "",
        description="The node's directory holding the socket of its cache keeper (`runplane node-cache --socket "
        "DIR/cache.sock`, a DaemonSet): mounted read-only into run Pods, whose runners get their dbt packages "
        "there (a hostPath volume: the runs namespace must allow it); empty: each Pod runs dbt deps itself.",
    )
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
    pod_creates_per_second: float = Field(
        50.0,
        description="Pod creates per second this dispatcher sends the cluster's API server at most; 0: no limit.",
    )
    intake_horizon: float = Field(
        2.0,
        ge=0,
        description="Seconds of Pod creates, at the create rate the dispatcher measures, that it takes runs from the "
        "pickup queue for (within the room `capacity` leaves); the rest of a peak is left to other clusters' "
        "dispatchers. 0: no bound.",
    )
    warm_pools: list[WarmPoolSettings] = Field(
        default_factory=list,
        description="Warm Pod pools (JSON list) this dispatcher keeps and hands runs to; a run no waiting Pod "
        "fits gets a Pod of its own. Give them to one dispatcher per cluster.",
    )
    pool_interval: float = Field(1.0, description="Seconds between looks at the pools (refill, resize, replace).")
    pool_silent_seconds: float = Field(
        10.0, description="A waiting pool Pod not heard from for this long gets no run and is replaced."
    )
    pool_start_seconds: float = Field(
        300.0, description="A pool Pod that has not called the runner API this long after its creation is replaced."
    )
    pool_creates_per_pass: int = Field(8, ge=1, description="Pool Pods created per look, at most.")
    pool_lead_seconds: float = Field(
        60.0,
        ge=0,
        description="Pools grow to the forecast of a minute at least this long before it; longer when the forecast "
        "cannot be created in time at the pool's measured create rate.",
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
        "",
        description="Where this host keeps mirrors of projects' repositories (the host's own: runs get clones of "
        "them); empty: ~/.cache/runplane/repositories of the runner, or /var/lib/runplane/cache/repositories "
        "(beside local_run_root) when runs have uids of their own; git then runs as the uid just below local_uid, "
        "never root, and needs to reach it.",
    )
    package_cache: str = Field(
        "",
        description="Where this host keeps installed dbt packages by account, dbt version and lock file (linked "
        "into runs, so dbt deps runs once per lock); empty: dbt-packages beside the repositories' default.",
    )
    node_cache_socket: str = Field(
        "",
        description="A run Pod: the socket of its node's cache keeper (`runplane node-cache`), which keeps the dbt "
        "packages for the node's runs of each account (asked with the run's token); empty: the Pod installs them.",
    )
    dbt_versions: dict[str, str] = Field(
        default_factory=dict,
        description="Installed dbt versions on this host: version -> directory holding its dbt executable "
        '(JSON, e.g. {"1.10": "/opt/dbt-1.10/bin"}). An environment\'s dbt_version picks one.',
    )
    work_dir: str = Field("", description="Where runs execute; empty: a temporary directory.")
    local_uid: int = Field(
        200_000,
        ge=-1,
        description="local launcher, started as root: the first uid (and gid) runners switch to, so a step cannot "
        "read the control plane's processes (the default is far above any login user's). -1 keeps the "
        "dispatcher's user (one trusted tenant only). A dispatcher that is not root cannot switch: its runners "
        "keep its user, and it warns at start.",
    )
    local_uid_count: int = Field(
        1000,
        ge=1,
        description="How many uids from local_uid runs lease (the first free one from run id modulo this): no two "
        "running runs share a uid, and a uid is cleared of its last run's processes and HOME before the next.",
    )
    local_fence: bool = Field(
        True,
        description="local launcher, as root: fence each run like a Pod (nftables rules owned by its uid, a cgroup, "
        "namespaces for its steps); false keeps only the uid of its own (to measure what the fence costs).",
    )
    local_run_root: str = Field(
        "/var/lib/runplane/runs",
        description="local launcher, as root: where each run uid's private directory (HOME and temporary "
        "directory) is made; root's own, closed to listing.",
    )
    local_warehouse_root: str = Field(
        "/var/lib/runplane/warehouses",
        description="local launcher: where environments keep warehouse files (DuckDB's path), each in a "
        "directory of its own (<root>/<directory>/<file>) that only its runs may enter; a path elsewhere is "
        "refused when the environment is saved.",
    )
    local_warehouse_gid: int = Field(
        1_000_000_000,
        ge=1,
        description="local launcher, as root: the group of an environment's warehouse directory is this plus the "
        "environment's id; its runs, and no other, join it for the run (far above local_uid's range).",
    )
    local_pids_max: int = Field(
        4096,
        ge=16,
        description="local launcher, as root: most processes and threads a run may have at once; lowered so that "
        "a full machine's runs (dispatcher.local_capacity of them) hold at most half of kernel.pid_max.",
    )
    local_scratch_mb: int = Field(
        1024,
        ge=1,
        description="local launcher, as root: the room of a run's scratch space, in MiB (one tmpfs for its /tmp, "
        "/var/tmp, /dev/shm, /run/lock and every other world-writable place of the machine; its memory counts "
        'in the run\'s): a step writing past it gets ENOSPC and the run ends with "disk quota exceeded".',
    )
    local_disk_mb: int = Field(
        2048,
        ge=1,
        description="local launcher, as root: the room of a run's HOME and checkout together, in MiB (a tmpfs of "
        "the run's own; its memory counts in the run's, the clone's objects included): a step writing past it gets "
        'ENOSPC and the run ends with "disk quota exceeded".',
    )
    local_cpu_weight: int = Field(
        100,
        ge=1,
        le=10_000,
        description="local launcher, as root: a run's share of the CPUs against other runs when they are busy, "
        "for accounts without their own (accounts.cpu_weight) "
        "(cgroup v2 cpu.weight; v1 cpu.shares of weight × 1024 / 100); 100 is an equal share.",
    )
    local_cpu_max: float = Field(
        0.0,
        ge=0,
        description="local launcher, as root: most CPUs a run may use at once, even on an idle machine, for "
        "accounts without their own (accounts.cpu_max) (cgroup "
        "cpu.max, or v1 cpu.cfs_quota_us, over a 100 ms period); 0: no cap, only the weight.",
    )
    local_open_files: int = Field(
        4096,
        ge=64,
        description="local launcher, as root: the open-files limit (RLIMIT_NOFILE, soft and hard) of a run's "
        "runner and steps, set for the run rather than inherited from the dispatcher.",
    )
    local_resolver: bool = Field(
        False,
        description="local launcher, as root: let runs reach the DNS resolver /etc/resolv.conf names when it is on "
        "this machine (systemd-resolved's 127.0.0.53, a dnsmasq); off, nothing on this machine answers a run on "
        "port 53 and such a machine's runs resolve no names. A resolver elsewhere is always reached.",
    )
    local_hidden_paths: list[str] = Field(
        default_factory=lambda: ["/run/postgresql", "/run/redis", "/run/rabbitmq", "/run/mysqld"],
        description="local launcher: directories of the control plane's Unix sockets that steps see empty "
        "(JSON list); the directory of a socket named in database_url is added.",
    )
    pool_wait_seconds: float = Field(
        20.0, description="Warm pool Pod: how long one WaitForRun call waits for a run before it is made again."
    )
    pool_poll_interval: float = Field(
        0.1, description="Runner API: how often a waiting pool Pod's call looks for a run given to it."
    )
    pool_seen_interval: float = Field(
        2.0, description="Runner API: how often a waiting pool Pod's heartbeat is written while its call waits."
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
    notifications: NotificationSettings = NotificationSettings()
    repositories: RepositorySettings = RepositorySettings()
    orchestrator: OrchestratorSettings = OrchestratorSettings()
    queuer: QueuerSettings = QueuerSettings()
    scheduler: SchedulerSettings = SchedulerSettings()
    forecast: ForecastSettings = ForecastSettings()
    dispatcher: DispatcherSettings = DispatcherSettings()
    runner: RunnerSettings = RunnerSettings()
    kubernetes: KubernetesSettings = KubernetesSettings()
