-- Durable submission intents: a paid POST is recorded here, and committed, before it is sent.
-- An intent is `queued` until Sume answers 202 (then `submitted`, linked to its job row) or
-- rejects it for good (`rejected`, with Sume's error code, message and request_id).
-- vidpoll: step
CREATE TABLE IF NOT EXISTS video_intents (
  -- sent as Idempotency-Key on every attempt: a replay after an unknown outcome gets the job the
  -- first attempt started, never a second clip
  idempotency_key    text PRIMARY KEY,
  payload            jsonb NOT NULL,
  state              text NOT NULL DEFAULT 'queued'
                     CHECK (state IN ('queued', 'submitted', 'rejected')),
  -- higher goes first; within a priority, first in first out (seq is the insertion order)
  priority           integer NOT NULL DEFAULT 0,
  seq                bigint GENERATED ALWAYS AS IDENTITY,
  -- the schedule and the lease, as for jobs: a claim pushes it past the lease
  next_attempt_at    timestamptz NOT NULL DEFAULT now(),
  -- POSTs sent (or possibly sent: a crash after the claim counts); > 0 means a render may exist
  attempts           integer NOT NULL DEFAULT 0,
  consecutive_errors integer NOT NULL DEFAULT 0,
  claim_token        uuid,
  claimed_by         text,
  claimed_at         timestamptz,
  job_id             text,
  created_at         timestamptz NOT NULL DEFAULT now(),
  updated_at         timestamptz NOT NULL DEFAULT now(),
  submitted_at       timestamptz,
  rejected_at        timestamptz,
  last_http_status   integer,
  last_error_class   text,
  last_error         text,
  last_request_id    text,
  -- Sume's error envelope of a rejection, kept for the person who has to fix the request
  error_code         text,
  error_message      text
);

-- The submitter's queue: small (only queued intents), in claim order.
-- vidpoll: step no-transaction
CREATE INDEX CONCURRENTLY IF NOT EXISTS video_intents_queue_idx
  ON video_intents (priority DESC, seq) WHERE state = 'queued';
-- The job of a key is one column away; the key of a job is this index away.
-- vidpoll: step no-transaction
CREATE INDEX CONCURRENTLY IF NOT EXISTS video_intents_job_id_idx
  ON video_intents (job_id) WHERE job_id IS NOT NULL;

-- Which key created a job (NULL for ids added by hand or by the seed's own submit step).
-- vidpoll: step
ALTER TABLE video_jobs ADD COLUMN IF NOT EXISTS idempotency_key text;

-- Wake-ups for submitters: a new or re-queued intent, or a job leaving `pending` (a slot under
-- --max-active frees up). The payload of the jobs' terminal notice is the job id, so `submit
-- --wait` and wait() can listen for one job instead of re-reading the table.
-- vidpoll: step
CREATE OR REPLACE FUNCTION vidpoll_notify_intents() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('vidpoll_intents', '');
  RETURN NULL;
END
$$;

-- vidpoll: step
DROP TRIGGER IF EXISTS vidpoll_intents_queued ON video_intents;
CREATE TRIGGER vidpoll_intents_queued
  AFTER INSERT OR UPDATE OF state ON video_intents
  FOR EACH STATEMENT EXECUTE FUNCTION vidpoll_notify_intents();

-- vidpoll: step
CREATE OR REPLACE FUNCTION vidpoll_notify_job_done() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('vidpoll_job_done', NEW.job_id);
  RETURN NULL;
END
$$;

-- vidpoll: step
DROP TRIGGER IF EXISTS vidpoll_jobs_done ON video_jobs;
CREATE TRIGGER vidpoll_jobs_done
  AFTER UPDATE OF state ON video_jobs
  FOR EACH ROW
  WHEN (OLD.state = 'pending' AND NEW.state <> 'pending')
  EXECUTE FUNCTION vidpoll_notify_job_done();

-- vidpoll: step
ALTER TABLE video_intents SET (
  autovacuum_vacuum_scale_factor = 0.05,
  autovacuum_analyze_scale_factor = 0.05
);
