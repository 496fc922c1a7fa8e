"""The control plane's API process: its doors, and the use cases and store every door shares.

``process``: the API process, above every door: it starts the servers and the webhook deliveries
over one pool and one store, supervises them, and drains them on stop.

Doors (each a folder; they meet only in the use cases below):

- ``grpc/``: the public gRPC API (JobService, ProjectService, RunService), its token interceptor,
  health checking and reflection.
- ``rest/``: the dbt Cloud–compatible REST API (v2) and the webhook subscriptions' REST calls.
- ``web/``: the web pages for people, served by the REST server under ``/ui/``.
- ``runner/``: the runner API (RunnerService): hostile callers, its own port, a token per run.
- ``webhooks/``: webhooks out (subscriptions, the outbox's deliveries, where they may go) and Git
  webhooks in (pull request and merge events that start CI and merge runs).

Use cases and the store, shared by every door:

- ``triggering`` / ``cancelling`` / ``pausing`` / ``rerunning`` / ``pull_requests``: one home per rule.
- ``lookup``: one job, run or artifact of an account; ``validation`` / ``projects_validation``: what
  callers send, checked before anything is written; ``scopes`` / ``auth``: tokens and what they may do.
- ``pickup_publisher``: the Pickup hint to dispatchers after a trigger.
- ``store`` + ``queries.sql``: the shared reads and writes of Postgres (a door's own queries sit in
  its folder: ``runner/queries.sql``, ``webhooks/queries.sql``).
- ``admin``: the operator tasks behind ``runplane admin`` (a door of its own, for operators);
  ``demo``: the demo account and jobs of ``make run``.
"""
