-- Run webhooks: call the trigger function only for the statuses that have an event (running and
-- the terminal ones). Queued and starting have none; the function returned at once for them, but
-- calling it per row cost every dispatch a function call per run it started.

DROP TRIGGER runs_webhook_events ON runs;
CREATE TRIGGER runs_webhook_events AFTER UPDATE OF status ON runs
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status AND NEW.status IN (3, 10, 20, 30))
    EXECUTE FUNCTION runplane_webhook_events();
