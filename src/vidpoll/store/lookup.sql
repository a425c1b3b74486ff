-- Finding a job by the shortened id `jobs list` prints (its first 8 and last 4 characters).

-- name: jobs_by_short_id
-- Up to three ids, tracked or archived, that start with %(head)s and end with %(tail)s and
-- are longer than the shortened form (a scan: for a person's command, not a hot path).
SELECT job_id FROM (
  SELECT job_id FROM video_jobs
  WHERE starts_with(job_id, %(head)s) AND right(job_id, %(tail_len)s) = %(tail)s
    AND length(job_id) > %(min_len)s
  UNION
  SELECT job_id FROM video_jobs_archive
  WHERE starts_with(job_id, %(head)s) AND right(job_id, %(tail_len)s) = %(tail)s
    AND length(job_id) > %(min_len)s
) found
ORDER BY job_id
LIMIT 3;
