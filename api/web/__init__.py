"""The web pages for people: runs, a run with its live log, jobs, and the account's on-time view.

Served under ``/ui/`` by the REST API's HTTP server, over the same store, auth and rules as the
APIs (``api.lookup``, ``api.triggering``, ``api.cancelling``, ``api.scopes``).
"""
