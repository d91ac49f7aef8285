#!/usr/bin/env python3
"""Model fingerprints: the final loss (to the last digit), an md5 of the weights, the evaluation
report and a trace, over a fixed matrix of trainings (every strategy and buffer mode, every
model kind, normalize, l1/l2, class weights, mini-batches, sparse, validation, tolerance, a9a).
For showing that a change that must not change behaviour changes no model:

    PGHOST=... PGPORT=... PGUSER=... scripts/model_fingerprints.py before.json   # old build
    PGHOST=... PGPORT=... PGUSER=... scripts/model_fingerprints.py after.json    # new build
    cmp before.json after.json

Uses its own database corgipile_fingerprint; a9a comes from $CORGIPILE_DATASETS or
../shared/datasets."""
import json, os, pathlib, subprocess, sys, psycopg
from psycopg.types.json import Jsonb
DB = "corgipile_fingerprint"
REPO = str(pathlib.Path(__file__).resolve().parent.parent)
DATASETS = pathlib.Path(os.environ.get("CORGIPILE_DATASETS", pathlib.Path(REPO).parent / "shared" / "datasets"))
with psycopg.connect(dbname="postgres", autocommit=True) as a:
    if not a.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DB,)).fetchone():
        a.execute(f"CREATE DATABASE {DB}")
with psycopg.connect(dbname=DB, autocommit=True) as c:
    c.execute("CREATE EXTENSION IF NOT EXISTS corgipile")
    c.execute("ALTER EXTENSION corgipile UPDATE")
    if not c.execute("SELECT to_regclass('a9a_train')").fetchone()[0]:
        subprocess.run([sys.executable, f"{REPO}/scripts/load_libsvm.py", str(DATASETS / "a9a.train.bz2"), "a9a_train", "--n-features", "123", "-d", DB], check=True)
        c.execute("CREATE TABLE a9a_clustered AS SELECT * FROM a9a_train ORDER BY label, id")
        c.execute("""CREATE TABLE det AS SELECT i AS id,
            ARRAY[sin(i), cos(i * 0.7), (i % 13) / 13.0, ((i * 7919) % 1000) / 1000.0]::float8[] AS features,
            (i % 3) AS cls, ((i % 3) = 1) AS flag, sin(i) * 3 + cos(i * 0.7) AS y,
            ARRAY[1 + i % 5, 7 + i % 11, 40 + i % 17]::int4[] AS idx, ARRAY[1.0, (i % 4) / 4.0, -0.5]::float8[] AS val,
            'c' || (i % 4) AS tlabel
            FROM generate_series(1, 30000) i ORDER BY i % 3, i""")
    cols = [r[0] for r in c.execute("SELECT column_name FROM information_schema.columns WHERE table_name = 'a9a_train'")]
    a9a_feat = "features" if "features" in cols else None
    cases = []
    for shuffle in ["corgipile", "no_shuffle", "block_only", "sliding_window", "mrs"]:
        for db in [True, False]:
            cases.append(("det", "svm", {"label": "flag", "shuffle": shuffle, "double_buffer": db}))
    cases += [
        ("det", "logistic", {"label": "flag", "normalize": True, "batch_size": 8, "l2": 0.01}),
        ("det", "logistic", {"label": "flag", "l1": 0.001, "class_weight": "balanced"}),
        ("det", "linear", {"label": "y", "normalize": True, "validation": {"fraction": 0.2}}),
        ("det", "softmax", {"label": "cls", "batch_size": 4, "validation": {"predicate": "id % 5 = 0"}}),
        ("det", "softmax", {"label": "tlabel", "l2": 0.001}),
        ("det", "svm", {"label": "flag", "features": {"indices": "idx", "values": "val"}, "l2": 0.001}),
        ("det", "logistic", {"label": "flag", "features": {"indices": "idx", "values": "val"}, "n_features": 100, "batch_size": 16}),
        ("det", "svm", {"label": "flag", "tolerance": 0.01, "epochs": 50}),
        ("a9a_clustered", "svm", {}),
        ("a9a_clustered", "logistic", {"normalize": True}),
    ]
    out = {}
    for table, model, p in cases:
        params = {"epochs": 5, "seed": 7, "verbose": False, **p}
        mid = c.execute("SELECT corgipile_train(%s, %s, %s)", (table, model, Jsonb(params))).fetchone()[0]
        loss, md5 = c.execute("SELECT (metrics->>'loss'), md5(weights::text || bias::text) FROM corgipile.models WHERE id = %s", (mid,)).fetchone()
        ev = c.execute("SELECT corgipile_evaluate(%s, %s::regclass)", (mid, table)).fetchone()[0]
        ev.pop("model_id", None)
        key = f"{table} {model} {json.dumps(p, sort_keys=True)}"
        out[key] = [loss, md5, json.dumps(ev, sort_keys=True)]
        print(key, loss, md5)
    trace = c.execute("SELECT md5(string_agg(position || ':' || label || ':' || first_feature, ',' ORDER BY position)) FROM corgipile_trace('det', '{\"seed\": 3, \"label\": \"cls\"}')").fetchone()[0]
    out["trace"] = trace
    json.dump(out, open(sys.argv[1], "w"), indent=1, sort_keys=True)
