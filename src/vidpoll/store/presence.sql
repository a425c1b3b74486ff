-- Who serves what: read by wait() (and `submit --wait`, `jobs watch`) to say when no worker
-- polls a job's account. No table of its own: each worker process names its connections
-- `vidpoll <worker id>` and its LISTEN connection `vidpoll <worker id> serves ps:<accounts>;`
-- (store.presence_name); application_name is visible to every role in pg_stat_activity.

-- name: session_names
-- The application_name of every other session on this database that looks like vidpoll's.
SELECT application_name
FROM pg_stat_activity
WHERE datname = current_database()
  AND pid <> pg_backend_pid()
  AND application_name LIKE 'vidpoll %%';
