-- Submission intents (0003): recorded before the paid POST, claimed like jobs.
-- Run by vidpoll.store.intents.

-- name: insert_intent
-- Records an intent. ON CONFLICT keeps the first: a key we already have is never re-queued or
-- changed, so recording again after a crash or a re-run cannot send a second POST.
INSERT INTO video_intents (idempotency_key, payload, priority, account, provider, model,
                           tags, duration_key)
VALUES (%(key)s, %(payload)s, %(priority)s, %(account)s, %(provider)s, %(model)s,
        %(tags)s::jsonb, %(duration_key)s)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING idempotency_key;

-- name: insert_intents
-- The bulk path (`submit --file`): one statement per batch; returns the keys that were new.
INSERT INTO video_intents (idempotency_key, payload, priority, account, provider, model,
                           tags, duration_key)
SELECT k, p, pr, %(account)s, %(provider)s, %(model)s, %(tags)s::jsonb, dk
FROM unnest(%(keys)s::text[], %(payloads)s::jsonb[], %(priorities)s::int[],
            %(duration_keys)s::text[]) AS u(k, p, pr, dk)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING idempotency_key;

-- name: intent_payloads
-- The stored payloads of some keys, to tell a harmless re-run from a key reused for another
-- request.
SELECT idempotency_key, payload FROM video_intents WHERE idempotency_key = ANY(%(keys)s::text[]);

-- name: get_intent
-- With its reservation, if it was sent (0017).
SELECT i.*, s.estimate AS spend_estimate, s.status AS spend_status
FROM video_intents i LEFT JOIN vidpoll_spend s USING (idempotency_key)
WHERE i.idempotency_key = %(key)s;

-- name: get_intent_by_job
SELECT i.*, s.estimate AS spend_estimate, s.status AS spend_status
FROM video_intents i LEFT JOIN vidpoll_spend s USING (idempotency_key)
WHERE i.job_id = %(job_id)s ORDER BY i.seq LIMIT 1;

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
         + (SELECT count(*) FROM (SELECT 1 FROM video_intents
                                  WHERE state = 'reconciling' AND account = %(account)s
                                  LIMIT %(max_active)s::int) r)
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
  SELECT ctid, claim_token AS old_token FROM video_intents
  WHERE state = 'unknown' AND account = %(account)s
    AND NOT (SELECT yes FROM paused)
    AND next_attempt_at <= coalesce(%(now)s::timestamptz, now())
    AND (%(key)s::text IS NULL OR idempotency_key = %(key)s::text)
  ORDER BY next_attempt_at
  LIMIT %(limit)s
  FOR UPDATE SKIP LOCKED
),
lookups AS (
  -- creates without an idempotency key being looked up in the provider's records (0015;
  -- their own small partial index)
  SELECT ctid, claim_token AS old_token FROM video_intents
  WHERE state = 'reconciling' AND account = %(account)s
    AND NOT (SELECT yes FROM paused)
    AND next_attempt_at <= coalesce(%(now)s::timestamptz, now())
    AND (%(key)s::text IS NULL OR idempotency_key = %(key)s::text)
  ORDER BY next_attempt_at
  LIMIT greatest(0, %(limit)s - (SELECT count(*) FROM unknowns))
  FOR UPDATE SKIP LOCKED
),
retries AS (
  SELECT ctid, claim_token AS old_token FROM video_intents
  WHERE state = 'queued' AND attempts > 0 AND account = %(account)s
    AND NOT (SELECT yes FROM paused)
    AND next_attempt_at <= coalesce(%(now)s::timestamptz, now())
    AND (%(key)s::text IS NULL OR idempotency_key = %(key)s::text)
  ORDER BY priority DESC, seq
  LIMIT greatest(0, %(limit)s - (SELECT count(*) FROM unknowns)
                   - (SELECT count(*) FROM lookups))
  FOR UPDATE SKIP LOCKED
),
held AS (
  -- intents a cap held (0017) whose window turned or whose budget freed: checked again by the
  -- caller (vidpoll.store.spend) before they go, oldest first, ahead of fresh ones; each needs
  -- a free slot like a fresh intent (their own small partial index)
  SELECT ctid, claim_token AS old_token FROM video_intents
  WHERE state = 'held' AND account = %(account)s
    AND NOT (SELECT yes FROM paused)
    AND next_attempt_at <= coalesce(%(now)s::timestamptz, now())
    AND (%(key)s::text IS NULL OR idempotency_key = %(key)s::text)
  ORDER BY priority DESC, seq
  LIMIT greatest(0, least(
    %(limit)s - (SELECT count(*) FROM unknowns) - (SELECT count(*) FROM lookups)
      - (SELECT count(*) FROM retries),
    CASE WHEN %(max_active)s::int IS NULL THEN %(limit)s
         ELSE %(max_active)s::int - (SELECT n FROM active) END))
  FOR UPDATE SKIP LOCKED
),
fresh AS (
  SELECT ctid, claim_token AS old_token FROM video_intents
  WHERE state = 'queued' AND attempts = 0 AND account = %(account)s
    AND NOT (SELECT yes FROM paused)
    AND next_attempt_at <= coalesce(%(now)s::timestamptz, now())
    AND (%(key)s::text IS NULL OR idempotency_key = %(key)s::text)
  ORDER BY priority DESC, seq
  LIMIT greatest(0, least(
    %(limit)s - (SELECT count(*) FROM unknowns) - (SELECT count(*) FROM lookups)
      - (SELECT count(*) FROM retries) - (SELECT count(*) FROM held),
    CASE WHEN %(max_active)s::int IS NULL THEN %(limit)s
         ELSE %(max_active)s::int - (SELECT n FROM active) - (SELECT count(*) FROM held)
              - coalesce((SELECT n FROM ahead), 0) END))
  FOR UPDATE SKIP LOCKED
),
picked AS (SELECT ctid, old_token FROM unknowns UNION ALL SELECT ctid, old_token FROM lookups
           UNION ALL SELECT ctid, old_token FROM retries
           UNION ALL SELECT ctid, old_token FROM held
           UNION ALL SELECT ctid, old_token FROM fresh)
UPDATE video_intents AS i
-- the lease starts now, by the wall clock: now() is when the transaction began, before the wait
-- for the admission lock, and a lease that began in the past would end before the submitter
-- expects it to (and another one could send the same key while this one still waits)
SET next_attempt_at = coalesce(%(now)s::timestamptz, clock_timestamp())
                      + make_interval(secs => %(lease_s)s::float8),
    claim_token = gen_random_uuid(),
    claimed_by = %(worker_id)s,
    claimed_at = coalesce(%(now)s::timestamptz, now()),
    -- a held intent is claimed as it is: the caller sends it as a fresh one (send_held) or
    -- holds it again. (Never `SET state` here: the statement trigger that wakes submitters
    -- on a change of state would fire on every claim, even an empty one: a hot loop.)
    held_reason = NULL, held_cap = NULL,
    -- a look-up in the provider's records is no POST
    attempts = i.attempts + CASE WHEN i.state = 'reconciling' THEN 0 ELSE 1 END,
    -- a POST may go out now: the window of unsettled creates begins at this claim (a
    -- previous unsettled one keeps its earlier start)
    create_window_from = CASE WHEN i.state IN ('queued', 'held')
                              THEN coalesce(i.create_window_from,
                                            coalesce(%(now)s::timestamptz, now()))
                              ELSE i.create_window_from END,
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
          i.account, i.state, i.model,
          -- attempts > 1 (counted after this claim's increment): an earlier attempt was
          -- neither given back unsent (release_intent takes its count back) nor answered
          -- clearly (that ends the intent), so its outcome was unknown, even when a
          -- submitter from before 0010 recorded it without unknown_outcome_at (a rolling
          -- upgrade: migrate first, submitters restarted after)
          (i.unknown_outcome_at IS NOT NULL OR i.state = 'unknown' OR i.attempts > 1)
            AS outcome_unknown,
          -- a create that may have reached the provider and is not settled: the previous
          -- claim never recorded its POST's answer, or the intent is being looked up
          ((picked.old_token IS NOT NULL AND i.state = 'queued' AND i.attempts > 1)
           OR i.state = 'reconciling') AS unsettled,
          i.create_window_from AS window_from,
          -- the latest an unsettled create may have been sent: when its outcome was recorded
          -- unknown (no POST goes out while an intent is reconciling), else now (the dead
          -- claim's POST went out before its lease ended)
          coalesce(i.unknown_outcome_at, coalesce(%(now)s::timestamptz, now())) AS window_to,
          i.last_http_status,
          -- for the spend check (vidpoll.store.spend): order, tags, an operator's release,
          -- and the database's clock, which counts its windows for the whole fleet
          i.seq, i.priority, i.tags, i.past_cap, i.provider, clock_timestamp() AS db_now;

-- name: claim_unknown_intents
-- While an account's submitting is paused for credits (402), its `unknown` intents still go
-- out on their slow schedule (a top-up must bring their jobs back within minutes, and they
-- already hold their slots); nothing else of that account is claimed. Leased like
-- claim_intents; a server pause (429) stops these too.
WITH picked AS (
  SELECT ctid FROM video_intents
  WHERE state IN ('unknown', 'reconciling') AND account = %(account)s
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
    attempts = i.attempts + CASE WHEN i.state = 'reconciling' THEN 0 ELSE 1 END,
    updated_at = coalesce(%(now)s::timestamptz, now())
FROM picked
WHERE i.ctid = picked.ctid
RETURNING i.idempotency_key, i.claim_token, i.payload, i.attempts, i.consecutive_errors,
          i.account, i.state, i.model, true AS outcome_unknown,
          i.state = 'reconciling' AS unsettled, i.create_window_from AS window_from,
          i.last_http_status;

-- name: admission
-- For `submit` and `intents stats`: how many renders of an account (NULL: all) may be
-- running, and what is queued. `unconfirmed`: intents attempted with no job yet, the
-- `unknown` ones included (they hold their slots too).
SELECT
  (SELECT count(*) FROM video_jobs WHERE state = 'pending'
     AND (%(account)s::text IS NULL OR account = %(account)s)) AS pending_jobs,
  (SELECT count(*) FROM video_intents
   WHERE ((state = 'queued' AND attempts > 0) OR state IN ('unknown', 'reconciling'))
     AND (%(account)s::text IS NULL OR account = %(account)s)) AS unconfirmed,
  (SELECT count(*) FROM video_intents WHERE state = 'unknown'
     AND (%(account)s::text IS NULL OR account = %(account)s)) AS unknown,
  (SELECT count(*) FROM video_intents WHERE state = 'reconciling'
     AND (%(account)s::text IS NULL OR account = %(account)s)) AS reconciling,
  (SELECT count(*) FROM video_intents WHERE state = 'queued'
     AND (%(account)s::text IS NULL OR account = %(account)s)) AS queued,
  (SELECT count(*) FROM video_intents WHERE state = 'held'
     AND (%(account)s::text IS NULL OR account = %(account)s)) AS held;

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
  INSERT INTO video_jobs (job_id, state, next_poll_at, idempotency_key, account, provider,
                          handle, tags, model, duration_key)
  VALUES (%(job_id)s, 'pending',
          coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(delay_s)s::float8),
          %(key)s,
          coalesce((SELECT account FROM video_intents WHERE idempotency_key = %(key)s),
                   'default'),
          coalesce((SELECT provider FROM video_intents WHERE idempotency_key = %(key)s),
                   %(provider)s),
          -- the provider's handle of the job (0016): the URLs fal says never to build
          %(handle)s::jsonb,
          -- `submit --tag` (0017)
          (SELECT tags FROM video_intents WHERE idempotency_key = %(key)s),
          -- which render times plan its reads (0018)
          (SELECT model FROM video_intents WHERE idempotency_key = %(key)s),
          (SELECT duration_key FROM video_intents WHERE idempotency_key = %(key)s))
  ON CONFLICT (job_id) DO UPDATE
    SET idempotency_key = coalesce(video_jobs.idempotency_key, EXCLUDED.idempotency_key),
        handle = coalesce(video_jobs.handle, EXCLUDED.handle)
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
    AND state IN ('queued', 'unknown', 'reconciling')
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
WHERE idempotency_key = %(key)s AND claim_token = %(token)s
  AND state IN ('queued', 'unknown', 'reconciling')
RETURNING idempotency_key;

-- name: release_intent
-- Gives a claimed intent back without counting an attempt: it was never sent, or Sume refused
-- the API key (nothing started). Due again after the delay. An intent that no create of
-- could have reached the provider (no attempt left, no unknown outcome) gives its
-- reservation back too (0017): the claim that sends it reserves again, on its own day.
WITH i AS (
  UPDATE video_intents
  SET next_attempt_at = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(delay_s)s::float8),
      attempts = CASE WHEN state = 'reconciling' THEN attempts ELSE greatest(0, attempts - 1) END,
      -- nothing was sent under this claim: a window it opened closes again
      create_window_from = CASE WHEN create_window_from = claimed_at THEN NULL
                                ELSE create_window_from END,
      claim_token = NULL,
      updated_at = coalesce(%(now)s::timestamptz, now())
  WHERE idempotency_key = %(key)s AND claim_token = %(token)s
    AND state IN ('queued', 'unknown', 'reconciling')
  RETURNING idempotency_key, state, attempts, unknown_outcome_at
), unspent AS (
  UPDATE vidpoll_spend s SET status = 'released', amount = 0, settled_at = clock_timestamp()
  FROM i
  WHERE s.idempotency_key = i.idempotency_key AND i.state = 'queued' AND i.attempts = 0
    AND i.unknown_outcome_at IS NULL AND s.status = 'reserved' AND s.job_id IS NULL
  RETURNING s.idempotency_key
)
SELECT idempotency_key FROM i;

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
  WHERE idempotency_key = %(key)s AND state IN ('queued', 'unknown', 'reconciling', 'rejected')
    AND (claim_token IS NULL OR next_attempt_at <= coalesce(%(now)s::timestamptz, now()))
    AND NOT EXISTS (SELECT 1 FROM video_jobs j
                    WHERE j.job_id = %(job_id)s AND j.idempotency_key IS NOT NULL
                      AND j.idempotency_key <> %(key)s)
    AND NOT EXISTS (SELECT 1 FROM video_intents o
                    WHERE o.job_id = %(job_id)s AND o.idempotency_key <> %(key)s)
  RETURNING idempotency_key, account, provider, tags, model, duration_key
), job AS (
  INSERT INTO video_jobs (job_id, state, next_poll_at, idempotency_key, account, provider,
                          tags, model, duration_key)
  SELECT %(job_id)s, 'pending', coalesce(%(now)s::timestamptz, now()), i.idempotency_key,
         i.account, i.provider, i.tags, i.model, i.duration_key
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
WHERE idempotency_key = %(key)s AND state IN ('queued', 'unknown', 'reconciling', 'held')
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
    -- an operator's release past a cap was for that send: a new one is checked (0017)
    past_cap = CASE WHEN state = 'rejected' THEN false ELSE past_cap END,
    resolution = CASE WHEN state = 'rejected' THEN NULL ELSE resolution END,
    resolved_at = CASE WHEN state = 'rejected' THEN NULL ELSE resolved_at END,
    consecutive_errors = 0, rejected_at = NULL,
    -- a dead claim's token stays: its POST may have been sent and never answered, and the
    -- next claim must see that (a provider without an idempotency key then looks it up
    -- instead of sending it again; 0015)
    claim_token = CASE WHEN state = 'rejected' THEN NULL ELSE claim_token END,
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
-- Seconds until the earliest queued, `held` (its window's turn) or `unknown` intent of
-- `accounts` is due (database
-- clock), counting only the unknown ones of `unknown_accounts` (paused for credits); NULL if
-- none is waiting.
SELECT extract(epoch FROM min(next_attempt_at) - now())::float8 AS next_due_in_s
FROM video_intents
WHERE (state IN ('queued', 'held') AND account = ANY(%(accounts)s::text[]))
   OR (state IN ('unknown', 'reconciling')
       AND account = ANY(%(accounts)s::text[] || %(unknown_accounts)s::text[]));

-- name: count_intents_by_state
SELECT state, count(*) AS n FROM video_intents GROUP BY state ORDER BY state;

-- name: has_queued_intents
-- For --drain with the submitter on: is any intent still waiting to be sent?
SELECT EXISTS (SELECT 1 FROM video_intents
               WHERE state IN ('queued', 'reconciling')
                 AND account = ANY(%(accounts)s::text[])) AS has_queued;

-- name: record_intent_reconciling
-- A create of a provider without an idempotency key whose outcome is unknown (or whose
-- look-up found nothing certain yet): looked up in the provider's records after the delay,
-- never sent again meanwhile. Fenced like every intent write.
UPDATE video_intents
SET state = 'reconciling',
    next_attempt_at = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(delay_s)s::float8),
    unknown_outcome_at = coalesce(unknown_outcome_at, coalesce(%(now)s::timestamptz, now())),
    create_window_from = coalesce(create_window_from, claimed_at),
    consecutive_errors = consecutive_errors + 1, claim_token = NULL,
    updated_at = coalesce(%(now)s::timestamptz, now()),
    last_http_status = coalesce(%(http_status)s, last_http_status),
    last_error_class = coalesce(%(error_class)s, last_error_class),
    last_error = %(error)s, last_request_id = coalesce(%(request_id)s, last_request_id)
WHERE idempotency_key = %(key)s AND claim_token = %(token)s
  AND state IN ('queued', 'reconciling')
RETURNING idempotency_key;

-- name: record_intent_settled
-- The provider's records prove that no create of this intent was made (the whole window
-- listed, its settle time passed): queued again, due at once, sent once more. Its window
-- closes; the look-up that proved it is kept in last_error.
UPDATE video_intents
SET state = 'queued', next_attempt_at = coalesce(%(now)s::timestamptz, now()),
    create_window_from = NULL, unknown_outcome_at = NULL, claim_token = NULL,
    updated_at = coalesce(%(now)s::timestamptz, now()),
    last_error = %(error)s
WHERE idempotency_key = %(key)s AND claim_token = %(token)s
  AND state IN ('queued', 'reconciling')
RETURNING idempotency_key;

-- name: adopt_job
-- A look-up found this intent's job in the provider's records: the job row is inserted and
-- the intent marked submitted in one statement, exactly as after a 201. A job another intent
-- already holds is never adopted (ON CONFLICT updates only a row with no key or this key; two
-- submitters adopting one job for two keys: the second waits on the first's row, then finds
-- its key and adopts nothing).
WITH job AS (
  INSERT INTO video_jobs (job_id, state, next_poll_at, idempotency_key, account, provider,
                          handle, tags, model, duration_key)
  SELECT %(job_id)s, 'pending',
         coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(delay_s)s::float8),
         i.idempotency_key, i.account, i.provider, %(handle)s::jsonb, i.tags, i.model,
         i.duration_key
  FROM video_intents i
  WHERE i.idempotency_key = %(key)s AND i.claim_token = %(token)s
    AND i.state IN ('queued', 'reconciling')
  ON CONFLICT (job_id) DO UPDATE SET idempotency_key = EXCLUDED.idempotency_key,
                                     handle = coalesce(video_jobs.handle, EXCLUDED.handle)
    WHERE video_jobs.idempotency_key IS NULL
       OR video_jobs.idempotency_key = EXCLUDED.idempotency_key
  RETURNING job_id
), intent AS (
  UPDATE video_intents
  SET state = 'submitted', job_id = %(job_id)s,
      submitted_at = coalesce(%(now)s::timestamptz, now()),
      updated_at = coalesce(%(now)s::timestamptz, now()),
      create_window_from = NULL, consecutive_errors = 0, claim_token = NULL,
      last_error = %(error)s
  WHERE idempotency_key = %(key)s AND claim_token = %(token)s
    AND state IN ('queued', 'reconciling')
    AND EXISTS (SELECT 1 FROM job)
  RETURNING idempotency_key
)
SELECT EXISTS (SELECT 1 FROM job) AS adopted, EXISTS (SELECT 1 FROM intent) AS intent_updated;

-- name: jobs_of_ids
-- Which of some job ids vidpoll tracks already, and under which key (NULL: added by hand):
-- a look-up never adopts a job another intent holds.
SELECT job_id, idempotency_key FROM video_jobs WHERE job_id = ANY(%(ids)s::text[]);

