-- The database and its schema version, read before anything else (vidpoll.store.base:
-- creating a database, PgStore.check_schema). The migration runner's own queries and
-- the schema level: vidpoll/sql/schema.sql.

-- name: schema_table_exists
-- False on a database vidpoll never migrated (checked before reading the version table).
SELECT to_regclass('vidpoll_schema_migrations') IS NOT NULL AS present;

-- name: schema_version
-- The highest applied migration.
SELECT max(version) AS version FROM vidpoll_schema_migrations;

-- name: database_exists
-- Used before CREATE DATABASE (the embedded server, the demo, the test template).
SELECT 1 FROM pg_database WHERE datname = %(name)s;
