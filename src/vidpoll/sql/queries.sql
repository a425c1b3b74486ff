-- Every query vidpoll runs at runtime, one `-- name: ...` block each (loaded by vidpoll.sql).
-- Parameters are named (%(job_id)s); `now` may be passed to inject time in tests, else NULL.

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
            request_id text, age_s float8, succeeded bool)
)
UPDATE video_jobs AS j
SET state = o.state,
    -- a webhook poked the row while this read was in flight: read it again at once
    next_poll_at = CASE WHEN o.state = 'pending'
                        THEN o.answered_at + make_interval(
                               secs => CASE WHEN j.poked_at > j.claimed_at THEN 0
                                            ELSE o.delay_s END)
                        ELSE j.next_poll_at END,
    poked_at = NULL,
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
    -- every completed job's result is queued, whichever worker saw it complete; workers
    -- started with --fetch-results fetch them
    -- `succeeded`: the provider's word says a video was made (completed, succeeded, ...)
    result_state = CASE WHEN o.succeeded THEN 'pending' ELSE j.result_state END,
    result_next_at = CASE WHEN o.succeeded THEN o.answered_at ELSE j.result_next_at END
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

-- name: can_vacuum_jobs
-- Whether this role may VACUUM video_jobs: the table's owner, the database's owner, a member
-- of either role, a superuser, or from PostgreSQL 17 a holder of MAINTAIN. A worker without
-- it leaves the table to autovacuum. CASE keeps PostgreSQL before 17 from evaluating the
-- privilege name it does not know.
SELECT pg_has_role(current_user, c.relowner, 'USAGE')
       OR pg_has_role(current_user, d.datdba, 'USAGE')
       OR CASE WHEN current_setting('server_version_num')::int >= 170000
               THEN has_table_privilege(c.oid, 'MAINTAIN') ELSE false END AS allowed
FROM pg_class c, pg_database d
WHERE c.oid = 'video_jobs'::regclass AND d.datname = current_database();

-- name: vacuum_jobs
-- Every poll writes two row versions that cannot be HOT (next_poll_at is indexed), and
-- autovacuum visits a database at most once per autovacuum_naptime (a minute by default),
-- so at thousands of polls a second the table and its partial indexes grow 15-fold between
-- visits (bench/bloat.py). Workers vacuum it themselves after a set number of row writes.
-- SKIP_LOCKED: if autovacuum or another worker is at it, this one steps aside.
-- TRUNCATE false: no end-of-table truncation, whose exclusive lock (replayed on replicas)
-- would come with every one of these frequent runs.
-- INDEX_CLEANUP ON: PostgreSQL skips the index pass while dead rows sit on fewer than 2 % of
-- the table's pages, which a small hot set among millions of finished rows always does: then
-- no vacuum (autovacuum's neither) ever cleans the hot partial indexes, and at 10,000 pending
-- rows among 5,000,000 finished ones they grew from 0.17 MB to 25-49 MB in 180 s
-- (bench/vacuum_scale.py); forced, they stayed at 2.3 MB. The pass reads every index whole
-- when there are dead rows to remove, so it costs more with more finished rows (0.45 s at 5M
-- here, when forced every 15 s): archive them (docs/SCALING.md).
VACUUM (SKIP_LOCKED, TRUNCATE false, INDEX_CLEANUP ON) video_jobs;

-- name: has_pending
-- For --drain: is any row still being polled (claimed or not)?
SELECT EXISTS (SELECT 1 FROM video_jobs
               WHERE state = 'pending' AND account = ANY(%(accounts)s::text[]))
    OR (%(results)s AND EXISTS (SELECT 1 FROM video_jobs
                                WHERE result_state = 'pending'
                                  AND account = ANY(%(accounts)s::text[]))) AS has_pending;

-- name: insert_job
-- Tracks a job id Sume returned. ON CONFLICT keeps the first row: a job id we already have is
-- never reset, so re-adding after a crash cannot restart polling or lose the record.
INSERT INTO video_jobs (job_id, state, next_poll_at, account)
VALUES (%(job_id)s, 'pending',
        coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(delay_s)s::float8),
        %(account)s)
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

-- name: count_by_state
-- Counts for the demo view and `jobs stats`.
SELECT state, count(*) AS n FROM video_jobs GROUP BY state ORDER BY state;

-- name: due_backlog
-- How many pending rows are due now and how late the oldest one is (index only on the partial).
SELECT count(*) AS due, extract(epoch FROM coalesce(%(now)s::timestamptz, now()) - min(next_poll_at))::float8 AS oldest_late_s
FROM video_jobs
WHERE state = 'pending' AND next_poll_at <= coalesce(%(now)s::timestamptz, now());

-- name: schema_table_exists
-- False on a database vidpoll never migrated (checked before reading the version table).
SELECT to_regclass('vidpoll_schema_migrations') IS NOT NULL AS present;

-- name: schema_version
-- The highest applied migration.
SELECT max(version) AS version FROM vidpoll_schema_migrations;

-- name: database_exists
-- Used before CREATE DATABASE (the embedded server, the demo, the test template).
SELECT 1 FROM pg_database WHERE datname = %(name)s;

-- ---------------------------------------------------------------------------------------------
-- Submission intents (0003): recorded before the paid POST, claimed like jobs.

-- name: insert_intent
-- Records an intent. ON CONFLICT keeps the first: a key we already have is never re-queued or
-- changed, so recording again after a crash or a re-run cannot send a second POST.
INSERT INTO video_intents (idempotency_key, payload, priority, account)
VALUES (%(key)s, %(payload)s, %(priority)s, %(account)s)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING idempotency_key;

-- name: insert_intents
-- The bulk path (`submit --file`): one statement per batch; returns the keys that were new.
INSERT INTO video_intents (idempotency_key, payload, priority, account)
SELECT k, p, pr, %(account)s
FROM unnest(%(keys)s::text[], %(payloads)s::jsonb[], %(priorities)s::int[]) AS u(k, p, pr)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING idempotency_key;

-- name: intent_payloads
-- The stored payloads of some keys, to tell a harmless re-run from a key reused for another
-- request.
SELECT idempotency_key, payload FROM video_intents WHERE idempotency_key = ANY(%(keys)s::text[]);

-- name: get_intent
SELECT * FROM video_intents WHERE idempotency_key = %(key)s;

-- name: get_intent_by_job
SELECT * FROM video_intents WHERE job_id = %(job_id)s ORDER BY seq LIMIT 1;

-- name: list_intents
SELECT * FROM video_intents
WHERE (%(state)s::text IS NULL OR state = %(state)s)
ORDER BY seq DESC
LIMIT %(limit)s;

-- name: lock_admission
-- Serialises admission decisions for one account fleet-wide for the rest of the transaction:
-- two submitters that each counted "one slot left" must not both take it.
SELECT pg_advisory_xact_lock(730619836, hashtext(%(account)s));

-- name: claim_intents
-- Claims one account's due intents for sending, committed at once (the lease is the schedule,
-- as for jobs); the cap counts that account's renders only (Sume caps each account).
-- An intent already attempted (attempts > 0), and an `unknown` one, may have started a render,
-- so it holds a slot under --max-active and is claimed without needing a new one; a fresh
-- intent needs a free slot. Unknown intents due go first (their slow schedule), then retries,
-- then fresh intents strictly in (priority DESC, seq) order; with %(key)s set only that
-- intent is considered, and only if no due fresh intent is ahead of it for the slots left.
WITH active AS (
  -- pending jobs and intents that may have started a render, each count bounded by the cap
  -- so the cost stays small however large the table is
  SELECT CASE WHEN %(max_active)s::int IS NULL THEN 0 ELSE
           (SELECT count(*) FROM (SELECT 1 FROM video_jobs
                                  WHERE state = 'pending' AND account = %(account)s
                                  LIMIT %(max_active)s::int) p)
         + (SELECT count(*) FROM (SELECT 1 FROM video_intents
                                  WHERE state = 'queued' AND attempts > 0
                                    AND account = %(account)s
                                  LIMIT %(max_active)s::int) q)
         + (SELECT count(*) FROM (SELECT 1 FROM video_intents
                                  WHERE state = 'unknown' AND account = %(account)s
                                  LIMIT %(max_active)s::int) u)
         END AS n
),
me AS (
  SELECT priority, seq FROM video_intents WHERE idempotency_key = %(key)s::text
),
ahead AS (
  -- due fresh intents that go before the one asked for by key (FIFO within priority)
  SELECT count(*) AS n FROM video_intents a, me
  WHERE a.state = 'queued' AND a.attempts = 0 AND a.account = %(account)s
    AND a.next_attempt_at <= coalesce(%(now)s::timestamptz, now())
    AND (a.priority > me.priority OR (a.priority = me.priority AND a.seq < me.seq))
),
paused AS (
  -- the server said stop (429, RateLimit-Remaining: 0): no create for this account until then
  SELECT EXISTS (SELECT 1 FROM vidpoll_rate_buckets
                 WHERE account = %(account)s AND kind = 'create'
                   AND paused_until > clock_timestamp()) AS yes
),
unknowns AS (
  -- refused after an unknown outcome: re-sent on their own slow schedule (the small partial
  -- index on (account, next_attempt_at))
  SELECT ctid FROM video_intents
  WHERE state = 'unknown' AND account = %(account)s
    AND NOT (SELECT yes FROM paused)
    AND next_attempt_at <= coalesce(%(now)s::timestamptz, now())
    AND (%(key)s::text IS NULL OR idempotency_key = %(key)s::text)
  ORDER BY next_attempt_at
  LIMIT %(limit)s
  FOR UPDATE SKIP LOCKED
),
retries AS (
  SELECT ctid FROM video_intents
  WHERE state = 'queued' AND attempts > 0 AND account = %(account)s
    AND NOT (SELECT yes FROM paused)
    AND next_attempt_at <= coalesce(%(now)s::timestamptz, now())
    AND (%(key)s::text IS NULL OR idempotency_key = %(key)s::text)
  ORDER BY priority DESC, seq
  LIMIT greatest(0, %(limit)s - (SELECT count(*) FROM unknowns))
  FOR UPDATE SKIP LOCKED
),
fresh AS (
  SELECT ctid FROM video_intents
  WHERE state = 'queued' AND attempts = 0 AND account = %(account)s
    AND NOT (SELECT yes FROM paused)
    AND next_attempt_at <= coalesce(%(now)s::timestamptz, now())
    AND (%(key)s::text IS NULL OR idempotency_key = %(key)s::text)
  ORDER BY priority DESC, seq
  LIMIT greatest(0, least(
    %(limit)s - (SELECT count(*) FROM unknowns) - (SELECT count(*) FROM retries),
    CASE WHEN %(max_active)s::int IS NULL THEN %(limit)s
         ELSE %(max_active)s::int - (SELECT n FROM active)
              - coalesce((SELECT n FROM ahead), 0) END))
  FOR UPDATE SKIP LOCKED
),
picked AS (SELECT ctid FROM unknowns UNION ALL SELECT ctid FROM retries
           UNION ALL SELECT ctid FROM fresh)
UPDATE video_intents AS i
-- the lease starts now, by the wall clock: now() is when the transaction began, before the wait
-- for the admission lock, and a lease that began in the past would end before the submitter
-- expects it to (and another one could send the same key while this one still waits)
SET next_attempt_at = coalesce(%(now)s::timestamptz, clock_timestamp())
                      + make_interval(secs => %(lease_s)s::float8),
    claim_token = gen_random_uuid(),
    claimed_by = %(worker_id)s,
    claimed_at = coalesce(%(now)s::timestamptz, now()),
    attempts = i.attempts + 1,
    -- a previous claim whose attempt was never recorded (its token is still set: the process
    -- died or hung with the POST possibly sent) is an unknown outcome too
    unknown_outcome_at = CASE WHEN i.claim_token IS NOT NULL AND i.attempts > 0
                              THEN coalesce(i.unknown_outcome_at,
                                            coalesce(%(now)s::timestamptz, now()))
                              ELSE i.unknown_outcome_at END,
    updated_at = coalesce(%(now)s::timestamptz, now())
FROM picked
WHERE i.ctid = picked.ctid
RETURNING i.idempotency_key, i.claim_token, i.payload, i.attempts, i.consecutive_errors,
          i.account, i.state,
          -- attempts > 1 (counted after this claim's increment): an earlier attempt was
          -- neither given back unsent (release_intent takes its count back) nor answered
          -- clearly (that ends the intent), so its outcome was unknown, even when a
          -- submitter from before 0010 recorded it without unknown_outcome_at (a rolling
          -- upgrade: migrate first, submitters restarted after)
          (i.unknown_outcome_at IS NOT NULL OR i.state = 'unknown' OR i.attempts > 1)
            AS outcome_unknown;

-- name: claim_unknown_intents
-- While an account's submitting is paused for credits (402), its `unknown` intents still go
-- out on their slow schedule (a top-up must bring their jobs back within minutes, and they
-- already hold their slots); nothing else of that account is claimed. Leased like
-- claim_intents; a server pause (429) stops these too.
WITH picked AS (
  SELECT ctid FROM video_intents
  WHERE state = 'unknown' AND account = %(account)s
    AND next_attempt_at <= coalesce(%(now)s::timestamptz, now())
    AND NOT EXISTS (SELECT 1 FROM vidpoll_rate_buckets
                    WHERE account = %(account)s AND kind = 'create'
                      AND paused_until > clock_timestamp())
  ORDER BY next_attempt_at
  LIMIT %(limit)s
  FOR UPDATE SKIP LOCKED
)
UPDATE video_intents AS i
SET next_attempt_at = coalesce(%(now)s::timestamptz, clock_timestamp())
                      + make_interval(secs => %(lease_s)s::float8),
    claim_token = gen_random_uuid(),
    claimed_by = %(worker_id)s,
    claimed_at = coalesce(%(now)s::timestamptz, now()),
    attempts = i.attempts + 1,
    updated_at = coalesce(%(now)s::timestamptz, now())
FROM picked
WHERE i.ctid = picked.ctid
RETURNING i.idempotency_key, i.claim_token, i.payload, i.attempts, i.consecutive_errors,
          i.account, i.state, true AS outcome_unknown;

-- name: admission
-- For `submit` and `intents stats`: how many renders of an account (NULL: all) may be
-- running, and what is queued. `unconfirmed`: intents attempted with no job yet, the
-- `unknown` ones included (they hold their slots too).
SELECT
  (SELECT count(*) FROM video_jobs WHERE state = 'pending'
     AND (%(account)s::text IS NULL OR account = %(account)s)) AS pending_jobs,
  (SELECT count(*) FROM video_intents
   WHERE ((state = 'queued' AND attempts > 0) OR state = 'unknown')
     AND (%(account)s::text IS NULL OR account = %(account)s)) AS unconfirmed,
  (SELECT count(*) FROM video_intents WHERE state = 'unknown'
     AND (%(account)s::text IS NULL OR account = %(account)s)) AS unknown,
  (SELECT count(*) FROM video_intents WHERE state = 'queued'
     AND (%(account)s::text IS NULL OR account = %(account)s)) AS queued;

-- name: intents_ahead
-- Queued intents that go out before this one (FIFO within priority).
SELECT count(*) AS n FROM video_intents a, video_intents me
WHERE me.idempotency_key = %(key)s AND a.state = 'queued' AND a.account = me.account
  AND a.idempotency_key <> me.idempotency_key
  AND (a.priority > me.priority OR (a.priority = me.priority AND a.seq < me.seq));

-- name: record_submitted
-- Sume answered 202 with a job id: the job row is inserted and the intent marked submitted in
-- one transaction, so a crash leaves either both or neither (and neither means the same key is
-- sent again, which returns this same job). The job row is written even if the intent's fence
-- failed: the id is Sume's answer for this key whoever asked, and a paid job must be tracked.
WITH job AS (
  INSERT INTO video_jobs (job_id, state, next_poll_at, idempotency_key, account)
  VALUES (%(job_id)s, 'pending',
          coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(delay_s)s::float8),
          %(key)s,
          coalesce((SELECT account FROM video_intents WHERE idempotency_key = %(key)s),
                   'default'))
  ON CONFLICT (job_id) DO UPDATE
    SET idempotency_key = coalesce(video_jobs.idempotency_key, EXCLUDED.idempotency_key)
  RETURNING (xmax = 0) AS inserted
), intent AS (
  UPDATE video_intents
  SET state = 'submitted', job_id = %(job_id)s,
      submitted_at = coalesce(%(now)s::timestamptz, now()),
      updated_at = coalesce(%(now)s::timestamptz, now()),
      consecutive_errors = 0, claim_token = NULL,
      last_http_status = %(http_status)s, last_error_class = NULL,
      last_request_id = coalesce(%(request_id)s, last_request_id)
  WHERE idempotency_key = %(key)s AND claim_token = %(token)s
    AND state IN ('queued', 'unknown')
  RETURNING idempotency_key
)
SELECT (SELECT bool_or(inserted) FROM job) AS job_inserted,
       EXISTS (SELECT 1 FROM intent) AS intent_updated;

-- name: record_intent_retry
-- An unknown outcome (timeout, 5xx, 429, ...): the intent stays queued and is sent again with
-- the same key after the delay, and it remembers the unknown outcome (a later refusal then
-- makes it `unknown`, not `rejected`). Fenced like job writes.
UPDATE video_intents
SET next_attempt_at = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(delay_s)s::float8),
    unknown_outcome_at = coalesce(unknown_outcome_at, coalesce(%(now)s::timestamptz, now())),
    consecutive_errors = consecutive_errors + 1,
    claim_token = NULL,
    updated_at = coalesce(%(now)s::timestamptz, now()),
    last_http_status = %(http_status)s, last_error_class = %(error_class)s,
    last_error = %(error)s, last_request_id = coalesce(%(request_id)s, last_request_id)
WHERE idempotency_key = %(key)s AND claim_token = %(token)s AND state = 'queued'
RETURNING idempotency_key;

-- name: record_intent_rejected
-- Sume refused the request in its own words (402, 422, ...): final until a person re-queues it.
UPDATE video_intents
SET state = 'rejected', rejected_at = coalesce(%(now)s::timestamptz, now()),
    updated_at = coalesce(%(now)s::timestamptz, now()), claim_token = NULL,
    last_http_status = %(http_status)s, last_error_class = %(error_class)s,
    last_error = %(error)s, last_request_id = coalesce(%(request_id)s, last_request_id),
    error_code = %(error_code)s, error_message = %(error_message)s
WHERE idempotency_key = %(key)s AND claim_token = %(token)s AND state = 'queued'
RETURNING idempotency_key;

-- name: record_intent_unknown
-- Refused (or unanswered again) after an earlier unknown outcome: a render may be billed, so
-- the intent is `unknown`, visible, and sent again with the same key after the (slow) delay.
-- Sume's refusal is kept for the operator; an answer without one keeps the last refusal.
UPDATE video_intents
SET state = 'unknown',
    next_attempt_at = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(delay_s)s::float8),
    unknown_outcome_at = coalesce(unknown_outcome_at, coalesce(%(now)s::timestamptz, now())),
    consecutive_errors = consecutive_errors + 1, claim_token = NULL,
    updated_at = coalesce(%(now)s::timestamptz, now()),
    last_http_status = %(http_status)s, last_error_class = %(error_class)s,
    last_error = %(error)s, last_request_id = coalesce(%(request_id)s, last_request_id),
    error_code = coalesce(%(error_code)s, error_code),
    error_message = CASE WHEN %(error_code)s::text IS NULL THEN error_message
                         ELSE %(error_message)s END
WHERE idempotency_key = %(key)s AND claim_token = %(token)s AND state IN ('queued', 'unknown')
RETURNING idempotency_key;

-- name: release_intent
-- Gives a claimed intent back without counting an attempt: it was never sent, or Sume refused
-- the API key (nothing started). Due again after the delay.
UPDATE video_intents
SET next_attempt_at = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(delay_s)s::float8),
    attempts = greatest(0, attempts - 1), claim_token = NULL,
    updated_at = coalesce(%(now)s::timestamptz, now())
WHERE idempotency_key = %(key)s AND claim_token = %(token)s AND state IN ('queued', 'unknown')
RETURNING idempotency_key;

-- name: resolve_intent_job
-- `intents resolve KEY --job-id ID`: an operator found the job this key started (Sume's
-- dashboard, support). The intent becomes submitted with that job and the job is tracked
-- (polled now), in one statement. Refused (no row) for an intent being sent right now (its
-- claim is live), one already submitted, or a job id tracked under another key.
WITH i AS (
  UPDATE video_intents
  SET state = 'submitted', job_id = %(job_id)s,
      submitted_at = coalesce(%(now)s::timestamptz, now()),
      updated_at = coalesce(%(now)s::timestamptz, now()),
      resolution = 'job', resolved_at = coalesce(%(now)s::timestamptz, now()),
      rejected_at = NULL, consecutive_errors = 0, claim_token = NULL
  WHERE idempotency_key = %(key)s AND state IN ('queued', 'unknown', 'rejected')
    AND (claim_token IS NULL OR next_attempt_at <= coalesce(%(now)s::timestamptz, now()))
    AND NOT EXISTS (SELECT 1 FROM video_jobs j
                    WHERE j.job_id = %(job_id)s AND j.idempotency_key IS NOT NULL
                      AND j.idempotency_key <> %(key)s)
    AND NOT EXISTS (SELECT 1 FROM video_intents o
                    WHERE o.job_id = %(job_id)s AND o.idempotency_key <> %(key)s)
  RETURNING idempotency_key, account
), job AS (
  INSERT INTO video_jobs (job_id, state, next_poll_at, idempotency_key, account)
  SELECT %(job_id)s, 'pending', coalesce(%(now)s::timestamptz, now()), i.idempotency_key,
         i.account
  FROM i
  ON CONFLICT (job_id) DO UPDATE
    SET idempotency_key = coalesce(video_jobs.idempotency_key, EXCLUDED.idempotency_key)
  RETURNING (xmax = 0) AS inserted
)
SELECT (SELECT idempotency_key FROM i) AS key,
       coalesce((SELECT bool_or(inserted) FROM job), false) AS job_inserted;

-- name: resolve_intent_not_billed
-- `intents resolve KEY --not-billed`: an operator established that nothing was billed (or
-- gives up on the request). Final, like a rejection, with Sume's last refusal kept; never
-- for an intent being sent right now or one already submitted.
UPDATE video_intents
SET state = 'rejected', rejected_at = coalesce(%(now)s::timestamptz, now()),
    resolution = 'not_billed', resolved_at = coalesce(%(now)s::timestamptz, now()),
    updated_at = coalesce(%(now)s::timestamptz, now()), claim_token = NULL
WHERE idempotency_key = %(key)s AND state IN ('queued', 'unknown')
  AND (claim_token IS NULL OR next_attempt_at <= coalesce(%(now)s::timestamptz, now()))
RETURNING idempotency_key;

-- name: requeue_intents
-- `vidpoll intents retry`: rejected intents back to the queue, due now, with fresh counts; a
-- queued or `unknown` intent is made due now (an unknown one stays unknown: its render may be
-- billed). Never one whose claim is live (it is being sent).
UPDATE video_intents
SET state = CASE WHEN state = 'unknown' THEN 'unknown' ELSE 'queued' END,
    next_attempt_at = coalesce(%(now)s::timestamptz, now()),
    -- a rejection means nothing started under this key (Sume said so, or an operator
    -- resolved it as not billed), so it waits for a free slot and its turn like a new intent
    -- instead of going out as an in-doubt retry
    attempts = CASE WHEN state = 'rejected' THEN 0 ELSE attempts END,
    unknown_outcome_at = CASE WHEN state = 'rejected' THEN NULL ELSE unknown_outcome_at END,
    resolution = CASE WHEN state = 'rejected' THEN NULL ELSE resolution END,
    resolved_at = CASE WHEN state = 'rejected' THEN NULL ELSE resolved_at END,
    consecutive_errors = 0, rejected_at = NULL, claim_token = NULL,
    updated_at = coalesce(%(now)s::timestamptz, now())
WHERE (idempotency_key = ANY(%(keys)s::text[])
       OR (%(all_rejected)s AND state = 'rejected'
           AND (%(code)s::text IS NULL OR error_code = %(code)s)))
  AND (state = 'rejected'
       OR (state IN ('queued', 'unknown')
           AND (claim_token IS NULL
                OR next_attempt_at <= coalesce(%(now)s::timestamptz, now()))))
RETURNING idempotency_key;

-- name: next_intent_due_in
-- Seconds until the earliest queued or `unknown` intent of `accounts` is due (database
-- clock), counting only the unknown ones of `unknown_accounts` (paused for credits); NULL if
-- none is waiting.
SELECT extract(epoch FROM min(next_attempt_at) - now())::float8 AS next_due_in_s
FROM video_intents
WHERE (state = 'queued' AND account = ANY(%(accounts)s::text[]))
   OR (state = 'unknown'
       AND account = ANY(%(accounts)s::text[] || %(unknown_accounts)s::text[]));

-- name: count_intents_by_state
SELECT state, count(*) AS n FROM video_intents GROUP BY state ORDER BY state;

-- name: has_queued_intents
-- For --drain with the submitter on: is any intent still waiting to be sent?
SELECT EXISTS (SELECT 1 FROM video_intents
               WHERE state = 'queued' AND account = ANY(%(accounts)s::text[])) AS has_queued;


-- ---------------------------------------------------------------------------------------------
-- The fleet-wide rate budget (0004): one token bucket per account and kind of call.

-- name: bucket_for_update
-- Locks one bucket for the rest of the transaction and says how much time has passed since it
-- was last refilled, by the database's clock (every worker shares it, whatever theirs say).
SELECT tokens, rate_factor, clock_timestamp() AS at,
       greatest(0, extract(epoch FROM clock_timestamp() - updated_at))::float8 AS elapsed_s,
       greatest(0, coalesce(extract(epoch FROM paused_until - clock_timestamp()), 0))::float8
         AS paused_s
FROM vidpoll_rate_buckets
WHERE account = %(account)s AND kind = %(kind)s
FOR UPDATE;

-- name: bucket_create
-- A new bucket starts with one token, not a full burst: the server's own bucket for this key
-- may already be partly spent (another client, a fleet that ran before), and a fleet that
-- starts full can overrun it by the few ms between the two buckets' starts.
INSERT INTO vidpoll_rate_buckets (account, kind, tokens, rate_per_s, burst)
VALUES (%(account)s, %(kind)s, 1, %(rate_per_s)s, %(burst)s)
ON CONFLICT (account, kind) DO NOTHING;

-- name: bucket_spend
-- Writes the refilled-then-spent token count, as of the moment bucket_for_update read.
UPDATE vidpoll_rate_buckets
SET tokens = %(tokens)s, updated_at = %(at)s, rate_per_s = %(rate_per_s)s, burst = %(burst)s,
    rate_factor = %(rate_factor)s
WHERE account = %(account)s AND kind = %(kind)s;

-- name: bucket_refund
-- Gives back tokens taken for rows that were not there to claim (never above one burst).
UPDATE vidpoll_rate_buckets
SET tokens = least(coalesce(burst, tokens + %(n)s), tokens + %(n)s)
WHERE account = %(account)s AND kind = %(kind)s
  -- not into a bucket the server paused meanwhile: it must start empty at the reset
  AND (paused_until IS NULL OR paused_until <= clock_timestamp());

-- name: bucket_pause
-- The server said stop (429 + Retry-After, or RateLimit-Remaining: 0 + RateLimit-Reset): every
-- worker's claims for this account and kind wait until then. A refusal (a 429: %(cut)s)
-- empties the bucket until the reset and multiplies the fleet's rate by %(factor)s, once a
-- second at most (the workers that all saw the same burst of 429s cut it once, not once
-- each). "Remaining: 0" on a success only pauses: a server running at its limit says it on
-- almost every answer, and taking the fleet's tokens each time would hold it well below that
-- limit (measured: 0.79 of it with a burst of 2 and 600 ms answers).
INSERT INTO vidpoll_rate_buckets (account, kind, tokens, paused_until, server_pauses,
                                  rate_factor, last_cut_at)
VALUES (%(account)s, %(kind)s, 0,
        clock_timestamp() + make_interval(secs => %(seconds)s::float8), 1,
        CASE WHEN %(cut)s THEN %(factor)s ELSE 1 END,
        CASE WHEN %(cut)s THEN clock_timestamp() END)
ON CONFLICT (account, kind) DO UPDATE
SET paused_until = greatest(coalesce(vidpoll_rate_buckets.paused_until, '-infinity'),
                            EXCLUDED.paused_until),
    tokens = CASE WHEN %(cut)s THEN least(vidpoll_rate_buckets.tokens, 0)
                  ELSE vidpoll_rate_buckets.tokens END,
    updated_at = CASE WHEN %(cut)s
                      THEN greatest(vidpoll_rate_buckets.updated_at, EXCLUDED.paused_until)
                      ELSE vidpoll_rate_buckets.updated_at END,
    server_pauses = vidpoll_rate_buckets.server_pauses + 1,
    rate_factor = CASE
      WHEN %(cut)s AND (vidpoll_rate_buckets.last_cut_at IS NULL
                        OR vidpoll_rate_buckets.last_cut_at < clock_timestamp() - interval '1 second')
      THEN greatest(%(min_factor)s, vidpoll_rate_buckets.rate_factor * %(factor)s)
      ELSE vidpoll_rate_buckets.rate_factor END,
    last_cut_at = CASE
      WHEN %(cut)s AND (vidpoll_rate_buckets.last_cut_at IS NULL
                        OR vidpoll_rate_buckets.last_cut_at < clock_timestamp() - interval '1 second')
      THEN clock_timestamp() ELSE vidpoll_rate_buckets.last_cut_at END;

-- name: list_buckets
-- For `jobs stats`: each bucket's tokens now (refilled), pause and counters.
SELECT account, kind, rate_per_s, burst, server_pauses, rate_factor,
       CASE WHEN rate_per_s IS NULL THEN NULL ELSE
         least(coalesce(burst, tokens), tokens + rate_per_s * rate_factor *
               greatest(0, extract(epoch FROM clock_timestamp() - updated_at)))::float8 END
         AS tokens,
       greatest(0, coalesce(extract(epoch FROM paused_until - clock_timestamp()), 0))::float8
         AS paused_s
FROM vidpoll_rate_buckets
ORDER BY account, kind;

-- name: backlog_by_account
-- Rows due now and how late the oldest is, per account (the budget's backlog).
SELECT account, count(*) AS due,
       extract(epoch FROM now() - min(next_poll_at))::float8 AS oldest_late_s
FROM video_jobs
WHERE state = 'pending' AND next_poll_at <= now()
GROUP BY account
ORDER BY account;

-- ---------------------------------------------------------------------------------------------
-- Webhooks (0005): a hint that makes a job due now; polling stays the source of truth.

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

-- ---------------------------------------------------------------------------------------------
-- Results (0007): fetched after completion, from their own small leased queue.

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
RETURNING j.job_id, j.result_token, j.result_attempts, j.account;

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

-- name: job_history
-- One job's events, oldest first (`jobs show`).
SELECT at, kind, from_state, to_state, error_class, http_status, detail
FROM video_job_events WHERE job_id = %(job_id)s ORDER BY id;

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
          j.finished_at, j.created_at, j.polls, j.idempotency_key,
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

-- ---------------------------------------------------------------------------------------------
-- Operations (0009): counters over time, browsing, poll-now, prune, doctor.

-- name: add_minutes
-- A worker's counters since its last flush, added to the minute they happened in, in one
-- statement (no row per poll: one row per minute, kind, account and outcome).
INSERT INTO vidpoll_minutes AS m (minute, kind, account, outcome, n, late_sum_s, late_max_s)
SELECT * FROM unnest(%(minutes)s::timestamptz[], %(kinds)s::text[], %(accounts)s::text[],
                     %(outcomes)s::text[], %(ns)s::bigint[], %(late_sums)s::float8[],
                     %(late_maxes)s::float8[])
ON CONFLICT (minute, kind, account, outcome) DO UPDATE
SET n = CASE WHEN m.kind = 'backlog' THEN greatest(m.n, excluded.n) ELSE m.n + excluded.n END,
    late_sum_s = CASE WHEN m.kind = 'backlog' THEN greatest(m.late_sum_s, excluded.late_sum_s)
                      ELSE m.late_sum_s + excluded.late_sum_s END,
    late_max_s = greatest(m.late_max_s, excluded.late_max_s);

-- name: forget_old_minutes
-- The counters keep a week.
DELETE FROM vidpoll_minutes WHERE minute < now() - interval '7 days';

-- name: due_backlog_sample
-- Rows due now, counted up to 100,000 (the chart's sample; an exact count of a huge backlog
-- would cost more than it tells), and how late the oldest is.
SELECT (SELECT count(*) FROM (SELECT 1 FROM video_jobs
                              WHERE state = 'pending' AND next_poll_at <= now()
                              LIMIT 100000) AS due) AS due,
       coalesce(extract(epoch FROM now() - (SELECT min(next_poll_at) FROM video_jobs
                                             WHERE state = 'pending')), 0)::float8
         AS oldest_late_s;

-- name: minutes_since
-- The counters of the last `minutes` minutes, summed over accounts, oldest first.
SELECT minute, kind, outcome, sum(n)::bigint AS n, sum(late_sum_s)::float8 AS late_sum_s,
       max(late_max_s)::float8 AS late_max_s
FROM vidpoll_minutes
WHERE minute >= date_trunc('minute', now()) - make_interval(mins => %(minutes)s::int)
GROUP BY minute, kind, outcome
ORDER BY minute, kind, outcome;

-- name: list_pending
-- Pending rows in due order (the partial index), after a keyset cursor: stays fast at any depth.
SELECT job_id, state, account, next_poll_at, polls, consecutive_errors, last_error_class,
       last_http_status, provider_status, created_at, finished_at, claimed_by, claim_token
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
       last_http_status, provider_status, created_at, finished_at, claimed_by, claim_token
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
       last_http_status, provider_status, created_at, finished_at, claimed_by, claim_token
FROM video_jobs
WHERE (%(account)s::text IS NULL OR account = %(account)s)
  AND (%(after_id)s::text IS NULL OR job_id > %(after_id)s)
ORDER BY job_id
LIMIT %(limit)s;

-- name: list_finished_oldest
-- list_finished oldest first: the same index, scanned backwards.
SELECT job_id, state, account, next_poll_at, polls, consecutive_errors, last_error_class,
       last_http_status, provider_status, created_at, finished_at, claimed_by, claim_token
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
       last_http_status, provider_status, created_at, finished_at, claimed_by, claim_token
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
       last_http_status, provider_status, created_at, finished_at, claimed_by, claim_token
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
  result_next_at, result_attempts, result_token, result_error, result_fetched_at)
SELECT
  job_id, state, next_poll_at, created_at, updated_at, polling_since, finished_at, polls,
  consecutive_errors, errors_total, not_found_count, last_polled_at, last_http_status,
  last_error_class, last_error, last_request_id, provider_status, last_response, claim_token,
  claimed_by, claimed_at, idempotency_key, account, poked_at, result, result_state,
  result_next_at, result_attempts, result_token, result_error, result_fetched_at
FROM moved
RETURNING job_id;

-- name: get_archived_job
-- One archived row, for `jobs show` of a pruned job.
SELECT * FROM video_jobs_archive WHERE job_id = %(job_id)s;

-- name: recent_errors
-- The latest error events (from the history), for the dashboard's overview.
SELECT e.job_id, e.at, e.error_class, e.http_status, e.detail, j.account
FROM video_job_events e
LEFT JOIN video_jobs j ON j.job_id = e.job_id
WHERE e.kind = 'error'
ORDER BY e.id DESC
LIMIT %(limit)s;

-- name: stuck_claims
-- Claims whose lease ran out long ago without a record (a worker that died or hangs): which
-- worker held them, since when. A lease-mode row is due again at once anyway; this is for
-- the operator's "which worker is stuck".
SELECT claimed_by, count(*) AS rows, min(claimed_at) AS since
FROM video_jobs
WHERE state = 'pending' AND claim_token IS NOT NULL AND next_poll_at < now() - interval '1 minute'
GROUP BY claimed_by
ORDER BY since;

-- name: doctor_tables
-- vidpoll's tables: live and dead rows, sizes, vacuum history and per-table settings.
SELECT c.relname AS table_name, s.n_live_tup AS live, s.n_dead_tup AS dead,
       pg_relation_size(c.oid) AS heap_bytes, pg_total_relation_size(c.oid) AS total_bytes,
       greatest(s.last_autovacuum, s.last_vacuum) AS last_vacuum,
       greatest(s.last_autoanalyze, s.last_analyze) AS last_analyze,
       coalesce(c.reloptions, '{}') AS options
FROM pg_class c
JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.relname IN ('video_jobs', 'video_intents', 'vidpoll_deliveries', 'vidpoll_rate_buckets',
                    'vidpoll_minutes', 'video_job_events', 'video_jobs_archive',
                    'vidpoll_webhook_events')
  AND c.relnamespace = to_regnamespace(current_schema())
ORDER BY c.relname;

-- name: doctor_hot_indexes
-- The hot table's indexes: size, scans, and (for the partial due index) bytes per pending row,
-- the tell-tale of index bloat.
SELECT i.indexrelname AS index_name, pg_relation_size(i.indexrelid) AS bytes, i.idx_scan AS scans,
       (SELECT count(*) FROM video_jobs WHERE state = 'pending') AS pending_rows
FROM pg_stat_user_indexes i
WHERE i.relname = 'video_jobs'
  AND i.schemaname = current_schema()
ORDER BY i.indexrelname;

-- name: doctor_xmin
-- What holds the xmin horizon back (vacuum cannot remove rows newer than it): the oldest open
-- transaction or snapshot, replication slots, prepared transactions.
SELECT 'session' AS holder, pid::text AS who, application_name AS detail,
       extract(epoch FROM now() - coalesce(xact_start, query_start))::float8 AS age_s,
       age(backend_xmin)::bigint AS xmin_age
FROM pg_stat_activity
-- only this database's sessions hold back the horizon of its tables (PostgreSQL 14+)
WHERE backend_xmin IS NOT NULL AND pid <> pg_backend_pid() AND datname = current_database()
UNION ALL
SELECT 'replication slot', slot_name::text, slot_type, NULL,
       greatest(age(xmin), age(catalog_xmin))::bigint
FROM pg_replication_slots
WHERE xmin IS NOT NULL OR catalog_xmin IS NOT NULL
UNION ALL
SELECT 'prepared transaction', gid, owner::text,
       extract(epoch FROM now() - prepared)::float8, age(transaction)::bigint
FROM pg_prepared_xacts
ORDER BY xmin_age DESC NULLS LAST
LIMIT 5;

-- name: doctor_connections
-- Connections in use against the server's limit, and vidpoll's listeners (LISTEN sessions).
SELECT (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend') AS used,
       current_setting('max_connections')::int AS max_connections,
       (SELECT count(*) FROM pg_stat_activity
        WHERE datname = current_database() AND query ILIKE 'LISTEN%%') AS listeners,
       pg_notification_queue_usage()::float8 AS notify_queue_usage,
       -- without pg_read_all_stats, other roles' sessions hide their query and xact times
       pg_has_role(current_user, 'pg_read_all_stats', 'MEMBER') AS sees_all_sessions,
       current_setting('autovacuum') AS autovacuum,
       current_setting('track_counts') AS track_counts;

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

-- name: hot_table_rows
-- The planner's estimate of video_jobs' rows (doctor judges the claim plan only on a table big
-- enough for an index to be the right plan).
SELECT greatest(reltuples, 0)::bigint AS estimate
FROM pg_class WHERE oid = 'video_jobs'::regclass;

-- ---------------------------------------------------------------------------------------------
-- Retention (`jobs prune`): why rows stay, and the history and webhook events it deletes.

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
