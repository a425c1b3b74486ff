-- Render times (issue 31): how long each model's renders take, learned from the table's own
-- finished jobs, for a poll schedule that reads sparsely while a render cannot be done yet and
-- densely where renders of its model usually end; and the overdue flag.
--
-- When a job ends (pending -> anything, an outcome of succeeded or failed), a trigger appends
-- its render time to vidpoll_render_times: the provider's own figure when the worker read one
-- from the final answer (`render_s`: Replicate's completed_at - created_at), else vidpoll's:
-- from the row's creation to the middle of the last read that saw it running and the read that
-- saw it end (the end lies between them). Workers that plan reads from these times summarise
-- them into vidpoll_render_stats at most once a minute, fleet-wide (store/durations.py): 51
-- quantiles of the newest 1,000 render times of each account, provider, model and duration
-- key (and of each model over every key, `*`) that ended within 30 days; the summary is what a
-- worker reads, never the samples. The same refresh prunes samples beyond those.
-- Code of level 17 works beside it: it never reads the new columns; its jobs' render times are
-- recorded by the trigger too (without a model).
-- vidpoll: expand

-- The request's model and duration key (the clip length, where the provider's rules know
-- one), copied from the intent when the job is recorded; the provider's own render time;
-- why the next read is when it is (the worker's words, for `jobs show`); when the job becomes
-- overdue (its group's p99 times the account's factor, from its creation); the last read
-- whose answer said the job was still running (a read that failed says nothing: its time is
-- no bound on the render's end).
-- vidpoll: step
ALTER TABLE video_jobs
  ADD COLUMN IF NOT EXISTS model text,
  ADD COLUMN IF NOT EXISTS duration_key text,
  ADD COLUMN IF NOT EXISTS render_s real,
  ADD COLUMN IF NOT EXISTS poll_reason text,
  ADD COLUMN IF NOT EXISTS overdue_at timestamptz,
  ADD COLUMN IF NOT EXISTS running_seen_at timestamptz;
-- vidpoll: step
ALTER TABLE video_jobs_archive
  ADD COLUMN IF NOT EXISTS model text,
  ADD COLUMN IF NOT EXISTS duration_key text,
  ADD COLUMN IF NOT EXISTS render_s real,
  ADD COLUMN IF NOT EXISTS poll_reason text,
  ADD COLUMN IF NOT EXISTS overdue_at timestamptz,
  ADD COLUMN IF NOT EXISTS running_seen_at timestamptz;
-- vidpoll: step
ALTER TABLE video_intents ADD COLUMN IF NOT EXISTS duration_key text;

-- `jobs list --overdue`, the overdue gauge: pending rows whose reads a learned schedule
-- planned (overdue_at is set on their first read that found them running; rows of providers
-- that hint, or without history, are not in it).
-- vidpoll: step no-transaction
CREATE INDEX CONCURRENTLY IF NOT EXISTS video_jobs_overdue_idx
  ON video_jobs (overdue_at) WHERE state = 'pending' AND overdue_at IS NOT NULL;

-- One row per ended job: appended by the trigger, pruned by the summary's refresh.
-- vidpoll: step
CREATE TABLE IF NOT EXISTS vidpoll_render_times (
  id           bigserial PRIMARY KEY,
  account      text NOT NULL,
  provider     text NOT NULL,
  model        text NOT NULL DEFAULT '',
  duration_key text NOT NULL DEFAULT '',
  ended_at     timestamptz NOT NULL,
  seconds      real NOT NULL CHECK (seconds >= 0),
  -- 'provider': its own timestamps; 'observed': vidpoll's reads (± half the last gap)
  source       text NOT NULL CHECK (source IN ('provider', 'observed')),
  -- how far the observed end may be from the true one (half the last gap), 0 for 'provider'
  spread_s     real NOT NULL DEFAULT 0
);
-- the newest samples of a group (the refresh's window)
-- vidpoll: step no-transaction
CREATE INDEX CONCURRENTLY IF NOT EXISTS vidpoll_render_times_group_idx
  ON vidpoll_render_times (account, provider, model, duration_key, ended_at DESC);

-- The summary the workers plan from: a few rows, one per group, refreshed once a minute.
-- vidpoll: step
CREATE TABLE IF NOT EXISTS vidpoll_render_stats (
  account      text NOT NULL,
  provider     text NOT NULL,
  model        text NOT NULL,
  duration_key text NOT NULL,   -- '*': the model over every key
  jobs         integer NOT NULL,
  quantiles    real[] NOT NULL, -- the 0th, 2nd, ..., 100th percentile, seconds
  p10 real NOT NULL, p50 real NOT NULL, p90 real NOT NULL, p99 real NOT NULL,
  refreshed_at timestamptz NOT NULL,
  through_id   bigint NOT NULL,  -- the newest sample it saw
  PRIMARY KEY (account, provider, model, duration_key)
);

-- vidpoll: step
CREATE OR REPLACE FUNCTION vidpoll_note_render_time() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
  ended timestamptz := coalesce(NEW.finished_at, clock_timestamp());
  -- a level-17 writer sets no running_seen_at: its last read is the best bound there is
  seen_running timestamptz := greatest(NEW.created_at,
                                       coalesce(OLD.running_seen_at, OLD.last_polled_at,
                                                NEW.created_at));
BEGIN
  IF NEW.outcome IS NULL OR NEW.outcome NOT IN ('succeeded', 'failed') THEN
    RETURN NULL;
  END IF;
  -- keep the group to its newest 1,000: each one added drops the oldest beyond them (an
  -- index scan of the group's newest entries), so the table stays bounded whoever reads it
  DELETE FROM vidpoll_render_times
  WHERE id = (SELECT id FROM vidpoll_render_times
              WHERE account = NEW.account AND provider = NEW.provider
                AND model = coalesce(NEW.model, '')
                AND duration_key = coalesce(NEW.duration_key, '')
              ORDER BY ended_at DESC OFFSET 999 LIMIT 1);
  IF NEW.render_s IS NOT NULL AND NEW.render_s >= 0 THEN
    INSERT INTO vidpoll_render_times (account, provider, model, duration_key, ended_at,
                                      seconds, source)
    VALUES (NEW.account, NEW.provider, coalesce(NEW.model, ''),
            coalesce(NEW.duration_key, ''), ended, NEW.render_s, 'provider');
  ELSIF ended >= seen_running THEN
    -- the end lies between the last read that saw the job running and the one that saw it
    -- end: its middle, ± half the gap
    INSERT INTO vidpoll_render_times (account, provider, model, duration_key, ended_at,
                                      seconds, source, spread_s)
    VALUES (NEW.account, NEW.provider, coalesce(NEW.model, ''),
            coalesce(NEW.duration_key, ''), ended,
            extract(epoch FROM (seen_running - NEW.created_at))
              + extract(epoch FROM (ended - seen_running)) / 2,
            'observed', extract(epoch FROM (ended - seen_running)) / 2);
  END IF;
  RETURN NULL;
END
$$;

-- vidpoll: step
DROP TRIGGER IF EXISTS vidpoll_jobs_render_time ON video_jobs;
CREATE TRIGGER vidpoll_jobs_render_time
  AFTER UPDATE OF state ON video_jobs
  FOR EACH ROW
  WHEN (OLD.state = 'pending' AND NEW.state <> 'pending')
  EXECUTE FUNCTION vidpoll_note_render_time();

-- The summary, brought up to date first when it is older than max_age_s (at least 10 s) and
-- render times were added since (one refresher at a time, fleet-wide: the others read the
-- summary as it is), then returned. SECURITY DEFINER: a worker's role needs no grant on
-- either table. `at`: a test's clock (the 30-day window and the summary's age); only the
-- owner may give one (EXECUTE revoked from PUBLIC): the public form uses the database's.
-- vidpoll: step
CREATE OR REPLACE FUNCTION vidpoll_render_stats_at(max_age_s float8, at timestamptz)
RETURNS SETOF vidpoll_render_stats
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
  now_ts timestamptz := coalesce(at, clock_timestamp());
  points float8[] := ARRAY(SELECT i / 50.0 FROM generate_series(0, 50) AS i ORDER BY i);
  seen bigint;
  fresh_at timestamptz;
  newest bigint;
BEGIN
  SELECT max(through_id), max(refreshed_at) INTO seen, fresh_at FROM vidpoll_render_stats;
  SELECT max(id) INTO newest FROM vidpoll_render_times;
  IF newest IS DISTINCT FROM seen
     -- a summary from the future (a clock set back) counts as stale
     AND (fresh_at IS NULL OR fresh_at > now_ts
          OR fresh_at < now_ts - make_interval(secs => greatest(max_age_s, 10)))
     AND pg_try_advisory_xact_lock(hashtext('vidpoll'), 31) THEN
    -- keep the newest 1,000 of each group that ended within 30 days
    DELETE FROM vidpoll_render_times t
    USING (SELECT id, row_number() OVER (PARTITION BY account, provider, model, duration_key
                                         ORDER BY ended_at DESC, id DESC) AS rn
           FROM vidpoll_render_times) r
    WHERE t.id = r.id AND (r.rn > 1000 OR t.ended_at < now_ts - interval '30 days');
    DELETE FROM vidpoll_render_stats;
    INSERT INTO vidpoll_render_stats (account, provider, model, duration_key, jobs, quantiles,
                                      p10, p50, p90, p99, refreshed_at, through_id)
    SELECT account, provider, model, key, jobs, q::real[], q[6], q[26], q[46], p99, now_ts,
           coalesce(newest, 0)
    FROM (SELECT account, provider, model,
                 CASE WHEN GROUPING(duration_key) = 1 THEN '*' ELSE duration_key END AS key,
                 count(*)::int AS jobs,
                 percentile_cont(points) WITHIN GROUP (ORDER BY seconds) AS q,
                 percentile_cont(0.99) WITHIN GROUP (ORDER BY seconds) AS p99
          FROM vidpoll_render_times
          GROUP BY GROUPING SETS ((account, provider, model, duration_key),
                                  (account, provider, model))) AS g;
  END IF;
  RETURN QUERY SELECT * FROM vidpoll_render_stats;
END
$$;
-- vidpoll: step
REVOKE EXECUTE ON FUNCTION vidpoll_render_stats_at(float8, timestamptz) FROM PUBLIC;

-- vidpoll: step
CREATE OR REPLACE FUNCTION vidpoll_render_stats_fresh(max_age_s float8)
RETURNS SETOF vidpoll_render_stats
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
  SELECT * FROM vidpoll_render_stats_at(max_age_s, NULL)
$$;
