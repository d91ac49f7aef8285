-- corgipile catalog: trained models and their per-epoch history.
CREATE SCHEMA corgipile;

CREATE TABLE corgipile.models (
    id               bigserial   PRIMARY KEY,
    model_type       text        NOT NULL,            -- svm, logistic, linear, softmax
    relation         text        NOT NULL,            -- schema-qualified name at training time
    label_column     text        NOT NULL,
    features         jsonb       NOT NULL,            -- the features param: "col", ["a","b"] or {"indices": .., "values": ..}
    n_features       integer     NOT NULL CHECK (n_features > 0),
    n_outputs        integer     NOT NULL DEFAULT 1 CHECK (n_outputs > 0),   -- classes for softmax, else 1
    label_mapping    jsonb       NOT NULL,            -- {"classes": [...], "label_type": ...}; classifiers only
    weights          float8[]    NOT NULL CHECK (cardinality(weights) = n_features::bigint * n_outputs),
    bias             float8[]    NOT NULL CHECK (cardinality(bias) = n_outputs),
    standardizer     jsonb,                           -- per-feature mean/scale when trained with normalize (already folded into weights)
    params           jsonb       NOT NULL,            -- every param, defaults filled in
    metrics          jsonb       NOT NULL,            -- final epoch's metrics
    rows_trained     bigint      NOT NULL,
    rows_skipped     bigint      NOT NULL,
    training_seconds float8      NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    trained_by       name        NOT NULL DEFAULT current_user
);

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
    PRIMARY KEY (model_id, epoch)
);

-- Every role may train and use models; each role sees and deletes only its own models
-- (superusers and the extension owner see all).
GRANT USAGE ON SCHEMA corgipile TO PUBLIC;
GRANT SELECT, INSERT, DELETE ON corgipile.models, corgipile.epochs TO PUBLIC;
GRANT USAGE ON SEQUENCE corgipile.models_id_seq TO PUBLIC;
ALTER TABLE corgipile.models ENABLE ROW LEVEL SECURITY;
ALTER TABLE corgipile.epochs ENABLE ROW LEVEL SECURITY;
CREATE POLICY models_own ON corgipile.models
    USING (trained_by = current_user) WITH CHECK (trained_by = current_user);
CREATE POLICY epochs_own ON corgipile.epochs
    USING (EXISTS (SELECT 1 FROM corgipile.models m WHERE m.id = model_id));

-- pg_dump carries the models: extension member tables are otherwise skipped.
SELECT pg_catalog.pg_extension_config_dump('corgipile.models', '');
SELECT pg_catalog.pg_extension_config_dump('corgipile.models_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('corgipile.epochs', '');
