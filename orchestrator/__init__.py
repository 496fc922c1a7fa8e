"""The orchestrator: leadership, term, job ownership, heartbeats, failover and rebalancing."""
