"""The scheduler loop, the dispatchers and the launchers."""
