-- The fleet-wide rate budget (0004): one token bucket per account and kind of call.
-- Run by vidpoll.store.budgets.

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
