-- corgipile catalog: trained models and their per-epoch history.
-- A fresh install runs this file; a database created by an older version gets the same objects
-- from the upgrade scripts (sql/corgipile--A--B.sql). tests/test_upgrade.py checks they agree.
CREATE SCHEMA corgipile;

CREATE TABLE corgipile.models (
    id               bigserial   PRIMARY KEY,
    model_type       text        NOT NULL,            -- svm, logistic, linear, softmax, mlp, mlp_regression
    relation         text        NOT NULL,            -- schema-qualified name at training time
    label_column     text        NOT NULL,
    features         jsonb       NOT NULL,            -- the features param: "col", ["a","b"] or {"indices": .., "values": ..}
    n_features       integer     NOT NULL CHECK (n_features > 0),
    n_outputs        integer     NOT NULL DEFAULT 1 CHECK (n_outputs > 0),   -- classes for softmax and mlp, else 1
    label_mapping    jsonb       NOT NULL,            -- {"classes": [...], "label_type": ...}; classifiers only
    weights          float8[]    NOT NULL,            -- linear: n_outputs x n_features, row-major; networks: every layer's matrix in order (layer l input-major: layers[l] x layers[l+1])
    bias             float8[]    NOT NULL,            -- linear: n_outputs; networks: every layer's biases in order
    standardizer     jsonb,                           -- per-feature mean/scale of a dense array trained with normalize (already folded into weights)
    params           jsonb       NOT NULL,            -- every param, defaults filled in
    metrics          jsonb       NOT NULL,            -- final epoch's metrics
    rows_trained     bigint      NOT NULL,
    rows_skipped     bigint      NOT NULL,
    training_seconds float8      NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    trained_by       name        NOT NULL DEFAULT current_user,
    name             text,                            -- the name param; NULL for unnamed models
    version          integer,                         -- 1, 2, ... per (trained_by, name)
    pinned           boolean     NOT NULL DEFAULT false,   -- set by corgipile_deploy
    preprocessing    jsonb,                           -- column lists: per-column encoding and its statistics (0.4.0)
    layers           integer[],                       -- networks (mlp, mlp_regression): every layer's width, input first (= n_features), output last (= n_outputs); NULL for linear models (0.5.0)
    -- The sizes of weights and bias: checked here for linear models; a network's follow from layers.
    -- (The names are those PostgreSQL gave these checks when they were column constraints, before 0.5.0.)
    CONSTRAINT models_check CHECK (layers IS NOT NULL OR cardinality(weights) = n_features::bigint * n_outputs),
    CONSTRAINT models_check1 CHECK (layers IS NOT NULL OR cardinality(bias) = n_outputs),
    CONSTRAINT models_layers_check CHECK (layers IS NULL OR (cardinality(layers) >= 3 AND layers[1] = n_features
                                          AND layers[cardinality(layers)] = n_outputs AND 0 < ALL (layers))),
    CONSTRAINT models_name_check CHECK (name <> ''),
    CONSTRAINT models_version_check CHECK ((name IS NULL) = (version IS NULL) AND version > 0),
    CONSTRAINT models_name_version_key UNIQUE (trained_by, name, version)
);
-- At most one pinned version per name.
CREATE UNIQUE INDEX models_pinned_name ON corgipile.models (trained_by, name) WHERE pinned;

CREATE TABLE corgipile.epochs (
    model_id            bigint  NOT NULL REFERENCES corgipile.models (id) ON DELETE CASCADE,
    epoch               integer NOT NULL,
    loss                float8  NOT NULL,
    accuracy            float8,            -- classifiers
    r2                  float8,            -- linear regression
    tuples              bigint  NOT NULL,
    seconds             float8  NOT NULL,
    learning_rate       float8  NOT NULL,
    validation_loss     float8,
    validation_accuracy float8,
    validation_r2       float8,
    validation_seconds  float8,            -- time of the validation pass (not part of seconds)
    PRIMARY KEY (model_id, epoch)
);

-- Privileges on models that their owners granted to other roles (corgipile_grant /
-- corgipile_revoke): on a model name (every version, present and future) or on one model id.
-- `use` lets the grantee see the model and predict/evaluate with it; `manage` also lets it
-- deploy, drop, retrain (new versions of the name, owned by the owner) and grant. grantee 0
-- ('-') is PUBLIC; a regrole column so that pg_dump writes role names, not OIDs.
CREATE TABLE corgipile.model_grants (
    owner       name        NOT NULL,         -- trained_by of the models it covers
    model_name  text,                         -- a name of the owner's: all its versions
    model_id    bigint      REFERENCES corgipile.models (id) ON DELETE CASCADE,
    grantee     regrole     NOT NULL,         -- '-' (0) = PUBLIC
    privilege   text        NOT NULL CHECK (privilege IN ('use', 'manage')),
    granted_by  name        NOT NULL,
    granted_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT model_grants_target_check CHECK ((model_name IS NULL) <> (model_id IS NULL)),
    CONSTRAINT model_grants_key UNIQUE NULLS NOT DISTINCT (owner, model_name, model_id, grantee, privilege)
);

-- Every role may train and use models; each role sees its own models and those granted to it
-- (to a role it inherits privileges from, as pg_has_role 'USAGE' says, or to PUBLIC);
-- superusers and the extension owner see all. Only corgipile's functions write these tables (as
-- their owner, for the calling role): PUBLIC may read, so no role can forge rows, pick ids, or
-- lock the tables beyond ACCESS SHARE. SELECT on the sequence lets pg_dump read it as any role.
-- A grant to a dropped role is dead at once: pg_has_role is false for a role that no longer
-- exists, the grant is hidden, never dumped, and deleted by the next corgipile_grant/_revoke.
GRANT USAGE ON SCHEMA corgipile TO PUBLIC;
GRANT SELECT ON corgipile.models, corgipile.epochs, corgipile.model_grants TO PUBLIC;
GRANT SELECT ON SEQUENCE corgipile.models_id_seq TO PUBLIC;
ALTER TABLE corgipile.models ENABLE ROW LEVEL SECURITY;
ALTER TABLE corgipile.epochs ENABLE ROW LEVEL SECURITY;
ALTER TABLE corgipile.model_grants ENABLE ROW LEVEL SECURITY;
-- Visible through a grant only while it gives the caller a privilege: to PUBLIC or to a role
-- whose privileges the caller has. (A role also sees the grants it made, which give it nothing.)
CREATE POLICY models_visible ON corgipile.models
    USING (trained_by = current_user OR EXISTS (
        SELECT 1 FROM corgipile.model_grants g
        WHERE g.owner = models.trained_by AND (g.model_name = models.name OR g.model_id = models.id)
          AND (g.grantee::oid = 0 OR pg_has_role(current_user, g.grantee::oid, 'USAGE'))))
    WITH CHECK (trained_by = current_user);
CREATE POLICY epochs_own ON corgipile.epochs
    USING (EXISTS (SELECT 1 FROM corgipile.models m WHERE m.id = model_id));
-- A role sees the grants on its models, the grants it made (as a manager) and the grants that
-- reach it; only those to PUBLIC and to roles that exist.
CREATE POLICY model_grants_visible ON corgipile.model_grants
    USING ((grantee::oid = 0 OR EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.oid = grantee::oid))
           AND (owner = current_user
                OR granted_by = current_user
                OR grantee::oid = 0
                OR pg_has_role(current_user, grantee::oid, 'USAGE')));

-- pg_dump carries the models: extension member tables are otherwise skipped.
SELECT pg_catalog.pg_extension_config_dump('corgipile.models', '');
SELECT pg_catalog.pg_extension_config_dump('corgipile.models_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('corgipile.epochs', '');
-- Grants to roles that no longer exist are not dumped (their OIDs would mean nothing, or
-- another role, elsewhere).
SELECT pg_catalog.pg_extension_config_dump('corgipile.model_grants',
    'WHERE grantee::pg_catalog.oid OPERATOR(pg_catalog.=) 0 OR EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.oid OPERATOR(pg_catalog.=) grantee::pg_catalog.oid)');

-- Every decision about which version of a name is deployed (0.5.0): corgipile_deploy (a pin,
-- an unpin, 'best', 'previous'), a training whose new version became the deployed one, a gated
-- training's verdict ("deploy": "if_better", with both scores), a drop of the deployed version.
-- Written by corgipile's functions alone (as the catalog's owner), in the transaction of the
-- decision; never updated. from_model and to_model are the versions deployed before and after
-- (NULL: none); candidate is a gated training's new version (deployed or not). Not references:
-- the history outlives the versions it names. corgipile_deploy(name, 'previous') reads it.
CREATE TABLE corgipile.deployments (
    id            bigserial   PRIMARY KEY,
    owner         name        NOT NULL,           -- the name's owner (trained_by of its versions)
    name          text        NOT NULL CHECK (name <> ''),
    from_model    bigint,
    to_model      bigint,
    candidate     bigint,
    how           text        NOT NULL CHECK (how IN ('train', 'gated', 'manual', 'latest', 'best', 'previous', 'drop')),
    metric        text        CHECK (metric IN ('accuracy', 'r2')),
    new_score     float8,                         -- gated: the new version's; best: the chosen one's
    old_score     float8,                         -- the version deployed before, on the same rows
    margin        float8,
    held_out_rows bigint,                         -- gated: the rows both were scored on
    reason        text        NOT NULL,
    deployed_by   name        NOT NULL,           -- the role that called
    deployed_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX deployments_owner_name ON corgipile.deployments (owner, name, id);
GRANT SELECT ON corgipile.deployments TO PUBLIC;
GRANT SELECT ON SEQUENCE corgipile.deployments_id_seq TO PUBLIC;
ALTER TABLE corgipile.deployments ENABLE ROW LEVEL SECURITY;
-- A role sees the history of its own names and of the names granted to it (either privilege,
-- to PUBLIC or to a role whose privileges it has), as it sees their versions; a grant on one
-- model id shows no history (the history names the name's other versions).
CREATE POLICY deployments_visible ON corgipile.deployments
    USING (owner = current_user OR EXISTS (
        SELECT 1 FROM corgipile.model_grants g
        WHERE g.owner = deployments.owner AND g.model_name = deployments.name
          AND (g.grantee::oid = 0 OR pg_has_role(current_user, g.grantee::oid, 'USAGE'))));
SELECT pg_catalog.pg_extension_config_dump('corgipile.deployments', '');
SELECT pg_catalog.pg_extension_config_dump('corgipile.deployments_id_seq', '');

-- One line per model, newest first; `deployed` marks the version corgipile_predict('name', ...)
-- uses (the pinned one, else the newest). security_invoker: the caller's row-level security.
CREATE VIEW corgipile.model_summary WITH (security_invoker = true) AS
SELECT m.id, m.name, m.version, m.model_type AS model, m.relation, m.rows_trained AS rows,
       (m.metrics OPERATOR(pg_catalog.->>) 'epochs_run')::integer AS epochs,
       round((m.metrics OPERATOR(pg_catalog.->>) 'loss')::numeric, 6) AS loss,
       round((m.metrics OPERATOR(pg_catalog.->>) 'accuracy')::numeric, 4) AS accuracy,
       round((m.metrics OPERATOR(pg_catalog.->>) 'r2')::numeric, 4) AS r2,
       -- NULL (unknown) for a model granted by id alone: its other versions are not visible.
       CASE WHEN m.name IS NULL OR m.trained_by = current_user
                 OR EXISTS (SELECT 1 FROM corgipile.model_grants g
                            WHERE g.owner = m.trained_by AND g.model_name = m.name
                              AND (g.grantee::oid = 0 OR pg_has_role(current_user, g.grantee::oid, 'USAGE')))
                 OR pg_has_role(current_user, (SELECT c.relowner FROM pg_catalog.pg_class c
                                               WHERE c.oid = 'corgipile.models'::regclass), 'USAGE')
            THEN coalesce(m.id = (SELECT d.id FROM corgipile.models d
                                  WHERE d.name = m.name AND d.trained_by = m.trained_by
                                  ORDER BY d.pinned DESC, d.version DESC LIMIT 1), false)
       END AS deployed,
       date_trunc('second', m.created_at) AS created_at, m.trained_by
FROM corgipile.models m
ORDER BY m.id DESC;

-- Trainings running now, from the activity line corgipile_train reports (pg_stat_activity.query
-- while it runs): no shared_preload_libraries needed. Other roles' trainings show only to roles
-- that may see their queries (pg_read_all_stats), as in pg_stat_activity. shards: for a sharded
-- table, the round and each shard's state (NULL otherwise).
CREATE VIEW corgipile.progress WITH (security_invoker = true) AS
SELECT a.pid, a.usename, a.datname, p[1] AS relation, p[2] AS model, p[3] AS phase,
       p[4]::integer AS epoch, p[5]::integer AS epochs, p[6]::float8 AS epoch_percent,
       p[7]::bigint AS tuples_this_epoch, nullif(p[8], '-')::float8 AS last_epoch_loss,
       p[9]::float8 AS elapsed_seconds, nullif(p[10], '-')::float8 AS remaining_seconds,
       p[12] AS query, p[11] AS shards
FROM pg_catalog.pg_stat_activity a,
     LATERAL pg_catalog.regexp_match(a.query,
        '^corgipile: relation (.*) model (\S+) \| (.+?) \| epoch (\d+)/(\d+) \| ([0-9.]+)% \| tuples (\d+) \| loss (\S+) \| elapsed ([0-9.]+) s \| remaining (\S+) s(?: \| shards (.*?))? \| query: (.*)$') AS p
WHERE p IS NOT NULL AND a.state = 'active';
GRANT SELECT ON corgipile.model_summary, corgipile.progress TO PUBLIC;

-- One row per configuration of a search (corgipile_train with "search", 0.5.0): each is a model,
-- a version of the search's name; search_id is the search's first model. score is the
-- validation score select_by ranks by; selected marks the best, stored last (so the name's
-- newest version). Per-epoch validation metrics: corgipile.epochs of model_id.
CREATE VIEW corgipile.search_trials WITH (security_invoker = true) AS
SELECT (s OPERATOR(pg_catalog.->>) 'search_id')::bigint AS search_id, m.name, m.version,
       m.id AS model_id, m.model_type AS model,
       (s OPERATOR(pg_catalog.->>) 'trial')::integer AS trial,
       (s OPERATOR(pg_catalog.->>) 'of')::integer AS trials,
       s OPERATOR(pg_catalog.->) 'params' AS params,
       s OPERATOR(pg_catalog.->>) 'select_by' AS select_by,
       (s OPERATOR(pg_catalog.->>) 'score')::float8 AS score,
       (s OPERATOR(pg_catalog.->>) 'selected')::boolean AS selected,
       (m.metrics OPERATOR(pg_catalog.#>>) '{validation,loss}')::float8 AS validation_loss,
       (m.metrics OPERATOR(pg_catalog.#>>) '{validation,accuracy}')::float8 AS validation_accuracy,
       (m.metrics OPERATOR(pg_catalog.#>>) '{validation,r2}')::float8 AS validation_r2,
       (m.metrics OPERATOR(pg_catalog.->>) 'epochs_run')::integer AS epochs,
       (s OPERATOR(pg_catalog.->>) 'train_seconds')::float8 AS train_seconds,
       m.created_at, m.trained_by
FROM corgipile.models m,
     LATERAL (SELECT m.metrics OPERATOR(pg_catalog.->) 'search') AS t(s)
WHERE s IS NOT NULL;
GRANT SELECT ON corgipile.search_trials TO PUBLIC;

-- One row per group of a training with "group_by" (0.5.0): each group's model is a version of
-- the name, and family_id is the model of every row (stored last, so the name's newest
-- version), which predicts the rows of groups without a model of their own.
CREATE VIEW corgipile.group_models WITH (security_invoker = true) AS
SELECT (g OPERATOR(pg_catalog.->>) 'family')::bigint AS family_id, m.name, m.version,
       m.id AS model_id, m.model_type AS model,
       g OPERATOR(pg_catalog.->) 'columns' AS group_columns,
       g OPERATOR(pg_catalog.->>) 'key' AS group_key,
       (g OPERATOR(pg_catalog.->>) 'rows')::bigint AS group_rows,
       (m.metrics OPERATOR(pg_catalog.->>) 'loss')::float8 AS loss,
       (m.metrics OPERATOR(pg_catalog.->>) 'accuracy')::float8 AS accuracy,
       (m.metrics OPERATOR(pg_catalog.->>) 'r2')::float8 AS r2,
       m.created_at, m.trained_by
FROM corgipile.models m,
     LATERAL (SELECT m.metrics OPERATOR(pg_catalog.->) 'group') AS t(g)
WHERE g IS NOT NULL;
GRANT SELECT ON corgipile.group_models TO PUBLIC;
