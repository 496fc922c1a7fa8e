-- Leadership is a lease, not a session: the leader renews it every second and loses it when it has
-- not renewed within the lease, even while its connection stays open (a frozen process keeps its
-- sessions). A standby takes an expired lease with the next term (orchestrator/leadership.py).
-- NULL: nobody has led since.
ALTER TABLE orchestrator_term ADD COLUMN lease_expires_at timestamptz;
