-- corgipile 0.2.0 -> 0.3.0: hardening. The catalog is written only through corgipile's
-- functions (PUBLIC keeps SELECT), and the id sequence is readable so that pg_dump works for
-- any role. The result must equal a fresh 0.3.0 install: tests/test_upgrade.py compares them.
\echo Use "ALTER EXTENSION corgipile UPDATE TO '0.3.0'" to load this file. \quit

REVOKE INSERT, DELETE ON corgipile.models, corgipile.epochs FROM PUBLIC;
REVOKE UPDATE (pinned) ON corgipile.models FROM PUBLIC;
REVOKE USAGE ON SEQUENCE corgipile.models_id_seq FROM PUBLIC;
GRANT SELECT ON SEQUENCE corgipile.models_id_seq TO PUBLIC;

-- corgipile_shuffle: a full, uniform shuffle of a table into a new table (the pile shuffle).
CREATE FUNCTION "corgipile_shuffle"(
	"source" regclass,
	"target" TEXT,
	"params" jsonb DEFAULT '{}'
) RETURNS bigint
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'corgipile_shuffle_wrapper';
