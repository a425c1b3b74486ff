-- Operations (0009): vacuum, counters over time, the figures of `jobs stats` and the
-- overview, doctor (vidpoll.store.operations; beside it scrape.sql, dashboard.sql and
-- presence.sql).

-- name: can_vacuum_jobs
-- Whether this role may VACUUM video_jobs: the table's owner, the database's owner, a member
-- of either role, a superuser, or from PostgreSQL 17 a holder of MAINTAIN. A worker without
-- it leaves the table to autovacuum. CASE keeps PostgreSQL before 17 from evaluating the
-- privilege name it does not know.
SELECT pg_has_role(current_user, c.relowner, 'USAGE')
       OR pg_has_role(current_user, d.datdba, 'USAGE')
       OR CASE WHEN current_setting('server_version_num')::int >= 170000
               THEN has_table_privilege(c.oid, 'MAINTAIN') ELSE false END AS allowed
FROM pg_class c, pg_database d
WHERE c.oid = 'video_jobs'::regclass AND d.datname = current_database();

-- name: vacuum_jobs
-- Every poll writes two row versions that cannot be HOT (next_poll_at is indexed), and
-- autovacuum visits a database at most once per autovacuum_naptime (a minute by default),
-- so at thousands of polls a second the table and its partial indexes grow 15-fold between
-- visits (bench/bloat.py). Workers vacuum it themselves after a set number of row writes.
-- SKIP_LOCKED: if autovacuum or another worker is at it, this one steps aside.
-- TRUNCATE false: no end-of-table truncation, whose exclusive lock (replayed on replicas)
-- would come with every one of these frequent runs.
-- INDEX_CLEANUP ON: PostgreSQL skips the index pass while dead rows sit on fewer than 2 % of
-- the table's pages, which a small hot set among millions of finished rows always does: then
-- no vacuum (autovacuum's neither) ever cleans the hot partial indexes, and at 10,000 pending
-- rows among 5,000,000 finished ones they grew from 0.17 MB to 25-49 MB in 180 s
-- (bench/vacuum_scale.py); forced, they stayed at 2.3 MB. The pass reads every index whole
-- when there are dead rows to remove, so it costs more with more finished rows (0.45 s at 5M
-- here, when forced every 15 s): archive them (docs/SCALING.md).
VACUUM (SKIP_LOCKED, TRUNCATE false, INDEX_CLEANUP ON) video_jobs;

-- name: count_by_state
-- Counts for the demo view and `jobs stats`.
SELECT state, count(*) AS n FROM video_jobs GROUP BY state ORDER BY state;

-- name: due_backlog
-- How many pending rows are due now and how late the oldest one is (index only on the partial).
SELECT count(*) AS due, extract(epoch FROM coalesce(%(now)s::timestamptz, now()) - min(next_poll_at))::float8 AS oldest_late_s
FROM video_jobs
WHERE state = 'pending' AND next_poll_at <= coalesce(%(now)s::timestamptz, now());

-- name: add_minutes
-- A worker's counters since its last flush, added to the minute they happened in, in one
-- statement (no row per poll: one row per minute, kind, account and outcome).
INSERT INTO vidpoll_minutes AS m (minute, kind, account, outcome, n, late_sum_s, late_max_s)
SELECT * FROM unnest(%(minutes)s::timestamptz[], %(kinds)s::text[], %(accounts)s::text[],
                     %(outcomes)s::text[], %(ns)s::bigint[], %(late_sums)s::float8[],
                     %(late_maxes)s::float8[])
ON CONFLICT (minute, kind, account, outcome) DO UPDATE
SET n = CASE WHEN m.kind = 'backlog' THEN greatest(m.n, excluded.n) ELSE m.n + excluded.n END,
    late_sum_s = CASE WHEN m.kind = 'backlog' THEN greatest(m.late_sum_s, excluded.late_sum_s)
                      ELSE m.late_sum_s + excluded.late_sum_s END,
    late_max_s = greatest(m.late_max_s, excluded.late_max_s);

-- name: forget_old_minutes
-- The counters keep a week.
DELETE FROM vidpoll_minutes WHERE minute < now() - interval '7 days';

-- name: due_backlog_sample
-- Rows due now, counted up to 100,000 (the chart's sample; an exact count of a huge backlog
-- would cost more than it tells), and how late the oldest is.
SELECT (SELECT count(*) FROM (SELECT 1 FROM video_jobs
                              WHERE state = 'pending' AND next_poll_at <= now()
                              LIMIT 100000) AS due) AS due,
       coalesce(extract(epoch FROM now() - (SELECT min(next_poll_at) FROM video_jobs
                                             WHERE state = 'pending')), 0)::float8
         AS oldest_late_s;

-- name: minutes_since
-- The counters of the last `minutes` minutes, summed over accounts, oldest first.
SELECT minute, kind, outcome, sum(n)::bigint AS n, sum(late_sum_s)::float8 AS late_sum_s,
       max(late_max_s)::float8 AS late_max_s
FROM vidpoll_minutes
WHERE minute >= date_trunc('minute', now()) - make_interval(mins => %(minutes)s::int)
GROUP BY minute, kind, outcome
ORDER BY minute, kind, outcome;

-- name: recent_errors
-- The latest error events (from the history), for the dashboard's overview.
SELECT e.job_id, e.at, e.error_class, e.http_status, e.detail, j.account
FROM video_job_events e
LEFT JOIN video_jobs j ON j.job_id = e.job_id
WHERE e.kind = 'error'
ORDER BY e.id DESC
LIMIT %(limit)s;

-- name: stuck_claims
-- Claims whose lease ran out long ago without a record (a worker that died or hangs): which
-- worker held them, since when. A lease-mode row is due again at once anyway; this is for
-- the operator's "which worker is stuck".
SELECT claimed_by, count(*) AS rows, min(claimed_at) AS since
FROM video_jobs
WHERE state = 'pending' AND claim_token IS NOT NULL AND next_poll_at < now() - interval '1 minute'
GROUP BY claimed_by
ORDER BY since;

-- name: doctor_tables
-- vidpoll's tables: live and dead rows, sizes, vacuum history and per-table settings.
SELECT c.relname AS table_name, s.n_live_tup AS live, s.n_dead_tup AS dead,
       pg_relation_size(c.oid) AS heap_bytes, pg_total_relation_size(c.oid) AS total_bytes,
       greatest(s.last_autovacuum, s.last_vacuum) AS last_vacuum,
       greatest(s.last_autoanalyze, s.last_analyze) AS last_analyze,
       coalesce(c.reloptions, '{}') AS options
FROM pg_class c
JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.relname IN ('video_jobs', 'video_intents', 'vidpoll_deliveries', 'vidpoll_rate_buckets',
                    'vidpoll_minutes', 'video_job_events', 'video_jobs_archive',
                    'vidpoll_webhook_events')
  AND c.relnamespace = to_regnamespace(current_schema())
ORDER BY c.relname;

-- name: doctor_hot_indexes
-- The hot table's indexes: size, scans, and (for the partial due index) bytes per pending row,
-- the tell-tale of index bloat.
SELECT i.indexrelname AS index_name, pg_relation_size(i.indexrelid) AS bytes, i.idx_scan AS scans,
       (SELECT count(*) FROM video_jobs WHERE state = 'pending') AS pending_rows
FROM pg_stat_user_indexes i
WHERE i.relname = 'video_jobs'
  AND i.schemaname = current_schema()
ORDER BY i.indexrelname;

-- name: doctor_xmin
-- What holds the xmin horizon back (vacuum cannot remove rows newer than it): the oldest open
-- transaction or snapshot, replication slots, prepared transactions.
SELECT 'session' AS holder, pid::text AS who, application_name AS detail,
       extract(epoch FROM now() - coalesce(xact_start, query_start))::float8 AS age_s,
       age(backend_xmin)::bigint AS xmin_age
FROM pg_stat_activity
-- only this database's sessions hold back the horizon of its tables (PostgreSQL 14+)
WHERE backend_xmin IS NOT NULL AND pid <> pg_backend_pid() AND datname = current_database()
UNION ALL
SELECT 'replication slot', slot_name::text, slot_type, NULL,
       greatest(age(xmin), age(catalog_xmin))::bigint
FROM pg_replication_slots
WHERE xmin IS NOT NULL OR catalog_xmin IS NOT NULL
UNION ALL
SELECT 'prepared transaction', gid, owner::text,
       extract(epoch FROM now() - prepared)::float8, age(transaction)::bigint
FROM pg_prepared_xacts
ORDER BY xmin_age DESC NULLS LAST
LIMIT 5;

-- name: doctor_connections
-- Connections in use against the server's limit, and vidpoll's listeners (LISTEN sessions).
SELECT (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend') AS used,
       current_setting('max_connections')::int AS max_connections,
       (SELECT count(*) FROM pg_stat_activity
        WHERE datname = current_database() AND query ILIKE 'LISTEN%%') AS listeners,
       pg_notification_queue_usage()::float8 AS notify_queue_usage,
       -- without pg_read_all_stats, other roles' sessions hide their query and xact times
       pg_has_role(current_user, 'pg_read_all_stats', 'MEMBER') AS sees_all_sessions,
       current_setting('autovacuum') AS autovacuum,
       current_setting('track_counts') AS track_counts;

-- name: hot_table_rows
-- The planner's estimate of video_jobs' rows (doctor judges the claim plan only on a table big
-- enough for an index to be the right plan).
SELECT greatest(reltuples, 0)::bigint AS estimate
FROM pg_class WHERE oid = 'video_jobs'::regclass;
