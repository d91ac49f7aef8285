SET client_min_messages = warning;
-- A customer table as analysts have them: text and boolean columns, raw scales, NULLs, stored
-- clustered by the label. Defaults only: the text columns are one-hot encoded, NULL numbers
-- imputed with the mean, numbers standardized while training (the stored weights are in the
-- table's units), the iterates averaged.
CREATE TYPE plan_kind AS ENUM ('basic', 'plus', 'pro');
CREATE TABLE customers AS
SELECT id, state, intl_plan, plan, income, age, calls, has_app,
       (0.8 * (intl_plan = 'Yes')::int + 0.00004 * coalesce(income, 60000) - 0.04 * age
        + 0.3 * calls + 0.6 * coalesce(state IN ('CA', 'TX'), false)::int - 0.5 * coalesce(has_app, false)::int
        + 0.2 * (plan = 'basic')::int - 3.1 + 1.6 * (((id * 7919) % 1000) / 1000.0 - 0.5)) > 0 AS churn
FROM (SELECT i AS id,
             (ARRAY['CA', 'TX', 'NY', 'FL', 'OH', 'WA', 'KS', NULL])[1 + (i * 31) % 8] AS state,
             CASE WHEN i % 7 = 0 THEN 'Yes' ELSE 'No' END AS intl_plan,
             (ARRAY['basic', 'plus', 'pro'])[1 + (i * 13) % 3]::plan_kind AS plan,
             CASE WHEN i % 20 = 0 THEN NULL ELSE 20000 + (i * 7727) % 90000 END::float8 AS income,
             18 + (i * 17) % 60 AS age,
             (i * 11) % 9 AS calls,
             CASE WHEN i % 25 = 0 THEN NULL ELSE i % 3 = 0 END AS has_app
      FROM generate_series(1, 20000) i) c
ORDER BY churn, id;
-- PostgreSQL 16+ extends a table being filled by many pages at once: VACUUM drops the empty
-- tail, so the pages (and a seed's block order) are the same on every major.
VACUUM customers;
SELECT churn, count(*) FROM customers GROUP BY churn ORDER BY churn;

SELECT corgipile_train('customers', 'logistic',
    '{"features": "*", "exclude": ["id"], "label": "churn", "seed": 1, "name": "churn"}') AS m \gset

-- What was learned and stored: the columns, their encoding and statistics.
SELECT features, n_features FROM corgipile.models WHERE id = :m;
SELECT c->>'name' AS column, c->>'source' AS source, c->>'encode' AS encode, c->>'impute' AS impute,
       round((c->>'fill')::numeric, 1) AS fill, c->'categories' AS categories, c->'other' AS other, c->'null' AS "null"
FROM corgipile.models, jsonb_array_elements(preprocessing->'columns') c WHERE id = :m;

-- Evaluate on the table (any relation with these columns works).
SELECT round((r->>'accuracy')::numeric, 2) AS accuracy, round((r->>'roc_auc')::numeric, 2) AS roc_auc,
       r->>'rows_scored' AS rows_scored
FROM corgipile_evaluate('churn', 'customers') r;

-- Predict from a whole row: columns matched by name, the stored preprocessing applied.
SELECT id, churn, corgipile_predict_class('churn', c) AS predicted,
       round((corgipile_predict_proba('churn', c))[2]::numeric, 3) AS p_churn
FROM customers c WHERE id IN (7, 40, 41, 1000) ORDER BY id;
-- A new customer: an unseen state is "(other)" if the model has it, else no state feature;
-- a NULL income is imputed with the training mean.
SELECT corgipile_predict_class('churn', r) AS predicted
FROM (SELECT 'AK' AS state, 'Yes' AS intl_plan, 'basic'::plan_kind AS plan, NULL::float8 AS income,
             30 AS age, 8 AS calls, false AS has_app) r;

-- Coefficients with readable names, in the table's units.
SELECT feature, round(coefficient::numeric, 5) AS coefficient
FROM corgipile_model_coefficients('churn') ORDER BY feature_index NULLS LAST;
