#!/usr/bin/env python3
"""Model fingerprints: the final loss (to the last digit), an md5 of the weights, the evaluation
report and a trace, over a fixed matrix of trainings (every strategy and buffer mode, every
model kind, normalize, l1/l2, class weights, mini-batches, sparse, validation, tolerance, a9a, a
column list with one-hot, hashed and imputed columns, parallel workers, a sharded table (linear
models, networks and fm); and
networks, mlp and mlp_regression, in one process: dense, a column list, sparse pairs, relu and
tanh, Adam and SGD, validation with patience; several models side by side: a search with folds,
per-group models, patience, with their NOTICE lines). For showing that a change that must not change
behaviour changes no model:

    PGHOST=... PGPORT=... PGUSER=... scripts/model_fingerprints.py before.json   # old build
    PGHOST=... PGPORT=... PGUSER=... scripts/model_fingerprints.py after.json    # new build
    cmp before.json after.json

Uses its own database corgipile_fingerprint; a9a comes from $CORGIPILE_DATASETS or
../shared/datasets. A build without networks (before 0.5.0: no corgipile.models.layers) trains
the linear cases only; a linear model's fingerprint is computed as before networks were added
(it does not read layers), so linear fingerprints compare across versions and with older files."""
import hashlib, json, os, pathlib, re, subprocess, sys, psycopg
from psycopg.types.json import Jsonb
DB = "corgipile_fingerprint"
REPO = str(pathlib.Path(__file__).resolve().parent.parent)
DATASETS = pathlib.Path(os.environ.get("CORGIPILE_DATASETS", pathlib.Path(REPO).parent / "shared" / "datasets"))
SHARD_DB = DB + "_shard"


def parallel_and_sharded(c):
    """Parallel trainings are not bit-identical run to run (the exchanges interleave
    differently): for them only what is deterministic is kept (rows per epoch, classes, the
    statistics pass's standardizer) plus the accuracy rounded to 2 digits. Sharded trainings
    (two postgres_fdw shards on this same server, in another database, and a local partition)
    are deterministic: all of it."""
    out = {}
    for p in [{"label": "flag"}, {"label": "flag", "double_buffer": False},
              {"label": "flag", "normalize": True, "average": True},
              {"label": "y", "normalize": True}]:
        model = "linear" if p["label"] == "y" else "logistic"
        params = {"epochs": 3, "seed": 7, "verbose": False, "workers": 1, **p}
        mid = c.execute("SELECT corgipile_train('det', %s, %s)", (model, Jsonb(params))).fetchone()[0]
        row = c.execute("""SELECT md5(concat_ws('|', label_mapping::text, standardizer::text, n_features, n_outputs, rows_trained,
                                 (SELECT string_agg(tuples::text, ',' ORDER BY epoch) FROM corgipile.epochs e WHERE e.model_id = m.id)))
                           FROM corgipile.models m WHERE id = %s""", (mid,)).fetchone()[0]
        ev = c.execute("SELECT corgipile_evaluate(%s, 'det'::regclass)", (mid,)).fetchone()[0]
        metric = ev.get("accuracy", ev.get("r2"))
        out[f"workers det {model} {json.dumps(p, sort_keys=True)}"] = [row, round(metric, 2)]
    with psycopg.connect(dbname="postgres", autocommit=True) as a:
        if not a.execute("SELECT 1 FROM pg_database WHERE datname = %s", (SHARD_DB,)).fetchone():
            a.execute(f"CREATE DATABASE {SHARD_DB}")
    det = """SELECT i AS id, ARRAY[sin(i), cos(i * 0.7), (i % 13) / 13.0, ((i * 7919) % 1000) / 1000.0]::float8[] AS features,
                    ((i % 3) = 1) AS flag, sin(i) * 3 + cos(i * 0.7) AS y FROM generate_series(1, 30000) i"""
    with psycopg.connect(dbname=SHARD_DB, autocommit=True) as s:
        s.execute("CREATE EXTENSION IF NOT EXISTS corgipile")
        s.execute("ALTER EXTENSION corgipile UPDATE")
        for name, lo, hi in [("det_p1", 1, 12000), ("det_p2", 12001, 20000)]:
            if not s.execute("SELECT to_regclass(%s)", (name,)).fetchone()[0]:
                s.execute(f"CREATE TABLE {name} AS SELECT * FROM ({det}) d WHERE id BETWEEN {lo} AND {hi} ORDER BY flag, id")
    c.execute("CREATE EXTENSION IF NOT EXISTS postgres_fdw")
    if not c.execute("SELECT to_regclass('det_sharded')").fetchone()[0]:
        host, port = os.environ.get("PGHOST", "/tmp"), os.environ.get("PGPORT", "5432")
        for srv in ["fp_s1", "fp_s2"]:
            c.execute(f"CREATE SERVER {srv} FOREIGN DATA WRAPPER postgres_fdw OPTIONS (host '{host}', port '{port}', dbname '{SHARD_DB}')")
            c.execute(f"CREATE USER MAPPING FOR CURRENT_USER SERVER {srv} OPTIONS (user 'postgres')")
        c.execute("CREATE TABLE det_sharded (id int, features float8[], flag boolean, y float8) PARTITION BY RANGE (id)")
        c.execute("CREATE FOREIGN TABLE det_sh1 PARTITION OF det_sharded FOR VALUES FROM (1) TO (12001) SERVER fp_s1 OPTIONS (table_name 'det_p1')")
        c.execute("CREATE FOREIGN TABLE det_sh2 PARTITION OF det_sharded FOR VALUES FROM (12001) TO (20001) SERVER fp_s2 OPTIONS (table_name 'det_p2')")
        c.execute("CREATE TABLE det_sh3 PARTITION OF det_sharded FOR VALUES FROM (20001) TO (30001)")
        c.execute(f"INSERT INTO det_sh3 SELECT * FROM ({det}) d WHERE id > 20000 ORDER BY flag, id")
    for model, p in [("svm", {"label": "flag"}), ("logistic", {"label": "flag", "normalize": True, "sync": 4}),
                     ("logistic", {"label": "flag", "average": True, "class_weight": "balanced"}),
                     ("linear", {"label": "y", "normalize": True}),
                     # Networks (one learner: each shard keeps its optimizer state between rounds).
                     ("mlp", {"label": "flag", "hidden": [6]}),
                     ("mlp", {"label": "flag", "hidden": [6, 3], "validation": {"fraction": 0.2}, "patience": 1}),
                     ("mlp_regression", {"label": "y", "hidden": [4], "optimizer": "sgd", "momentum": 0.5}),
                     ("fm", {"label": "flag", "factors": 2})]:
        params = {"epochs": 3, "seed": 7, "verbose": False, **p}
        mid = c.execute("SELECT corgipile_train('det_sharded', %s, %s)", (model, Jsonb(params))).fetchone()[0]
        layers = ", layers::text" if model[0] in "mf" else ""  # linear fingerprints as before networks
        row = c.execute(f"""SELECT md5(concat_ws('|', weights::text, bias::text, label_mapping::text, standardizer::text, metrics->>'loss',
                                 rows_trained, rows_skipped,
                                 (SELECT string_agg(concat_ws(':', epoch, loss, accuracy, r2, tuples), ',' ORDER BY epoch)
                                    FROM corgipile.epochs e WHERE e.model_id = m.id){layers}))
                           FROM corgipile.models m WHERE id = %s""", (mid,)).fetchone()[0]
        ev = c.execute("SELECT corgipile_evaluate(%s, 'det_sharded'::regclass)", (mid,)).fetchone()[0]
        ev.pop("model_id", None)
        out[f"sharded {model} {json.dumps(p, sort_keys=True)}"] = [row, json.dumps(ev, sort_keys=True)]
    return out


def stable(value):
    """A model's metrics without what differs run to run: seconds and the ids of models (a
    family's group models are stored in no fixed order)."""
    if isinstance(value, dict):
        return {k: (sorted(v) if k == "models" and isinstance(v, dict) else stable(v)) for k, v in value.items()
                if not (k.endswith("seconds") or k.endswith("_id") or k == "family")}
    if isinstance(value, list):
        return [stable(v) for v in value]
    return value


def many_models(c):
    """Trainings of several models side by side (a search with folds, per-group models, patience
    on a linear model), verbose: every model the call stored (weights, epochs, metrics with the
    search's and folds' scores) and its NOTICE lines (without the seconds, which vary)."""
    out = {}
    notices = []
    c.add_notice_handler(lambda d: notices.append(d.message_primary))
    for table, model, p in [
        ("det", "logistic", {"label": "flag", "search": {"learning_rate": [0.01, 0.1], "l2": [0, 0.001]}, "folds": 3}),
        ("det", "linear", {"label": "y", "search": {"learning_rate": [0.001, 0.01]}, "select_by": "loss",
                           "validation": {"fraction": 0.2}, "patience": 1, "epochs": 8}),
        ("tab", "svm", {"label": "churned", "features": ["amount", "state", "promo"], "group_by": "plan"}),
        ("det", "linear", {"label": "y", "validation": {"predicate": "id % 4 = 0"}, "patience": 1, "epochs": 10,
                           "learning_rate": 0.05}),
        ("tab", "logistic", {"label": "churned", "features": ["amount", "plan", "promo"], "group_by": "state",
                             "min_group_rows": 500}),
    ]:
        p = {"name": "fp_many", **p}
        notices.clear()
        before = c.execute("SELECT coalesce(max(id), 0) FROM corgipile.models").fetchone()[0]
        params = {"epochs": 5, "seed": 7, "verbose": True, **p}
        c.execute("SELECT corgipile_train(%s, %s, %s)", (table, model, Jsonb(params)))
        models = c.execute("""SELECT concat_ws('|', name, weights::text, bias::text, label_mapping::text,
                                        standardizer::text, n_features, rows_trained, rows_skipped,
                                        (SELECT string_agg(concat_ws(':', epoch, loss, accuracy, r2, tuples, learning_rate,
                                                                     validation_loss, validation_accuracy, validation_r2), ',' ORDER BY epoch)
                                           FROM corgipile.epochs e WHERE e.model_id = m.id)), metrics
                            FROM corgipile.models m WHERE id > %s ORDER BY id""", (before,)).fetchall()
        text = ";".join(sorted(f"{row}|{json.dumps(stable(metrics), sort_keys=True)}" for row, metrics in models))
        rows = (hashlib.md5(text.encode()).hexdigest(), len(models))
        lines = [re.sub(r" +[0-9.e+-]+$", "", n) if n.startswith("corgipile ") else n for n in notices]
        lines = [re.sub(r"[0-9.]+ s\b", "- s", n) for n in lines]
        key = f"many {table} {model} {json.dumps(p, sort_keys=True)}"
        out[key] = [rows[0], rows[1], lines]
        print(key, rows[1], rows[0])
    return out


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
    # A column list: numbers with NULLs, a text column one-hot and one hashed, a boolean.
    if not c.execute("SELECT to_regclass('tab')").fetchone()[0]:
        c.execute("""CREATE TABLE tab AS SELECT i AS id, CASE WHEN i % 17 = 0 THEN NULL ELSE (i % 101) * 3.5 END AS amount,
            'p' || (i % 5) AS plan, CASE WHEN i % 11 = 0 THEN NULL ELSE 's' || (i % 23) END AS state, (i % 7 = 0) AS promo,
            ((i % 5) + (i % 101) / 50.0 > 3) AS churned
            FROM generate_series(1, 20000) i ORDER BY churned, i""")
    tab_features = ["amount", "plan", "state", "promo"]
    cases += [
        ("tab", "logistic", {"label": "churned", "features": tab_features}),
        ("tab", "svm", {"label": "churned", "features": tab_features,
                        "preprocess": {"state": {"encode": "hash", "buckets": 16}, "amount": {"impute": "zero"}}}),
        ("tab", "softmax", {"label": "plan", "features": ["amount", "state", "promo"], "batch_size": 8}),
        ("tab", "linear", {"label": "amount", "features": ["plan", "state", "promo"], "double_buffer": False}),
    ]
    # Networks (0.5.0), one process: deterministic by seed. Their md5 also reads the layer widths
    # and the epochs' validation metrics (patience keeps the best epoch's model).
    networks = c.execute("SELECT 1 FROM information_schema.columns WHERE table_schema = 'corgipile' "
                         "AND table_name = 'models' AND column_name = 'layers'").fetchone() is not None
    network_cases = [
        ("det", "mlp", {"label": "cls", "hidden": [8], "batch_size": 16}),
        ("det", "mlp", {"label": "tlabel", "hidden": [8, 4], "activation": "tanh", "optimizer": "sgd", "l2": 0.001}),
        ("det", "mlp", {"label": "flag", "features": {"indices": "idx", "values": "val"}, "n_features": 64, "hidden": [6]}),
        ("det", "mlp", {"label": "cls", "hidden": [8], "normalize": True, "validation": {"fraction": 0.2}, "patience": 2,
                        "epochs": 12}),
        ("det", "mlp_regression", {"label": "y", "hidden": [8], "normalize": True}),
        ("det", "mlp_regression", {"label": "y", "features": {"indices": "idx", "values": "val"}, "n_features": 64,
                                   "hidden": [6], "activation": "tanh", "optimizer": "sgd", "momentum": 0.5}),
        ("tab", "mlp", {"label": "plan", "features": ["amount", "state", "promo"], "hidden": [8], "batch_size": 8}),
        ("tab", "mlp_regression", {"label": "amount", "features": ["plan", "state", "promo"], "hidden": [4],
                                   "activation": "tanh", "optimizer": "sgd",
                                   "preprocess": {"state": {"encode": "hash", "buckets": 16}}}),
    ]
    network_md5 = """, layers::text,
                                        (SELECT string_agg(concat_ws(':', epoch, validation_loss, validation_accuracy, validation_r2), ',' ORDER BY epoch)
                                           FROM corgipile.epochs e WHERE e.model_id = m.id)"""
    out = {}
    for table, model, p in cases + (network_cases if networks else []):
        params = {"epochs": 5, "seed": 7, "verbose": False, **p}
        mid = c.execute("SELECT corgipile_train(%s, %s, %s)", (table, model, Jsonb(params))).fetchone()[0]
        extra = network_md5 if model.startswith("mlp") else ""
        loss, md5 = c.execute(f"""SELECT (metrics->>'loss'), md5(concat_ws('|', weights::text, bias::text, label_mapping::text,
                                        standardizer::text, preprocessing::text, n_features, n_outputs, rows_trained, rows_skipped,
                                        (SELECT string_agg(concat_ws(':', epoch, loss, accuracy, r2, tuples, learning_rate), ',' ORDER BY epoch)
                                           FROM corgipile.epochs e WHERE e.model_id = m.id){extra}))
                                 FROM corgipile.models m WHERE id = %s""", (mid,)).fetchone()
        ev = c.execute("SELECT corgipile_evaluate(%s, %s::regclass)", (mid, table)).fetchone()[0]
        ev.pop("model_id", None)
        key = f"{table} {model} {json.dumps(p, sort_keys=True)}"
        out[key] = [loss, md5, json.dumps(ev, sort_keys=True)]
        print(key, loss, md5)
    out.update(many_models(c))
    out.update(parallel_and_sharded(c))
    trace = c.execute("SELECT md5(string_agg(position || ':' || label || ':' || first_feature, ',' ORDER BY position)) FROM corgipile_trace('det', '{\"seed\": 3, \"label\": \"cls\"}')").fetchone()[0]
    out["trace"] = trace
    json.dump(out, open(sys.argv[1], "w"), indent=1, sort_keys=True)
