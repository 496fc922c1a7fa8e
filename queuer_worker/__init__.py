"""Queuer workers: the in-memory cron heap of the jobs a worker owns; queuing runs at their time."""
