-- A job's handle (issue 28): what a provider's answer to a create says beyond the job id that
-- later reads must use. fal answers a create with the URLs of the request's status, result
-- and cancel, and says not to build them; they live under the app's owner/name only, without
-- the endpoint's subpath, so they cannot be derived from the model either. The handle is
-- stored with the job in the statement that inserts it (record_submitted, adopt_job) and
-- given back to the provider's client with every read of that job (claim_due, claim_results).
-- NULL for every provider that needs none (Sume, Replicate): their reads take the id alone.
-- Code of level 15 works beside it: it never reads the column and inserts NULL.
-- vidpoll: expand

-- vidpoll: step
ALTER TABLE video_jobs ADD COLUMN IF NOT EXISTS handle jsonb;
-- vidpoll: step
ALTER TABLE video_jobs_archive ADD COLUMN IF NOT EXISTS handle jsonb;
