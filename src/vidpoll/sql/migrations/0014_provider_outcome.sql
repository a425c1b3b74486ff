-- Provider-neutral outcomes (issue 19). `state` keeps the provider's own terminal word
-- lower-cased, as before; `outcome` says how the render ended in every provider's terms
-- (succeeded, failed, canceled, expired, or vidpoll's own not_found, gave_up; NULL while
-- pending), and results, deliveries, hooks, metrics and the dashboard go by it.
--
-- Every row has a provider (the seed's table and every existing row are Sume's). A writer
-- that names no outcome (the seed's own loop, a worker of an older release during a rolling
-- deploy) gets one from its provider's terminal words, kept in vidpoll_outcome_words. That
-- table is written by `migrate` in Python from each provider's `rules.words`
-- (vidpoll.outcome_words), after this file, which names no provider's words; the same code
-- then fills in the outcome of rows that ended before this migration, in batches.
-- Code of level 13 works beside it: it never reads the new columns, and the trigger gives
-- its writes an outcome (the delivery trigger queues all that it did).
-- vidpoll: expand

-- Constant defaults: no table rewrite (PostgreSQL 11+).
-- vidpoll: step
ALTER TABLE video_jobs
  ADD COLUMN IF NOT EXISTS provider text NOT NULL DEFAULT 'sume',
  ADD COLUMN IF NOT EXISTS outcome text;
-- `jobs prune` keeps both in the archive.
-- vidpoll: step
ALTER TABLE video_jobs_archive
  ADD COLUMN IF NOT EXISTS provider text NOT NULL DEFAULT 'sume',
  ADD COLUMN IF NOT EXISTS outcome text;
-- vidpoll: step
ALTER TABLE video_intents
  ADD COLUMN IF NOT EXISTS provider text NOT NULL DEFAULT 'sume',
  -- the model a create runs (`submit --model`), for a provider whose creates name one
  ADD COLUMN IF NOT EXISTS model text;

-- Added NOT VALID (new and updated rows are checked at once), validated in a step of its own.
-- vidpoll: step
ALTER TABLE video_jobs DROP CONSTRAINT IF EXISTS video_jobs_outcome_check;
ALTER TABLE video_jobs ADD CONSTRAINT video_jobs_outcome_check
  CHECK (outcome IN ('succeeded', 'failed', 'canceled', 'expired', 'not_found', 'gave_up'))
  NOT VALID;
-- vidpoll: step
ALTER TABLE video_jobs VALIDATE CONSTRAINT video_jobs_outcome_check;

-- Each provider's terminal words (lower-cased) and the outcome each one means.
-- vidpoll: step
CREATE TABLE IF NOT EXISTS vidpoll_outcome_words (
  provider text NOT NULL,
  word     text NOT NULL,
  outcome  text NOT NULL CHECK (outcome IN ('succeeded', 'failed', 'canceled', 'expired')),
  PRIMARY KEY (provider, word)
);

-- The outcome of a row whose state changed: NULL while pending; vidpoll's own terminal states
-- are their own outcome; a provider's word keeps the outcome its writer gave (one that names
-- none, on an update: one that leaves it as it was), else its provider's words say it, and a
-- word they do not know ended the job without a video. A provider none of whose words are
-- written yet (between this migration and `migrate` writing them) leaves it NULL, for the
-- backfill that follows to fill in.
-- Called by the two triggers below only when state or outcome changes: a poll that keeps a
-- row pending never runs it. SECURITY DEFINER: it reads the words as the schema's owner, so a
-- role that writes job rows needs no grant on the words table (a worker of the previous
-- release, the seed's own loop: their writes must not fail between `migrate` and a GRANT).
-- vidpoll: step
CREATE OR REPLACE FUNCTION vidpoll_outcome_of_state() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
  IF NEW.state = 'pending' THEN
    NEW.outcome := NULL;
  ELSIF NEW.state IN ('not_found', 'gave_up') THEN
    NEW.outcome := NEW.state;
  ELSE
    -- an outcome the writer gave is kept; on an update (this runs when the state changed),
    -- one equal to the old was carried over by a writer that names none
    IF NEW.outcome IS NOT NULL THEN
      IF TG_OP = 'INSERT' THEN
        RETURN NEW;
      END IF;
      IF NEW.outcome IS DISTINCT FROM OLD.outcome THEN
        RETURN NEW;
      END IF;
    END IF;
    SELECT w.outcome INTO NEW.outcome FROM vidpoll_outcome_words w
    WHERE w.provider = NEW.provider AND w.word = lower(NEW.state);
    IF NOT FOUND THEN
      NEW.outcome := CASE WHEN EXISTS (SELECT 1 FROM vidpoll_outcome_words w
                                       WHERE w.provider = NEW.provider)
                          THEN 'failed' END;
    END IF;
  END IF;
  RETURN NEW;
END
$$;

-- Two triggers, so each WHEN can skip the function: an insert of a pending row naming no
-- outcome, an update that changes neither column. (BEFORE triggers run before every AFTER
-- trigger, which see the outcome set here: vidpoll_jobs_deliveries among them.)
-- vidpoll: step
DROP TRIGGER IF EXISTS vidpoll_jobs_outcome_inserted ON video_jobs;
DROP TRIGGER IF EXISTS vidpoll_jobs_outcome_changed ON video_jobs;
CREATE TRIGGER vidpoll_jobs_outcome_inserted
  BEFORE INSERT ON video_jobs
  FOR EACH ROW
  WHEN (NEW.state <> 'pending' OR NEW.outcome IS NOT NULL)
  EXECUTE FUNCTION vidpoll_outcome_of_state();
CREATE TRIGGER vidpoll_jobs_outcome_changed
  BEFORE UPDATE OF state, outcome ON video_jobs
  FOR EACH ROW
  WHEN (NEW.state IS DISTINCT FROM OLD.state OR NEW.outcome IS DISTINCT FROM OLD.outcome)
  EXECUTE FUNCTION vidpoll_outcome_of_state();

-- Downloads for jobs whose outcome is `succeeded` (whatever their provider's word), hooks for
-- every terminal state, as before. An outcome still NULL on a terminal row (its provider's
-- words not written yet) queues the download too: the downloader looks at the job when it
-- runs, by when the backfill has given it its outcome; a download never queued is lost.
-- vidpoll: step
CREATE OR REPLACE FUNCTION vidpoll_queue_deliveries() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  -- downloads only for jobs that ended with a video; hooks for every terminal state
  INSERT INTO vidpoll_deliveries (job_id, consumer)
  SELECT NEW.job_id, c.name FROM vidpoll_consumers c
  WHERE c.name <> 'download' OR coalesce(NEW.outcome, 'succeeded') = 'succeeded'
  -- a job that ends again (resumed after giving up) is delivered again, with its new state;
  -- a run in progress keeps its lease (and token), its outcome is re-queued by generation
  ON CONFLICT (job_id, consumer) DO UPDATE
    SET state = 'pending', attempts = 0, last_error = NULL, done_at = NULL,
        generation = vidpoll_deliveries.generation + 1,
        next_at = CASE WHEN vidpoll_deliveries.token IS NULL
                         OR vidpoll_deliveries.state <> 'pending'
                       THEN now() ELSE vidpoll_deliveries.next_at END;
  RETURN NULL;
END
$$;
