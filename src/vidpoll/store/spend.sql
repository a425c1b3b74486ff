-- Spend (0017): the reservations every create makes before it is sent, the caps they are
-- checked against, and where the money went. Run by vidpoll.store.spend.

-- name: spend_used
-- What counts against an account's caps now (under its admission lock), from the running
-- totals (a few rows): the day's and the month's amounts (spent and reserved apart, for the
-- held reason; the month only with a month cap); creates in the last hour (only with
-- max_creates_per_hour, counted to one past it); each capped prefix's day (the ledger's rows
-- of the day: only with such caps); and which of the claimed keys hold a reservation already
-- (a re-sent create reserves nothing more).
SELECT
  (SELECT coalesce(sum(spent), 0) FROM vidpoll_spend_days
   WHERE account = %(account)s AND day = %(day)s) AS day_spent,
  (SELECT coalesce(sum(reserved), 0) FROM vidpoll_spend_days
   WHERE account = %(account)s AND day = %(day)s) AS day_reserved,
  CASE WHEN %(month)s THEN
    (SELECT coalesce(sum(spent), 0) FROM vidpoll_spend_days
     WHERE account = %(account)s AND day >= %(month_from)s AND day < %(month_to)s) END
    AS month_spent,
  CASE WHEN %(month)s THEN
    (SELECT coalesce(sum(reserved), 0) FROM vidpoll_spend_days
     WHERE account = %(account)s AND day >= %(month_from)s AND day < %(month_to)s) END
    AS month_reserved,
  CASE WHEN %(hour_max)s::int IS NOT NULL THEN
    (SELECT count(*) FROM (SELECT 1 FROM vidpoll_spend
                           WHERE account = %(account)s AND reserved_at > %(hour_from)s
                           LIMIT %(hour_max)s::int + 1) h) END AS hour_creates,
  CASE WHEN %(hour_max)s::int IS NOT NULL THEN
    (SELECT min(reserved_at) FROM vidpoll_spend
     WHERE account = %(account)s AND reserved_at > %(hour_from)s) END AS hour_oldest,
  ARRAY(SELECT coalesce((SELECT sum(s.amount) FROM vidpoll_spend s
                         WHERE s.account = %(account)s AND s.day = %(day)s
                           AND s.status <> 'released' AND starts_with(s.idempotency_key, p)),
                        0)
        FROM unnest(%(prefixes)s::text[]) WITH ORDINALITY AS u(p, n) ORDER BY n)
    AS prefix_used,
  ARRAY(SELECT idempotency_key FROM vidpoll_spend
        WHERE idempotency_key = ANY(%(keys)s::text[]) AND status <> 'released')
    AS reserved_keys;

-- name: held_for_cap
-- How many intents of an account one cap holds now (the hourly cap spaces their resumes).
SELECT count(*) AS n FROM video_intents
WHERE state = 'held' AND account = %(account)s AND held_cap = %(cap)s;

-- name: wake_next_held
-- A claim sent held intents and held none: the next ones are due now (20 at a time).
SELECT vidpoll_wake_held(%(account)s) AS woken;

-- name: reserve_spend
-- The reservations of the creates about to be sent: a key whose reservation was released (a
-- refused create queued again by hand) reserves again.
INSERT INTO vidpoll_spend (idempotency_key, account, provider, model, tags, day, reserved_at,
                           currency, estimate, amount, status, past_cap)
SELECT k, %(account)s, pr, m, t, %(day)s, %(at)s, %(currency)s, e, e, 'reserved', pc
FROM unnest(%(keys)s::text[], %(providers)s::text[], %(models)s::text[], %(tags)s::jsonb[],
            %(estimates)s::numeric[], %(past_cap)s::bool[]) AS u(k, pr, m, t, e, pc)
ON CONFLICT (idempotency_key) DO UPDATE
SET day = EXCLUDED.day, reserved_at = EXCLUDED.reserved_at, estimate = EXCLUDED.estimate,
    amount = EXCLUDED.amount, status = 'reserved', past_cap = EXCLUDED.past_cap,
    currency = EXCLUDED.currency, settled_at = NULL
WHERE vidpoll_spend.status = 'released' AND vidpoll_spend.job_id IS NULL;

-- name: hold_intents
-- Claimed intents a cap does not let go: given back unsent as `held` (no attempt counted, a
-- window their claim opened closed again), due when their window turns. Fenced on the claim.
UPDATE video_intents AS i
SET state = 'held', held_reason = u.reason, held_cap = u.cap, next_attempt_at = u.until,
    attempts = greatest(0, i.attempts - 1),
    create_window_from = CASE WHEN i.create_window_from = i.claimed_at THEN NULL
                              ELSE i.create_window_from END,
    claim_token = NULL, updated_at = clock_timestamp()
FROM unnest(%(keys)s::text[], %(tokens)s::uuid[], %(reasons)s::text[], %(caps)s::text[],
            %(untils)s::timestamptz[]) AS u(k, t, reason, cap, until)
WHERE i.idempotency_key = u.k AND i.claim_token = u.t AND i.state IN ('queued', 'held')
RETURNING i.idempotency_key;

-- name: send_held
-- Held intents of this claim that may go now: queued again, as fresh ones (their claim and
-- lease stand).
UPDATE video_intents SET state = 'queued'
WHERE idempotency_key = ANY(%(keys)s::text[]) AND claim_token = ANY(%(tokens)s::uuid[])
  AND state = 'held'
RETURNING idempotency_key;

-- name: spend_warning_once
-- The 80 percent warning of one cap and window: true for the first submitter of the fleet to see
-- it, so it is logged once.
INSERT INTO vidpoll_spend_warnings (account, cap, window_start)
VALUES (%(account)s, %(cap)s, %(window_start)s)
ON CONFLICT DO NOTHING
RETURNING cap;

-- name: release_held_intent
-- `vidpoll intents release KEY`: an operator sends a held intent past its cap.
UPDATE video_intents
SET state = 'queued', past_cap = true, held_reason = NULL, held_cap = NULL,
    next_attempt_at = clock_timestamp(), updated_at = clock_timestamp()
WHERE idempotency_key = %(key)s AND state = 'held' AND claim_token IS NULL
RETURNING idempotency_key, account;

-- name: wake_held_intents
-- A submitter started, or reloaded its caps: the oldest held intents of its accounts are due
-- now, checked against the caps as they are now (those that go wake the next ones).
SELECT coalesce(sum(vidpoll_wake_held(a)), 0) AS woken
FROM unnest(%(accounts)s::text[]) AS a;

-- name: spend_by_day
-- `vidpoll spend`: amounts by day, account, model and status, each account in its window.
SELECT s.day, s.account, s.model, s.currency,
       coalesce(sum(s.amount) FILTER (WHERE s.status = 'spent'), 0) AS spent,
       coalesce(sum(s.amount) FILTER (WHERE s.status = 'reserved'), 0) AS reserved,
       count(*) FILTER (WHERE s.status <> 'released') AS creates,
       count(*) FILTER (WHERE s.status = 'released') AS released
FROM vidpoll_spend s
JOIN unnest(%(accounts)s::text[], %(froms)s::date[], %(tos)s::date[]) AS w(account, d_from, d_to)
  ON s.account = w.account AND s.day >= w.d_from AND s.day <= w.d_to
GROUP BY s.day, s.account, s.model, s.currency
ORDER BY s.day, s.account, s.model;

-- name: spend_by_tag
-- `vidpoll spend`: amounts by account and tag (name=value), each account in its window.
SELECT s.account, t.key AS tag, t.value, s.currency,
       coalesce(sum(s.amount) FILTER (WHERE s.status = 'spent'), 0) AS spent,
       coalesce(sum(s.amount) FILTER (WHERE s.status = 'reserved'), 0) AS reserved,
       count(*) FILTER (WHERE s.status <> 'released') AS creates
FROM vidpoll_spend s
JOIN unnest(%(accounts)s::text[], %(froms)s::date[], %(tos)s::date[]) AS w(account, d_from, d_to)
  ON s.account = w.account AND s.day >= w.d_from AND s.day <= w.d_to
CROSS JOIN LATERAL jsonb_each_text(coalesce(s.tags, '{}'::jsonb)) AS t(key, value)
GROUP BY s.account, t.key, t.value, s.currency
ORDER BY s.account, t.key, t.value;

-- name: held_by_cap
-- Held intents by account and cap (`vidpoll spend`, the metrics, the dashboard).
SELECT account, coalesce(held_cap, '') AS cap, count(*) AS n,
       min(next_attempt_at) AS next_resume
FROM video_intents WHERE state = 'held'
GROUP BY account, held_cap ORDER BY account, held_cap;

-- name: spend_totals
-- For /metrics: spent by account and model since the ledger began (a counter), and what is
-- reserved now by account, from the running totals (a row per account, day and model).
SELECT account, model, sum(spent) AS spent, sum(reserved) AS reserved
FROM vidpoll_spend_days
GROUP BY account, model ORDER BY account, model;

-- name: spend_burst_recent
-- Creates of one key prefix in the last 10 minutes (counted to the warning's floor: cheap).
SELECT count(*) AS n FROM (
  SELECT 1 FROM vidpoll_spend
  WHERE account = %(account)s AND starts_with(idempotency_key, %(prefix)s)
    AND reserved_at > %(now)s::timestamptz - interval '10 minutes'
  LIMIT %(floor)s) r;

-- name: spend_burst
-- Creates of one key prefix in the last 10 minutes and in the 24 hours before them (the
-- runaway guard's warning: a prefix far above its usual rate).
SELECT count(*) FILTER (WHERE reserved_at > %(now)s::timestamptz - interval '10 minutes')
         AS recent,
       count(*) FILTER (WHERE reserved_at <= %(now)s::timestamptz - interval '10 minutes')
         AS before
FROM vidpoll_spend
WHERE account = %(account)s AND starts_with(idempotency_key, %(prefix)s)
  AND reserved_at > %(now)s::timestamptz - interval '24 hours 10 minutes';
