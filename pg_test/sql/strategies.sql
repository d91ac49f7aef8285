SET client_min_messages = warning;
-- A 1,000-row table clustered by label, features[1] = the original row number.
CREATE TABLE order_demo AS
SELECT i AS id, ARRAY[i, (i % 7)]::float8[] AS features, CASE WHEN i <= 500 THEN -1 ELSE 1 END AS label
FROM generate_series(1, 1000) i ORDER BY i;
-- PostgreSQL 16+ extends a table being filled by many pages at once: VACUUM drops the empty
-- tail, so the pages (and a seed's block order) are the same on every major.
VACUUM order_demo;
-- Every strategy visits every row exactly once per epoch ...
SELECT s AS strategy, count(*) AS visited, count(DISTINCT first_feature) AS distinct_rows
FROM unnest(ARRAY['no_shuffle', 'block_only', 'corgipile', 'sliding_window']) s,
     corgipile_trace('order_demo', jsonb_build_object('shuffle', s, 'seed', 1, 'buffer_size', 100, 'block_size', 1))
GROUP BY s ORDER BY s;
-- ... except mrs, whose memory loop revisits the reservoir: every row at least once.
SELECT count(DISTINCT first_feature) AS distinct_rows, count(*) > 1000 AS revisits_reservoir
FROM corgipile_trace('order_demo', '{"shuffle": "mrs", "seed": 1, "buffer_size": 100}');
-- How mixed is the first tenth of the epoch? (share of positives among the first 100 visits)
SELECT s AS strategy, round(avg((label > 0)::int) FILTER (WHERE position <= 100), 2) AS positives_in_first_100
FROM unnest(ARRAY['no_shuffle', 'sliding_window', 'block_only', 'corgipile']) s,
     corgipile_trace('order_demo', jsonb_build_object('shuffle', s, 'seed', 3, 'buffer_size', 200, 'block_size', 1))
GROUP BY s ORDER BY s;
-- no_shuffle is storage order; sliding_window never emits a row before it was read.
SELECT bool_and(first_feature = position) AS storage_order
FROM corgipile_trace('order_demo', '{"shuffle": "no_shuffle"}');
SELECT bool_and(first_feature <= position + 100) AS causal
FROM corgipile_trace('order_demo', '{"shuffle": "sliding_window", "buffer_size": 100, "seed": 2}');
-- Training works with both baselines; mrs trains on more tuples than rows.
SELECT corgipile_train('order_demo', 'logistic', '{"shuffle": "sliding_window", "epochs": 2, "seed": 1, "buffer_size": 100}') AS sw \gset
SELECT corgipile_train('order_demo', 'logistic', '{"shuffle": "mrs", "epochs": 2, "seed": 1, "buffer_size": 100}') AS mrs \gset
SELECT id = :sw AS sliding_window, rows_trained, (SELECT min(tuples) FROM corgipile.epochs WHERE model_id = id) AS tuples_per_epoch
FROM corgipile.models WHERE id IN (:sw, :mrs) ORDER BY id;
SELECT regexp_replace(line, '  \(cost=.*$', '') AS plan
FROM corgipile_explain('order_demo', 'svm', '{"shuffle": "mrs", "seed": 1}') AS line WHERE line ~ 'Strategy|Block Order';
