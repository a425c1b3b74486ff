-- Reconciling unknown creates (issue 20). A provider with no idempotency key on create
-- (Replicate, fal, Veo, Runway, Luma, Kling) bills every create that reaches it, so a create
-- whose outcome is unknown (a timeout, a dropped connection, a 5xx, a crash mid-POST) is never
-- sent again blindly: the intent becomes `reconciling`, and the submitter looks the create up
-- in the provider's own records (its list of recent jobs, matched on model and input) around
-- the time window of the attempt. Found: adopted (the job row inserted, the intent
-- `submitted`, exactly as after a 201). Proven absent: `queued` again, sent once more. Neither
-- (two identical inputs in the window, a list unavailable past a deadline): `unknown`, for an
-- operator (`vidpoll intents resolve`).
-- Code of level 14 works beside it: its claims never pick a `reconciling` intent (they name
-- `queued` and `unknown` only) and it never writes one.
-- vidpoll: expand

-- When the earliest create that is not yet settled may have been sent (the claim before it):
-- the start of the window the provider's records are searched in. NULL once it is settled.
-- vidpoll: step
ALTER TABLE video_intents ADD COLUMN IF NOT EXISTS create_window_from timestamptz;

-- vidpoll: step
ALTER TABLE video_intents DROP CONSTRAINT IF EXISTS video_intents_state_check;
ALTER TABLE video_intents ADD CONSTRAINT video_intents_state_check
  CHECK (state IN ('queued', 'submitted', 'rejected', 'unknown', 'reconciling')) NOT VALID;
-- vidpoll: step
ALTER TABLE video_intents VALIDATE CONSTRAINT video_intents_state_check;

-- The submitter's look-ups, due by time per account (few rows: each settles within seconds).
-- vidpoll: step no-transaction
CREATE INDEX CONCURRENTLY IF NOT EXISTS video_intents_reconciling_idx
  ON video_intents (account, next_attempt_at) WHERE state = 'reconciling';
