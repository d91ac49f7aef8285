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
