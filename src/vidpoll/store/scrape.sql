-- What a /metrics scrape and the dashboard's overview read from video_jobs: nothing here
-- scans the table. The pending rows are counted exactly through the seed's partial index;
-- the finished rows are PostgreSQL's own estimates (catalog reads); a small table is counted
-- exactly, with a LIMIT so a stale estimate can never turn it into a full scan.


-- name: scrape_table_estimate
-- The planner's row estimate of video_jobs: reltuples from the last VACUUM or ANALYZE scaled
-- to the table's size now (as the planner scales it, so rows inserted since count), each
-- state's share of ANALYZE's sample, and when that sample was taken. rows is NULL when the
-- table was never vacuumed or analyzed.
SELECT CASE WHEN c.reltuples < 0 OR c.relpages = 0 THEN NULL
            ELSE c.reltuples / c.relpages
                 * (pg_relation_size(c.oid) / current_setting('block_size')::int)
       END::float8 AS rows,
       s.most_common_vals::text::text[] AS states,
       s.most_common_freqs::float8[] AS shares,
       greatest(t.last_analyze, t.last_autoanalyze) AS analyzed_at
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_stats s
  ON s.schemaname = n.nspname AND s.tablename = c.relname AND s.attname = 'state'
     AND NOT s.inherited
LEFT JOIN pg_stat_user_tables t ON t.relid = c.oid
WHERE c.oid = 'video_jobs'::regclass;


-- name: scrape_count_states_upto
-- Exact rows per state of a small table: at most `upto` + 1 rows are read, so a table that
-- grew past its estimate costs that much and no more (the caller then uses the estimates).
SELECT state, count(*) AS n
FROM (SELECT state FROM video_jobs LIMIT %(upto)s::int + 1) AS head
GROUP BY state;


-- name: scrape_pending
-- Pending rows, rows due now and how late the most overdue one is, in one walk of the partial
-- index on next_poll_at WHERE state = 'pending' (an index-only scan). The walk goes in due
-- order and stops after `upto` + 1 entries: the due rows come first, so `due` is exact up to
-- `upto` + 1 whatever the number of rows due later.
SELECT count(*) AS pending,
       count(*) FILTER (WHERE next_poll_at <= now()) AS due,
       greatest(0, extract(epoch FROM now() - min(next_poll_at)))::float8 AS oldest_late_s
FROM (SELECT next_poll_at FROM video_jobs WHERE state = 'pending'
      ORDER BY next_poll_at LIMIT %(upto)s::int + 1) AS walk;


-- name: scrape_stuck_claims
-- stuck_claims for the overview, looked for among the `upto` most overdue rows only (a walk
-- of the pending index in due order, stopped there): a backlog of a million late rows costs
-- no more than `upto` of them. A lease ends at next_poll_at, so a claim stuck for long is
-- among the most overdue rows unless an older backlog is ahead of it.
SELECT claimed_by, count(*) AS rows, min(claimed_at) AS since
FROM (SELECT claimed_by, claimed_at, claim_token FROM video_jobs
      WHERE state = 'pending' AND next_poll_at < now() - interval '1 minute'
      ORDER BY next_poll_at LIMIT %(upto)s::int) AS late
WHERE claim_token IS NOT NULL
GROUP BY claimed_by
ORDER BY since;
