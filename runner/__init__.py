"""The runner: executes one run (steps, logs, artifacts, heartbeats, outcome)."""
