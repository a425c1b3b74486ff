-- Spend (issue 30): what each render costs, and caps the whole fleet obeys.
--
-- Every create a submitter sends first reserves its estimate (the account's price for the
-- request) in vidpoll_spend, one row per intent, in the transaction that claims the intent,
-- under the account's admission lock: submitters on any number of machines see each other's
-- reservations, so a cap is never exceeded by even one job. An intent that would exceed a cap
-- is not sent: it becomes `held`, with the cap and the figures in `held_reason`, due again
-- when the window turns (next_attempt_at), or earlier when budget frees (a refunded failure
-- pokes it) or an operator raises the cap (the submitters make every held intent due when
-- they reload their settings) or releases it (`vidpoll intents release KEY`: `past_cap`).
-- When the job ends, the reservation becomes what it cost: the provider's own figure (the
-- job's `cost`, converted by the worker from the provider's unit where the account prices it),
-- else the estimate; 0 (a failure the provider does not charge) releases it. A rejected
-- create (nothing started) releases it too. Both by triggers, whoever writes the row: the
-- seed's own loop and a worker of level 16 settle reservations at their estimate.
-- Code of level 16 works beside it: its claims name `queued` only and never pick a `held`
-- intent; it never reads the new columns (its submitters do not reserve: caps hold once
-- every submitter runs this release).
-- vidpoll: expand

-- vidpoll: step
ALTER TABLE video_intents
  -- `submit --tag name=value`: stored with the intent, its job and its reservation
  ADD COLUMN IF NOT EXISTS tags jsonb,
  -- why a `held` intent waits (which cap, spent and reserved, when it resumes), and the cap
  ADD COLUMN IF NOT EXISTS held_reason text,
  ADD COLUMN IF NOT EXISTS held_cap text,
  -- an operator released it past its cap (`intents release`): sent without a cap check
  ADD COLUMN IF NOT EXISTS past_cap boolean NOT NULL DEFAULT false;
-- The cost in the account's currency (the provider's figure converted, else the estimate; 0:
-- not charged), and the provider's own figure in its own unit (kept even when the account has
-- no price for that unit: recorded, never mixed into money).
-- vidpoll: step
ALTER TABLE video_jobs
  ADD COLUMN IF NOT EXISTS cost numeric,
  ADD COLUMN IF NOT EXISTS provider_cost numeric,
  ADD COLUMN IF NOT EXISTS provider_cost_unit text,
  ADD COLUMN IF NOT EXISTS tags jsonb;
-- vidpoll: step
ALTER TABLE video_jobs_archive
  ADD COLUMN IF NOT EXISTS cost numeric,
  ADD COLUMN IF NOT EXISTS provider_cost numeric,
  ADD COLUMN IF NOT EXISTS provider_cost_unit text,
  ADD COLUMN IF NOT EXISTS tags jsonb;

-- vidpoll: step
ALTER TABLE video_intents DROP CONSTRAINT IF EXISTS video_intents_state_check;
ALTER TABLE video_intents ADD CONSTRAINT video_intents_state_check
  CHECK (state IN ('queued', 'submitted', 'rejected', 'unknown', 'reconciling', 'held'))
  NOT VALID;
-- vidpoll: step
ALTER TABLE video_intents VALIDATE CONSTRAINT video_intents_state_check;

-- Held intents, due by time per account (the window's turn), poked by account.
-- vidpoll: step no-transaction
CREATE INDEX CONCURRENTLY IF NOT EXISTS video_intents_held_idx
  ON video_intents (account, next_attempt_at) WHERE state = 'held';

-- The ledger: one row per intent sent. `day` is the reservation's calendar day in the
-- account's cap_timezone (caps and `vidpoll spend` count by it); `amount` is what counts
-- against the caps now: the estimate while reserved, the cost once spent, 0 once released.
-- NULL amounts (an account without prices) count creates only (max_creates_per_hour).
-- Kept when jobs are pruned: the month's spend must survive a prune.
-- vidpoll: step
CREATE TABLE IF NOT EXISTS vidpoll_spend (
  idempotency_key text PRIMARY KEY,
  account     text NOT NULL,
  provider    text NOT NULL,
  model       text,
  tags        jsonb,
  day         date NOT NULL,
  reserved_at timestamptz NOT NULL,
  currency    text,
  estimate    numeric CHECK (estimate >= 0),
  amount      numeric CHECK (amount >= 0),
  status      text NOT NULL CHECK (status IN ('reserved', 'spent', 'released')),
  past_cap    boolean NOT NULL DEFAULT false,
  job_id      text,
  settled_at  timestamptz
);
-- The caps' sums: by day (cap_per_day, cap_per_month, `vidpoll spend`), by the hour
-- (max_creates_per_hour).
-- vidpoll: step no-transaction
CREATE INDEX CONCURRENTLY IF NOT EXISTS vidpoll_spend_day_idx ON vidpoll_spend (account, day);
-- vidpoll: step no-transaction
CREATE INDEX CONCURRENTLY IF NOT EXISTS vidpoll_spend_recent_idx
  ON vidpoll_spend (account, reserved_at);

-- The 80 percent warnings already logged: once per account, cap and window, fleet-wide.
-- vidpoll: step
CREATE TABLE IF NOT EXISTS vidpoll_spend_warnings (
  account    text NOT NULL,
  cap        text NOT NULL,
  window_start date NOT NULL,
  logged_at  timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (account, cap, window_start)
);

-- Running totals of the ledger by account, day and model, kept by a trigger on every change
-- of it: a claim's cap check and /metrics read a few rows of these (at most one per day and
-- model) instead of summing a month of the ledger under the account's lock.
-- vidpoll: step
CREATE TABLE IF NOT EXISTS vidpoll_spend_days (
  account  text NOT NULL,
  day      date NOT NULL,
  model    text NOT NULL DEFAULT '',
  reserved numeric NOT NULL DEFAULT 0,
  spent    numeric NOT NULL DEFAULT 0,
  creates  bigint NOT NULL DEFAULT 0,
  PRIMARY KEY (account, day, model)
);

-- vidpoll: step
CREATE OR REPLACE FUNCTION vidpoll_spend_days_kept() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
  IF TG_OP = 'UPDATE' THEN
    UPDATE vidpoll_spend_days
    SET reserved = reserved - CASE WHEN OLD.status = 'reserved' THEN coalesce(OLD.amount, 0)
                                   ELSE 0 END,
        spent = spent - CASE WHEN OLD.status = 'spent' THEN coalesce(OLD.amount, 0) ELSE 0 END,
        creates = creates - CASE WHEN OLD.status <> 'released' THEN 1 ELSE 0 END
    WHERE account = OLD.account AND day = OLD.day AND model = coalesce(OLD.model, '');
  END IF;
  INSERT INTO vidpoll_spend_days AS d (account, day, model, reserved, spent, creates)
  VALUES (NEW.account, NEW.day, coalesce(NEW.model, ''),
          CASE WHEN NEW.status = 'reserved' THEN coalesce(NEW.amount, 0) ELSE 0 END,
          CASE WHEN NEW.status = 'spent' THEN coalesce(NEW.amount, 0) ELSE 0 END,
          CASE WHEN NEW.status <> 'released' THEN 1 ELSE 0 END)
  ON CONFLICT (account, day, model) DO UPDATE
  SET reserved = d.reserved + EXCLUDED.reserved, spent = d.spent + EXCLUDED.spent,
      creates = d.creates + EXCLUDED.creates;
  RETURN NULL;
END
$$;

-- vidpoll: step
DROP TRIGGER IF EXISTS vidpoll_spend_days_kept ON vidpoll_spend;
CREATE TRIGGER vidpoll_spend_days_kept
  AFTER INSERT OR UPDATE OF status, amount, day, model ON vidpoll_spend
  FOR EACH ROW EXECUTE FUNCTION vidpoll_spend_days_kept();

-- Budget freed on an account: its oldest held intents are due now (each is checked again by
-- the next claim and held again, with its reason brought up to date, if it still does not
-- fit). A few: one refund frees room for about one job, and waking thousands would have each
-- claimed and held again for nothing (a reload of the caps wakes them all).
-- The submitters wake them too: at start and on a reload of the caps (the oldest 20), and a
-- claim that sent held intents without holding any wakes the next 20 (so a cap raised lets
-- them all go, 20 at a time, never all at once).
-- vidpoll: step
DROP FUNCTION IF EXISTS vidpoll_wake_held(text);
CREATE FUNCTION vidpoll_wake_held(acct text) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
  woken integer;
BEGIN
  UPDATE video_intents SET next_attempt_at = clock_timestamp()
  WHERE idempotency_key IN (
      SELECT idempotency_key FROM video_intents
      WHERE state = 'held' AND account = acct AND next_attempt_at > clock_timestamp()
        AND claim_token IS NULL
      ORDER BY priority DESC, seq
      LIMIT 20)
    -- checked again on the row as it is when locked (a claim may have taken it since the
    -- subquery's snapshot): never one claimed or sent, whose lease is its schedule
    AND state = 'held' AND claim_token IS NULL;
  GET DIAGNOSTICS woken = ROW_COUNT;
  IF woken > 0 THEN
    PERFORM pg_notify('vidpoll_intents', '');
  END IF;
  RETURN woken;
END
$$;

-- A job that ends settles its reservation: its cost (the worker's figure, else the estimate,
-- which the row then shows); 0 releases it and wakes the account's held intents. Named to
-- run after vidpoll_jobs_outcome_* (BEFORE triggers run in name order), which sets the
-- outcome it reads. SECURITY DEFINER: a role that writes job rows (the seed's own loop) needs
-- no grant on the ledger.
-- vidpoll: step
CREATE OR REPLACE FUNCTION vidpoll_job_spend() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
  est numeric;
  settled numeric;
  was text;
BEGIN
  IF NEW.outcome IS NULL OR NEW.idempotency_key IS NULL THEN
    RETURN NEW;
  END IF;
  IF OLD.outcome IS NOT DISTINCT FROM NEW.outcome AND OLD.cost IS NOT DISTINCT FROM NEW.cost THEN
    RETURN NEW;
  END IF;
  SELECT s.estimate, s.status INTO est, was FROM vidpoll_spend s
  WHERE s.idempotency_key = NEW.idempotency_key FOR UPDATE;
  IF NOT FOUND THEN
    RETURN NEW;
  END IF;
  settled := coalesce(NEW.cost, est);
  UPDATE vidpoll_spend
  SET amount = settled,
      status = CASE WHEN settled = 0 THEN 'released' ELSE 'spent' END,
      job_id = NEW.job_id, settled_at = clock_timestamp()
  WHERE idempotency_key = NEW.idempotency_key;
  IF NEW.cost IS NULL THEN
    NEW.cost := est;
  END IF;
  -- a refund, or a cost well under the estimate, frees room for another job
  IF settled IS NOT NULL AND est > 0 AND (settled = 0 OR est - settled >= est / 2) THEN
    PERFORM vidpoll_wake_held(NEW.account);
  END IF;
  RETURN NEW;
END
$$;

-- vidpoll: step
DROP TRIGGER IF EXISTS vidpoll_jobs_spend ON video_jobs;
CREATE TRIGGER vidpoll_jobs_spend
  BEFORE UPDATE OF state, outcome, cost ON video_jobs
  FOR EACH ROW
  WHEN (NEW.state IS DISTINCT FROM OLD.state OR NEW.outcome IS DISTINCT FROM OLD.outcome
        OR NEW.cost IS DISTINCT FROM OLD.cost)
  EXECUTE FUNCTION vidpoll_job_spend();

-- A create refused in the provider's words (or settled by hand as not billed) started
-- nothing: its reservation is released.
-- vidpoll: step
CREATE OR REPLACE FUNCTION vidpoll_intent_spend() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
  UPDATE vidpoll_spend SET amount = 0, status = 'released', settled_at = clock_timestamp()
  WHERE idempotency_key = NEW.idempotency_key AND status = 'reserved';
  IF FOUND THEN
    PERFORM vidpoll_wake_held(NEW.account);
  END IF;
  RETURN NULL;
END
$$;

-- vidpoll: step
DROP TRIGGER IF EXISTS vidpoll_intents_spend ON video_intents;
CREATE TRIGGER vidpoll_intents_spend
  AFTER UPDATE OF state ON video_intents
  FOR EACH ROW
  WHEN (NEW.state = 'rejected' AND OLD.state IS DISTINCT FROM 'rejected')
  EXECUTE FUNCTION vidpoll_intent_spend();
