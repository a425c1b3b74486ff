-- Deliveries handed back by a worker that is shutting down (src/vidpoll/deliver.py: a grace
-- period ends before a download or hook does).

-- name: release_delivery
-- A running delivery given back by its stopping worker: its lease ends, and it is due again
-- `delay_s` from now for any worker (0 for an attempt that was stopped; a few seconds for a
-- sync hook whose thread still runs until its process ends, which it does at once). Without
-- `error` the try the claim counted is given back (attempts - 1): a shutdown is no fault of
-- the delivery and must not spend its retry budget; with one (a hook past its timeout) the try
-- counts and the error is kept. Fenced on the token like every write, so a lease that already
-- lapsed (and may be another worker's) is left alone; the NOTIFY wakes the other workers.
WITH d AS (
  UPDATE vidpoll_deliveries
  SET next_at = clock_timestamp() + make_interval(secs => %(delay_s)s::float8),
      attempts = CASE WHEN %(error)s::text IS NULL THEN greatest(attempts - 1, 0)
                      ELSE attempts END,
      last_error = coalesce(%(error)s::text, last_error),
      token = NULL
  WHERE job_id = %(job_id)s AND consumer = %(consumer)s AND token = %(token)s
    AND state = 'pending'
  RETURNING job_id
)
SELECT job_id, pg_notify('vidpoll_job_done', job_id) IS NULL AS notified FROM d;
