-- Webhook deliveries seen, by Sume's event id: a repeated delivery is recognised and ignored.
-- A webhook never sets a job's state; it only makes the job due now so a worker reads it.
-- vidpoll: step
CREATE TABLE IF NOT EXISTS vidpoll_webhook_events (
  event_id    text PRIMARY KEY,
  received_at timestamptz NOT NULL DEFAULT now(),
  job_id      text,
  -- what the delivery did: made_due (the row will be read now), already_due, claimed (a
  -- read is in flight), finished (the row is final), unknown (no such job)
  effect      text NOT NULL
);
-- the signature is unique too: a captured delivery resent under a new event id (the event id
-- is not signed) is still the same signed delivery
-- vidpoll: step
ALTER TABLE vidpoll_webhook_events ADD COLUMN IF NOT EXISTS signature text;
-- vidpoll: step no-transaction
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS vidpoll_webhook_events_signature_idx
  ON vidpoll_webhook_events (signature);

-- A delivery for a row a worker is reading right now cannot move next_poll_at (the read in
-- flight would overwrite it): it leaves a mark instead, and the read's record makes the row
-- due again at once.
-- vidpoll: step
ALTER TABLE video_jobs ADD COLUMN IF NOT EXISTS poked_at timestamptz;
