SET client_min_messages = warning;
\set VERBOSITY default
-- Every bad input is an ERROR with a clear message; nothing is written.
SELECT count(*) AS models_before FROM corgipile.models \gset
SELECT corgipile_train('no_such_table', 'svm');
SELECT corgipile_train('clustered', 'random_forest');
SELECT corgipile_train('clustered', 'svm', '{"epoch": 3}');
SELECT corgipile_train('clustered', 'svm', '{"learning_rat": 0.1}');
SELECT corgipile_train('clustered', 'svm', '[1, 2]');
SELECT corgipile_train('clustered', 'svm', '{"epochs": 0}');
SELECT corgipile_train('clustered', 'svm', '{"epochs": 2.5}');
SELECT corgipile_train('clustered', 'svm', '{"epochs": "ten"}');
SELECT corgipile_train('clustered', 'svm', '{"learning_rate": -1}');
SELECT corgipile_train('clustered', 'svm', '{"decay": 1.5}');
SELECT corgipile_train('clustered', 'svm', '{"batch_size": 0}');
SELECT corgipile_train('clustered', 'svm', '{"shuffle": "random"}');
SELECT corgipile_train('clustered', 'svm', '{"buffer_size": "1TB"}');
SELECT corgipile_train('clustered', 'svm', '{"buffer_size": "0%"}');
SELECT corgipile_train('clustered', 'svm', '{"block_size": "ten megabytes"}');
SELECT corgipile_train('clustered', 'svm', '{"double_buffer": "yes"}');
-- Columns: missing, wrong type, injection attempts are just missing columns.
SELECT corgipile_train('clustered', 'svm', '{"features": "feats"}');
SELECT corgipile_train('clustered', 'svm', '{"label": "label\"; DROP TABLE clustered; --"}');
SELECT corgipile_train('clustered', 'svm', '{"label": "features"}');
SELECT corgipile_train('clustered', 'svm', '{"features": "label"}');
SELECT corgipile_train('clustered', 'svm', '{"label": "ctid"}');
-- Relations that are not plain tables.
CREATE SEQUENCE some_seq;
SELECT corgipile_train('some_seq', 'svm');
-- A partitioned table is read through its partitions; with none, it has no rows.
CREATE TABLE parted (features float8[], label int) PARTITION BY RANGE (label);
SELECT corgipile_train('parted', 'svm');
SELECT corgipile_train('parted', 'svm', '{"only": true}');
-- Data problems.
CREATE TABLE empty_t (features float8[], label int);
SELECT corgipile_train('empty_t', 'svm');
CREATE TABLE all_skipped AS SELECT NULL::float8[] AS features, 1 AS label FROM generate_series(1, 10);
SELECT corgipile_train('all_skipped', 'svm');
CREATE TABLE one_class AS SELECT ARRAY[random(), random()] AS features, 1 AS label FROM generate_series(1, 100);
SELECT corgipile_train('one_class', 'svm');
CREATE TABLE three_classes AS SELECT ARRAY[random(), random()] AS features, i % 3 AS label FROM generate_series(1, 100) i;
SELECT corgipile_train('three_classes', 'svm', '{"seed": 1}');
CREATE TABLE ragged (features float8[], label int);
INSERT INTO ragged VALUES ('{1,2}', 1), ('{1,2}', -1), ('{1,2,3}', 1);
SELECT corgipile_train('ragged', 'svm', '{"shuffle": "no_shuffle"}');
CREATE TABLE nan_features (features float8[], label int);
INSERT INTO nan_features VALUES ('{1,2}', 1), ('{NaN,2}', -1);
SELECT corgipile_train('nan_features', 'svm', '{"shuffle": "no_shuffle"}');
CREATE TABLE inf_features (features float8[], label int);
INSERT INTO inf_features VALUES ('{1,Infinity}', 1);
SELECT corgipile_train('inf_features', 'svm');
CREATE TABLE null_elements (features float8[], label int);
INSERT INTO null_elements VALUES ('{1,NULL}', 1);
SELECT corgipile_train('null_elements', 'svm');
CREATE TABLE two_dim (features float8[], label int);
INSERT INTO two_dim VALUES ('{{1,2},{3,4}}', 1);
SELECT corgipile_train('two_dim', 'svm');
CREATE TABLE nan_label (features float8[], label float8);
INSERT INTO nan_label VALUES ('{1,2}', 'NaN');
SELECT corgipile_train('nan_label', 'svm');
CREATE TABLE diverge AS SELECT ARRAY[i * 1e150, 1]::float8[] AS features, CASE WHEN i % 2 = 0 THEN 1 ELSE -1 END AS label FROM generate_series(1, 100) i;
SELECT corgipile_train('diverge', 'svm', '{"learning_rate": 1000, "seed": 1, "normalize": false}');
-- Nothing was written by any of the failures above.
SELECT count(*) - :models_before AS models_written FROM corgipile.models;
-- Prediction errors.
SELECT corgipile_train('clustered', 'svm', '{"epochs": 1}') AS id \gset
SELECT corgipile_predict(:id, ARRAY[1, 2]::float8[]);
SELECT corgipile_predict(:id, ARRAY[1, 2, 3, 'NaN']::float8[]);
SELECT corgipile_predict(:id, ARRAY[1, 2, NULL, 4]::float8[]);
SELECT corgipile_predict(:id, '{}'::float8[]);
SELECT corgipile_predict(:id, NULL::float8[]) IS NULL AS strict_null;
-- An untyped NULL (or literal) could be an array or a row: PostgreSQL asks for a cast.
SELECT corgipile_predict(:id, NULL);
SELECT corgipile_predict(999999, ARRAY[1, 2, 3, 4]::float8[]);
-- The session still works after all of that.
SELECT corgipile_predict(:id, ARRAY[1, 2, 3, 4]::float8[]) IN (-1, 1) AS works;
