-- corgipile 0.1.0 -> 0.2.0: model names and versions, deployment, coefficient export,
-- progress view, validation_seconds, EXPLAIN formats. The result must equal a fresh 0.2.0
-- install (sql/catalog.sql + the generated functions): tests/test_upgrade.py compares them.
\echo Use "ALTER EXTENSION corgipile UPDATE TO '0.2.0'" to load this file. \quit

ALTER TABLE corgipile.models
    ADD COLUMN name    text,
    ADD COLUMN version integer,
    ADD COLUMN pinned  boolean NOT NULL DEFAULT false,
    ADD CONSTRAINT models_name_check CHECK (name <> ''),
    ADD CONSTRAINT models_version_check CHECK ((name IS NULL) = (version IS NULL) AND version > 0),
    ADD CONSTRAINT models_name_version_key UNIQUE (trained_by, name, version);
CREATE UNIQUE INDEX models_pinned_name ON corgipile.models (trained_by, name) WHERE pinned;
ALTER TABLE corgipile.epochs ADD COLUMN validation_seconds float8;
GRANT UPDATE (pinned) ON corgipile.models TO PUBLIC;

-- One line per model, newest first; `deployed` marks the version corgipile_predict('name', ...)
-- uses (the pinned one, else the newest). security_invoker: the caller's row-level security.
CREATE VIEW corgipile.model_summary WITH (security_invoker = true) AS
SELECT m.id, m.name, m.version, m.model_type AS model, m.relation, m.rows_trained AS rows,
       (m.metrics OPERATOR(pg_catalog.->>) 'epochs_run')::integer AS epochs,
       round((m.metrics OPERATOR(pg_catalog.->>) 'loss')::numeric, 6) AS loss,
       round((m.metrics OPERATOR(pg_catalog.->>) 'accuracy')::numeric, 4) AS accuracy,
       round((m.metrics OPERATOR(pg_catalog.->>) 'r2')::numeric, 4) AS r2,
       coalesce(m.id = (SELECT d.id FROM corgipile.models d
                        WHERE d.name = m.name AND d.trained_by = m.trained_by
                        ORDER BY d.pinned DESC, d.version DESC LIMIT 1), false) AS deployed,
       date_trunc('second', m.created_at) AS created_at, m.trained_by
FROM corgipile.models m
ORDER BY m.id DESC;

-- Trainings running now, from the activity line corgipile_train reports (pg_stat_activity.query
-- while it runs): no shared_preload_libraries needed. Other roles' trainings show only to roles
-- that may see their queries (pg_read_all_stats), as in pg_stat_activity.
CREATE VIEW corgipile.progress WITH (security_invoker = true) AS
SELECT a.pid, a.usename, a.datname, p[1] AS relation, p[2] AS model, p[3] AS phase,
       p[4]::integer AS epoch, p[5]::integer AS epochs, p[6]::float8 AS epoch_percent,
       p[7]::bigint AS tuples_this_epoch, nullif(p[8], '-')::float8 AS last_epoch_loss,
       p[9]::float8 AS elapsed_seconds, nullif(p[10], '-')::float8 AS remaining_seconds,
       p[11] AS query
FROM pg_catalog.pg_stat_activity a,
     LATERAL pg_catalog.regexp_match(a.query,
        '^corgipile: relation (.*) model (\S+) \| (.+?) \| epoch (\d+)/(\d+) \| ([0-9.]+)% \| tuples (\d+) \| loss (\S+) \| elapsed ([0-9.]+) s \| remaining (\S+) s \| query: (.*)$') AS p
WHERE p IS NOT NULL AND a.state = 'active';
GRANT SELECT ON corgipile.model_summary, corgipile.progress TO PUBLIC;

-- corgipile_explain gained a format argument.
DROP FUNCTION corgipile_explain(regclass, text, jsonb, bool);
CREATE FUNCTION "corgipile_explain"(
	"relation" regclass, /* PgRelation */
	"model" TEXT, /* & str */
	"params" jsonb DEFAULT '{}', /* ParamsArg */
	"analyze" bool DEFAULT false, /* bool */
	"format" TEXT DEFAULT 'text' /* & str */
) RETURNS SETOF TEXT /* String */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'corgipile_explain_wrapper';

CREATE FUNCTION "corgipile_decision_function"(
	"model_name" TEXT, /* & str */
	"features" double precision[] /* Array < '_, f64 > */
) RETURNS double precision /* f64 */
STRICT STABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'corgipile_decision_function_by_name_wrapper';

CREATE FUNCTION "corgipile_decision_function"(
	"model_name" TEXT, /* & str */
	"indices" INT[], /* Array < '_, i32 > */
	"values" double precision[] /* Array < '_, f64 > */
) RETURNS double precision /* f64 */
STRICT STABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'corgipile_decision_function_sparse_by_name_wrapper';

CREATE FUNCTION "corgipile_deploy"(
	"model_name" TEXT, /* & str */
	"model_id" bigint DEFAULT NULL /* Option < i64 > */
) RETURNS bigint /* i64 */
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'corgipile_deploy_wrapper';

CREATE FUNCTION "corgipile_drop_model"(
	"model_id" bigint /* i64 */
) RETURNS bigint /* i64 */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'corgipile_drop_model_wrapper';

CREATE FUNCTION "corgipile_drop_model"(
	"model_name" TEXT /* & str */
) RETURNS bigint /* i64 */
STRICT VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'corgipile_drop_model_by_name_wrapper';

CREATE FUNCTION "corgipile_evaluate"(
	"model_name" TEXT, /* & str */
	"relation" regclass, /* PgRelation */
	"params" jsonb DEFAULT '{}' /* ParamsArg */
) RETURNS jsonb /* JsonB */
STRICT VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'corgipile_evaluate_by_name_wrapper';

CREATE FUNCTION "corgipile_model_coefficients"(
	"model_id" bigint /* i64 */
) RETURNS TABLE (
	"class" TEXT,  /* Option < String > */
	"feature" TEXT,  /* String */
	"feature_index" bigint,  /* Option < i64 > */
	"coefficient" double precision  /* f64 */
)
STRICT STABLE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'corgipile_model_coefficients_wrapper';

CREATE FUNCTION "corgipile_model_coefficients"(
	"model_name" TEXT /* & str */
) RETURNS TABLE (
	"class" TEXT,  /* Option < String > */
	"feature" TEXT,  /* String */
	"feature_index" bigint,  /* Option < i64 > */
	"coefficient" double precision  /* f64 */
)
STRICT STABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'corgipile_model_coefficients_by_name_wrapper';

CREATE FUNCTION "corgipile_predict"(
	"model_name" TEXT, /* & str */
	"features" double precision[] /* Array < '_, f64 > */
) RETURNS double precision /* f64 */
STRICT STABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'corgipile_predict_by_name_wrapper';

CREATE FUNCTION "corgipile_predict"(
	"model_name" TEXT, /* & str */
	"indices" INT[], /* Array < '_, i32 > */
	"values" double precision[] /* Array < '_, f64 > */
) RETURNS double precision /* f64 */
STRICT STABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'corgipile_predict_sparse_by_name_wrapper';

CREATE FUNCTION "corgipile_predict_class"(
	"model_name" TEXT, /* & str */
	"features" double precision[] /* Array < '_, f64 > */
) RETURNS TEXT /* String */
STRICT STABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'corgipile_predict_class_by_name_wrapper';

CREATE FUNCTION "corgipile_predict_class"(
	"model_name" TEXT, /* & str */
	"indices" INT[], /* Array < '_, i32 > */
	"values" double precision[] /* Array < '_, f64 > */
) RETURNS TEXT /* String */
STRICT STABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'corgipile_predict_class_sparse_by_name_wrapper';

CREATE FUNCTION "corgipile_predict_proba"(
	"model_name" TEXT, /* & str */
	"features" double precision[] /* Array < '_, f64 > */
) RETURNS double precision[] /* Vec < f64 > */
STRICT STABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'corgipile_predict_proba_by_name_wrapper';

CREATE FUNCTION "corgipile_predict_proba"(
	"model_name" TEXT, /* & str */
	"indices" INT[], /* Array < '_, i32 > */
	"values" double precision[] /* Array < '_, f64 > */
) RETURNS double precision[] /* Vec < f64 > */
STRICT STABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'corgipile_predict_proba_sparse_by_name_wrapper';
