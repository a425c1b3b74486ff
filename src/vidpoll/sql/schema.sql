-- The migration runner's queries (vidpoll.schema) and the schema level read by
-- PgStore.check_schema. The migrations themselves are the files in migrations/.

-- name: try_lock_migrations
-- Serialises concurrent `vidpoll migrate` runs for the whole session (the key is the one the
-- one-transaction runner took per transaction, so old and new runners exclude each other too).
-- Polled, never waited on inside a statement: a waiting statement holds a snapshot, and the
-- running migrate's CREATE INDEX CONCURRENTLY would wait for it.
SELECT pg_try_advisory_lock(7306198364525511);

-- name: set_setting
-- One setting for the session, or (local) for the current transaction.
SELECT set_config(%(name)s, %(value)s, %(local)s);

-- name: create_migrations_table
-- The schema-version table: one row per applied migration file, with the oldest vidpoll code
-- level that works with the schema it leaves (rolling deploys: docs/UPGRADING.md).
CREATE TABLE IF NOT EXISTS vidpoll_schema_migrations (
  version     integer PRIMARY KEY,
  name        text NOT NULL,
  applied_at  timestamptz NOT NULL DEFAULT now(),
  oldest_code integer
);

-- name: migrations_have_oldest_code
-- False on a version table made by the one-transaction runner (before rolling deploys).
SELECT EXISTS (SELECT 1 FROM pg_attribute
               WHERE attrelid = 'vidpoll_schema_migrations'::regclass
                 AND attname = 'oldest_code' AND NOT attisdropped);

-- name: add_oldest_code_column
ALTER TABLE vidpoll_schema_migrations ADD COLUMN IF NOT EXISTS oldest_code integer;

-- name: fill_oldest_code
-- The levels of the migrations this vidpoll ships, for rows recorded before the column was.
UPDATE vidpoll_schema_migrations m SET oldest_code = l.level
FROM unnest(%(versions)s::int[], %(levels)s::int[]) AS l(version, level)
WHERE m.version = l.version AND m.oldest_code IS NULL;

-- name: applied_migrations
-- Versions already applied, to skip them.
SELECT version FROM vidpoll_schema_migrations ORDER BY version;

-- name: record_migration
-- Marks one migration file applied, after its last step.
INSERT INTO vidpoll_schema_migrations (version, name, oldest_code)
VALUES (%(version)s, %(name)s, %(oldest_code)s);

-- name: index_is_invalid
-- True when an index of this name exists and is INVALID (a CREATE INDEX CONCURRENTLY that
-- was cancelled or whose session died): it is dropped and built again.
SELECT NOT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass(%(name)s);

-- name: schema_level
-- The latest applied migration and the oldest code level that works with it. Read through
-- to_jsonb so a version table without the oldest_code column (made before rolling deploys)
-- reads NULL: only code of that version's own level.
SELECT m.version, m.name, (to_jsonb(m) ->> 'oldest_code')::int AS oldest_code
FROM vidpoll_schema_migrations m ORDER BY m.version DESC LIMIT 1;
