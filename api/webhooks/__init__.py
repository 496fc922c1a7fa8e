"""Webhooks, out and in.

- ``subscriptions``: an account's webhook subscriptions, what they may say, their reads and writes.
- ``deliveries``: delivering outgoing webhooks from the outbox, at least once.
- ``targets``: where outgoing webhooks may go (public addresses only, unless the operator names a network).
- ``git_events``: Git webhooks in: GitHub and GitLab pull/merge request events start CI and merge runs
  (their HTTP routes are in ``api/rest/git_hooks.py``).
- ``queries.sql``: their reads and writes.
"""
