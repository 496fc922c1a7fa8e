"""Dispatchers and the launchers."""
