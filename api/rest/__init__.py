"""The dbt Cloud–compatible REST API (v2), a second door to the same rules as the gRPC API.

- ``app``: the FastAPI application, its error envelope and the routes' registration.
- ``auth``: ``Authorization: Token|Bearer <token>`` resolved to the account; other accounts' ids are 404.
- ``shapes``: runplane rows in dbt Cloud's field names (runs, triggers, steps, jobs, accounts).
- ``runs`` / ``jobs`` / ``accounts``: the routes; they call ``triggering``, ``cancelling``, ``lookup``
  and ``store`` exactly as the gRPC services do.
- ``server``: uvicorn serving the app (HTTPS with a certificate from settings, or plain HTTP).
"""
