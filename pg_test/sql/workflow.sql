-- A worked example, as the README tells it: a table stored clustered by its label (the case
-- CorgiPile is for), trained without shuffling it, evaluated, used for prediction, retrained
-- as a new version of a named model, deployed, exported, dropped. (tests/test_dump_restore.py
-- carries such models through pg_dump and pg_restore.)
SET client_min_messages = warning;

-- 20,000 hospital visits, all the non-readmitted ones first: ORDER BY the label.
CREATE TABLE visits AS
SELECT i AS id,
       20 + (i * 7919 % 6007) / 6007.0 * 60 AS age,
       15 + (i * 104729 % 5003) / 5003.0 * 25 AS bmi,
       (i * 7919 % 6007) / 6007.0 * 2 + (i * 104729 % 5003) / 5003.0 + (i * 31 % 11) / 11.0 - 1.0 > 1.0 AS readmitted
FROM generate_series(1, 20000) AS i
ORDER BY readmitted;
-- PostgreSQL 16+ extends a table being filled by many pages at once: VACUUM drops the empty
-- tail, so the pages (and a seed's block order) are the same on every major.
VACUUM visits;
CREATE TABLE new_visits AS
SELECT id, age, bmi FROM visits WHERE id % 1000 = 0;

-- Train a logistic regression on two numeric columns, as version 1 of "readmission".
SELECT corgipile_train('visits', 'logistic',
       '{"name": "readmission", "features": ["age", "bmi"], "label": "readmitted",
         "normalize": true, "epochs": 3, "seed": 7, "verbose": false}') > 0 AS trained;

-- How good is it? (Scored with the same block scan, not one SQL call per row.)
SELECT round((m->>'accuracy')::numeric, 2) AS accuracy, round((m->>'roc_auc')::numeric, 2) AS roc_auc,
       m->>'rows_scored' AS rows_scored
FROM corgipile_evaluate('readmission', 'visits') AS m;

-- Predict by name: the label (a boolean label predicts 0 or 1), the class as the label column
-- shows it, the probability of each class (in the order false, true).
SELECT id, corgipile_predict('readmission', ARRAY[age, bmi]) AS predicted,
       corgipile_predict_class('readmission', ARRAY[age, bmi]) AS class,
       round((corgipile_predict_proba('readmission', ARRAY[age, bmi]))[2]::numeric, 2) AS p_readmitted
FROM new_visits ORDER BY id LIMIT 5;

-- Retrain with more epochs: version 2, which predict-by-name now uses.
SELECT corgipile_train('visits', 'logistic',
       '{"name": "readmission", "features": ["age", "bmi"], "label": "readmitted",
         "normalize": true, "epochs": 6, "seed": 7, "verbose": false}') > 0 AS trained;
SELECT name, version, model, relation, rows, epochs, deployed FROM corgipile.model_summary
WHERE name = 'readmission' ORDER BY version;

-- Pin version 1 (say version 2 misbehaves in production), then follow the newest again.
SELECT corgipile_deploy('readmission', id) = id AS pinned
FROM corgipile.model_summary WHERE name = 'readmission' AND version = 1;
SELECT version, deployed FROM corgipile.model_summary WHERE name = 'readmission' ORDER BY version;
SELECT corgipile_deploy('readmission') = max(id) AS newest_deployed
FROM corgipile.model_summary WHERE name = 'readmission';

-- The coefficients, in the units of the table (compare with scikit-learn's coef_/intercept_).
SELECT class, feature, feature_index, coefficient > 0 AS positive
FROM corgipile_model_coefficients('readmission');

-- Per-epoch history of the deployed version.
SELECT e.epoch, e.tuples, round(e.loss::numeric, 3) AS loss, round(e.learning_rate::numeric, 5) AS learning_rate
FROM corgipile.epochs e JOIN corgipile.model_summary s ON s.id = e.model_id
WHERE s.name = 'readmission' AND s.deployed ORDER BY e.epoch;

-- Drop every version.
SELECT corgipile_drop_model('readmission') AS dropped;
SELECT count(*) AS left_over FROM corgipile.model_summary WHERE name = 'readmission';
