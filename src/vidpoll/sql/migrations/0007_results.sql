-- Results of completed jobs: GET /v1/jobs/{id}/result after Sume said `completed`, stored with
-- the job. Fetched by workers from their own small queue (result_state = 'pending'), leased
-- and fenced like status reads, so a crash or a 409 `job_not_completed` only means "later".
-- vidpoll: step
ALTER TABLE video_jobs
  ADD COLUMN IF NOT EXISTS result            jsonb,
  -- NULL: no result wanted; pending: to fetch; fetched; failed (gave up, see result_error)
  ADD COLUMN IF NOT EXISTS result_state      text,
  ADD COLUMN IF NOT EXISTS result_next_at    timestamptz,
  ADD COLUMN IF NOT EXISTS result_attempts   integer NOT NULL DEFAULT 0,
  ADD COLUMN IF NOT EXISTS result_token      uuid,
  ADD COLUMN IF NOT EXISTS result_error      text,
  ADD COLUMN IF NOT EXISTS result_fetched_at timestamptz;

-- vidpoll: step no-transaction
CREATE INDEX CONCURRENTLY IF NOT EXISTS video_jobs_result_due_idx
  ON video_jobs (account, result_next_at) WHERE result_state = 'pending';
