SET client_min_messages = warning;
-- The shortest call works: default params, columns "features" and "label".
SELECT corgipile_train('clustered', 'svm') AS id \gset
SELECT model_type, relation, label_column, features, n_features, n_outputs, label_mapping,
       rows_trained, rows_skipped, trained_by = current_user AS mine,
       params->>'epochs' AS epochs, params->>'shuffle' AS shuffle, (params->>'seed') IS NOT NULL AS seed_filled
FROM corgipile.models WHERE id = :id;
SELECT count(*) AS epochs_rows, min(epoch), max(epoch), bool_and(tuples = 6000) AS all_tuples
FROM corgipile.epochs WHERE model_id = :id;
-- Predictions come back in the table's label values.
SELECT avg((corgipile_predict(:id, features) = label)::int) > 0.9 AS accurate FROM clustered;
SELECT DISTINCT corgipile_predict(:id, features) AS predicted FROM clustered ORDER BY 1;

-- Same seed and data: identical model; single- and double-buffered training agree bit for bit.
SELECT corgipile_train('clustered', 'logistic', '{"epochs": 3, "seed": 7}') AS a \gset
SELECT corgipile_train('clustered', 'logistic', '{"epochs": 3, "seed": 7}') AS b \gset
SELECT corgipile_train('clustered', 'logistic', '{"epochs": 3, "seed": 7, "double_buffer": false}') AS c \gset
SELECT corgipile_train('clustered', 'logistic', '{"epochs": 3, "seed": 8}') AS d \gset
SELECT (SELECT weights FROM corgipile.models WHERE id = :a) = (SELECT weights FROM corgipile.models WHERE id = :b) AS same_seed_same_model,
       (SELECT weights FROM corgipile.models WHERE id = :a) = (SELECT weights FROM corgipile.models WHERE id = :c) AS double_buffer_same_model,
       (SELECT weights FROM corgipile.models WHERE id = :a) <> (SELECT weights FROM corgipile.models WHERE id = :d) AS other_seed_other_model;

-- Label encodings: 0/1, boolean, and any two numeric values (the smaller is the negative class).
SELECT corgipile_train('labels01', 'logistic', '{"epochs": 2, "seed": 1}') AS m01 \gset
SELECT corgipile_train('labelsbool', 'svm', '{"epochs": 2, "seed": 1}') AS mbool \gset
SELECT corgipile_train('labels37', 'svm', '{"epochs": 2, "seed": 1, "features": "feats", "label": "y"}') AS m37 \gset
SELECT id = :m01 AS m01, label_mapping FROM corgipile.models WHERE id IN (:m01, :mbool, :m37) ORDER BY id;
SELECT DISTINCT corgipile_predict(:m01, features) FROM labels01 ORDER BY 1;
SELECT DISTINCT corgipile_predict(:mbool, features) FROM labelsbool ORDER BY 1;
SELECT DISTINCT corgipile_predict(:m37, feats::float8[]) FROM labels37 ORDER BY 1;
SELECT avg((corgipile_predict(:m37, feats::float8[]) = y)::int) > 0.9 AS accurate37 FROM labels37;
-- Relabelling the classes (+1 -> 3, -1 -> 7, so 7 is now the larger, positive class) gives
-- exactly the negated model, whichever class the shuffled scan happens to meet first.
CREATE TABLE relabelled AS SELECT id, features, CASE WHEN label > 0 THEN 3 ELSE 7 END AS label FROM clustered;
VACUUM relabelled;  -- the same pages as clustered (see setup.sql)
SELECT corgipile_train('relabelled', 'svm', '{"epochs": 2, "seed": 1}') AS mr \gset
SELECT corgipile_train('clustered', 'svm', '{"epochs": 2, "seed": 1}') AS mc \gset
SELECT (SELECT weights FROM corgipile.models WHERE id = :mr) =
       (SELECT array_agg(-w ORDER BY i) FROM corgipile.models, unnest(weights) WITH ORDINALITY AS u(w, i) WHERE id = :mc)
       AS relabel_gives_negated_model;

-- Rows with a NULL label or NULL/empty features are skipped and counted.
CREATE TABLE with_nulls AS SELECT * FROM clustered;
INSERT INTO with_nulls VALUES (-1, NULL, 1), (-2, ARRAY[1,2,3,4]::float8[], NULL), (-3, '{}', 1);
SELECT corgipile_train('with_nulls', 'svm', '{"epochs": 1, "seed": 1}') AS mn \gset
SELECT rows_trained, rows_skipped FROM corgipile.models WHERE id = :mn;

-- Mini-batches, block_only and no_shuffle run and store their params.
SELECT corgipile_train('clustered', 'svm', '{"epochs": 2, "batch_size": 16, "shuffle": "block_only", "block_size": 2, "buffer_size": 500}') AS mb \gset
SELECT params->'batch_size' AS batch_size, params->'shuffle' AS shuffle, params->'block_size' AS block_size,
       params->'buffer_size' AS buffer_size FROM corgipile.models WHERE id = :mb;
SELECT corgipile_train('clustered', 'svm', '{"epochs": 5, "tolerance": 1000}') AS mt \gset
SELECT jsonb_array_length(jsonb_agg(epoch)) AS epochs_run_with_huge_tolerance FROM corgipile.epochs WHERE model_id = :mt;

-- Deleting a model: predict errors on the next statement.
DELETE FROM corgipile.models WHERE id = :mt;
SELECT corgipile_predict(:mt, ARRAY[1,2,3,4]::float8[]);
SELECT count(*) FROM corgipile.epochs WHERE model_id = :mt;
