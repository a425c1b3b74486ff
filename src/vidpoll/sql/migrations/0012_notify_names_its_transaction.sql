-- A wake-up NOTIFY on vidpoll_jobs names the transaction that sent it (its id as the payload;
-- PostgreSQL still sends one per transaction). A worker whose claim began after a notification
-- reached it saw that transaction's rows, so when the claim took every due row it can tell the
-- fleet which notifications it covered (vidpoll_drained), and the workers that were about to
-- answer the same notifications stay asleep: one claim for a new row, not one per worker.
-- Code of level 11 ignores payloads: it works beside this.
-- vidpoll: expand
CREATE OR REPLACE FUNCTION vidpoll_notify_jobs() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('vidpoll_jobs', pg_current_xact_id()::text);
  RETURN NULL;
END
$$;
