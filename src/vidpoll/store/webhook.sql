-- Webhook events' housekeeping by `vidpoll serve` (the events themselves: jobs.sql, 0005;
-- their pruning by `jobs prune`: retention.sql).

-- name: may_delete_webhook_events
-- Whether this role may delete webhook events: `vidpoll serve` prunes the old ones itself
-- when it may, and otherwise leaves them to `jobs prune` (run by the owner), saying so once.
SELECT has_table_privilege('vidpoll_webhook_events', 'DELETE') AS allowed;
