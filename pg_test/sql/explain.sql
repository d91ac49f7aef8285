SET client_min_messages = warning;
-- The plan has the three nodes, each with its settings (costs stripped: they follow statistics).
SELECT regexp_replace(line, '  \(cost=.*$', '') AS plan
FROM corgipile_explain('clustered', 'svm', '{"seed": 42, "block_size": "16kB", "buffer_size": "20%"}') AS line;
-- With analyze: what each node did.
SELECT regexp_replace(regexp_replace(line, '  \(cost=.*$', ''), '[0-9]+\.[0-9]+ s$|[0-9.]+ ms$', 'N') AS plan
FROM corgipile_explain('clustered', 'logistic', '{"seed": 42, "epochs": 2, "double_buffer": false, "buffer_size": 1000}', true) AS line
WHERE line !~ '^\s*(Buffers|Final|Planning|Training Time)';
-- EXPLAIN-only does not train or store anything.
SELECT count(*) AS models FROM corgipile.models WHERE params->>'seed' = '42';
