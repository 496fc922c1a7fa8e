"""A run's lifecycle: every status transition after a run is queued, and what follows from it.

- ``finish``: ending a run (terminal status, failure counts, deactivation, completion triggers, retries);
- ``relaunch``: a launch that failed or a run stuck in starting goes back to queued, or ends in error;
- ``pickups``: at most one scheduler Pickup per account waiting on the bus;
- ``transitions.sql``: the SQL of these transitions, one named statement each.
"""
