-- corgipile 0.3.0 -> 0.4.0: models trained on a list of columns store their preprocessing
-- (per-column encoding and statistics), and predictions take a whole row. The result must
-- equal a fresh 0.4.0 install: tests/test_upgrade.py compares them.
\echo Use "ALTER EXTENSION corgipile UPDATE TO '0.4.0'" to load this file. \quit

ALTER TABLE corgipile.models ADD COLUMN preprocessing jsonb;
