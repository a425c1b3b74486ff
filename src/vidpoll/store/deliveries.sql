-- Results (0007): fetched after completion, from their own small leased queue.
-- Deliveries (0008): one per registered consumer (a hook, the downloads) and finished job.
-- Run by vidpoll.store.deliveries; a delivery handed back at shutdown: deliver_shutdown.sql.

-- name: claim_results
-- Like claim_due, for completed jobs whose result is still to fetch: the lease is the schedule
-- (result_next_at moves past it) and result_token fences the write.
WITH due AS (
  SELECT ctid FROM video_jobs
  WHERE result_state = 'pending' AND account = %(account)s
    AND result_next_at <= coalesce(%(now)s::timestamptz, now())
    -- result reads are reads: a server pause of the account's reads stops them too
    AND NOT EXISTS (SELECT 1 FROM vidpoll_rate_buckets b
                    WHERE b.account = %(account)s AND b.kind = 'status'
                      AND b.paused_until > clock_timestamp())
  ORDER BY result_next_at
  LIMIT %(limit)s
  FOR UPDATE SKIP LOCKED
)
UPDATE video_jobs AS j
SET result_next_at = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(lease_s)s::float8),
    result_token = gen_random_uuid(),
    result_attempts = j.result_attempts + 1
FROM due
WHERE j.ctid = due.ctid
RETURNING j.job_id, j.result_token, j.result_attempts, j.account, j.handle;

-- name: record_result
-- One result fetch's outcome, fenced on its token: fetched (the body is stored), failed (gave
-- up, with the error), or pending again after a delay (409 not yet, 5xx, timeout, 429).
UPDATE video_jobs
SET result_state = %(state)s,
    result = coalesce(%(result)s, result),
    result_error = %(error)s,
    result_next_at = CASE WHEN %(state)s = 'pending'
                          THEN coalesce(%(now)s::timestamptz, now())
                               + make_interval(secs => %(delay_s)s::float8)
                          ELSE result_next_at END,
    result_fetched_at = CASE WHEN %(state)s = 'fetched'
                             THEN coalesce(%(now)s::timestamptz, now()) ELSE result_fetched_at END,
    result_token = NULL
WHERE job_id = %(job_id)s AND result_token = %(token)s AND result_state = 'pending'
RETURNING job_id;

-- name: register_consumer
-- A worker that runs a hook or downloads says so; from then on every terminal transition
-- queues a delivery for it (the trigger of 0008_deliveries.sql).
INSERT INTO vidpoll_consumers (name) VALUES (%(name)s)
ON CONFLICT (name) DO UPDATE SET last_seen_at = now()
RETURNING (xmax = 0) AS new;

-- name: claim_deliveries
-- Like claim_due, for one consumer's due deliveries; the lease is the schedule, the token the
-- fence. A completed job's deliveries wait for its result (a fresh one after an expired link),
-- and hooks wait for the job's download, so a hook sees the files. The job is joined inside
-- the locking CTE, so a delivery whose job row is gone never takes a slot of the LIMIT.
WITH due AS (
  SELECT d.job_id
  FROM vidpoll_deliveries d
  JOIN video_jobs j ON j.job_id = d.job_id
  WHERE d.consumer = %(consumer)s AND d.state = 'pending'
    AND d.next_at <= coalesce(%(now)s::timestamptz, now())
    AND j.result_state IS DISTINCT FROM 'pending'
    AND (d.consumer = 'download'
         OR NOT EXISTS (SELECT 1 FROM vidpoll_deliveries f
                        WHERE f.job_id = d.job_id AND f.consumer = 'download'
                          AND f.state = 'pending'))
  ORDER BY d.next_at
  LIMIT %(limit)s
  FOR UPDATE OF d SKIP LOCKED
)
UPDATE vidpoll_deliveries AS d
SET next_at = clock_timestamp() + make_interval(secs => %(lease_s)s::float8),
    token = gen_random_uuid(),
    attempts = d.attempts + 1
FROM due, video_jobs j
WHERE d.consumer = %(consumer)s AND d.job_id = due.job_id AND j.job_id = d.job_id
RETURNING d.job_id, d.consumer, d.token, d.attempts, d.generation, d.detail,
          j.state AS job_state, j.account, j.provider_status, j.result, j.result_state,
          j.outcome, j.provider,
          j.finished_at, j.created_at, j.polls, j.idempotency_key,
          -- what it cost (0017): `job.cost` in a hook
          j.cost, j.provider_cost, j.provider_cost_unit, j.tags,
          (SELECT f.detail FROM vidpoll_deliveries f
           WHERE f.job_id = d.job_id AND f.consumer = 'download' AND f.state = 'done') AS files;

-- name: record_delivery
-- One attempt's outcome, fenced on its token: done (with what was written), pending (retry
-- after delay_s, the error kept) or failed (gave up; `deliveries retry` re-queues it). If the
-- job ended again while this attempt ran (generation moved on), the delivery is due again at
-- once for the new state instead. With refresh_result, the job's result is fetched again first
-- (a media link expired), in the same statement, so the retry waits for a fresh link.
WITH d AS (
  UPDATE vidpoll_deliveries
  SET state = CASE WHEN generation <> %(generation)s THEN 'pending' ELSE %(state)s END,
      next_at = CASE WHEN generation <> %(generation)s THEN clock_timestamp()
                     WHEN %(state)s = 'pending'
                     THEN clock_timestamp() + make_interval(secs => %(delay_s)s::float8)
                     ELSE next_at END,
      last_error = CASE WHEN generation <> %(generation)s THEN NULL ELSE %(error)s END,
      detail = coalesce(%(detail)s, detail),
      done_at = CASE WHEN %(state)s = 'done' AND generation = %(generation)s THEN now()
                     ELSE NULL END,
      token = NULL
  WHERE job_id = %(job_id)s AND consumer = %(consumer)s AND token = %(token)s
    AND state = 'pending'
  RETURNING job_id
), r AS (
  UPDATE video_jobs j
  SET result_state = 'pending', result_next_at = now(), result_attempts = 0
  FROM d
  WHERE %(refresh_result)s AND j.job_id = d.job_id AND j.result_state IS DISTINCT FROM 'pending'
  RETURNING j.job_id
)
SELECT job_id FROM d;

-- name: next_delivery_due_in
-- Seconds until the earliest claimable delivery of these consumers is due; NULL if none.
-- The same gates as claim_deliveries, so a delivery waiting for its result is not "due".
SELECT extract(epoch FROM min(d.next_at) - now())::float8 AS next_due_in_s
FROM vidpoll_deliveries d
JOIN video_jobs j ON j.job_id = d.job_id
WHERE d.consumer = ANY(%(consumers)s::text[]) AND d.state = 'pending'
  AND j.result_state IS DISTINCT FROM 'pending'
  AND (d.consumer = 'download'
       OR NOT EXISTS (SELECT 1 FROM vidpoll_deliveries f
                      WHERE f.job_id = d.job_id AND f.consumer = 'download'
                        AND f.state = 'pending'));

-- name: pending_deliveries
-- For --drain: deliveries of these consumers not done yet, and how many are due within
-- `within_s` (a delivery backing off longer is left to a running worker).
SELECT count(*) AS pending,
       count(*) FILTER (WHERE next_at <= now() + make_interval(secs => %(within_s)s::float8))
         AS due_soon
FROM vidpoll_deliveries
WHERE consumer = ANY(%(consumers)s::text[]) AND state = 'pending';

-- name: job_deliveries
-- One job's deliveries, for `jobs show` and Job.files.
SELECT consumer, state, attempts, next_at, last_error, detail, done_at
FROM vidpoll_deliveries WHERE job_id = %(job_id)s ORDER BY consumer;

-- name: delivery_counts
-- Deliveries by consumer and state, and the oldest undone one, for `deliveries list`.
-- `waiting`: pending, but blocked on the job's result fetch or its download.
SELECT c.name AS consumer, c.last_seen_at,
       count(d.*) FILTER (WHERE d.state = 'pending') AS pending,
       count(d.*) FILTER (WHERE d.state = 'done') AS done,
       count(d.*) FILTER (WHERE d.state = 'failed') AS failed,
       count(d.*) FILTER (WHERE d.state = 'pending' AND d.last_error IS NOT NULL) AS retrying,
       count(d.*) FILTER (WHERE d.state = 'pending' AND (
         EXISTS (SELECT 1 FROM video_jobs j
                 WHERE j.job_id = d.job_id AND j.result_state = 'pending')
         OR (d.consumer <> 'download' AND EXISTS (
               SELECT 1 FROM vidpoll_deliveries f
               WHERE f.job_id = d.job_id AND f.consumer = 'download'
                 AND f.state = 'pending')))) AS waiting,
       min(d.created_at) FILTER (WHERE d.state = 'pending') AS oldest_pending
FROM vidpoll_consumers c
LEFT JOIN vidpoll_deliveries d ON d.consumer = c.name
GROUP BY c.name, c.last_seen_at
ORDER BY c.name;

-- name: failed_deliveries
-- The failed (given up) and retrying deliveries, newest first, with their errors.
SELECT job_id, consumer, state, attempts, next_at, last_error
FROM vidpoll_deliveries
WHERE (state = 'failed' OR (state = 'pending' AND last_error IS NOT NULL))
  AND (%(consumer)s::text IS NULL OR consumer = %(consumer)s)
ORDER BY next_at DESC
LIMIT %(limit)s;

-- name: retry_deliveries
-- `deliveries retry`: failed (or backing-off) deliveries due now, their tries reset. One
-- running right now (leased: a token and a lease not yet over) is left alone.
WITH r AS (
  UPDATE vidpoll_deliveries
  SET state = 'pending', next_at = now(), attempts = 0, token = NULL, last_error = NULL
  WHERE (state = 'failed' OR (state = 'pending' AND last_error IS NOT NULL))
    AND (token IS NULL OR next_at <= now())
    AND (%(consumer)s::text IS NULL OR consumer = %(consumer)s)
    AND (%(job_id)s::text IS NULL OR job_id = %(job_id)s)
  RETURNING job_id, consumer
)
SELECT r.*, pg_notify('vidpoll_job_done', r.job_id) IS NULL AS notified FROM r;

-- name: forget_consumer
-- `deliveries forget NAME`: a hook that no longer exists stops collecting deliveries; its
-- undone ones are removed (its done ones stay as a record).
WITH gone AS (DELETE FROM vidpoll_consumers WHERE name = %(name)s RETURNING name),
     dropped AS (DELETE FROM vidpoll_deliveries d USING gone
                 WHERE d.consumer = gone.name AND d.state <> 'done' RETURNING d.job_id)
SELECT (SELECT count(*) FROM gone) AS consumers, (SELECT count(*) FROM dropped) AS dropped;

-- name: extend_delivery
-- A running delivery (a long download, a slow hook) keeps its lease; no row means the lease
-- lapsed and another worker took it.
UPDATE vidpoll_deliveries
SET next_at = clock_timestamp() + make_interval(secs => %(lease_s)s::float8)
WHERE job_id = %(job_id)s AND consumer = %(consumer)s AND token = %(token)s
  AND state = 'pending'
RETURNING job_id;

-- name: delivery_backlog
-- The overview's cheap view of deliveries: pending (waiting on a result or a download,
-- retrying) and failed per consumer, through the partial indexes; no count of the done ones.
SELECT c.name AS consumer,
       (SELECT count(*) FROM vidpoll_deliveries d
        WHERE d.consumer = c.name AND d.state = 'pending') AS pending,
       (SELECT count(*) FROM vidpoll_deliveries d
        WHERE d.consumer = c.name AND d.state = 'pending' AND d.last_error IS NOT NULL)
         AS retrying,
       (SELECT count(*) FROM vidpoll_deliveries d
        WHERE d.consumer = c.name AND d.state = 'failed') AS failed
FROM vidpoll_consumers c
ORDER BY c.name;
