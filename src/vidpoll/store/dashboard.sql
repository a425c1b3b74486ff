-- The dashboard's sign-in state (migration 0013; vidpoll.web.dashboard.Guard).

-- name: dashboard_salt
-- The database's salt for the dashboard's signing key: the one stored, or %(salt)s stored now
-- by the first `serve` to ask. Two first starts at once: the loser's insert does nothing, and
-- its snapshot (taken before the winner committed) may not see the winner's row either; it
-- then gets no row and asks again.
WITH made AS (
  INSERT INTO vidpoll_dashboard_salt (one, salt) VALUES (true, %(salt)s)
  ON CONFLICT (one) DO NOTHING
  RETURNING salt
)
SELECT salt FROM made
UNION ALL
SELECT salt FROM vidpoll_dashboard_salt WHERE one
LIMIT 1;

-- name: add_dashboard_session
-- A session signed in now, kept for %(max_age_s)s seconds; sessions that expired an hour ago
-- go (a login is rare: the table stays as small as the sessions alive).
WITH gone AS (
  DELETE FROM vidpoll_dashboard_sessions WHERE expires_at < now() - interval '1 hour'
)
INSERT INTO vidpoll_dashboard_sessions (digest, expires_at)
VALUES (%(digest)s, now() + make_interval(secs => %(max_age_s)s))
ON CONFLICT (digest) DO NOTHING;

-- name: dashboard_session_live
-- Whether a session was signed in and neither logged out nor expired (a primary-key read).
SELECT EXISTS (SELECT 1 FROM vidpoll_dashboard_sessions
               WHERE digest = %(digest)s AND expires_at > now()) AS live;

-- name: end_dashboard_session
-- Log a session out: its cookie, however copied, signs nobody in again.
DELETE FROM vidpoll_dashboard_sessions WHERE digest = %(digest)s
RETURNING true AS ended;

-- name: spend_accounts_since
-- The accounts with ledger rows from %(since)s on (the dashboard's spend page: an account no
-- longer in the settings still shows what it spent). The recursive CTE is a skip scan of
-- vidpoll_spend_day_idx (account, day): one short index probe per account, however long the
-- ledger grows; each account's EXISTS is one more probe of the same index.
WITH RECURSIVE accounts AS (
  (SELECT account FROM vidpoll_spend ORDER BY account LIMIT 1)
  UNION ALL
  SELECT (SELECT s.account FROM vidpoll_spend s WHERE s.account > a.account
          ORDER BY s.account LIMIT 1)
  FROM accounts a WHERE a.account IS NOT NULL
)
SELECT a.account FROM accounts a
WHERE a.account IS NOT NULL
  AND EXISTS (SELECT 1 FROM vidpoll_spend s WHERE s.account = a.account AND s.day >= %(since)s)
ORDER BY a.account;
