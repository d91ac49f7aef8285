-- Fixtures shared by the regression tests.
CREATE EXTENSION corgipile;
SET client_min_messages = warning;
SELECT setseed(0.25);
-- Two Gaussian-ish classes in 4 dimensions, stored negatives first (label-clustered).
CREATE TABLE clustered AS
SELECT i AS id,
       ARRAY[(random() - 0.5) + s * 0.6, (random() - 0.5) + s * 0.4,
             (random() - 0.5) - s * 0.3, random() - 0.5]::float8[] AS features,
       s::int AS label
FROM (SELECT i, CASE WHEN i <= 3000 THEN -1 ELSE 1 END AS s FROM generate_series(1, 6000) i) g
ORDER BY i;
-- The same rows with other label encodings and feature types.
CREATE TABLE labels01 AS SELECT id, features, (label + 1) / 2 AS label FROM clustered;
CREATE TABLE labelsbool AS SELECT id, features, label > 0 AS label FROM clustered;
CREATE TABLE labels37 AS SELECT id, features::float4[] AS feats, CASE WHEN label > 0 THEN 3 ELSE 7 END::numeric AS y FROM clustered;
-- PostgreSQL 16+ extends a table being filled by many pages at once: VACUUM drops the empty
-- tail, so the pages (and a seed's block order) are the same on every major.
VACUUM clustered;
