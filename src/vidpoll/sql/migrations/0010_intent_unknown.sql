-- An intent whose outcome is unknown (issue 15, item 3).
--
-- A POST whose reply was lost (a timeout, a dropped connection, a 5xx, a 2xx without a job id,
-- a crash before the answer was recorded, ...) may have started a billed render. If a later
-- attempt of the same key is refused (a provider that checks credits or limits before its
-- idempotency lookup answers 402 to the re-send of a render it already started), the refusal
-- is no proof that nothing was billed. Such an intent is `unknown`: it is sent again with the
-- same key on a slow schedule (at most 2 minutes apart), so a top-up brings back the job the
-- first attempt started, and an operator can settle it (`vidpoll intents resolve KEY
-- --job-id ID | --not-billed`). It holds a slot under --max-active (it may be rendering).

-- When an attempt's outcome was first unknown; NULL: every attempt so far had a clear answer.
-- Set by the record of an unknown outcome, and by the claim that finds the previous claim's
-- attempt never recorded (the process died with the POST possibly sent).
-- vidpoll: step
ALTER TABLE video_intents ADD COLUMN IF NOT EXISTS unknown_outcome_at timestamptz;
-- An operator's settlement of an unknown intent: 'job' (billed, this job) or 'not_billed'.
ALTER TABLE video_intents ADD COLUMN IF NOT EXISTS resolution text;
ALTER TABLE video_intents ADD COLUMN IF NOT EXISTS resolved_at timestamptz;

-- Each CHECK is swapped in one short transaction, added NOT VALID (no scan under the lock;
-- new and updated rows are checked at once), then validated in a step of its own, which
-- scans the table without blocking its writes.
-- vidpoll: step
ALTER TABLE video_intents DROP CONSTRAINT IF EXISTS video_intents_state_check;
ALTER TABLE video_intents ADD CONSTRAINT video_intents_state_check
  CHECK (state IN ('queued', 'submitted', 'rejected', 'unknown')) NOT VALID;
-- vidpoll: step
ALTER TABLE video_intents VALIDATE CONSTRAINT video_intents_state_check;
-- vidpoll: step
ALTER TABLE video_intents DROP CONSTRAINT IF EXISTS video_intents_resolution_check;
ALTER TABLE video_intents ADD CONSTRAINT video_intents_resolution_check
  CHECK (resolution IN ('job', 'not_billed')) NOT VALID;
-- vidpoll: step
ALTER TABLE video_intents VALIDATE CONSTRAINT video_intents_resolution_check;

-- The unknown intents' slow re-send schedule: few rows, claimed by due time per account.
-- vidpoll: step no-transaction
CREATE INDEX CONCURRENTLY IF NOT EXISTS video_intents_unknown_idx
  ON video_intents (account, next_attempt_at) WHERE state = 'unknown';

-- Intents being retried now had an attempt whose outcome was unknown: remember it. (Intents
-- rejected before this migration after such an attempt are left as they are, never re-sent by
-- surprise; `intents list --state rejected` with attempts > 1 lists the ones to check.)
-- vidpoll: step batched video_intents idempotency_key
UPDATE video_intents SET unknown_outcome_at = coalesce(updated_at, now())
WHERE idempotency_key BETWEEN %(first)s AND %(last)s
  AND state = 'queued' AND attempts > 0 AND unknown_outcome_at IS NULL;
