-- corgipile 0.4.0 -> 0.5.0: the catalog can store multilayer perceptrons (model kinds mlp and
-- mlp_regression): models gets a layers column (every layer's width, input first, output last;
-- NULL for linear models), and the size checks of weights and bias apply to linear models only
-- (a network stores every layer's matrix and biases, in order). Existing models are untouched:
-- their layers is NULL and the checks they passed still apply to them. The result must equal a
-- fresh 0.5.0 install: tests/test_upgrade.py compares them.
\echo Use "ALTER EXTENSION corgipile UPDATE TO '0.5.0'" to load this file. \quit

ALTER TABLE corgipile.models ADD COLUMN layers integer[];

-- The checks keep the names PostgreSQL gave them as column constraints (models_check on
-- weights, models_check1 on bias).
ALTER TABLE corgipile.models
    DROP CONSTRAINT models_check,
    DROP CONSTRAINT models_check1,
    ADD CONSTRAINT models_check CHECK (layers IS NOT NULL OR cardinality(weights) = n_features::bigint * n_outputs),
    ADD CONSTRAINT models_check1 CHECK (layers IS NOT NULL OR cardinality(bias) = n_outputs),
    ADD CONSTRAINT models_layers_check CHECK (layers IS NULL OR (cardinality(layers) >= 3 AND layers[1] = n_features
                                              AND layers[cardinality(layers)] = n_outputs AND 0 < ALL (layers)));

-- A model's layers: a network's hidden and output layers, a linear model's one layer.
CREATE FUNCTION "corgipile_model_layers"(
	"model_id" bigint /* i64 */
) RETURNS TABLE (
	"layer" INT,  /* i32 */
	"inputs" INT,  /* i32 */
	"outputs" INT,  /* i32 */
	"activation" TEXT,  /* alloc::string::String */
	"weights" double precision[],  /* alloc::vec::Vec<f64> */
	"biases" double precision[]  /* alloc::vec::Vec<f64> */
)
STRICT STABLE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'corgipile_model_layers_wrapper';

CREATE FUNCTION "corgipile_model_layers"(
	"model_name" TEXT /* &str */
) RETURNS TABLE (
	"layer" INT,  /* i32 */
	"inputs" INT,  /* i32 */
	"outputs" INT,  /* i32 */
	"activation" TEXT,  /* alloc::string::String */
	"weights" double precision[],  /* alloc::vec::Vec<f64> */
	"biases" double precision[]  /* alloc::vec::Vec<f64> */
)
STRICT STABLE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'corgipile_model_layers_by_name_wrapper';

-- One row per configuration of a search (corgipile_train with "search", 0.5.0): each is a model,
-- a version of the search's name; search_id is the search's first model. score is the
-- validation score select_by ranks by; selected marks the best, stored last (so the name's
-- newest version). Per-epoch validation metrics: corgipile.epochs of model_id.
CREATE VIEW corgipile.search_trials WITH (security_invoker = true) AS
SELECT (s OPERATOR(pg_catalog.->>) 'search_id')::bigint AS search_id, m.name, m.version,
       m.id AS model_id, m.model_type AS model,
       (s OPERATOR(pg_catalog.->>) 'trial')::integer AS trial,
       (s OPERATOR(pg_catalog.->>) 'of')::integer AS trials,
       s OPERATOR(pg_catalog.->) 'params' AS params,
       s OPERATOR(pg_catalog.->>) 'select_by' AS select_by,
       (s OPERATOR(pg_catalog.->>) 'score')::float8 AS score,
       (s OPERATOR(pg_catalog.->>) 'selected')::boolean AS selected,
       (m.metrics OPERATOR(pg_catalog.#>>) '{validation,loss}')::float8 AS validation_loss,
       (m.metrics OPERATOR(pg_catalog.#>>) '{validation,accuracy}')::float8 AS validation_accuracy,
       (m.metrics OPERATOR(pg_catalog.#>>) '{validation,r2}')::float8 AS validation_r2,
       (m.metrics OPERATOR(pg_catalog.->>) 'epochs_run')::integer AS epochs,
       (s OPERATOR(pg_catalog.->>) 'train_seconds')::float8 AS train_seconds,
       m.created_at, m.trained_by
FROM corgipile.models m,
     LATERAL (SELECT m.metrics OPERATOR(pg_catalog.->) 'search') AS t(s)
WHERE s IS NOT NULL;
GRANT SELECT ON corgipile.search_trials TO PUBLIC;

-- Deploy a version of a name by a strategy: 'best' (the best validation score), 'latest', an id.
CREATE FUNCTION "corgipile_deploy"(
	"model_name" TEXT, /* core::option::Option<&str> */
	"strategy" TEXT /* core::option::Option<&str> */
) RETURNS bigint /* i64 */
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'corgipile_deploy_by_wrapper';

-- One row per group of a training with "group_by" (0.5.0): each group's model is a version of
-- the name, and family_id is the model of every row (stored last, so the name's newest
-- version), which predicts the rows of groups without a model of their own.
CREATE VIEW corgipile.group_models WITH (security_invoker = true) AS
SELECT (g OPERATOR(pg_catalog.->>) 'family')::bigint AS family_id, m.name, m.version,
       m.id AS model_id, m.model_type AS model,
       g OPERATOR(pg_catalog.->) 'columns' AS group_columns,
       g OPERATOR(pg_catalog.->>) 'key' AS group_key,
       (g OPERATOR(pg_catalog.->>) 'rows')::bigint AS group_rows,
       (m.metrics OPERATOR(pg_catalog.->>) 'loss')::float8 AS loss,
       (m.metrics OPERATOR(pg_catalog.->>) 'accuracy')::float8 AS accuracy,
       (m.metrics OPERATOR(pg_catalog.->>) 'r2')::float8 AS r2,
       m.created_at, m.trained_by
FROM corgipile.models m,
     LATERAL (SELECT m.metrics OPERATOR(pg_catalog.->) 'group') AS t(g)
WHERE g IS NOT NULL;
GRANT SELECT ON corgipile.group_models TO PUBLIC;

-- Which model predicts a row of a model trained with "group_by", and its prediction.
CREATE FUNCTION "corgipile_predict_group"(
	"model_name" TEXT, /* pgrx::TextArg */
	"row" record /* pgrx::RecordArg */
) RETURNS TABLE (
	"prediction" TEXT,  /* core::option::Option<alloc::string::String> */
	"model_id" bigint,  /* i64 */
	"group_key" TEXT,  /* core::option::Option<alloc::string::String> */
	"own_model" bool  /* bool */
)
STRICT STABLE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'corgipile_predict_group_wrapper';

-- Training on a query's rows, spilled through the pile shuffle into a temporary table first.
CREATE FUNCTION "corgipile_train_query"(
	"query" TEXT, /* & str */
	"model" TEXT, /* & str */
	"params" jsonb DEFAULT '{}' /* ParamsArg */
) RETURNS bigint /* i64 */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'corgipile_train_query_wrapper';

-- Predicting from a table's own row reads only the model's columns: the planner rewrites
-- corgipile_predict(model, t) into corgipile_predict_columns(model, '{a,b,...}', t.a, t.b, ...)
-- (and likewise the class, proba and decision_function row forms), through a support function
-- of the row forms.
CREATE FUNCTION "corgipile_predict_support"(
	"request" internal /* Internal */
) RETURNS internal /* Internal */
IMMUTABLE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'corgipile_predict_support_wrapper';

CREATE FUNCTION "corgipile_predict_columns"("model_id" bigint, "column_names" text[], VARIADIC "column_values" "any")
RETURNS double precision STABLE PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'corgipile_predict_columns';
CREATE FUNCTION "corgipile_predict_columns"("model_name" text, "column_names" text[], VARIADIC "column_values" "any")
RETURNS double precision STABLE PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'corgipile_predict_columns_by_name';
CREATE FUNCTION "corgipile_predict_class_columns"("model_id" bigint, "column_names" text[], VARIADIC "column_values" "any")
RETURNS text STABLE PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'corgipile_predict_class_columns';
CREATE FUNCTION "corgipile_predict_class_columns"("model_name" text, "column_names" text[], VARIADIC "column_values" "any")
RETURNS text STABLE PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'corgipile_predict_class_columns_by_name';
CREATE FUNCTION "corgipile_predict_proba_columns"("model_id" bigint, "column_names" text[], VARIADIC "column_values" "any")
RETURNS double precision[] STABLE PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'corgipile_predict_proba_columns';
CREATE FUNCTION "corgipile_predict_proba_columns"("model_name" text, "column_names" text[], VARIADIC "column_values" "any")
RETURNS double precision[] STABLE PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'corgipile_predict_proba_columns_by_name';
CREATE FUNCTION "corgipile_decision_function_columns"("model_id" bigint, "column_names" text[], VARIADIC "column_values" "any")
RETURNS double precision STABLE PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'corgipile_decision_function_columns';
CREATE FUNCTION "corgipile_decision_function_columns"("model_name" text, "column_names" text[], VARIADIC "column_values" "any")
RETURNS double precision STABLE PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'corgipile_decision_function_columns_by_name';

ALTER FUNCTION "corgipile_predict"(bigint, record) SUPPORT "corgipile_predict_support";
ALTER FUNCTION "corgipile_predict"(text, record) SUPPORT "corgipile_predict_support";
ALTER FUNCTION "corgipile_predict_class"(bigint, record) SUPPORT "corgipile_predict_support";
ALTER FUNCTION "corgipile_predict_class"(text, record) SUPPORT "corgipile_predict_support";
ALTER FUNCTION "corgipile_predict_proba"(bigint, record) SUPPORT "corgipile_predict_support";
ALTER FUNCTION "corgipile_predict_proba"(text, record) SUPPORT "corgipile_predict_support";
ALTER FUNCTION "corgipile_decision_function"(bigint, record) SUPPORT "corgipile_predict_support";
ALTER FUNCTION "corgipile_decision_function"(text, record) SUPPORT "corgipile_predict_support";

-- The evaluation tables of a classifier on a relation: confusion matrix, ROC curve (with
-- precision and recall), calibration bins; each by model id or by model name.
CREATE FUNCTION "corgipile_confusion_matrix"("model_id" bigint, "relation" regclass, "params" jsonb DEFAULT '{}')
RETURNS TABLE ("actual" TEXT, "predicted" TEXT, "rows" bigint)
STRICT VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'corgipile_confusion_matrix_wrapper';
CREATE FUNCTION "corgipile_confusion_matrix"("model_name" TEXT, "relation" regclass, "params" jsonb DEFAULT '{}')
RETURNS TABLE ("actual" TEXT, "predicted" TEXT, "rows" bigint)
STRICT VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'corgipile_confusion_matrix_by_name_wrapper';
CREATE FUNCTION "corgipile_roc_curve"("model_id" bigint, "relation" regclass, "params" jsonb DEFAULT '{}')
RETURNS TABLE ("class" TEXT, "threshold" double precision, "tp" bigint, "fp" bigint, "tpr" double precision,
               "fpr" double precision, "precision" double precision, "recall" double precision, "f1" double precision)
STRICT VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'corgipile_roc_curve_wrapper';
CREATE FUNCTION "corgipile_roc_curve"("model_name" TEXT, "relation" regclass, "params" jsonb DEFAULT '{}')
RETURNS TABLE ("class" TEXT, "threshold" double precision, "tp" bigint, "fp" bigint, "tpr" double precision,
               "fpr" double precision, "precision" double precision, "recall" double precision, "f1" double precision)
STRICT VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'corgipile_roc_curve_by_name_wrapper';
CREATE FUNCTION "corgipile_calibration"("model_id" bigint, "relation" regclass, "params" jsonb DEFAULT '{}')
RETURNS TABLE ("class" TEXT, "bin" INT, "lower" double precision, "upper" double precision, "rows" bigint,
               "mean_predicted" double precision, "observed" double precision)
STRICT VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'corgipile_calibration_wrapper';
CREATE FUNCTION "corgipile_calibration"("model_name" TEXT, "relation" regclass, "params" jsonb DEFAULT '{}')
RETURNS TABLE ("class" TEXT, "bin" INT, "lower" double precision, "upper" double precision, "rows" bigint,
               "mean_predicted" double precision, "observed" double precision)
STRICT VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'corgipile_calibration_by_name_wrapper';
-- Per-prediction explanations: each input column's share of a prediction's decision value
-- against the baseline row (the training means and most frequent categories), and the baseline.
CREATE FUNCTION "corgipile_explain_predict"(
	"model_id" bigint, /* Option < i64 > */
	"row" record, /* Option < RecordArg > */
	"for_class" TEXT DEFAULT NULL, /* Option < & str > */
	"top" INT DEFAULT NULL /* Option < i32 > */
) RETURNS TABLE (
	"column_name" TEXT,  /* String */
	"value" TEXT,  /* Option < String > */
	"contribution" double precision,  /* f64 */
	"class" TEXT  /* Option < String > */
)
STABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'corgipile_explain_predict_row_wrapper';

CREATE FUNCTION "corgipile_explain_predict"(
	"model_name" TEXT, /* Option < TextArg > */
	"row" record, /* Option < RecordArg > */
	"for_class" TEXT DEFAULT NULL, /* Option < & str > */
	"top" INT DEFAULT NULL /* Option < i32 > */
) RETURNS TABLE (
	"column_name" TEXT,  /* String */
	"value" TEXT,  /* Option < String > */
	"contribution" double precision,  /* f64 */
	"class" TEXT  /* Option < String > */
)
STABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'corgipile_explain_predict_row_by_name_wrapper';

CREATE FUNCTION "corgipile_explain_predict"(
	"model_id" bigint, /* Option < i64 > */
	"features" double precision[], /* Option < Float8ArrayArg > */
	"for_class" TEXT DEFAULT NULL, /* Option < & str > */
	"top" INT DEFAULT NULL /* Option < i32 > */
) RETURNS TABLE (
	"column_name" TEXT,  /* String */
	"value" TEXT,  /* Option < String > */
	"contribution" double precision,  /* f64 */
	"class" TEXT  /* Option < String > */
)
STABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'corgipile_explain_predict_array_wrapper';

CREATE FUNCTION "corgipile_explain_predict"(
	"model_name" TEXT, /* Option < TextArg > */
	"features" double precision[], /* Option < Float8ArrayArg > */
	"for_class" TEXT DEFAULT NULL, /* Option < & str > */
	"top" INT DEFAULT NULL /* Option < i32 > */
) RETURNS TABLE (
	"column_name" TEXT,  /* String */
	"value" TEXT,  /* Option < String > */
	"contribution" double precision,  /* f64 */
	"class" TEXT  /* Option < String > */
)
STABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'corgipile_explain_predict_array_by_name_wrapper';

-- Permutation importance of a model's input columns on a sample of a relation.
CREATE FUNCTION "corgipile_feature_importance"("model_id" bigint, "relation" regclass, "params" jsonb DEFAULT '{}')
RETURNS TABLE ("column_name" TEXT, "importance" double precision, "importance_std" double precision,
               "standardized_coefficient" double precision, "metric" TEXT, "baseline" double precision, "rows" bigint)
STRICT VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'corgipile_feature_importance_wrapper';
CREATE FUNCTION "corgipile_feature_importance"("model_name" TEXT, "relation" regclass, "params" jsonb DEFAULT '{}')
RETURNS TABLE ("column_name" TEXT, "importance" double precision, "importance_std" double precision,
               "standardized_coefficient" double precision, "metric" TEXT, "baseline" double precision, "rows" bigint)
STRICT VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'corgipile_feature_importance_by_name_wrapper';
-- Standard errors and p-values ("inference": true): corgipile_model_coefficients gets six
-- columns at the end (NULL for models trained without "inference"). A function's result type
-- cannot change in place: both forms are dropped and created again.
DROP FUNCTION "corgipile_model_coefficients"(bigint);
DROP FUNCTION "corgipile_model_coefficients"(TEXT);
CREATE FUNCTION "corgipile_model_coefficients"(
	"model_id" bigint /* i64 */
) RETURNS TABLE (
	"class" TEXT,  /* Option < String > */
	"feature" TEXT,  /* String */
	"feature_index" bigint,  /* Option < i64 > */
	"coefficient" double precision,  /* f64 */
	"std_error" double precision,  /* Option < f64 > */
	"statistic" double precision,  /* Option < f64 > */
	"p_value" double precision,  /* Option < f64 > */
	"ci_low" double precision,  /* Option < f64 > */
	"ci_high" double precision,  /* Option < f64 > */
	"odds_ratio" double precision  /* Option < f64 > */
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
	"coefficient" double precision,  /* f64 */
	"std_error" double precision,  /* Option < f64 > */
	"statistic" double precision,  /* Option < f64 > */
	"p_value" double precision,  /* Option < f64 > */
	"ci_low" double precision,  /* Option < f64 > */
	"ci_high" double precision,  /* Option < f64 > */
	"odds_ratio" double precision  /* Option < f64 > */
)
STRICT STABLE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'corgipile_model_coefficients_by_name_wrapper';

-- A model as the text of a plain PL/pgSQL function that scores a row as the model does.
CREATE FUNCTION "corgipile_export_sql"(
	"model_id" bigint, /* i64 */
	"function_name" TEXT DEFAULT NULL, /* Option < & str > */
	"output" TEXT DEFAULT 'predict' /* & str */
) RETURNS TEXT /* String */
STABLE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'corgipile_export_sql_wrapper';

CREATE FUNCTION "corgipile_export_sql"(
	"model_name" TEXT, /* & str */
	"function_name" TEXT DEFAULT NULL, /* Option < & str > */
	"output" TEXT DEFAULT 'predict' /* & str */
) RETURNS TEXT /* String */
STABLE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'corgipile_export_sql_by_name_wrapper';

-- A model as the bytes of an ONNX model that scores a row as the model does.
CREATE FUNCTION "corgipile_export_onnx"(
	"model_id" bigint /* i64 */
) RETURNS bytea /* Vec < u8 > */
STRICT STABLE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'corgipile_export_onnx_wrapper';

CREATE FUNCTION "corgipile_export_onnx"(
	"model_name" TEXT /* & str */
) RETURNS bytea /* Vec < u8 > */
STRICT STABLE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'corgipile_export_onnx_by_name_wrapper';

-- Every decision about which version of a name is deployed (0.5.0): corgipile_deploy (a pin,
-- an unpin, 'best', 'previous'), a training whose new version became the deployed one, a gated
-- training's verdict ("deploy": "if_better", with both scores), a drop of the deployed version.
-- Written by corgipile's functions alone (as the catalog's owner), in the transaction of the
-- decision; never updated. from_model and to_model are the versions deployed before and after
-- (NULL: none); candidate is a gated training's new version (deployed or not). Not references:
-- the history outlives the versions it names. corgipile_deploy(name, 'previous') reads it.
CREATE TABLE corgipile.deployments (
    id            bigserial   PRIMARY KEY,
    owner         name        NOT NULL,           -- the name's owner (trained_by of its versions)
    name          text        NOT NULL CHECK (name <> ''),
    from_model    bigint,
    to_model      bigint,
    candidate     bigint,
    how           text        NOT NULL CHECK (how IN ('train', 'gated', 'manual', 'latest', 'best', 'previous', 'drop')),
    metric        text        CHECK (metric IN ('accuracy', 'r2')),
    new_score     float8,                         -- gated: the new version's; best: the chosen one's
    old_score     float8,                         -- the version deployed before, on the same rows
    margin        float8,
    held_out_rows bigint,                         -- gated: the rows both were scored on
    reason        text        NOT NULL,
    deployed_by   name        NOT NULL,           -- the role that called
    deployed_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX deployments_owner_name ON corgipile.deployments (owner, name, id);
GRANT SELECT ON corgipile.deployments TO PUBLIC;
GRANT SELECT ON SEQUENCE corgipile.deployments_id_seq TO PUBLIC;
ALTER TABLE corgipile.deployments ENABLE ROW LEVEL SECURITY;
-- A role sees the history of its own names and of the names granted to it (either privilege,
-- to PUBLIC or to a role whose privileges it has), as it sees their versions; a grant on one
-- model id shows no history (the history names the name's other versions).
CREATE POLICY deployments_visible ON corgipile.deployments
    USING (owner = current_user OR EXISTS (
        SELECT 1 FROM corgipile.model_grants g
        WHERE g.owner = deployments.owner AND g.model_name = deployments.name
          AND (g.grantee::oid = 0 OR pg_has_role(current_user, g.grantee::oid, 'USAGE'))));
SELECT pg_catalog.pg_extension_config_dump('corgipile.deployments', '');
SELECT pg_catalog.pg_extension_config_dump('corgipile.deployments_id_seq', '');

-- Drift of a relation's rows from a model's training rows (per input column, the label and the
-- predictions).
CREATE FUNCTION "corgipile_drift"("model_id" bigint, "relation" regclass, "params" jsonb DEFAULT '{}')
RETURNS TABLE ("column_name" TEXT, "role" TEXT, "measure" TEXT, "distance" double precision,
               "threshold" double precision, "l_infinity" double precision, "passes" boolean,
               "training" jsonb, "today" jsonb)
STRICT VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'corgipile_drift_wrapper';
CREATE FUNCTION "corgipile_drift"("model_name" TEXT, "relation" regclass, "params" jsonb DEFAULT '{}')
RETURNS TABLE ("column_name" TEXT, "role" TEXT, "measure" TEXT, "distance" double precision,
               "threshold" double precision, "l_infinity" double precision, "passes" boolean,
               "training" jsonb, "today" jsonb)
STRICT VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'corgipile_drift_by_name_wrapper';
