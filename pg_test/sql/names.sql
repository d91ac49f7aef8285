SET client_min_messages = warning;
\set VERBOSITY default
-- Errors of names, deployment and export: each a clear ERROR, nothing changed.
SELECT corgipile_train('clustered', 'svm', '{"epochs": 1, "verbose": false}') AS id \gset
SELECT corgipile_train('clustered', 'svm', '{"name": ""}');
SELECT corgipile_train('clustered', 'svm', '{"name": " padded"}');
SELECT corgipile_train('clustered', 'svm', '{"name": 42}');
SELECT corgipile_train('clustered', 'svm', '{"name": "42"}');
-- An integer in text is a model id (as psql's :'var' passes it).
SELECT corgipile_predict(:'id', ARRAY[1, 2, 3, 4]::float8[]) = corgipile_predict(:id, ARRAY[1, 2, 3, 4]::float8[]) AS same;
SELECT corgipile_predict('999999', ARRAY[1, 2, 3, 4]::float8[]);
SELECT corgipile_predict('no such model', ARRAY[1, 2, 3, 4]::float8[]);
SELECT corgipile_evaluate('no such model', 'clustered');
SELECT corgipile_deploy('no such model');
SELECT corgipile_drop_model('no such model');
SELECT corgipile_drop_model(999999);
SELECT * FROM corgipile_model_coefficients(999999);
SELECT corgipile_train('clustered', 'svm', '{"epochs": 1, "name": "errors_a", "verbose": false}') AS a_id \gset
SELECT corgipile_train('clustered', 'svm', '{"epochs": 1, "name": "errors_b", "verbose": false}') AS b_id \gset
SELECT corgipile_deploy('errors_a', :b_id);
SELECT corgipile_deploy('errors_a', :id);
SELECT corgipile_deploy('errors_a', 999999);
-- Nothing changed: errors_a still deploys its only version.
SELECT corgipile_deploy('errors_a') = :a_id AS unchanged;
SELECT * FROM corgipile_explain('clustered', 'svm', '{}', false, 'html');
-- NULL arguments: a clear ERROR (22004), never an internal one or a silent no-op.
SELECT corgipile_deploy(NULL, :id);
\echo :LAST_ERROR_SQLSTATE
SELECT corgipile_grant('errors_a', NULL, 'use');
\echo :LAST_ERROR_SQLSTATE
SELECT corgipile_revoke('errors_a', 'public', 'use', NULL);
\echo :LAST_ERROR_SQLSTATE
