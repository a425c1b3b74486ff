-- name: render_stats
-- The render-time summary (vidpoll_render_times summarised per account, provider, model and
-- duration key), refreshed first if it is older than max_age_s and render times were added
-- since: by one caller at a time, fleet-wide (0018's vidpoll_render_stats_fresh).
SELECT account, provider, model, duration_key, jobs, quantiles, p10, p50, p90, p99,
       refreshed_at
FROM vidpoll_render_stats_fresh(%(max_age_s)s::float8)
ORDER BY account, provider, model, duration_key;

-- name: render_stats_at
-- The same at a test's clock (the owner's only: 0018 revokes it from PUBLIC).
SELECT account, provider, model, duration_key, jobs, quantiles, p10, p50, p90, p99,
       refreshed_at
FROM vidpoll_render_stats_at(%(max_age_s)s::float8, %(now)s::timestamptz)
ORDER BY account, provider, model, duration_key;

-- name: list_overdue
-- Pending jobs running past their group's p99 times the account's factor (overdue_at, set by
-- the worker that planned their reads), the longest overdue first, along the partial index
-- video_jobs_overdue_idx (pending rows with an overdue_at).
SELECT job_id, account, provider, model, duration_key, created_at, overdue_at, polls,
       provider_status, next_poll_at, poll_reason,
       extract(epoch FROM (coalesce(%(now)s::timestamptz, now()) - created_at))::float8 AS age_s
FROM video_jobs
WHERE state = 'pending' AND overdue_at IS NOT NULL
  AND overdue_at <= coalesce(%(now)s::timestamptz, now())
  AND (%(account)s::text IS NULL OR account = %(account)s)
ORDER BY overdue_at
LIMIT %(limit)s;

-- name: count_overdue
-- Overdue pending jobs by account (the gauge vidpoll_jobs_overdue, the dashboard).
SELECT account, count(*) AS overdue
FROM video_jobs
WHERE state = 'pending' AND overdue_at IS NOT NULL
  AND overdue_at <= coalesce(%(now)s::timestamptz, now())
GROUP BY account;
