-- Every query vidpoll runs at runtime, one `-- name: ...` block each (loaded by vidpoll.sql).
-- Parameters are named (%(job_id)s); `now` may be passed to inject time in tests, else NULL.

-- name: claim_due
-- One statement claims a batch. With lease_s set (lease mode) the claim is committed at once
-- and the lease *is* the schedule: next_poll_at moves past the lease, so a worker that dies
-- simply leaves the row due again when the lease ends; no rescuer process exists to race.
-- With lease_s NULL (lock mode) next_poll_at is untouched and the caller keeps the
-- transaction, and so the row locks, open for the HTTP read, as the seed's loop does.
-- Either way a fresh claim_token fences every later write on this claim.
WITH due AS (
  -- the seed's predicate and order, served by the partial index on next_poll_at;
  -- SKIP LOCKED makes concurrent workers pass over each other's rows instead of waiting
  SELECT ctid, next_poll_at
  FROM video_jobs
  WHERE state = 'pending'
    AND next_poll_at <= coalesce(%(now)s::timestamptz, now())
  ORDER BY next_poll_at
  LIMIT %(limit)s
  FOR UPDATE SKIP LOCKED
)
UPDATE video_jobs AS j
SET next_poll_at = CASE
      WHEN %(lease_s)s::float8 IS NULL THEN j.next_poll_at
      ELSE coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(lease_s)s::float8)
    END,
    claim_token = gen_random_uuid(),
    claimed_by = %(worker_id)s,
    claimed_at = coalesce(%(now)s::timestamptz, now())
FROM due
-- join on the physical row id the CTE locked: a TID lookup per row, never a scan of the table
-- (a join on job_id lets the planner pick a hash join over the whole table when it is small)
WHERE j.ctid = due.ctid
RETURNING j.job_id, j.claim_token, due.next_poll_at AS due_at, j.polling_since, j.polls,
          j.consecutive_errors, j.not_found_count;

-- name: record_outcomes
-- Writes a batch of read results in one statement. The WHERE clause is the fence: a row is
-- written only if it still carries this claim's token and is still pending, so a worker whose
-- lease ran out (and whose row another worker has claimed since) cannot overwrite newer state.
-- RETURNING tells the caller which writes landed; the others are counted as fenced out.
WITH o AS (
  SELECT *
  FROM unnest(%(job_ids)s::text[], %(tokens)s::uuid[], %(states)s::text[],
              %(delays_s)s::float8[], %(read_ok)s::bool[], %(http_statuses)s::int[],
              %(error_classes)s::text[], %(errors)s::text[], %(provider_statuses)s::text[],
              %(bodies)s::jsonb[], %(request_ids)s::text[])
       AS o(job_id, claim_token, state, delay_s, read_ok, http_status, error_class, error,
            provider_status, body, request_id)
)
UPDATE video_jobs AS j
SET state = o.state,
    next_poll_at = CASE WHEN o.state = 'pending'
                        THEN coalesce(%(now)s::timestamptz, now()) + make_interval(secs => o.delay_s)
                        ELSE j.next_poll_at END,
    finished_at = CASE WHEN o.state = 'pending' THEN NULL
                       ELSE coalesce(%(now)s::timestamptz, now()) END,
    updated_at = coalesce(%(now)s::timestamptz, now()),
    last_polled_at = coalesce(%(now)s::timestamptz, now()),
    polls = j.polls + CASE WHEN o.read_ok THEN 1 ELSE 0 END,
    consecutive_errors = CASE WHEN o.error_class IS NULL THEN 0 ELSE j.consecutive_errors + 1 END,
    errors_total = j.errors_total + CASE WHEN o.error_class IS NULL THEN 0 ELSE 1 END,
    not_found_count = CASE WHEN o.error_class = 'not_found' THEN j.not_found_count + 1 ELSE 0 END,
    last_http_status = o.http_status,
    last_error_class = o.error_class,
    last_error = coalesce(o.error, CASE WHEN o.error_class IS NULL THEN NULL ELSE j.last_error END),
    last_request_id = coalesce(o.request_id, j.last_request_id),
    provider_status = coalesce(o.provider_status, j.provider_status),
    last_response = coalesce(o.body, j.last_response),
    claim_token = NULL
FROM o
WHERE j.job_id = o.job_id
  AND j.claim_token = o.claim_token
  AND j.state = 'pending'
RETURNING j.job_id;

-- name: release_claims
-- Gives claimed rows back unread (shutdown before the read, or every read paused after a
-- 401/403): the row gets its old due time back and no counter moves. Fenced like a record.
UPDATE video_jobs AS j
SET next_poll_at = r.due_at, claim_token = NULL
FROM unnest(%(job_ids)s::text[], %(tokens)s::uuid[], %(due_ats)s::timestamptz[])
     AS r(job_id, claim_token, due_at)
WHERE j.job_id = r.job_id AND j.claim_token = r.claim_token AND j.state = 'pending'
RETURNING j.job_id;

-- name: next_due_in
-- Seconds until the earliest pending row is due (negative if overdue), by the database's clock
-- so worker clock skew does not matter; min() over the partial index is one index probe.
SELECT extract(epoch FROM min(next_poll_at) - now())::float8 AS next_due_in_s
FROM video_jobs WHERE state = 'pending';

-- name: has_pending
-- For --drain: is any row still being polled (claimed or not)?
SELECT EXISTS (SELECT 1 FROM video_jobs WHERE state = 'pending') AS has_pending;

-- name: insert_job
-- Tracks a job id Sume returned. ON CONFLICT keeps the first row: a job id we already have is
-- never reset, so re-adding after a crash cannot restart polling or lose the record.
INSERT INTO video_jobs (job_id, state, next_poll_at)
VALUES (%(job_id)s, 'pending',
        coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(delay_s)s::float8))
ON CONFLICT (job_id) DO NOTHING
RETURNING job_id;

-- name: resume_job
-- Puts a gave_up / not_found row (or a pending one) back to polling now, with fresh counters
-- and a fresh max-age clock. A row with Sume's own terminal state is left alone.
UPDATE video_jobs
SET state = 'pending', next_poll_at = coalesce(%(now)s::timestamptz, now()), finished_at = NULL,
    polling_since = coalesce(%(now)s::timestamptz, now()), consecutive_errors = 0,
    not_found_count = 0, updated_at = coalesce(%(now)s::timestamptz, now())
WHERE job_id = %(job_id)s AND state IN ('pending', 'gave_up', 'not_found')
RETURNING job_id;

-- name: get_job
-- One row, every column, for `jobs show` and tests.
SELECT * FROM video_jobs WHERE job_id = %(job_id)s;

-- name: count_by_state
-- Counts for the demo view and `jobs stats`.
SELECT state, count(*) AS n FROM video_jobs GROUP BY state ORDER BY state;

-- name: due_backlog
-- How many pending rows are due now and how late the oldest one is (index only on the partial).
SELECT count(*) AS due, extract(epoch FROM coalesce(%(now)s::timestamptz, now()) - min(next_poll_at))::float8 AS oldest_late_s
FROM video_jobs
WHERE state = 'pending' AND next_poll_at <= coalesce(%(now)s::timestamptz, now());

-- name: lock_migrations
-- Serialises concurrent `vidpoll migrate` runs; released when the transaction ends.
SELECT pg_advisory_xact_lock(7306198364525511);

-- name: lock_jobs_table
-- Taken before any DDL when a migration is pending. Taking the strongest lock first, instead
-- of letting each DDL statement upgrade a weaker one (CREATE INDEX IF NOT EXISTS takes SHARE),
-- avoids a deadlock with a seed-style loop that holds FOR UPDATE row locks and then UPDATEs:
-- that loop's UPDATE may jump the queue ahead of us, commit, and we proceed.
DO $$
BEGIN
  IF to_regclass('video_jobs') IS NOT NULL THEN
    LOCK TABLE video_jobs IN ACCESS EXCLUSIVE MODE;
  END IF;
END
$$;

-- name: create_migrations_table
-- The schema-version table: one row per applied migration file.
CREATE TABLE IF NOT EXISTS vidpoll_schema_migrations (
  version    integer PRIMARY KEY,
  name       text NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: applied_migrations
-- Versions already applied, to skip them.
SELECT version FROM vidpoll_schema_migrations ORDER BY version;

-- name: record_migration
-- Marks one migration file applied, in the same transaction as its DDL.
INSERT INTO vidpoll_schema_migrations (version, name) VALUES (%(version)s, %(name)s);

-- name: schema_table_exists
-- False on a database vidpoll never migrated (checked before reading the version table).
SELECT to_regclass('vidpoll_schema_migrations') IS NOT NULL AS present;

-- name: schema_version
-- The highest applied migration.
SELECT max(version) AS version FROM vidpoll_schema_migrations;

-- name: database_exists
-- Used before CREATE DATABASE (the embedded server, the demo, the test template).
SELECT 1 FROM pg_database WHERE datname = %(name)s;
