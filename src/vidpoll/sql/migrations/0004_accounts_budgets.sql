-- Accounts (one Sume API key each) and the fleet-wide rate budget every worker draws from.
-- The key itself never reaches the database: rows carry the account's name, and each worker
-- reads the keys of the accounts it serves from its environment.
-- Constant defaults: no table rewrite; the seed's own INSERTs land in the default account.
-- vidpoll: step
ALTER TABLE video_jobs ADD COLUMN IF NOT EXISTS account text NOT NULL DEFAULT 'default';
-- vidpoll: step
ALTER TABLE video_intents ADD COLUMN IF NOT EXISTS account text NOT NULL DEFAULT 'default';

-- Workers claim one account at a time (each has its own key and budget), so each claim walks
-- its own account's due rows in order instead of stepping over every other account's rows.
-- The seed's index on next_poll_at stays: the seed's own loop and the fleet-wide backlog
-- queries use it.
-- vidpoll: step no-transaction
CREATE INDEX CONCURRENTLY IF NOT EXISTS video_jobs_account_due_idx
  ON video_jobs (account, next_poll_at) WHERE state = 'pending';
-- vidpoll: step no-transaction
DROP INDEX CONCURRENTLY IF EXISTS video_intents_queue_idx;
-- vidpoll: step no-transaction
CREATE INDEX CONCURRENTLY IF NOT EXISTS video_intents_account_queue_idx
  ON video_intents (account, priority DESC, seq) WHERE state = 'queued';

-- One token bucket per account and kind of call (status reads, result reads, creates).
-- Workers take tokens under a row lock before they claim, so all of them together stay inside
-- the configured rate; a 429 or `RateLimit-Remaining: 0` sets paused_until, which stops every
-- worker's claims for that account and kind until the server's reset; a 429 also lowers the
-- fleet's rate (rate_factor) until the server stops refusing.
-- vidpoll: step
CREATE TABLE IF NOT EXISTS vidpoll_rate_buckets (
  account       text NOT NULL,
  kind          text NOT NULL CHECK (kind IN ('status', 'result', 'create')),
  tokens        float8 NOT NULL DEFAULT 0,
  updated_at    timestamptz NOT NULL DEFAULT now(),
  paused_until  timestamptz,
  -- the rate and burst the last worker used, for `jobs stats` (each worker passes its own)
  rate_per_s    float8,
  burst         float8,
  -- the share of the configured rate the fleet uses now: a 429 cuts it (at most once a
  -- second), and it grows back slowly, so a server whose limit is below the configured rate
  -- is met at its own rate instead of with a 429 every few calls
  rate_factor   float8 NOT NULL DEFAULT 1 CHECK (rate_factor > 0 AND rate_factor <= 1),
  last_cut_at   timestamptz,
  -- how often the server asked the fleet to pause, for operators
  server_pauses bigint NOT NULL DEFAULT 0,
  PRIMARY KEY (account, kind)
);
