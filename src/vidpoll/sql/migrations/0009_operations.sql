-- What operating vidpoll needs: counters over time, an archive, and indexes for browsing.

-- Per-minute counters that every worker adds to every few seconds (one upsert per flush):
-- status reads by outcome (not_ready, final, or the error class) with their lateness, and
-- submissions by outcome. `jobs stats` and the dashboard chart the last hour from it; rows
-- older than a week are deleted by the flushes themselves.
-- vidpoll: step
CREATE TABLE IF NOT EXISTS vidpoll_minutes (
  minute     timestamptz NOT NULL,
  account    text NOT NULL,
  kind       text NOT NULL,        -- poll | submit | backlog
  outcome    text NOT NULL,
  n          bigint NOT NULL DEFAULT 0,
  late_sum_s float8 NOT NULL DEFAULT 0,
  late_max_s float8 NOT NULL DEFAULT 0,
  PRIMARY KEY (minute, kind, account, outcome)
) WITH (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.1);

-- `jobs prune` moves finished rows here: the record of a paid job is never deleted, only
-- moved off the hot table. Same columns as video_jobs (a test keeps them equal), plus when.
-- (New and empty: nothing writes to it before this migration is recorded.)
-- vidpoll: step
CREATE TABLE IF NOT EXISTS video_jobs_archive (LIKE video_jobs INCLUDING DEFAULTS);
ALTER TABLE video_jobs_archive
  ADD COLUMN IF NOT EXISTS archived_at timestamptz NOT NULL DEFAULT now();
DO $$ BEGIN
  ALTER TABLE video_jobs_archive ADD PRIMARY KEY (job_id);
EXCEPTION WHEN invalid_table_definition THEN NULL;  -- already there
END $$;

-- Every final row has finished_at, whoever ended it (the seed's own loop, an operator's UPDATE,
-- rows that ended before 0002 added the column): browsing and pruning go by it. The trigger
-- comes first, so a row that ends while the backfill runs is never missed.
-- vidpoll: step
CREATE OR REPLACE FUNCTION vidpoll_set_finished_at() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  NEW.finished_at := now();
  RETURN NEW;
END
$$;

-- vidpoll: step
DROP TRIGGER IF EXISTS vidpoll_jobs_finished_at ON video_jobs;
CREATE TRIGGER vidpoll_jobs_finished_at
  BEFORE INSERT OR UPDATE OF state ON video_jobs
  FOR EACH ROW
  WHEN (NEW.state <> 'pending' AND NEW.finished_at IS NULL)
  EXECUTE FUNCTION vidpoll_set_finished_at();

-- Rows that ended before the trigger: in batches of job ids, one transaction each.
-- vidpoll: step batched video_jobs job_id
UPDATE video_jobs SET finished_at = coalesce(last_polled_at, updated_at, created_at, now())
WHERE job_id BETWEEN %(first)s AND %(last)s AND state <> 'pending' AND finished_at IS NULL;

-- The overview's "recent errors" walks only error events, newest first.
-- vidpoll: step no-transaction
CREATE INDEX CONCURRENTLY IF NOT EXISTS video_job_events_errors_idx
  ON video_job_events (id DESC) WHERE kind = 'error';
-- Failed deliveries are few and looked for often.
-- vidpoll: step no-transaction
CREATE INDEX CONCURRENTLY IF NOT EXISTS vidpoll_deliveries_failed_idx
  ON vidpoll_deliveries (consumer) WHERE state = 'failed';

-- Finished rows, newest first: the dashboard's and `jobs list`'s browsing of them and `jobs
-- prune`. Partial, so a status read (which keeps a row pending) never writes to it. Built
-- after the backfill, which would otherwise write every finished row into it twice.
-- vidpoll: step no-transaction
CREATE INDEX CONCURRENTLY IF NOT EXISTS video_jobs_finished_idx
  ON video_jobs (finished_at DESC, job_id DESC) WHERE state <> 'pending';

-- The queue tables change on every claim and record: vacuum them early, leave room on pages.
-- vidpoll: step
ALTER TABLE video_intents SET (fillfactor = 80, autovacuum_vacuum_threshold = 200);
-- vidpoll: step
ALTER TABLE vidpoll_deliveries SET (autovacuum_vacuum_scale_factor = 0.05,
                                    autovacuum_vacuum_threshold = 200);
-- The bucket rows are few and updated on every claim: vacuum them almost at once.
-- vidpoll: step
ALTER TABLE vidpoll_rate_buckets SET (fillfactor = 50, autovacuum_vacuum_scale_factor = 0,
                                      autovacuum_vacuum_threshold = 500);
