"""A dbt run's context, shared by the control plane that assembles it and the runner that uses it.

- ``context``: what a run of a job with an environment needs to run dbt (target, schema, threads,
  version, deferral), with the run's overrides.
- ``fields``: the one rule of each of a run's fields (target name, schema, dbt version, git SHA,
  threads), for jobs, environments, run overrides and runners alike.
- ``connections``: warehouse connections: which profile fields each dbt adapter takes, their types,
  and which are secret.
"""
