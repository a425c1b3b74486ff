-- The job table's own queries (vidpoll.store.jobs): claim, record, release, track, poke,
-- look up and list jobs; beside it, idle.sql (an idle poller's probes) and lookup.sql.
-- Parameters are named (%(job_id)s); `now` may be passed to inject time in tests, else NULL.
-- Webhooks (0005): a hint that makes a job due now; polling stays the source of truth.

-- name: claim_due
-- One statement claims a batch of one account's rows. With lease_s set (lease mode) the claim is committed at once
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
    -- one account per claim (its key, its budget), along (account, next_poll_at)
    AND account = %(account)s
    -- a server-side pause (a 429, or RateLimit-Remaining: 0) stops every worker's reads of
    -- that account until the server's reset: one probe, evaluated once, before any row
    AND NOT EXISTS (SELECT 1 FROM vidpoll_rate_buckets b
                    WHERE b.account = %(account)s AND b.kind = 'status'
                      AND b.paused_until > clock_timestamp())
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
          j.consecutive_errors, j.not_found_count, j.account,
          -- what the provider's reads of this job need beyond its id (0016; NULL for most)
          j.handle,
          -- which render times plan its reads, and its age (0018)
          j.created_at, j.model, j.duration_key,
          -- how late the claim is, by the database's clock (no worker clock skew in it)
          extract(epoch FROM coalesce(%(now)s::timestamptz, clock_timestamp())
                             - due.next_poll_at)::float8 AS late_s;

-- name: record_outcomes
-- Writes a batch of read results in one statement. The WHERE clause is the fence: a row is
-- written only if it still carries this claim's token and is still pending, so a worker whose
-- lease ran out (and whose row another worker has claimed since) cannot overwrite newer state.
-- RETURNING tells the caller which writes landed; the others are counted as fenced out.
-- The batch arrives as one JSON array of objects (cheaper to send than eleven arrays).
WITH o AS (
  SELECT o.*,
         -- when the answer arrived: the hint counts from the answer, not from this write nor
         -- (lock mode) from the claim's transaction, whose now() is the claim's time. age_s
         -- is measured on the worker's monotonic clock, so no clock skew enters
         coalesce(%(now)s::timestamptz,
                  clock_timestamp() - make_interval(secs => o.age_s)) AS answered_at
  FROM jsonb_to_recordset(%(outcomes)s::jsonb)
       AS o(job_id text, claim_token uuid, state text, delay_s float8, read_ok bool,
            http_status int, error_class text, error text, provider_status text, body jsonb,
            request_id text, age_s float8, succeeded bool, outcome text, inline bool,
            cost numeric, provider_cost numeric, provider_cost_unit text,
            render_s float8, poll_reason text, overdue_after_s float8)
)
UPDATE video_jobs AS j
SET state = o.state,
    -- the neutral outcome (0014): what results, deliveries, hooks and metrics go by
    outcome = o.outcome,
    -- what the ended job cost (0017): the worker's figure; NULL lets the spend trigger put
    -- the estimate reserved for it
    cost = CASE WHEN o.state = 'pending' THEN j.cost ELSE o.cost END,
    provider_cost = CASE WHEN o.state = 'pending' THEN j.provider_cost ELSE o.provider_cost END,
    provider_cost_unit = CASE WHEN o.state = 'pending' THEN j.provider_cost_unit
                              ELSE o.provider_cost_unit END,
    -- a webhook poked the row while this read was in flight: read it again at once
    next_poll_at = CASE WHEN o.state = 'pending'
                        THEN o.answered_at + make_interval(
                               secs => CASE WHEN j.poked_at > j.claimed_at THEN 0
                                            ELSE o.delay_s END)
                        ELSE j.next_poll_at END,
    poked_at = NULL,
    -- why the next read is when it is, and when the job becomes overdue (0018): the plan of
    -- its group (its p99 times the account's factor), set once; the last read that saw it
    -- running (its render time's bound); the provider's own render time
    poll_reason = CASE WHEN o.state = 'pending' THEN o.poll_reason ELSE NULL END,
    overdue_at = coalesce(j.overdue_at,
                          j.created_at + make_interval(secs => o.overdue_after_s)),
    running_seen_at = CASE WHEN o.read_ok AND o.state = 'pending' THEN o.answered_at
                           ELSE j.running_seen_at END,
    render_s = CASE WHEN o.state = 'pending' THEN j.render_s ELSE o.render_s END,
    finished_at = CASE WHEN o.state = 'pending' THEN NULL ELSE o.answered_at END,
    updated_at = coalesce(%(now)s::timestamptz, clock_timestamp()),
    last_polled_at = o.answered_at,
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
    claim_token = NULL,
    -- every succeeded job's result is queued, whichever worker saw it succeed; workers
    -- started with --fetch-results fetch them. `inline`: the provider's status answer is the
    -- result (ResultSource.INLINE), stored now: there is nothing to fetch
    result_state = CASE WHEN o.inline THEN 'fetched'
                        WHEN o.succeeded THEN 'pending' ELSE j.result_state END,
    result = CASE WHEN o.inline THEN o.body ELSE j.result END,
    result_fetched_at = CASE WHEN o.inline THEN o.answered_at ELSE j.result_fetched_at END,
    result_next_at = CASE WHEN o.succeeded AND NOT o.inline THEN o.answered_at
                          ELSE j.result_next_at END
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

-- name: has_pending
-- For --drain: is any row still being polled (claimed or not)?
SELECT EXISTS (SELECT 1 FROM video_jobs
               WHERE state = 'pending' AND account = ANY(%(accounts)s::text[]))
    OR (%(results)s AND EXISTS (SELECT 1 FROM video_jobs
                                WHERE result_state = 'pending'
                                  AND account = ANY(%(accounts)s::text[]))) AS has_pending;

-- name: insert_job
-- Tracks a job id the provider returned. ON CONFLICT keeps the first row: a job id we already
-- have is never reset, so re-adding after a crash cannot restart polling or lose the record.
INSERT INTO video_jobs (job_id, state, next_poll_at, account, provider)
VALUES (%(job_id)s, 'pending',
        coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(delay_s)s::float8),
        %(account)s, %(provider)s)
ON CONFLICT (job_id) DO NOTHING
RETURNING job_id;

-- name: resume_job
-- Puts a gave_up / not_found row back to polling now, with fresh counters and a fresh max-age
-- clock. Only vidpoll's own terminal states: no worker holds such a row (only pending rows are
-- claimed, and a record clears the token), so nothing in flight can overwrite the reset. A
-- pending row is not reset here (a worker may be reading it: a reset would make it due beside
-- that read, and the read's record, computed from the old counters, would undo the reset);
-- the caller pokes it as poll_now does. A row with Sume's own terminal state is left alone.
UPDATE video_jobs
SET state = 'pending', next_poll_at = coalesce(%(now)s::timestamptz, now()), finished_at = NULL,
    polling_since = coalesce(%(now)s::timestamptz, now()), consecutive_errors = 0,
    not_found_count = 0, updated_at = coalesce(%(now)s::timestamptz, now()), claim_token = NULL
WHERE job_id = %(job_id)s AND state IN ('gave_up', 'not_found')
RETURNING job_id;

-- name: get_job
-- One row, every column, for `jobs show` and tests.
SELECT * FROM video_jobs WHERE job_id = %(job_id)s;

-- name: webhook_receive
-- One delivery, in one statement: record the event (a repeat of its id or of its signature
-- changes nothing; the signature is the `v1=<hex>` value that verified, so a replay whose
-- header is re-spaced or re-ordered is still a repeat, and rows stored before, the raw header
-- of Sume's usual single value, compare equal to it) and, for a new one, poke its pending job:
-- an unclaimed row is made due now (the NOTIFY trigger on "made due sooner" wakes idle
-- workers); a row a worker is reading gets poked_at, and that read's record makes it due
-- again at once. The UPDATE re-checks the row after any lock wait, so a lock-mode read in
-- flight is handled like a leased one.
WITH event AS (
  INSERT INTO vidpoll_webhook_events (event_id, job_id, effect, signature)
  SELECT %(event_id)s, %(job_id)s,
         CASE WHEN j.job_id IS NULL THEN 'unknown'
              WHEN j.state <> 'pending' THEN 'finished'
              ELSE 'poked' END,
         %(signature)s
  FROM (SELECT 1) AS one
  LEFT JOIN video_jobs j ON j.job_id = %(job_id)s
  ON CONFLICT DO NOTHING
  RETURNING effect
), poke AS (
  UPDATE video_jobs
  SET next_poll_at = CASE WHEN claim_token IS NULL THEN least(next_poll_at, now())
                          ELSE next_poll_at END,
      poked_at = now()
  WHERE job_id = %(job_id)s AND state = 'pending' AND EXISTS (SELECT 1 FROM event)
  RETURNING claim_token IS NULL AS made_due
)
SELECT (SELECT effect FROM event) AS effect,
       coalesce((SELECT made_due FROM poke), false) AS made_due;

-- name: webhook_hint
-- An unsigned delivery (Luma's callbacks): nothing is recorded, and only a pending job of
-- that provider is poked, at most once every %(gap_s)s seconds (the provider's retries of one
-- update, or anyone's repeats, cost one poke): an unclaimed row is made due now; a row a
-- worker is reading gets poked_at, and that read's record makes it due again at once.
WITH j AS (
  SELECT job_id, state, poked_at FROM video_jobs
  WHERE job_id = %(job_id)s AND provider = %(provider)s
), poke AS (
  UPDATE video_jobs v
  SET next_poll_at = CASE WHEN v.claim_token IS NULL THEN least(v.next_poll_at, now())
                          ELSE v.next_poll_at END,
      poked_at = now()
  FROM j
  WHERE v.job_id = j.job_id AND v.state = 'pending'
    AND (v.poked_at IS NULL OR v.poked_at < now() - make_interval(secs => %(gap_s)s::float8))
  RETURNING v.claim_token IS NULL AS made_due
)
SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM j) THEN 'unknown'
            WHEN (SELECT state FROM j) <> 'pending' THEN 'finished'
            WHEN EXISTS (SELECT 1 FROM poke) THEN 'poked'
            ELSE 'duplicate' END AS effect,
       coalesce((SELECT made_due FROM poke), false) AS made_due;

-- name: job_history
-- One job's events, oldest first (`jobs show`).
SELECT at, kind, from_state, to_state, error_class, http_status, detail
FROM video_job_events WHERE job_id = %(job_id)s ORDER BY id;

-- name: list_pending
-- Pending rows in due order (the partial index), after a keyset cursor: stays fast at any depth.
SELECT job_id, state, account, next_poll_at, polls, consecutive_errors, last_error_class,
       last_http_status, provider_status, created_at, finished_at, claimed_by, claim_token,
       cost
FROM video_jobs
WHERE state = 'pending'
  AND (%(account)s::text IS NULL OR account = %(account)s)
  -- the first condition bounds the index scan (the row comparison alone would only filter)
  AND (%(after_at)s::timestamptz IS NULL OR next_poll_at >= %(after_at)s::timestamptz)
  AND (%(after_at)s::timestamptz IS NULL
       OR (next_poll_at, job_id) > (%(after_at)s::timestamptz, %(after_id)s::text))
ORDER BY next_poll_at, job_id
LIMIT %(limit)s;

-- name: list_finished
-- Finished rows (one final state, or all of them), newest first, through the partial index
-- on finished_at, after a keyset cursor.
SELECT job_id, state, account, next_poll_at, polls, consecutive_errors, last_error_class,
       last_http_status, provider_status, created_at, finished_at, claimed_by, claim_token,
       cost
FROM video_jobs
WHERE state <> 'pending'
  AND (%(state)s::text IS NULL OR state = %(state)s)
  AND (%(account)s::text IS NULL OR account = %(account)s)
  AND (%(after_at)s::timestamptz IS NULL
       OR (finished_at, job_id) < (%(after_at)s::timestamptz, %(after_id)s::text))
ORDER BY finished_at DESC, job_id DESC
LIMIT %(limit)s;

-- name: list_all
-- Every row by job id (the primary key), after a keyset cursor.
SELECT job_id, state, account, next_poll_at, polls, consecutive_errors, last_error_class,
       last_http_status, provider_status, created_at, finished_at, claimed_by, claim_token,
       cost
FROM video_jobs
WHERE (%(account)s::text IS NULL OR account = %(account)s)
  AND (%(after_id)s::text IS NULL OR job_id > %(after_id)s)
ORDER BY job_id
LIMIT %(limit)s;

-- name: list_finished_oldest
-- list_finished oldest first: the same index, scanned backwards.
SELECT job_id, state, account, next_poll_at, polls, consecutive_errors, last_error_class,
       last_http_status, provider_status, created_at, finished_at, claimed_by, claim_token,
       cost
FROM video_jobs
WHERE state <> 'pending'
  AND (%(state)s::text IS NULL OR state = %(state)s)
  AND (%(account)s::text IS NULL OR account = %(account)s)
  AND (%(after_at)s::timestamptz IS NULL
       OR (finished_at, job_id) > (%(after_at)s::timestamptz, %(after_id)s::text))
ORDER BY finished_at, job_id
LIMIT %(limit)s;

-- name: list_created_newest
-- Every row (or the pending ones) newest first, `jobs list`'s default, after a keyset cursor:
-- no index on created_at (none is worth its writes for an operator's listing), so each page
-- is one scan and a top-N sort, the same cost at any depth.
SELECT job_id, state, account, next_poll_at, polls, consecutive_errors, last_error_class,
       last_http_status, provider_status, created_at, finished_at, claimed_by, claim_token,
       cost
FROM video_jobs
WHERE (%(account)s::text IS NULL OR account = %(account)s)
  AND (NOT %(pending_only)s::bool OR state = 'pending')
  AND (%(after_at)s::timestamptz IS NULL
       OR (created_at, job_id) < (%(after_at)s::timestamptz, %(after_id)s::text))
ORDER BY created_at DESC, job_id DESC
LIMIT %(limit)s;

-- name: list_created_oldest
-- list_created_newest oldest first.
SELECT job_id, state, account, next_poll_at, polls, consecutive_errors, last_error_class,
       last_http_status, provider_status, created_at, finished_at, claimed_by, claim_token,
       cost
FROM video_jobs
WHERE (%(account)s::text IS NULL OR account = %(account)s)
  AND (NOT %(pending_only)s::bool OR state = 'pending')
  AND (%(after_at)s::timestamptz IS NULL
       OR (created_at, job_id) > (%(after_at)s::timestamptz, %(after_id)s::text))
ORDER BY created_at, job_id
LIMIT %(limit)s;

-- name: poll_now
-- `jobs poll-now` and the dashboard's button: a pending row is made due now (the NOTIFY
-- trigger wakes idle workers); one a worker is reading right now is marked, and that read's
-- record makes it due again at once (as a webhook does). Nothing else changes.
UPDATE video_jobs
SET next_poll_at = CASE WHEN claim_token IS NULL THEN least(next_poll_at, now())
                        ELSE next_poll_at END,
    poked_at = now()
WHERE job_id = %(job_id)s AND state = 'pending'
RETURNING job_id, claim_token IS NULL AS made_due;

-- name: get_archived_job
-- One archived row, for `jobs show` of a pruned job.
SELECT * FROM video_jobs_archive WHERE job_id = %(job_id)s;
