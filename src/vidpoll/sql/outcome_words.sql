-- Every provider's terminal words, and the outcome of rows that ended without one (migration
-- 0014; vidpoll.outcome_words runs these after the SQL migrations).

-- name: outcome_words_exist
-- Whether the schema has the words table yet (a database migrated short of 0014 has not).
SELECT to_regclass('vidpoll_outcome_words') IS NOT NULL;

-- name: upsert_outcome_word
-- One provider's word and its outcome; a changed outcome is rewritten, an equal one left.
INSERT INTO vidpoll_outcome_words (provider, word, outcome)
VALUES (%(provider)s, %(word)s, %(outcome)s)
ON CONFLICT (provider, word) DO UPDATE SET outcome = EXCLUDED.outcome
WHERE vidpoll_outcome_words.outcome IS DISTINCT FROM EXCLUDED.outcome;

-- name: any_outcome_unfilled
-- Whether any row is left to fill in: one scan that stops at the first, so a `migrate` with
-- nothing to do (every run after the first) does not walk the whole table.
SELECT EXISTS (
  SELECT 1 FROM video_jobs j
  WHERE j.outcome IS NULL AND j.state <> 'pending'
    AND EXISTS (SELECT 1 FROM vidpoll_outcome_words w WHERE w.provider = j.provider));

-- name: outcome_backfill_first_keys
-- The first and last of the first %(rows)s job ids, walked by the primary key.
SELECT min(job_id), max(job_id), count(*) FROM (
  SELECT job_id FROM video_jobs ORDER BY job_id LIMIT %(rows)s) b;

-- name: outcome_backfill_next_keys
-- The first and last of the %(rows)s job ids after %(after)s: a batch costs the same however
-- far along the table it is.
SELECT min(job_id), max(job_id), count(*) FROM (
  SELECT job_id FROM video_jobs WHERE job_id > %(after)s ORDER BY job_id LIMIT %(rows)s) b;

-- name: outcome_backfill
-- The outcome the trigger (vidpoll_outcome_of_state) would give, for the finished rows of one
-- range of ids that have none. Only the outcome is set: the state does not change, so no
-- delivery, history or NOTIFY trigger fires.
UPDATE video_jobs j
SET outcome = CASE
  WHEN j.state IN ('not_found', 'gave_up') THEN j.state
  ELSE coalesce((SELECT w.outcome FROM vidpoll_outcome_words w
                 WHERE w.provider = j.provider AND w.word = lower(j.state)),
                'failed') END
WHERE j.job_id BETWEEN %(first)s AND %(last)s
  AND j.outcome IS NULL AND j.state <> 'pending'
  -- a provider none of whose words are known yet keeps NULL: a later migrate fills it in
  AND EXISTS (SELECT 1 FROM vidpoll_outcome_words w WHERE w.provider = j.provider);
