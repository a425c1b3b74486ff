-- What a durable record of paid jobs needs beyond the seed's three columns.
-- Every ADD COLUMN has a constant or STABLE default, so PostgreSQL (11+) adds it without
-- rewriting the table: the ACCESS EXCLUSIVE lock is held for milliseconds, not a table scan.
-- Rows that existed before this migration get the migration time as created_at/polling_since.
-- Each step that needs video_jobs' ACCESS EXCLUSIVE lock is one short transaction of its own
-- (vidpoll.schema retries it if the lock is not granted within its lock_timeout).
-- vidpoll: step
ALTER TABLE video_jobs
  ADD COLUMN IF NOT EXISTS created_at         timestamptz NOT NULL DEFAULT now(),
  ADD COLUMN IF NOT EXISTS updated_at         timestamptz NOT NULL DEFAULT now(),
  -- the max-polling-age clock; `jobs resume` restarts it, created_at never moves
  ADD COLUMN IF NOT EXISTS polling_since      timestamptz NOT NULL DEFAULT now(),
  ADD COLUMN IF NOT EXISTS finished_at        timestamptz,
  -- three separate counters: answers read, failures in a row (drive backoff), 404s in a row
  ADD COLUMN IF NOT EXISTS polls              integer NOT NULL DEFAULT 0,
  ADD COLUMN IF NOT EXISTS consecutive_errors integer NOT NULL DEFAULT 0,
  ADD COLUMN IF NOT EXISTS errors_total       integer NOT NULL DEFAULT 0,
  ADD COLUMN IF NOT EXISTS not_found_count    integer NOT NULL DEFAULT 0,
  ADD COLUMN IF NOT EXISTS last_polled_at     timestamptz,
  ADD COLUMN IF NOT EXISTS last_http_status   integer,
  ADD COLUMN IF NOT EXISTS last_error_class   text,
  ADD COLUMN IF NOT EXISTS last_error         text,
  ADD COLUMN IF NOT EXISTS last_request_id    text,
  -- Sume's own status word, lower-cased, and the last body it sent (nothing is lost)
  ADD COLUMN IF NOT EXISTS provider_status    text,
  ADD COLUMN IF NOT EXISTS last_response      jsonb,
  -- the fencing token of the current claim; NULL when nobody owns the row
  ADD COLUMN IF NOT EXISTS claim_token        uuid,
  ADD COLUMN IF NOT EXISTS claimed_by         text,
  ADD COLUMN IF NOT EXISTS claimed_at         timestamptz;

-- Every pending row is updated every few seconds (claim, then record). Free space on each page
-- lets PostgreSQL keep new row versions on the same page, and an aggressive per-table
-- autovacuum keeps dead versions from bloating the table and its partial index.
-- vidpoll: step
ALTER TABLE video_jobs SET (
  fillfactor = 80,
  autovacuum_vacuum_scale_factor = 0.02,
  autovacuum_vacuum_threshold = 500,
  autovacuum_analyze_scale_factor = 0.05,
  autovacuum_vacuum_cost_delay = 1
);

-- NOTIFY is a wake-up hint for idle workers; they also sleep until the next due time, so a
-- missed notification only delays a read, never loses one. Only new rows and rows made due
-- sooner by someone other than a worker (resume, poll-now, an operator) notify: a worker's own
-- claim and record writes change claim_token and stay silent, so a busy fleet sends nothing.
-- vidpoll: step
CREATE OR REPLACE FUNCTION vidpoll_notify_jobs() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('vidpoll_jobs', '');
  RETURN NULL;
END
$$;

-- vidpoll: step
DROP TRIGGER IF EXISTS vidpoll_jobs_inserted ON video_jobs;
CREATE TRIGGER vidpoll_jobs_inserted
  AFTER INSERT ON video_jobs
  FOR EACH STATEMENT EXECUTE FUNCTION vidpoll_notify_jobs();

-- vidpoll: step
DROP TRIGGER IF EXISTS vidpoll_jobs_made_due ON video_jobs;
CREATE TRIGGER vidpoll_jobs_made_due
  AFTER UPDATE ON video_jobs
  FOR EACH ROW
  WHEN (NEW.state = 'pending'
        AND (OLD.state IS DISTINCT FROM 'pending' OR NEW.next_poll_at < OLD.next_poll_at)
        AND NEW.claim_token IS NOT DISTINCT FROM OLD.claim_token)
  EXECUTE FUNCTION vidpoll_notify_jobs();
