-- The seed document's table, exactly as it gives it. IF NOT EXISTS makes this a no-op on a
-- database that was created from the seed's DDL, so vidpoll adopts it in place. The index
-- name is the one PostgreSQL picks for the seed's unnamed `CREATE INDEX ON video_jobs ...`.
-- vidpoll: step
CREATE TABLE IF NOT EXISTS video_jobs (
  job_id        text PRIMARY KEY,
  state         text NOT NULL DEFAULT 'pending',
  next_poll_at  timestamptz NOT NULL DEFAULT now() + interval '15 seconds'
);
-- vidpoll: step no-transaction
CREATE INDEX CONCURRENTLY IF NOT EXISTS video_jobs_next_poll_at_idx
  ON video_jobs (next_poll_at) WHERE state = 'pending';
