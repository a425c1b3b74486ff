-- Retention (`jobs prune`): why rows stay, and the history and webhook events it deletes.
-- Run by vidpoll.store.retention (with webhook.sql: may `vidpoll serve` prune them too).

-- name: prune_finished
-- `jobs prune`: one batch of rows finished before `before` moved to video_jobs_archive, in one
-- statement (the DELETE's rows are the INSERT's). Rows whose result or deliveries are still
-- to do stay: moving them would strand that work (prune_kept says why each stayed).
-- The columns are named: a column someone added to video_jobs is not archived (prune says
-- so) instead of failing the INSERT or landing in archived_at; a column a migration adds to
-- both tables is added here too (test_retention checks the list against the archive's).
WITH batch AS (
  SELECT job_id FROM video_jobs j
  WHERE j.state <> 'pending' AND j.finished_at < %(before)s::timestamptz
    AND j.result_state IS DISTINCT FROM 'pending'
    -- an id already archived (tracked again after a prune) stays: both records are kept
    AND NOT EXISTS (SELECT 1 FROM video_jobs_archive a WHERE a.job_id = j.job_id)
    AND NOT EXISTS (SELECT 1 FROM vidpoll_deliveries d
                    WHERE d.job_id = j.job_id AND d.state = 'pending')
  ORDER BY j.finished_at DESC, j.job_id DESC
  LIMIT %(batch)s
  FOR UPDATE SKIP LOCKED
), moved AS (
  DELETE FROM video_jobs j USING batch WHERE j.job_id = batch.job_id
  RETURNING j.*
)
INSERT INTO video_jobs_archive (  -- archived_at takes its default
  job_id, state, next_poll_at, created_at, updated_at, polling_since, finished_at, polls,
  consecutive_errors, errors_total, not_found_count, last_polled_at, last_http_status,
  last_error_class, last_error, last_request_id, provider_status, last_response, claim_token,
  claimed_by, claimed_at, idempotency_key, account, poked_at, result, result_state,
  result_next_at, result_attempts, result_token, result_error, result_fetched_at, provider,
  outcome, handle, cost, provider_cost, provider_cost_unit, tags, model, duration_key,
  render_s, poll_reason, overdue_at, running_seen_at)
SELECT
  job_id, state, next_poll_at, created_at, updated_at, polling_since, finished_at, polls,
  consecutive_errors, errors_total, not_found_count, last_polled_at, last_http_status,
  last_error_class, last_error, last_request_id, provider_status, last_response, claim_token,
  claimed_by, claimed_at, idempotency_key, account, poked_at, result, result_state,
  result_next_at, result_attempts, result_token, result_error, result_fetched_at, provider,
  outcome, handle, cost, provider_cost, provider_cost_unit, tags, model, duration_key,
  render_s, poll_reason, overdue_at, running_seen_at
FROM moved
RETURNING job_id;

-- name: prune_kept
-- After the archiving: why each row finished before `before` is still in video_jobs, one
-- reason per row (the first that applies), counted, with the consumer to blame and the oldest
-- finish. "Stale" work was due more than stale_s ago and nobody took it: no worker doing that
-- work is running. A job's download goes first (its hooks wait for it).
WITH kept AS (
  SELECT j.finished_at, d.consumer,
         CASE WHEN EXISTS (SELECT 1 FROM video_jobs_archive a WHERE a.job_id = j.job_id)
                THEN 'already_archived'
              WHEN j.result_state = 'pending'
                   AND j.result_next_at < now() - make_interval(secs => %(stale_s)s::float8)
                THEN 'result_unfetched'
              WHEN j.result_state = 'pending' THEN 'result_pending'
              WHEN d.consumer IS NOT NULL THEN d.reason
              ELSE 'busy' END AS reason
  FROM video_jobs j
  LEFT JOIN LATERAL (
    SELECT d.consumer,
           CASE WHEN c.name IS NULL THEN 'consumer_gone'
                WHEN d.next_at < now() - make_interval(secs => %(stale_s)s::float8)
                  THEN 'delivery_stalled'
                ELSE 'delivery_pending' END AS reason
    FROM vidpoll_deliveries d
    LEFT JOIN vidpoll_consumers c ON c.name = d.consumer
    WHERE d.job_id = j.job_id AND d.state = 'pending'
    ORDER BY c.name IS NULL DESC, d.consumer = 'download' DESC, d.next_at, d.consumer
    LIMIT 1
  ) d ON true
  WHERE j.state <> 'pending' AND j.finished_at < %(before)s::timestamptz
)
SELECT reason, consumer, count(*) AS n, min(finished_at) AS oldest_finished
FROM kept
GROUP BY reason, consumer
ORDER BY count(*) DESC, reason, consumer;

-- name: unarchived_columns
-- Columns of video_jobs that prune does not copy to the archive (added by someone, not by a
-- migration): their values are lost when a row is archived, and prune says so.
SELECT attname::text AS column_name
FROM pg_attribute
WHERE attrelid = 'video_jobs'::regclass AND attnum > 0 AND NOT attisdropped
  AND attname::text <> ALL(%(archived)s::text[])
ORDER BY attnum;

-- name: prune_job_events
-- One window of the history: the next `batch` events after `after_id` by the primary key (so
-- a run reads the table once, whatever it keeps), deleting those of jobs no longer in
-- video_jobs (archived, or deleted by hand) whose whole history is older than older_than_s
-- (by the database's clock); a job's history goes all at once, never half. Returns where the
-- window ended, how many of its events were that old, and how many of those it deleted (the
-- rest belong to jobs still in video_jobs). Ids follow insertion, so a window with no event
-- that old ends the run.
WITH cutoff AS (
  SELECT now() - make_interval(secs => %(older_than_s)s::float8) AS at
), scan AS (
  SELECT e.id, e.job_id, e.at < cutoff.at AS old
  FROM video_job_events e, cutoff
  WHERE e.id > %(after_id)s
  ORDER BY e.id
  LIMIT %(batch)s
), doomed AS (
  SELECT s.id FROM scan s, cutoff
  WHERE s.old
    AND NOT EXISTS (SELECT 1 FROM video_jobs j WHERE j.job_id = s.job_id)
    -- the job's history goes whole: none of its events may be newer
    AND NOT EXISTS (SELECT 1 FROM video_job_events n
                    WHERE n.job_id = s.job_id AND n.at >= cutoff.at)
), gone AS (
  DELETE FROM video_job_events e USING doomed WHERE e.id = doomed.id
  RETURNING e.id
)
SELECT max(s.id) AS last_id, count(*) AS scanned, count(*) FILTER (WHERE s.old) AS old,
       (SELECT count(*) FROM gone) AS deleted
FROM scan s;

-- name: prune_webhook_events
-- One window of the webhook events (the replay de-duplication) by event id, deleting those
-- received more than older_than_s ago by the database's clock (the caller keeps at least the
-- replay window: a delivery is accepted while its timestamp is within the tolerance of now,
-- either way).
WITH scan AS (
  SELECT event_id, received_at FROM vidpoll_webhook_events
  WHERE event_id > %(after)s
  ORDER BY event_id
  LIMIT %(batch)s
), gone AS (
  DELETE FROM vidpoll_webhook_events w USING scan s
  WHERE w.event_id = s.event_id
    AND s.received_at < now() - make_interval(secs => %(older_than_s)s::float8)
  RETURNING w.event_id
)
SELECT max(s.event_id) AS last_key, count(*) AS scanned, (SELECT count(*) FROM gone) AS deleted
FROM scan s;
