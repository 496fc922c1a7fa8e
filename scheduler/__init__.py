"""The scheduler loop (``runplane scheduler``): Pickups for accounts with due runs, reaping, run metrics."""
