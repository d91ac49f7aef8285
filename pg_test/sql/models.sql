SET client_min_messages = warning;
-- Linear regression on a column list, with an exact linear target.
CREATE TABLE reg AS
SELECT i AS id, (i % 7)::float8 AS a, ((i * 3) % 11)::int AS b, (2 * (i % 7) - 0.5 * ((i * 3) % 11) + 4)::numeric AS y
FROM generate_series(1, 3000) i ORDER BY y;
SELECT corgipile_train('reg', 'linear', '{"features": ["a", "b"], "label": "y", "epochs": 30, "seed": 1, "normalize": true, "learning_rate": 0.05}') AS lin \gset
SELECT model_type, features, n_features, n_outputs, label_mapping, standardizer IS NOT NULL AS has_standardizer,
       round(weights[1]::numeric, 2) AS w_a, round(weights[2]::numeric, 2) AS w_b, round(bias[1]::numeric, 1) AS bias
FROM corgipile.models WHERE id = :lin;
SELECT round(corgipile_predict(:lin, ARRAY[1, 2]::float8[])::numeric, 1) AS predicted_3,
       round(corgipile_decision_function(:lin, ARRAY[1, 2]::float8[])::numeric, 1) AS decision_3;
SELECT (corgipile_evaluate(:lin, 'reg')->>'r2')::float8 > 0.999 AS r2_close_to_1,
       corgipile_evaluate(:lin, 'reg') ?& ARRAY['mse', 'rmse', 'mae', 'r2', 'rows_scored', 'rows_skipped'] AS has_keys;
SELECT count(*) = count(r2) AS every_epoch_has_r2 FROM corgipile.epochs WHERE model_id = :lin;
SELECT corgipile_predict_class(:lin, ARRAY[1, 2]::float8[]);
SELECT corgipile_predict_proba(:lin, ARRAY[1, 2]::float8[]);
SELECT corgipile_train('reg', 'linear', '{"features": ["a", "nope"], "label": "y"}');
SELECT corgipile_train('reg', 'linear', '{"features": ["a", "b"], "label": "y", "fit_intercept": false, "epochs": 1, "seed": 1}') AS noint \gset
SELECT bias FROM corgipile.models WHERE id = :noint;
-- A NULL in a listed column is imputed (the column's mean); "impute": "skip" skips the row.
INSERT INTO reg VALUES (-1, NULL, 1, 3);
SELECT corgipile_train('reg', 'linear', '{"features": ["a", "b"], "label": "y", "epochs": 1, "seed": 1}') AS withnull \gset
SELECT rows_trained, rows_skipped FROM corgipile.models WHERE id = :withnull;
SELECT corgipile_train('reg', 'linear', '{"features": ["a", "b"], "label": "y", "epochs": 1, "seed": 1, "preprocess": {"a": {"impute": "skip"}}}') AS skipnull \gset
SELECT rows_trained, rows_skipped FROM corgipile.models WHERE id = :skipnull;

-- Softmax over integer and text labels, integer array features.
CREATE TABLE blobs AS
SELECT i AS id, ARRAY[(c * 3 + (i % 5) * 0.1)::int, ((c % 2) * 4 + (i % 3))::int] AS pos, c AS cls,
       (ARRAY['red', 'green', 'blue'])[c + 1] AS colour
FROM (SELECT i, i % 3 AS c FROM generate_series(1, 3000) i) g ORDER BY c, i;
SELECT corgipile_train('blobs', 'softmax', '{"features": "pos", "label": "cls", "epochs": 10, "seed": 1, "normalize": true}') AS sm \gset
SELECT n_outputs, label_mapping, cardinality(weights) AS n_weights, cardinality(bias) AS n_bias FROM corgipile.models WHERE id = :sm;
SELECT (corgipile_evaluate(:sm, 'blobs')->>'accuracy')::float8 > 0.95 AS accurate,
       jsonb_array_length(corgipile_evaluate(:sm, 'blobs')->'per_class') AS classes;
SELECT corgipile_train('blobs', 'softmax', '{"features": "pos", "label": "colour", "epochs": 10, "seed": 1, "normalize": true}') AS smt \gset
SELECT label_mapping FROM corgipile.models WHERE id = :smt;
SELECT corgipile_predict_class(:smt, ARRAY[6, 4]::float8[]) AS blue_ish,
       round((SELECT sum(p) FROM unnest(corgipile_predict_proba(:smt, ARRAY[6, 4]::float8[])) p)::numeric, 12) AS proba_sum;
SELECT corgipile_predict(:smt, ARRAY[6, 4]::float8[]);
SELECT corgipile_decision_function(:smt, ARRAY[6, 4]::float8[]);
-- Binary classifiers over a text label with two values.
CREATE TABLE two_colours AS SELECT * FROM blobs WHERE colour <> 'blue';
-- PostgreSQL 16+ extends a table being filled by many pages at once: VACUUM drops the empty
-- tail, so the pages (and a seed's block order) are the same on every major.
VACUUM two_colours;
SELECT corgipile_train('two_colours', 'logistic', '{"features": "pos", "label": "colour", "epochs": 5, "seed": 1}') AS bt \gset
SELECT label_mapping, (corgipile_evaluate(:bt, 'two_colours')->>'accuracy')::float8 > 0.95 AS accurate FROM corgipile.models WHERE id = :bt;
SELECT corgipile_train('blobs', 'svm', '{"features": "pos", "label": "colour", "seed": 1}');
SELECT corgipile_train('blobs', 'svm', '{"features": "pos", "label": "colour", "class_weight": "balanced", "seed": 1}');

-- Sparse features: index and value arrays (1-based, as LIBSVM).
CREATE TABLE sp (id int, idx int[], val float8[], y int);
INSERT INTO sp SELECT i, ARRAY[1 + i % 3, 5 + (i % 2) * 4], ARRAY[1.0, CASE WHEN i % 2 = 0 THEN 2.0 ELSE -2.0 END], CASE WHEN i % 2 = 0 THEN 1 ELSE -1 END
FROM generate_series(1, 2000) i;
INSERT INTO sp VALUES (0, '{}', '{}', 1);  -- an all-zero row is a valid sparse row
SELECT corgipile_train('sp', 'svm', '{"features": {"indices": "idx", "values": "val"}, "label": "y", "epochs": 3, "seed": 1, "l2": 0.001, "l1": 0.0001}') AS sp1 \gset
SELECT n_features, features, rows_trained, rows_skipped FROM corgipile.models WHERE id = :sp1;
SELECT corgipile_predict(:sp1, ARRAY[2, 9], ARRAY[1.0, 2.0]) AS sparse_pos, corgipile_predict(:sp1, ARRAY[2, 5], ARRAY[1.0, -2.0]) AS sparse_neg,
       corgipile_predict(:sp1, ARRAY[0, 1, 0, 0, 0, 0, 0, 0, 2]::float8[]) AS dense_pos;
SELECT (corgipile_evaluate(:sp1, 'sp')->>'accuracy')::float8 > 0.99 AS accurate;
SELECT corgipile_train('sp', 'svm', '{"features": {"indices": "idx", "values": "val"}, "label": "y", "n_features": 1000, "epochs": 1, "seed": 1}') AS sp2 \gset
SELECT n_features FROM corgipile.models WHERE id = :sp2;
SELECT corgipile_predict(:sp1, ARRAY[9, 2], ARRAY[1.0, 2.0]);
SELECT corgipile_predict(:sp1, ARRAY[2, 2], ARRAY[1.0, 2.0]);
SELECT corgipile_predict(:sp1, ARRAY[0, 2], ARRAY[1.0, 2.0]);
SELECT corgipile_predict(:sp1, ARRAY[2, 10], ARRAY[1.0, 2.0]);
SELECT corgipile_predict(:sp1, ARRAY[2, 3], ARRAY[1.0]);
CREATE TABLE sp_bad AS SELECT * FROM sp WHERE id < 10;
INSERT INTO sp_bad VALUES (100, ARRAY[3, 2], ARRAY[1.0, 1.0], 1);
SELECT corgipile_train('sp_bad', 'svm', '{"features": {"indices": "idx", "values": "val"}, "label": "y", "shuffle": "no_shuffle"}');
DELETE FROM sp_bad WHERE id = 100;
INSERT INTO sp_bad VALUES (101, ARRAY[-1], ARRAY[1.0], 1);
SELECT corgipile_train('sp_bad', 'svm', '{"features": {"indices": "idx", "values": "val"}, "label": "y", "shuffle": "no_shuffle"}');
DELETE FROM sp_bad WHERE id = 101;
INSERT INTO sp_bad VALUES (102, ARRAY[1, 2], ARRAY[1.0], 1);
SELECT corgipile_train('sp_bad', 'svm', '{"features": {"indices": "idx", "values": "val"}, "label": "y", "shuffle": "no_shuffle"}');
SELECT corgipile_train('sp', 'svm', '{"features": {"indices": "idx", "values": "val"}, "label": "y", "n_features": 5, "seed": 1}');
SELECT corgipile_train('sp', 'svm', '{"features": {"indices": "idx", "values": "val"}, "label": "y", "index_base": 0, "n_features": 9, "epochs": 1, "seed": 1}');
SELECT corgipile_train('clustered', 'svm', '{"n_features": 4}');
SELECT corgipile_train('sp', 'svm', '{"features": {"indices": "val", "values": "idx"}, "label": "y"}');

-- Validation: a hash-held-out fraction, a predicate, another relation.
SELECT corgipile_train('clustered', 'logistic', '{"epochs": 2, "seed": 1, "validation": {"fraction": 0.2}}') AS v1 \gset
SELECT bool_and(validation_loss IS NOT NULL AND validation_accuracy > 0.8) AS validated,
       bool_and(tuples BETWEEN 4500 AND 5100) AS eighty_percent_trained FROM corgipile.epochs WHERE model_id = :v1;
SELECT corgipile_train('clustered', 'logistic', '{"epochs": 2, "seed": 1, "validation": {"predicate": "id % 4 = 0"}}') AS v2 \gset
SELECT bool_and(tuples = 4500) AS three_quarters_trained, bool_and(validation_accuracy > 0.8) AS validated FROM corgipile.epochs WHERE model_id = :v2;
CREATE TABLE clustered_holdout AS SELECT * FROM clustered WHERE id % 10 = 0;
SELECT corgipile_train('clustered', 'logistic', '{"epochs": 2, "seed": 1, "validation": {"relation": "clustered_holdout"}}') AS v3 \gset
SELECT bool_and(validation_accuracy > 0.8) AS validated, (SELECT metrics->'validation'->>'rows' FROM corgipile.models WHERE id = :v3) AS validation_rows
FROM corgipile.epochs WHERE model_id = :v3;
SELECT corgipile_train('clustered', 'logistic', '{"validation": {"predicate": "true); DROP TABLE clustered; SELECT (1"}}');
SELECT corgipile_train('clustered', 'logistic', '{"validation": {"relation": "no_such_holdout"}}');
SELECT count(*) AS clustered_still_there FROM clustered;

-- Optimizer options are stored with the model.
SELECT corgipile_train('clustered', 'svm', '{"epochs": 2, "seed": 1, "learning_rate_schedule": "inverse_sqrt", "class_weight": "balanced", "l1": 0.001}') AS opt \gset
SELECT params->'learning_rate_schedule' AS schedule, params->'class_weight' AS class_weight, params->'l1' AS l1,
       array_agg(round(learning_rate::numeric, 6) ORDER BY epoch) AS rates
FROM corgipile.models JOIN corgipile.epochs ON model_id = id WHERE id = :opt GROUP BY 1, 2, 3;

-- corgipile_evaluate errors.
SELECT corgipile_evaluate(:opt, 'clustered', '{"epochs": 3}');
SELECT corgipile_evaluate(:opt, 'reg');
SELECT corgipile_evaluate(999999, 'clustered');

-- Objects earlier on the search_path cannot change corgipile's internal queries.
CREATE SCHEMA evil;
CREATE DOMAIN evil.float8 AS text;
CREATE FUNCTION evil.unnest(anyarray) RETURNS SETOF anyelement LANGUAGE sql AS 'SELECT NULL::anyelement WHERE false';
SET search_path = evil, pg_catalog, public;
SELECT corgipile_train('reg', 'linear', '{"features": ["a", "b"], "label": "y", "epochs": 2, "seed": 1}') AS hardened \gset
SELECT count(*) AS epochs_stored, round(max(r2)::numeric, 2) AS r2 FROM corgipile.epochs WHERE model_id = :hardened;
RESET search_path;
DROP SCHEMA evil CASCADE;

-- Held-out validation rows and ROC AUC scores are bounded by corgipile.max_buffer_memory.
SET corgipile.max_buffer_memory = '64kB';
SELECT corgipile_train('clustered', 'logistic', '{"epochs": 1, "seed": 1, "buffer_size": 100, "validation": {"fraction": 0.5}}');
SELECT corgipile_evaluate(:v1, 'clustered') ?& ARRAY['roc_auc_note'] AS auc_skipped, (corgipile_evaluate(:v1, 'clustered')->>'rows_scored')::int AS rows_scored;
RESET corgipile.max_buffer_memory;
SELECT (corgipile_evaluate(:v1, 'clustered')->>'roc_auc')::float8 > 0.9 AS auc_computed;
