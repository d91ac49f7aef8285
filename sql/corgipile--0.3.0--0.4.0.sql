-- corgipile 0.3.0 -> 0.4.0: models trained on a list of columns store their preprocessing
-- (per-column encoding and statistics), and predictions take a whole row. The result must
-- equal a fresh 0.4.0 install: tests/test_upgrade.py compares them.
\echo Use "ALTER EXTENSION corgipile UPDATE TO '0.4.0'" to load this file. \quit

ALTER TABLE corgipile.models ADD COLUMN preprocessing jsonb;


-- Predictions from a whole row (models trained on a list of columns).
CREATE FUNCTION "corgipile_decision_function"(
	"model_id" bigint,
	"row" record
) RETURNS double precision
STRICT STABLE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'corgipile_decision_function_row_wrapper';

CREATE FUNCTION "corgipile_decision_function"(
	"model_name" TEXT,
	"row" record
) RETURNS double precision
STRICT STABLE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'corgipile_decision_function_row_by_name_wrapper';

CREATE FUNCTION "corgipile_predict"(
	"model_id" bigint,
	"row" record
) RETURNS double precision
STRICT STABLE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'corgipile_predict_row_wrapper';

CREATE FUNCTION "corgipile_predict"(
	"model_name" TEXT,
	"row" record
) RETURNS double precision
STRICT STABLE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'corgipile_predict_row_by_name_wrapper';

CREATE FUNCTION "corgipile_predict_class"(
	"model_id" bigint,
	"row" record
) RETURNS TEXT
STRICT STABLE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'corgipile_predict_class_row_wrapper';

CREATE FUNCTION "corgipile_predict_class"(
	"model_name" TEXT,
	"row" record
) RETURNS TEXT
STRICT STABLE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'corgipile_predict_class_row_by_name_wrapper';

CREATE FUNCTION "corgipile_predict_proba"(
	"model_id" bigint,
	"row" record
) RETURNS double precision[]
STRICT STABLE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'corgipile_predict_proba_row_wrapper';

CREATE FUNCTION "corgipile_predict_proba"(
	"model_name" TEXT,
	"row" record
) RETURNS double precision[]
STRICT STABLE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'corgipile_predict_proba_row_by_name_wrapper';


-- Models shared between roles (corgipile_grant / corgipile_revoke).
-- Privileges on models that their owners granted to other roles (corgipile_grant /
-- corgipile_revoke): on a model name (every version, present and future) or on one model id.
-- `use` lets the grantee see the model and predict/evaluate with it; `manage` also lets it
-- deploy, drop, retrain (new versions of the name, owned by the owner) and grant. grantee 0
-- ('-') is PUBLIC; a regrole column so that pg_dump writes role names, not OIDs.
CREATE TABLE corgipile.model_grants (
    owner       name        NOT NULL,         -- trained_by of the models it covers
    model_name  text,                         -- a name of the owner's: all its versions
    model_id    bigint      REFERENCES corgipile.models (id) ON DELETE CASCADE,
    grantee     regrole     NOT NULL,         -- '-' (0) = PUBLIC
    privilege   text        NOT NULL CHECK (privilege IN ('use', 'manage')),
    granted_by  name        NOT NULL,
    granted_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT model_grants_target_check CHECK ((model_name IS NULL) <> (model_id IS NULL)),
    CONSTRAINT model_grants_key UNIQUE NULLS NOT DISTINCT (owner, model_name, model_id, grantee, privilege)
);

GRANT SELECT ON corgipile.model_grants TO PUBLIC;
ALTER TABLE corgipile.model_grants ENABLE ROW LEVEL SECURITY;
DROP POLICY models_own ON corgipile.models;
-- Visible through a grant only while it gives the caller a privilege: to PUBLIC or to a role
-- whose privileges the caller has. (A role also sees the grants it made, which give it nothing.)
CREATE POLICY models_visible ON corgipile.models
    USING (trained_by = current_user OR EXISTS (
        SELECT 1 FROM corgipile.model_grants g
        WHERE g.owner = models.trained_by AND (g.model_name = models.name OR g.model_id = models.id)
          AND (g.grantee::oid = 0 OR pg_has_role(current_user, g.grantee::oid, 'USAGE'))))
    WITH CHECK (trained_by = current_user);
-- A role sees the grants on its models, the grants it made (as a manager) and the grants that
-- reach it; only those to PUBLIC and to roles that exist.
CREATE POLICY model_grants_visible ON corgipile.model_grants
    USING ((grantee::oid = 0 OR EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.oid = grantee::oid))
           AND (owner = current_user
                OR granted_by = current_user
                OR grantee::oid = 0
                OR pg_has_role(current_user, grantee::oid, 'USAGE')));
-- Grants to roles that no longer exist are not dumped (their OIDs would mean nothing, or
-- another role, elsewhere).
SELECT pg_catalog.pg_extension_config_dump('corgipile.model_grants',
    'WHERE grantee::pg_catalog.oid OPERATOR(pg_catalog.=) 0 OR EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.oid OPERATOR(pg_catalog.=) grantee::pg_catalog.oid)');

-- model_summary: `deployed` is unknown (NULL) for a model granted by id alone.
CREATE OR REPLACE VIEW corgipile.model_summary WITH (security_invoker = true) AS
SELECT m.id, m.name, m.version, m.model_type AS model, m.relation, m.rows_trained AS rows,
       (m.metrics OPERATOR(pg_catalog.->>) 'epochs_run')::integer AS epochs,
       round((m.metrics OPERATOR(pg_catalog.->>) 'loss')::numeric, 6) AS loss,
       round((m.metrics OPERATOR(pg_catalog.->>) 'accuracy')::numeric, 4) AS accuracy,
       round((m.metrics OPERATOR(pg_catalog.->>) 'r2')::numeric, 4) AS r2,
       -- NULL (unknown) for a model granted by id alone: its other versions are not visible.
       CASE WHEN m.name IS NULL OR m.trained_by = current_user
                 OR EXISTS (SELECT 1 FROM corgipile.model_grants g
                            WHERE g.owner = m.trained_by AND g.model_name = m.name
                              AND (g.grantee::oid = 0 OR pg_has_role(current_user, g.grantee::oid, 'USAGE')))
                 OR pg_has_role(current_user, (SELECT c.relowner FROM pg_catalog.pg_class c
                                               WHERE c.oid = 'corgipile.models'::regclass), 'USAGE')
            THEN coalesce(m.id = (SELECT d.id FROM corgipile.models d
                                  WHERE d.name = m.name AND d.trained_by = m.trained_by
                                  ORDER BY d.pinned DESC, d.version DESC LIMIT 1), false)
       END AS deployed,
       date_trunc('second', m.created_at) AS created_at, m.trained_by
FROM corgipile.models m
ORDER BY m.id DESC;

-- Grants and revokes: a NULL argument is an ERROR (22004), not a silent no-op, so they are
-- not STRICT; corgipile_revoke's cascade also revokes the grants that depended on a `manage`.
CREATE FUNCTION "corgipile_grant"(
	"model_name" TEXT,
	"role" TEXT,
	"privilege" TEXT
) RETURNS void
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'corgipile_grant_wrapper';

CREATE FUNCTION "corgipile_grant"(
	"model_id" bigint,
	"role" TEXT,
	"privilege" TEXT
) RETURNS void
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'corgipile_grant_id_wrapper';

CREATE FUNCTION "corgipile_revoke"(
	"model_name" TEXT,
	"role" TEXT,
	"privilege" TEXT,
	"cascade" bool DEFAULT false
) RETURNS void
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'corgipile_revoke_wrapper';

CREATE FUNCTION "corgipile_revoke"(
	"model_id" bigint,
	"role" TEXT,
	"privilege" TEXT,
	"cascade" bool DEFAULT false
) RETURNS void
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'corgipile_revoke_id_wrapper';

-- A shard server's part of a training over a sharded table (postgres_fdw partitions).
CREATE FUNCTION "corgipile_shard_round"(
	"relation" regclass,
	"model" TEXT,
	"params" jsonb,
	"request" TEXT
) RETURNS TEXT
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'corgipile_shard_round_wrapper';

-- corgipile.progress: a shards column (round and per-shard state of a sharded training).
CREATE OR REPLACE VIEW corgipile.progress WITH (security_invoker = true) AS
SELECT a.pid, a.usename, a.datname, p[1] AS relation, p[2] AS model, p[3] AS phase,
       p[4]::integer AS epoch, p[5]::integer AS epochs, p[6]::float8 AS epoch_percent,
       p[7]::bigint AS tuples_this_epoch, nullif(p[8], '-')::float8 AS last_epoch_loss,
       p[9]::float8 AS elapsed_seconds, nullif(p[10], '-')::float8 AS remaining_seconds,
       p[12] AS query, p[11] AS shards
FROM pg_catalog.pg_stat_activity a,
     LATERAL pg_catalog.regexp_match(a.query,
        '^corgipile: relation (.*) model (\S+) \| (.+?) \| epoch (\d+)/(\d+) \| ([0-9.]+)% \| tuples (\d+) \| loss (\S+) \| elapsed ([0-9.]+) s \| remaining (\S+) s(?: \| shards (.*?))? \| query: (.*)$') AS p
WHERE p IS NOT NULL AND a.state = 'active';
