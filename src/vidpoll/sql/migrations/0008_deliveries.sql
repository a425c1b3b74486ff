-- Deliveries: what happens to a job after its terminal state, at least once, tracked here.
--
-- A consumer is `download` (media files to a directory) or `hook:<module:function>` (a user
-- function). A worker that runs one registers it; from then on every terminal transition adds
-- one delivery per registered consumer, in the same transaction as the transition (a trigger,
-- so no code path and no crash can skip it). Deliveries are leased and fenced like status
-- reads: the lease is the schedule, a crash makes the delivery due again.
-- vidpoll: step
CREATE TABLE IF NOT EXISTS vidpoll_consumers (
  name          text PRIMARY KEY,
  registered_at timestamptz NOT NULL DEFAULT now(),
  last_seen_at  timestamptz NOT NULL DEFAULT now()
);

-- vidpoll: step
CREATE TABLE IF NOT EXISTS vidpoll_deliveries (
  job_id     text NOT NULL,
  consumer   text NOT NULL,
  state      text NOT NULL DEFAULT 'pending',   -- pending | done | failed
  next_at    timestamptz NOT NULL DEFAULT now(),
  token      uuid,
  attempts   integer NOT NULL DEFAULT 0,
  -- bumped when the job ends again (resumed, then final again) while this delivery may be
  -- running: that run's "done" then re-queues it for the new state instead of closing it
  generation integer NOT NULL DEFAULT 0,
  last_error text,
  detail     jsonb,                              -- download: the files written
  created_at timestamptz NOT NULL DEFAULT now(),
  done_at    timestamptz,
  PRIMARY KEY (job_id, consumer)
) WITH (fillfactor = 80);  -- every attempt rewrites the row: leave room for HOT updates

-- vidpoll: step no-transaction
CREATE INDEX CONCURRENTLY IF NOT EXISTS vidpoll_deliveries_due_idx
  ON vidpoll_deliveries (consumer, next_at) WHERE state = 'pending';

-- vidpoll: step
CREATE OR REPLACE FUNCTION vidpoll_queue_deliveries() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  -- downloads only for completed jobs; hooks for every terminal state
  INSERT INTO vidpoll_deliveries (job_id, consumer)
  SELECT NEW.job_id, c.name FROM vidpoll_consumers c
  WHERE c.name <> 'download' OR NEW.state = 'completed'
  -- a job that ends again (resumed after giving up) is delivered again, with its new state;
  -- a run in progress keeps its lease (and token), its outcome is re-queued by generation
  ON CONFLICT (job_id, consumer) DO UPDATE
    SET state = 'pending', attempts = 0, last_error = NULL, done_at = NULL,
        generation = vidpoll_deliveries.generation + 1,
        next_at = CASE WHEN vidpoll_deliveries.token IS NULL
                         OR vidpoll_deliveries.state <> 'pending'
                       THEN now() ELSE vidpoll_deliveries.next_at END;
  RETURN NULL;
END
$$;

-- vidpoll: step
DROP TRIGGER IF EXISTS vidpoll_jobs_deliveries ON video_jobs;
CREATE TRIGGER vidpoll_jobs_deliveries
  AFTER UPDATE OF state ON video_jobs
  FOR EACH ROW
  WHEN (OLD.state = 'pending' AND NEW.state <> 'pending')
  EXECUTE FUNCTION vidpoll_queue_deliveries();

-- A result recorded (or given up on) unblocks the job's deliveries and wait(with_result=True):
-- the same channel as "job done", with the job id.
-- vidpoll: step
DROP TRIGGER IF EXISTS vidpoll_jobs_result_done ON video_jobs;
CREATE TRIGGER vidpoll_jobs_result_done
  AFTER UPDATE OF result_state ON video_jobs
  FOR EACH ROW
  WHEN (OLD.result_state = 'pending' AND NEW.result_state IS DISTINCT FROM 'pending')
  EXECUTE FUNCTION vidpoll_notify_job_done();

-- A result fetch queued again by a download whose link expired wakes idle workers (a worker
-- recording a completion queues one too, but it is awake anyway).
-- vidpoll: step
DROP TRIGGER IF EXISTS vidpoll_jobs_result_requeued ON video_jobs;
CREATE TRIGGER vidpoll_jobs_result_requeued
  AFTER UPDATE OF result_state ON video_jobs
  FOR EACH ROW
  WHEN (OLD.result_state IS DISTINCT FROM 'pending' AND NEW.result_state = 'pending'
        AND OLD.state <> 'pending')
  EXECUTE FUNCTION vidpoll_notify_jobs();

-- A download finished (or was given up): the job's hooks, which wait for it, may run now,
-- in whichever process runs them (the same notice as "job done", with the job id).
-- vidpoll: step
DROP TRIGGER IF EXISTS vidpoll_download_settled ON vidpoll_deliveries;
CREATE TRIGGER vidpoll_download_settled
  AFTER UPDATE OF state ON vidpoll_deliveries
  FOR EACH ROW
  WHEN (NEW.consumer = 'download' AND OLD.state = 'pending' AND NEW.state <> 'pending')
  EXECUTE FUNCTION vidpoll_notify_job_done();
