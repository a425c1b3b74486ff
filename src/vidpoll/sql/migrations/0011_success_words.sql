-- A terminal state is the provider's own word lower-cased, and a render that produced a video
-- may say so with any of models.SUCCESS_STATES (Sume's CLI reads `succeeded`, `success`,
-- `complete` as well as `completed`): each gets its download queued, not only `completed`.
-- (record_outcomes queues the result fetch from the same list; a test keeps the two equal.)
-- Code of level 10 works beside it (the trigger queues all that it did, and more).
-- vidpoll: expand
CREATE OR REPLACE FUNCTION vidpoll_queue_deliveries() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  -- downloads only for jobs that ended with a video; hooks for every terminal state
  INSERT INTO vidpoll_deliveries (job_id, consumer)
  SELECT NEW.job_id, c.name FROM vidpoll_consumers c
  WHERE c.name <> 'download' OR NEW.state IN ('complete', 'completed', 'success', 'succeeded')
  -- a job that ends again (resumed after giving up) is delivered again, with its new state;
  -- a run in progress keeps its lease (and token), its outcome is re-queued by generation
  ON CONFLICT (job_id, consumer) DO UPDATE
    SET state = 'pending', attempts = 0, last_error = NULL, done_at = NULL,
        generation = vidpoll_deliveries.generation + 1,
        next_at = CASE WHEN vidpoll_deliveries.token IS NULL
                         OR vidpoll_deliveries.state <> 'pending'
                       THEN now() ELSE vidpoll_deliveries.next_at END;
  RETURN NULL;
END
$$;
