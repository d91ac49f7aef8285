"""Writes the golden fixtures of one corgipile version (run by scripts/make_golden_fixtures.sh,
against a throw-away cluster where that version's library is installed; PGHOST/PGPORT/PGUSER
name it). In a fresh database it creates a small deterministic table, trains one model of every
kind that version supports, computes the predictions of every prediction function on fixed
inputs, and writes into --out:

  meta.json         version, commit, server, the command
  tables.sql        the table the models were trained on (the tests recreate it for predictions
                    from rows)
  models.csv        COPY of corgipile.models (CSV with a header naming the columns)
  epochs.csv        COPY of corgipile.epochs
  predictions.json  one entry per (model, by id or name, function, input): the value returned

Timestamps and durations (created_at, training_seconds, the epochs' seconds) are written as fixed
values so that a second run writes the same bytes; everything else is as the version stored it.
Floats are written exactly: float8 text output is the shortest exact form (extra_float_digits 1),
and JSON numbers are Python's exact repr."""

import argparse
import json
import pathlib
import sys

import psycopg
from psycopg.types.json import Jsonb

DB = "corgipile_golden"

TABLE = """CREATE TABLE g AS
SELECT i AS id,
       ARRAY[((i * 37) % 100) / 100.0 - 0.5 + (i % 2) * 0.8,
             ((i * 53) % 100) / 100.0 - (i % 3) * 0.3,
             ((i * 71) % 100) / 50.0 - 1.0]::float8[] AS x,
       (i % 2) AS label,
       (i % 2 = 1) AS flag,
       (CASE WHEN i % 2 = 1 THEN 'dog' ELSE 'cat' END) AS tlabel,
       (i % 3) AS k,
       (ARRAY['red', 'green', 'blue'])[1 + i % 3] AS tk,
       (2.0 * (((i * 37) % 100) / 100.0) - (((i * 53) % 100) / 100.0) + ((i * 17) % 10) / 20.0)::float8 AS y,
       (((i * 37) % 100) / 100.0 - 0.5 + (i % 2) * 0.8)::float8 AS a,
       (((i * 53) % 100) / 100.0 - (i % 3) * 0.3)::float8 AS b,
       (((i * 71) % 100) / 50.0 - 1.0)::float8 AS c,
       ARRAY[1 + i % 4, 5 + i % 3, 9]::int4[] AS idx,
       ARRAY[((i * 37) % 100) / 100.0 + (i % 2) * 0.5, ((i * 53) % 100) / 100.0 - (i % 3) * 0.2,
             (i % 2) + 0.1]::float8[] AS val
FROM generate_series(1, 240) i
ORDER BY i"""

DENSE = "x"
SPARSE = {"indices": "idx", "values": "val"}
COLS = ["a", "b", "c"]

# (key, model, params, first version): trained with "epochs": 3, "verbose": false.
MODELS = [
    ("svm_dense", "svm", {"features": DENSE, "seed": 1}, "0.1.0"),
    ("svm_dense_l1_batch", "svm", {"features": DENSE, "seed": 2, "l1": 0.01, "batch_size": 8}, "0.1.0"),
    ("logistic_normalized", "logistic", {"features": DENSE, "seed": 3, "normalize": True}, "0.1.0"),
    ("logistic_bool_label", "logistic", {"features": DENSE, "label": "flag", "seed": 4}, "0.1.0"),
    ("logistic_balanced", "logistic", {"features": DENSE, "seed": 5, "class_weight": "balanced"}, "0.1.0"),
    ("svm_text_label", "svm", {"features": DENSE, "label": "tlabel", "seed": 6}, "0.1.0"),
    ("linear_dense", "linear", {"features": DENSE, "label": "y", "seed": 7, "l2": 0.001}, "0.1.0"),
    ("linear_normalized", "linear", {"features": DENSE, "label": "y", "seed": 8, "normalize": True}, "0.1.0"),
    ("softmax_int", "softmax", {"features": DENSE, "label": "k", "seed": 9}, "0.1.0"),
    ("softmax_text", "softmax", {"features": DENSE, "label": "tk", "seed": 10, "normalize": True}, "0.1.0"),
    ("svm_sparse", "svm", {"features": SPARSE, "n_features": 10, "seed": 11}, "0.1.0"),
    ("logistic_sparse_normalized", "logistic", {"features": SPARSE, "n_features": 10, "seed": 12, "normalize": True},
     "0.1.0"),
    ("softmax_sparse", "softmax", {"features": SPARSE, "n_features": 10, "label": "k", "seed": 13}, "0.1.0"),
    ("linear_columns", "linear", {"features": COLS, "label": "y", "seed": 14}, "0.1.0"),
    ("logistic_columns", "logistic", {"features": COLS, "seed": 15, "normalize": True}, "0.1.0"),
    # Names and versions (0.2.0): golden_svm has two versions, version 1 deployed.
    ("golden_svm_v1", "svm", {"features": DENSE, "seed": 16, "name": "golden_svm"}, "0.2.0"),
    ("golden_svm_v2", "svm", {"features": DENSE, "seed": 17, "name": "golden_svm"}, "0.2.0"),
    ("golden_softmax", "softmax", {"features": DENSE, "label": "tk", "seed": 18, "name": "golden_softmax"}, "0.2.0"),
    ("golden_sparse", "logistic", {"features": SPARSE, "n_features": 10, "seed": 19, "name": "golden_sparse"}, "0.2.0"),
    # Real tables (0.4.0): text and boolean columns, "*", predicted from rows.
    ("logistic_mixed_columns", "logistic", {"features": ["a", "tk", "flag", "x"], "seed": 20}, "0.4.0"),
    ("softmax_star", "softmax", {"features": "*", "label": "tk", "exclude": ["id", "k", "tlabel", "idx", "val"],
                                 "seed": 21}, "0.4.0"),
    ("linear_star_named", "linear", {"features": "*", "label": "y", "exclude": ["id", "idx", "val"], "seed": 22,
                                     "name": "golden_linear_rows"}, "0.4.0"),
]
DEPLOY = {"golden_svm": "golden_svm_v1"}  # name -> the version deployed (0.2.0+)

DENSE_INPUTS = [[0.0, 0.0, 0.0], [0.3, -0.2, 0.9], [1.5, 0.25, -1.0], [0.123456789, 0.987654321, -0.5], [10.0, -10.0, 3.0]]
SPARSE_INPUTS = [([1, 5, 9], [0.2, 0.5, 1.1]), ([2, 7], [1.0, -0.5]), ([], []), ([4, 9, 10], [0.3, 0.3, 2.0])]
ROW_IDS = [1, 2, 3, 7, 50, 239]  # rows of g, for predictions from a row (0.4.0+)
FUNCTIONS = ["corgipile_predict", "corgipile_predict_class", "corgipile_predict_proba", "corgipile_decision_function"]


def vkey(v):
    return tuple(int(p) for p in v.split("."))


def fixed(conn, table):
    """SELECT list of `table` with timestamps and durations replaced by constants."""
    cols = conn.execute("""SELECT column_name, data_type FROM information_schema.columns
                           WHERE table_schema = 'corgipile' AND table_name = %s ORDER BY ordinal_position""",
                        (table,)).fetchall()
    out = []
    for name, typ in cols:
        if typ.startswith("timestamp"):
            out.append(f"'2000-01-01 00:00:00+00'::timestamptz AS {name}")
        elif name.endswith("seconds"):
            out.append(f"(CASE WHEN {name} IS NULL THEN NULL ELSE 0 END)::float8 AS {name}")
        else:
            out.append(name)
    return ", ".join(out)


def copy_out(conn, sql):
    with conn.cursor() as cur:
        with cur.copy(f"COPY ({sql}) TO STDOUT WITH (FORMAT csv, HEADER true)") as cp:
            return b"".join(bytes(chunk) for chunk in cp).decode()


def call(conn, sql, params):
    try:
        return {"value": conn.execute(sql, params).fetchone()[0]}
    except psycopg.Error as e:
        return {"error": e.sqlstate}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--version", required=True)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--command", required=True, help="the command that made them, for meta.json")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DB}")
        admin.execute(f"CREATE DATABASE {DB}")
    with psycopg.connect(dbname=DB, autocommit=True) as conn:
        conn.execute("SET extra_float_digits = 1")
        conn.execute("CREATE EXTENSION corgipile")
        installed = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'corgipile'").fetchone()[0]
        assert installed == args.version, (installed, args.version)
        server = conn.execute("SHOW server_version").fetchone()[0]
        conn.execute(TABLE)
        conn.execute("VACUUM ANALYZE g")

        ids = {}
        for key, model, params, since in MODELS:
            if vkey(args.version) < vkey(since):
                continue
            p = {"epochs": 3, "verbose": False, **params}
            ids[key] = conn.execute("SELECT corgipile_train('g', %s, %s)", (model, Jsonb(p))).fetchone()[0]
        names = {}
        if vkey(args.version) >= (0, 2, 0):
            for name, key in DEPLOY.items():
                conn.execute("SELECT corgipile_deploy(%s, %s)", (name, ids[key]))
            # model_summary's "deployed": the version a name resolves to (pinned, else the latest).
            names = dict(conn.execute("""SELECT name, id FROM corgipile.model_summary
                                         WHERE name IS NOT NULL AND deployed""").fetchall())
        kinds = dict(conn.execute("SELECT id, features::text FROM corgipile.models").fetchall())

        predictions = []
        targets = [("id", key, i, "%s::bigint") for key, i in ids.items()]
        targets += [("name", name, i, "%s::text") for name, i in sorted(names.items())]
        for by, label, model_id, cast in targets:
            ref = model_id if by == "id" else label
            features = json.loads(kinds[model_id])
            sparse = isinstance(features, dict)
            for fn in FUNCTIONS:
                if sparse:
                    for idx, val in SPARSE_INPUTS:
                        r = call(conn, f"SELECT {fn}({cast}, %s::int4[], %s::float8[])", (ref, idx, val))
                        predictions.append({"model": label, "id": model_id, "by": by, "function": fn,
                                            "indices": idx, "values": val, **r})
                elif features == "x" or isinstance(features, list) and all(f in COLS for f in features):
                    for x in DENSE_INPUTS:
                        r = call(conn, f"SELECT {fn}({cast}, %s::float8[])", (ref, x))
                        predictions.append({"model": label, "id": model_id, "by": by, "function": fn,
                                            "features": x, **r})
                if vkey(args.version) >= (0, 4, 0):
                    for row in ROW_IDS:
                        r = call(conn, f"SELECT {fn}({cast}, g) FROM g WHERE id = %s", (ref, row))
                        predictions.append({"model": label, "id": model_id, "by": by, "function": fn,
                                            "row": row, **r})
        ok = [p for p in predictions if "value" in p]
        assert ok, "no prediction succeeded"
        for key, i in ids.items():
            assert any(p["id"] == i and "value" in p for p in predictions), f"model {key} predicted nothing"

        models = copy_out(conn, f"SELECT {fixed(conn, 'models')} FROM corgipile.models ORDER BY id")
        epochs = copy_out(conn, f"SELECT {fixed(conn, 'epochs')} FROM corgipile.epochs ORDER BY model_id, epoch")

    (out / "tables.sql").write_text(TABLE + ";\n")
    (out / "models.csv").write_text(models)
    (out / "epochs.csv").write_text(epochs)
    with open(out / "predictions.json", "w") as f:
        # Only the calls that returned a value (the others are the documented 42809 of a function
        # that does not apply to the model's kind, e.g. predict_proba of an svm).
        f.write("[\n" + ",\n".join(json.dumps(p, sort_keys=True) for p in ok) + "\n]\n")
    (out / "meta.json").write_text(json.dumps({
        "version": args.version, "commit": args.commit, "server": server,
        "models": ids, "names": names,
        "command": args.command,
        "predictions": len(ok), "errors": len(predictions) - len(ok),
    }, indent=1, sort_keys=True) + "\n")
    print(f"{args.version}: {len(ids)} models, {len(ok)} predictions ({len(predictions) - len(ok)} calls errored)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
