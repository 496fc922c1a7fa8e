"""The runner API (``runplane.v1.RunnerService``): the only door a run's runner has to the control plane.

Its callers run customers' code, so every call carries the run's own token, checked against the run's
lease. It listens on a port of its own (``api.runner_port``).

- ``service``: the RPCs (claim, heartbeat, logs, artifacts, outcome, the warm pool's WaitForRun).
- ``run_spec``: what a runner is told about its run (``RunSpec``), made from the claimed run's row.
- ``queries.sql``: the runner API's own reads and writes.
"""
