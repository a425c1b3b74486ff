-- Webhook deliveries seen, by Sume's event id: a repeated delivery is recognised and ignored.
-- A webhook never sets a job's state; it only makes the job due now so a worker reads it.
CREATE TABLE IF NOT EXISTS vidpoll_webhook_events (
  event_id    text PRIMARY KEY,
  received_at timestamptz NOT NULL DEFAULT now(),
  job_id      text,
  -- what the delivery did: made_due (the row will be read now), already_due, claimed (a
  -- read is in flight), finished (the row is final), unknown (no such job)
  effect      text NOT NULL
);
CREATE INDEX IF NOT EXISTS vidpoll_webhook_events_received_idx
  ON vidpoll_webhook_events (received_at);
