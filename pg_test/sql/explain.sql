SET client_min_messages = warning;
-- The plan has the three nodes, each with its settings (costs stripped: they follow statistics).
SELECT regexp_replace(line, '  \(cost=.*$', '') AS plan
FROM corgipile_explain('clustered', 'svm', '{"seed": 42, "block_size": "16kB", "buffer_size": "20%"}') AS line;
-- With analyze: what each node did.
SELECT regexp_replace(regexp_replace(line, '  \(cost=.*$', ''), '[0-9]+\.[0-9]+ s$|[0-9.]+ ms$', 'N') AS plan
FROM corgipile_explain('clustered', 'logistic', '{"seed": 42, "epochs": 2, "double_buffer": false, "buffer_size": 1000}', true) AS line
WHERE line !~ '^\s*(Buffers|Final|Planning|Training Time|Epoch Times)';
-- EXPLAIN-only does not train or store anything.
SELECT count(*) AS models FROM corgipile.models WHERE params->>'seed' = '42';
-- FORMAT json (also yaml, xml): one row holding the whole document.
SELECT j->0->'Plan'->>'Custom Plan Provider' AS top,
       j->0->'Plan'->'Plans'->0->>'Strategy' AS strategy,
       j->0->'Plan'->'Plans'->0->'Plans'->0->>'Block Size' AS block_size,
       j->0->'Plan'->'Plans'->0->'Plans'->0->>'Blocks' AS blocks
FROM (SELECT line::jsonb AS j FROM corgipile_explain('clustered', 'svm', '{"seed": 42, "block_size": "16kB", "buffer_size": "20%"}', false, 'json') AS line) s;
SELECT j->0 ? 'Training Time' AS has_training_time,
       cardinality(string_to_array(j->0->'Plan'->>'Epoch Times (ms)', ',')) AS epoch_times,
       (j->0->'Plan'->'Plans'->0->'Plans'->0->>'Pages Read')::int > 0 AS read_pages
FROM (SELECT line::jsonb AS j FROM corgipile_explain('clustered', 'svm', '{"seed": 42, "epochs": 2, "verbose": false}', true, 'JSON') AS line) s;
SELECT count(*) AS rows, bool_and(line LIKE '%<Custom-Plan-Provider>CorgiPile SGD</Custom-Plan-Provider>%') AS xml
FROM corgipile_explain('clustered', 'svm', '{"seed": 42}', false, 'xml') AS line;
