"""The command-line client users run (``python -m client``): it speaks to the API over its public
contracts only (the gRPC services of ``runplane.v1``, and the REST API for webhooks), never importing
server code, so it can be installed and upgraded apart from the server.

- ``cli``: the commands (jobs, projects, environments, triggers, runs, logs, artifacts).
- ``webhooks``: the webhook commands, over the REST API.
- ``address``: where the API is.
"""
