"""The ``runplane`` command (``cli``, the composition root that starts every service) and the commands
that are not a service: ``up`` (the whole system on one machine), ``status``, ``preflight``
(``check-services``), ``migrate`` and ``demo``.
"""
