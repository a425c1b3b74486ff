-- Queries of an idle worker: what it asks the database between claims (issue 16: an idle
-- worker's transactions per 30 s are counted).

-- name: next_work_due_in
-- One probe for a poller: seconds until the earliest pending row, and (with `results`) the
-- earliest result fetch, of these accounts is due (negative if overdue; NULL if none), by the
-- database's clock. Two index probes per account, one statement.
SELECT (SELECT extract(epoch FROM min(first.next_poll_at) - now())::float8
        FROM unnest(%(accounts)s::text[]) AS a(account),
             LATERAL (SELECT next_poll_at FROM video_jobs j
                      WHERE j.state = 'pending' AND j.account = a.account
                      ORDER BY j.next_poll_at LIMIT 1) AS first) AS poll_due_in_s,
       CASE WHEN %(results)s THEN
         (SELECT extract(epoch FROM min(first.result_next_at) - now())::float8
          FROM unnest(%(accounts)s::text[]) AS a(account),
               LATERAL (SELECT result_next_at FROM video_jobs j
                        WHERE j.result_state = 'pending' AND j.account = a.account
                        ORDER BY j.result_next_at LIMIT 1) AS first)
       END AS result_due_in_s;

-- name: announce_drained
-- A claim that a NOTIFY started took every due row of its accounts: the payload (JSON: by,
-- accounts, results, covered: the notifications it covered) lets the workers that staggered
-- their answer to those notifications stay asleep (vidpoll.worker, "no thundering herd").
SELECT pg_notify('vidpoll_drained', %(payload)s);
