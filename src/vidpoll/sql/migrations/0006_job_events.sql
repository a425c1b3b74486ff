-- An append-only history of each job: when it was tracked, every change of state and every
-- change of error class (a run of the same error is one event; an answer after errors is a
-- "recovered" event), not every routine poll. Written by triggers, so the seed's own loop,
-- an operator's UPDATE and every vidpoll version are recorded alike.
-- vidpoll: step
CREATE TABLE IF NOT EXISTS video_job_events (
  id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  job_id      text NOT NULL,
  at          timestamptz NOT NULL DEFAULT clock_timestamp(),
  kind        text NOT NULL,            -- tracked | state | error | recovered
  from_state  text,
  to_state    text,
  error_class text,
  http_status integer,
  detail      text
);
-- vidpoll: step no-transaction
CREATE INDEX CONCURRENTLY IF NOT EXISTS video_job_events_job_idx ON video_job_events (job_id, id);

-- vidpoll: step
CREATE OR REPLACE FUNCTION vidpoll_job_event() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    INSERT INTO video_job_events (job_id, kind, to_state)
    VALUES (NEW.job_id, 'tracked', NEW.state);
  ELSIF NEW.state IS DISTINCT FROM OLD.state THEN
    INSERT INTO video_job_events (job_id, kind, from_state, to_state, error_class, http_status,
                                  detail)
    VALUES (NEW.job_id, 'state', OLD.state, NEW.state, NEW.last_error_class,
            NEW.last_http_status, NEW.provider_status);
  ELSIF NEW.last_error_class IS NOT NULL THEN
    INSERT INTO video_job_events (job_id, kind, to_state, error_class, http_status, detail)
    VALUES (NEW.job_id, 'error', NEW.state, NEW.last_error_class, NEW.last_http_status,
            left(NEW.last_error, 300));
  ELSE
    INSERT INTO video_job_events (job_id, kind, to_state, http_status)
    VALUES (NEW.job_id, 'recovered', NEW.state, NEW.last_http_status);
  END IF;
  RETURN NULL;
END
$$;

-- vidpoll: step
DROP TRIGGER IF EXISTS vidpoll_jobs_tracked_event ON video_jobs;
CREATE TRIGGER vidpoll_jobs_tracked_event
  AFTER INSERT ON video_jobs
  FOR EACH ROW EXECUTE FUNCTION vidpoll_job_event();

-- vidpoll: step
DROP TRIGGER IF EXISTS vidpoll_jobs_changed_event ON video_jobs;
CREATE TRIGGER vidpoll_jobs_changed_event
  AFTER UPDATE OF state, last_error_class ON video_jobs
  FOR EACH ROW
  WHEN (OLD.state IS DISTINCT FROM NEW.state
        OR OLD.last_error_class IS DISTINCT FROM NEW.last_error_class)
  EXECUTE FUNCTION vidpoll_job_event();
