"""A run's lifecycle: every status transition after a run is queued, and what follows from it.

::

    queued ──dispatcher (start_runs)──▶ starting ──runner claims──▶ running ──▶ success | error | cancelled
      ▲                                    │                          │
      └──── relaunch.py (launch failed, ◀──┘        runner lost: lease expired, the scheduler loop's reaper
            no runner within the start timeout,     ends the run in error (finish.py) ──▶ retries.py
            Pod failed before the claim)

- ``finish.py``: ending a run and what follows (failure counts, deactivation, completion triggers);
- ``retries.py``: whether a failed run gets a new run, after the one backoff formula (``runplane.basics.backoff``);
- ``relaunch.py``: the same run back to queued after a failed launch, or ended once the budget is spent;
- ``pickups.py``: the one place Pickups are built and sent, and the marks that hold back repeats;
- ``transitions.sql`` (loaded by ``transitions.py``): every status transition of a run, one named
  statement each, for every part that moves a run: queuing, starting, claiming, cancelling, ending,
  requeuing.
"""
