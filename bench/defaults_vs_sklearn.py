#!/usr/bin/env python3
"""Default-params corgipile vs converged scikit-learn, on tables stored clustered by label.

The target: with no params but the model and the label/features (default epochs, learning rate,
schedule, normalize), corgipile's test accuracy is within 1 point and its ROC AUC within 0.01 of
scikit-learn's converged LogisticRegression (logistic) / LinearSVC (svm) fit on the same
preprocessing, with a spread across seeds of at most 0.3 points.

Datasets:
  ijcnn1, a9a, w8a   LIBSVM files from ../shared/datasets, loaded sparse (int4[] indices, float8[]
                     values; scripts/load_libsvm.py --sparse); w8a has no test split, rows with
                     id % 5 = 0 (id = line number) are its test set. sklearn: the same rows read back
                     from the database into a CSR matrix, MaxAbsScaler (corgipile's normalize on
                     sparse features divides by the largest |value|, does not center).
  mixed_a, mixed_b   generated (numpy, fixed seed) 50,000 train + 20,000 test rows of raw-scale
                     numbers (incomes in dollars, ages, day counts, signed balances), boolean flags and
                     text columns of 3..500 Zipf-distributed categories; NULL in 5% of every feature
                     column's cells; a boolean label, ~10% true, from a logistic model over the
                     standardized features plus per-category effects. corgipile: "features": "*",
                     "exclude": ["id"]. sklearn: ColumnTransformer(numbers and booleans:
                     SimpleImputer(mean) + StandardScaler; text: NULL -> "(null)" category +
                     OneHotEncoder(max_categories=102, handle_unknown="infrequent_if_exist"), i.e. the
                     100 most frequent values + NULL + one pooled "other", as corgipile encodes them).
Every training table is CREATE TABLE .. AS SELECT .. ORDER BY label, id (clustered by label); test
tables are in file / generation order.

corgipile: corgipile_train(train, model, {label, features, seed, verbose: false}) for each seed, timed
client side (the statement), then corgipile_evaluate(model, test) -> accuracy, roc_auc. The same
seeds on an ORDER BY md5(id) copy of the training table show what the defaults reach without the
clustering (skip with --no-shuffled).
scikit-learn (timed: fit of the whole pipeline): LogisticRegression(lbfgs, C=1, max_iter=10000);
LinearSVC(C=1, loss="hinge", dual=True, max_iter=200000): the hinge loss that corgipile's svm
minimizes (LinearSVC's default squared hinge is another objective: on w8a it ranks better, AUC
0.950 vs 0.917 for the hinge loss, at equal accuracy); AUC from predict_proba /
decision_function. corgipile's l2 default is 0; C=1 is a weak penalty at these row counts.

Usage: bench/defaults_vs_sklearn.py [--seeds 1-5] [--only a9a,mixed_a] [--models logistic,svm]
Needs PGHOST/PGPORT/PGUSER; uses (and creates) the database corgipile_defaults. Tables are reused
when their COMMENT carries the same generation signature. Prints a markdown table; writes the raw
numbers to bench/results/defaults_vs_sklearn.json."""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings

import numpy as np
import psycopg

import records
from cancel_latency import installed_library
import scipy.sparse as sp
from psycopg import sql
from psycopg.types.json import Jsonb
from sklearn.compose import ColumnTransformer
from sklearn.exceptions import ConvergenceWarning
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, roc_auc_score
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import MaxAbsScaler, OneHotEncoder, StandardScaler
from sklearn.svm import LinearSVC

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
LOADER = os.path.join(REPO, "scripts", "load_libsvm.py")
DATASET_DIR = os.environ.get("CORGIPILE_DATASETS", os.path.join(os.path.dirname(REPO), "shared", "datasets"))
DBNAME = "corgipile_defaults"
OUT = os.path.join(HERE, "results", "defaults_vs_sklearn.json")
GEN_VERSION = 1
ACC_BAR, AUC_BAR, SPREAD_BAR = 1.0, 0.01, 0.3  # points, AUC, points

LIBSVM = {
    # key: (train file, test file or None = hold out id % 5 = 0, n_features)
    "ijcnn1": ("ijcnn1.train.bz2", "ijcnn1.test.bz2", 22),
    "a9a": ("a9a.train.bz2", "a9a.test.bz2", 123),
    "w8a": ("w8a.bz2", None, 300),
}

# Generated mixed-type tables. numbers: name -> (kind, args, weight of its standardized value in the
# label's logit); flags: name -> (P(true), weight); text: name -> (categories, Zipf exponent,
# sd of the per-category effects); signal multiplies the whole logit.
MIXED = {
    "mixed_a": {
        "seed": 11, "train": 50_000, "test": 20_000, "positive": 0.10, "null": 0.05, "signal": 1.25,
        "numbers": {
            "income": ("lognormal_dollars", (50_000, 0.6), 0.8),
            "age": ("int_uniform", (18, 90), -0.5),
            "tenure_days": ("int_exponential", (900,), 0.4),
            "balance": ("normal_dollars", (2_000, 15_000), 0.6),
        },
        "flags": {"is_member": (0.3, 0.5), "has_card": (0.6, -0.4)},
        "text": {"region": (3, 1.0, 0.5), "state": (50, 1.0, 0.4), "product": (500, 1.05, 0.6)},
    },
    "mixed_b": {
        "seed": 22, "train": 50_000, "test": 20_000, "positive": 0.10, "null": 0.05, "signal": 1.15,
        "numbers": {
            "annual_income": ("lognormal_dollars", (65_000, 0.8), 0.7),
            "age": ("int_uniform", (18, 90), 0.3),
            "credit_limit": ("lognormal_dollars", (12_000, 1.0), -0.5),
            "balance": ("normal_dollars", (-500, 40_000), 0.5),
            "days_since_login": ("int_exponential", (30,), -0.6),
            "transactions": ("poisson", (12,), 0.4),
            "utilization": ("uniform", (0.0, 1.0), 0.5),
        },
        "flags": {"is_member": (0.25, 0.6), "has_card": (0.7, -0.3), "newsletter": (0.4, 0.2)},
        "text": {"channel": (5, 1.0, 0.5), "segment": (20, 1.1, 0.4), "city": (200, 1.0, 0.5),
                 "product": (500, 1.05, 0.6)},
    },
}
DATASETS = list(LIBSVM) + list(MIXED)


def log(msg):
    print(f"[defaults {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def connect(dbname=DBNAME):
    return psycopg.connect(dbname=dbname, autocommit=True)


def setup_database():
    with connect("postgres") as c:
        if not c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DBNAME,)).fetchone():
            c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DBNAME)))
    with connect() as c:
        c.execute("SET client_min_messages = warning")
        c.execute("CREATE EXTENSION IF NOT EXISTS corgipile")
        return c.execute("SELECT extversion FROM pg_extension WHERE extname = 'corgipile'").fetchone()[0]


def wait_for_server():
    for _ in range(120):
        try:
            connect().close()
            return
        except psycopg.OperationalError:
            time.sleep(1)


def retrying(fn, *args, attempts=4):
    """Rerun fn(*args) (which opens its own connections) when the server dropped the connection (a
    crash of another session's backend restarts every backend of a shared cluster) or the library was
    being replaced (a reinstall by another developer while this runs)."""
    for attempt in range(1, attempts + 1):
        try:
            return fn(*args)
        except (psycopg.OperationalError, psycopg.errors.UndefinedFile, psycopg.errors.InternalError,
                subprocess.CalledProcessError) as e:
            if attempt == attempts:
                raise
            log(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}; waiting for the server, retrying")
            time.sleep(3)
            wait_for_server()


# ---------------------------------------------------------------- tables

def signature(conn, table):
    return conn.execute("SELECT obj_description(to_regclass(%s), 'pg_class')", (table,)).fetchone()[0]


def reusable(conn, tables, sig):
    return all(signature(conn, t) == sig for t in tables)


def sign(conn, tables, sig):
    for t in tables:
        conn.execute(f"COMMENT ON TABLE {t} IS '{sig}'")
        conn.execute(f"VACUUM ANALYZE {t}")


def names(key):
    return f"dvs_{key}_train", f"dvs_{key}_test", f"dvs_{key}_shuffled"


def cluster(conn, raw, train, shuffled):
    conn.execute(f"DROP TABLE IF EXISTS {train}")
    conn.execute(f"CREATE TABLE {train} AS SELECT * FROM {raw} ORDER BY label, id")
    conn.execute(f"DROP TABLE IF EXISTS {shuffled}")
    conn.execute(f"CREATE TABLE {shuffled} AS SELECT * FROM {raw} ORDER BY md5(id::text)")
    conn.execute(f"DROP TABLE {raw}")


def load_libsvm_tables(key):
    with connect() as conn:
        return _load_libsvm_tables(conn, key)


def _load_libsvm_tables(conn, key):
    train_file, test_file, d = LIBSVM[key]
    train, test, shuffled = names(key)
    raw = f"dvs_{key}_raw"
    sig = f"defaults_vs_sklearn v{GEN_VERSION} libsvm {key} sparse"
    if reusable(conn, [train, test, shuffled], sig):
        return train, test, shuffled
    for t in (raw, test):
        conn.execute(f"DROP TABLE IF EXISTS {t}")

    def load(path, table):
        log(f"loading {path} into {table} (sparse)")
        subprocess.run([sys.executable, LOADER, path, table, "--sparse", "--n-features", str(d), "-d", DBNAME],
                       check=True, stdout=subprocess.DEVNULL)

    load(os.path.join(DATASET_DIR, train_file), raw)
    if test_file:
        load(os.path.join(DATASET_DIR, test_file), test)
    else:
        conn.execute(f"CREATE TABLE {test} AS SELECT * FROM {raw} WHERE id % 5 = 0 ORDER BY id")
        conn.execute(f"DELETE FROM {raw} WHERE id % 5 = 0")
    cluster(conn, raw, train, shuffled)
    sign(conn, [train, test, shuffled], sig)
    return train, test, shuffled


def zipf_probs(k, s):
    p = 1.0 / np.arange(1, k + 1) ** s
    return p / p.sum()


def generate_mixed(spec):
    """(columns, train rows, test rows): rows are dicts of Python values (None = NULL), ids from 1;
    the label comes from a logistic model over the standardized, complete features."""
    rng = np.random.default_rng(spec["seed"])
    n = spec["train"] + spec["test"]
    cols, logit = {}, np.zeros(n)
    for name, (kind, a, w) in spec["numbers"].items():
        if kind == "lognormal_dollars":
            v = np.round(a[0] * rng.lognormal(0.0, a[1], n), 2)
        elif kind == "normal_dollars":
            v = np.round(rng.normal(a[0], a[1], n), 2)
        elif kind == "int_uniform":
            v = rng.integers(a[0], a[1] + 1, n).astype(float)
        elif kind == "int_exponential":
            v = np.floor(rng.exponential(a[0], n))
        elif kind == "poisson":
            v = rng.poisson(a[0], n).astype(float)
        elif kind == "uniform":
            v = rng.uniform(a[0], a[1], n)
        else:
            raise ValueError(kind)
        cols[name] = ("number", v)
        logit += w * (v - v.mean()) / v.std()
    for name, (p, w) in spec["flags"].items():
        v = rng.random(n) < p
        cols[name] = ("bool", v)
        logit += w * (v - v.mean()) / v.std()
    for name, (k, s, sd) in spec["text"].items():
        perm = rng.permutation(k)  # category names not in frequency order
        codes = perm[rng.choice(k, size=n, p=zipf_probs(k, s))]
        effects = rng.normal(0.0, sd, k)
        cols[name] = ("text", np.array([f"{name[:3]}_{c:03d}" for c in range(k)], dtype=object)[codes])
        logit += effects[codes]
    logit *= spec["signal"]  # scales every weight: the oracle's test AUC lands near 0.88-0.89
    # Intercept for the wanted share of positives (bisection on the mean probability).
    lo, hi = -20.0, 20.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if (1 / (1 + np.exp(-(logit + mid)))).mean() > spec["positive"]:
            hi = mid
        else:
            lo = mid
    prob = 1 / (1 + np.exp(-(logit + lo)))
    label = rng.random(n) < prob
    oracle_auc = float(roc_auc_score(label[spec["train"]:], prob[spec["train"]:]))
    nulls = {name: rng.random(n) < spec["null"] for name in cols}
    rows = []
    for i in range(n):
        r = {"id": i + 1}
        for name, (kind, v) in cols.items():
            if nulls[name][i]:
                r[name] = None
            elif kind == "number":
                x = float(v[i])
                r[name] = int(x) if x.is_integer() and abs(x) < 2**31 and spec_int(spec, name) else x
            elif kind == "bool":
                r[name] = bool(v[i])
            else:
                r[name] = str(v[i])
        r["label"] = bool(label[i])
        rows.append(r)
    return cols, rows[:spec["train"]], rows[spec["train"]:], oracle_auc


def spec_int(spec, name):
    return spec["numbers"][name][0] in ("int_uniform", "int_exponential", "poisson")


def sql_type(spec, name, kind):
    if kind == "bool":
        return "boolean"
    if kind == "text":
        return "text"
    return "integer" if spec_int(spec, name) else "float8"


def load_mixed_tables(key):
    with connect() as conn:
        return _load_mixed_tables(conn, key)


def _load_mixed_tables(conn, key):
    spec = MIXED[key]
    train, test, shuffled = names(key)
    raw = f"dvs_{key}_raw"
    sig = f"defaults_vs_sklearn v{GEN_VERSION} mixed {key} " + json.dumps(spec, sort_keys=True)
    sig = sig.replace("'", "")
    if reusable(conn, [train, test, shuffled], sig):
        return train, test, shuffled
    log(f"generating {key} ({spec['train']:,} + {spec['test']:,} rows)")
    cols, train_rows, test_rows, oracle_auc = generate_mixed(spec)
    col_names = ["id"] + list(cols) + ["label"]
    ddl = ", ".join(["id bigint"] + [f"{n} {sql_type(spec, n, k)}" for n, (k, _) in cols.items()]
                    + ["label boolean"])
    for table, rows in ((raw, train_rows), (test, test_rows)):
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(f"CREATE TABLE {table} ({ddl})")
        with conn.cursor() as cur:
            with cur.copy(f"COPY {table} ({', '.join(col_names)}) FROM STDIN") as cp:
                for r in rows:
                    cp.write_row([r[c] for c in col_names])
    cluster(conn, raw, train, shuffled)
    sign(conn, [train, test, shuffled], sig)
    conn.execute(f"COMMENT ON COLUMN {test}.label IS 'oracle test AUC {oracle_auc:.4f}'")
    return train, test, shuffled


# ---------------------------------------------------------------- data for scikit-learn

def read_sparse(conn, table, d):
    rows = conn.execute(f"SELECT label, feature_indices, feature_values FROM {table} ORDER BY id").fetchall()
    y = np.array([r[0] for r in rows])
    indptr = np.zeros(len(rows) + 1, dtype=np.int64)
    indptr[1:] = np.cumsum([len(r[1]) for r in rows])
    idx = np.fromiter((i - 1 for r in rows for i in r[1]), dtype=np.int64, count=indptr[-1])
    val = np.fromiter((v for r in rows for v in r[2]), dtype=float, count=indptr[-1])
    return sp.csr_matrix((val, idx, indptr), shape=(len(rows), d)), y


def read_mixed(conn, table, key):
    spec = MIXED[key]
    numeric = list(spec["numbers"]) + list(spec["flags"])
    text = list(spec["text"])
    cols = numeric + text
    rows = conn.execute(f"SELECT {', '.join(cols)}, label FROM {table} ORDER BY id").fetchall()
    X = np.empty((len(rows), len(cols)), dtype=object)
    for i, r in enumerate(rows):
        for j, v in enumerate(r[:-1]):
            if j < len(numeric):
                X[i, j] = np.nan if v is None else float(v)
            else:
                X[i, j] = "(null)" if v is None else v  # NULL is a category of its own, as in corgipile
    y = np.array([bool(r[-1]) for r in rows])
    return X, y, list(range(len(numeric))), list(range(len(numeric), len(cols)))


def sklearn_pipeline(kind, model, num_idx=None, text_idx=None):
    if kind == "sparse":
        pre = MaxAbsScaler()
    else:
        pre = ColumnTransformer([
            ("num", make_pipeline(SimpleImputer(strategy="mean"), StandardScaler()), num_idx),
            ("cat", OneHotEncoder(max_categories=102, handle_unknown="infrequent_if_exist"), text_idx),
        ])
    if model == "logistic":
        clf = LogisticRegression(solver="lbfgs", C=1.0, max_iter=10_000)
    else:
        clf = (LinearSVC(C=1.0, loss="hinge", dual=True, max_iter=200_000) if SVM_LOSS == "hinge"
               else LinearSVC(C=1.0, dual=False, max_iter=10_000))
    return Pipeline([("pre", pre), ("clf", clf)])


def sklearn_run(data, model):
    Xtr, ytr, Xte, yte, kind, num_idx, text_idx = data
    pipe = sklearn_pipeline(kind, model, num_idx, text_idx)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        t0 = time.perf_counter()
        pipe.fit(Xtr, ytr)
        secs = time.perf_counter() - t0
    converged = not any(issubclass(w.category, ConvergenceWarning) for w in caught)
    clf = pipe.named_steps["clf"]
    score = pipe.predict_proba(Xte)[:, 1] if model == "logistic" else pipe.decision_function(Xte)
    pos = clf.classes_[1]
    return {"accuracy": float(accuracy_score(yte, pipe.predict(Xte))),
            "roc_auc": float(roc_auc_score(yte == pos, score)),
            "seconds": secs, "converged": converged, "n_iter": int(np.max(clf.n_iter_)),
            "n_features_out": int(clf.coef_.shape[1])}


# ---------------------------------------------------------------- corgipile

# --params: extra corgipile params (for trying other defaults); empty for the real measurement.
EXTRA_PARAMS = {}
# --svm-loss: scikit-learn's reference for svm: "hinge" (corgipile's objective) or
# "squared_hinge" (LinearSVC's default, another objective).
SVM_LOSS = "hinge"


def corgipile_params(key, seed):
    if key in LIBSVM:
        p = {"label": "label", "features": {"indices": "feature_indices", "values": "feature_values"}}
    else:
        p = {"label": "label", "features": "*", "exclude": ["id"]}
    return {**p, **EXTRA_PARAMS, "seed": seed, "verbose": False}


def corgipile_run(key, train, test, model, seed):
    """One training on a fresh connection (a reinstalled library is loaded by new backends)."""
    params = corgipile_params(key, seed)
    with connect() as c:
        lib = installed_library(c)
        t0 = time.perf_counter()
        mid = c.execute("SELECT corgipile_train(%s, %s, %s)", (train, model, Jsonb(params))).fetchone()[0]
        secs = time.perf_counter() - t0
        t1 = time.perf_counter()
        ev = c.execute("SELECT corgipile_evaluate(%s, %s)", (mid, test)).fetchone()[0]
        eval_secs = time.perf_counter() - t1
        m = c.execute("""SELECT (SELECT count(*) FROM corgipile.epochs e WHERE e.model_id = m.id), n_features,
                                (SELECT loss FROM corgipile.epochs e WHERE e.model_id = m.id ORDER BY epoch DESC LIMIT 1),
                                training_seconds, params
                         FROM corgipile.models m WHERE id = %s""", (mid,)).fetchone()
        c.execute("SELECT corgipile_drop_model(%s)", (mid,))
    return {"seed": seed, "accuracy": ev.get("accuracy"), "roc_auc": ev.get("roc_auc"),
            "roc_auc_note": ev.get("roc_auc_note"), "seconds": secs, "evaluate_seconds": eval_secs,
            "epochs": m[0], "n_features": m[1], "final_loss": m[2], "server_training_seconds": m[3],
            "n_test": ev.get("n"), "rows_skipped": ev.get("rows_skipped"), "library_mtime": lib[1],
            "params": params, "stored_params": m[4], "evaluate": ev}


# ---------------------------------------------------------------- main

def parse_seeds(s):
    out = []
    for part in s.split(","):
        if "-" in part:
            a, b = part.split("-")
            out += range(int(a), int(b) + 1)
        elif part:
            out.append(int(part))
    return out


def summarize(runs):
    acc = [r["accuracy"] for r in runs]
    auc = [r["roc_auc"] for r in runs if r["roc_auc"] is not None]
    return {"acc_mean": statistics.mean(acc), "acc_spread": max(acc) - min(acc),
            "auc_mean": statistics.mean(auc) if auc else None,
            "auc_spread": max(auc) - min(auc) if auc else None,
            "seconds_mean": statistics.mean(r["seconds"] for r in runs)}


def read_dataset(key):
    if key in LIBSVM:
        train, test, shuffled = load_libsvm_tables(key)
        d = LIBSVM[key][2]
        with connect() as c:
            Xtr, ytr = read_sparse(c, train, d)
            Xte, yte = read_sparse(c, test, d)
        data = (Xtr, ytr, Xte, yte, "sparse", None, None)
        shape = f"{Xtr.shape[0]:,} train / {Xte.shape[0]:,} test rows x {d} sparse features"
        oracle = None
    else:
        train, test, shuffled = load_mixed_tables(key)
        with connect() as c:
            Xtr, ytr, num_idx, text_idx = read_mixed(c, train, key)
            Xte, yte, _, _ = read_mixed(c, test, key)
            oracle = c.execute("SELECT col_description(%s::regclass, (SELECT attnum FROM pg_attribute "
                               "WHERE attrelid = %s::regclass AND attname = 'label'))", (test, test)).fetchone()[0]
        data = (Xtr, ytr, Xte, yte, "mixed", num_idx, text_idx)
        shape = (f"{len(ytr):,} train / {len(yte):,} test rows; {len(num_idx)} numeric/boolean + "
                 f"{len(text_idx)} text columns")
    return train, test, shuffled, data, shape, oracle


def run_dataset(key, models, seeds, shuffled_baseline):
    train, test, shuffled, data, shape, oracle = retrying(read_dataset, key)
    ytr = data[1]
    pos_share = float(np.mean(ytr == (1.0 if key in LIBSVM else True)))
    out = {"dataset": key, "train": train, "test": test, "shape": shape, "train_positive_share": pos_share,
           "oracle": oracle, "models": {}}
    for model in models:
        log(f"{key}: sklearn {model}")
        sk = sklearn_run(data, model)
        log(f"  acc {sk['accuracy']:.4f} auc {sk['roc_auc']:.4f} {sk['seconds']:.2f} s "
            f"(n_iter {sk['n_iter']}, converged {sk['converged']})")
        runs = []
        for seed in seeds:
            r = retrying(corgipile_run, key, train, test, model, seed)
            log(f"{key}: corgipile {model} seed {seed}: acc {r['accuracy']:.4f} auc {r['roc_auc']} "
                f"{r['seconds']:.2f} s")
            runs.append(r)
        entry = {"sklearn": sk, "corgipile": runs, "summary": summarize(runs)}
        if shuffled_baseline:
            sh = []
            for seed in seeds:
                r = retrying(corgipile_run, key, shuffled, test, model, seed)
                log(f"{key}: corgipile {model} on the shuffled copy, seed {seed}: acc {r['accuracy']:.4f} "
                    f"auc {r['roc_auc']}")
                sh.append(r)
            entry["corgipile_shuffled_copy"] = sh
            entry["shuffled_summary"] = summarize(sh)
        out["models"][model] = entry
    return out


def fmt_pm(mean, spread, digits=4):
    return "–" if mean is None else f"{mean:.{digits}f} ± {spread:.{digits}f}"


def figures(results):
    """The figures of report(results), for the run's record (bench/records.py)."""
    out = {}
    for d in results["datasets"]:
        for model, m in d["models"].items():
            s, sk = m["summary"], m["sklearn"]
            gap_auc = None if s["auc_mean"] is None else s["auc_mean"] - sk["roc_auc"]
            f = {"corgipile_accuracy_mean": s["acc_mean"], "corgipile_accuracy_spread": s["acc_spread"],
                 "corgipile_auc_mean": s["auc_mean"], "corgipile_auc_spread": s["auc_spread"],
                 "sklearn_accuracy": sk["accuracy"], "sklearn_auc": sk["roc_auc"],
                 "gap_accuracy_points": 100 * (s["acc_mean"] - sk["accuracy"]), "gap_auc": gap_auc,
                 "corgipile_s": s["seconds_mean"], "sklearn_s": sk["seconds"],
                 "bar_accuracy": "PASS" if 100 * (s["acc_mean"] - sk["accuracy"]) >= -ACC_BAR else "FAIL",
                 "bar_auc": "PASS" if gap_auc is not None and gap_auc >= -AUC_BAR else "FAIL",
                 "bar_spread": "PASS" if 100 * s["acc_spread"] <= SPREAD_BAR else "FAIL"}
            if "shuffled_summary" in m:
                h = m["shuffled_summary"]
                f.update({"shuffled_accuracy_mean": h["acc_mean"], "shuffled_auc_mean": h["auc_mean"],
                          "shuffled_gap_accuracy_points": 100 * (h["acc_mean"] - sk["accuracy"]),
                          "shuffled_gap_auc": None if h["auc_mean"] is None else h["auc_mean"] - sk["roc_auc"]})
            out[f"{d['dataset']} / {model}"] = f
    return out


def report(results):
    lines = ["| dataset | model | corgipile acc (mean ± spread) | corgipile AUC (mean ± spread) | sklearn acc | "
             "sklearn AUC | gap acc (pts) | gap AUC | corgipile s | sklearn s | bars (acc/AUC/spread) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for d in results["datasets"]:
        for model, m in d["models"].items():
            s, sk = m["summary"], m["sklearn"]
            gap_acc = 100 * (s["acc_mean"] - sk["accuracy"])
            gap_auc = None if s["auc_mean"] is None else s["auc_mean"] - sk["roc_auc"]
            bars = ("✓" if gap_acc >= -ACC_BAR else "✗") + ("✓" if gap_auc is not None and gap_auc >= -AUC_BAR else "✗") \
                + ("✓" if 100 * s["acc_spread"] <= SPREAD_BAR else "✗")
            lines.append(
                f"| {d['dataset']} | {model} | {fmt_pm(s['acc_mean'], s['acc_spread'])} | "
                f"{fmt_pm(s['auc_mean'], s['auc_spread'])} | {sk['accuracy']:.4f} | {sk['roc_auc']:.4f} | "
                f"{gap_acc:+.2f} | {'–' if gap_auc is None else f'{gap_auc:+.4f}'} | {s['seconds_mean']:.2f} | "
                f"{sk['seconds']:.2f} | {bars} |")
    shuffled = [(d["dataset"], model, m) for d in results["datasets"] for model, m in d["models"].items()
                if "shuffled_summary" in m]
    if shuffled:
        lines += ["", "Same defaults and seeds on a shuffled (ORDER BY md5(id)) copy of the training table "
                      "(separates what the clustered order costs from what the SGD defaults cost):", "",
                  "| dataset | model | clustered acc | shuffled-copy acc | clustered AUC | shuffled-copy AUC | "
                  "shuffled gap acc (pts) | shuffled gap AUC |", "|---|---|---|---|---|---|---|---|"]
        for ds, model, m in shuffled:
            s, h, sk = m["summary"], m["shuffled_summary"], m["sklearn"]
            lines.append(f"| {ds} | {model} | {fmt_pm(s['acc_mean'], s['acc_spread'])} | "
                         f"{fmt_pm(h['acc_mean'], h['acc_spread'])} | {fmt_pm(s['auc_mean'], s['auc_spread'])} | "
                         f"{fmt_pm(h['auc_mean'], h['auc_spread'])} | {100 * (h['acc_mean'] - sk['accuracy']):+.2f} | "
                         f"{h['auc_mean'] - sk['roc_auc']:+.4f} |")
    lines += ["", "gap = corgipile mean − sklearn (negative: corgipile worse). bars: accuracy gap ≥ −1 point, "
                  "AUC gap ≥ −0.01, accuracy spread (max − min over seeds) ≤ 0.3 points."]
    notes = [f"{d['dataset']}: {d['shape']}, train positive share {d['train_positive_share']:.3f}"
             + (f", {d['oracle']}" if d.get("oracle") else "") for d in results["datasets"]]
    lines += [""] + [f"- {n}" for n in notes]
    libs = sorted({r["library_mtime"] for d in results["datasets"] for m in d["models"].values()
                   for r in m["corgipile"] + m.get("corgipile_shuffled_copy", [])})
    lines += ["", f"corgipile {results['extversion']}, library mtime(s) seen: {', '.join(libs)}; "
                  f"scikit-learn {results['sklearn_version']}, numpy {results['numpy_version']}; "
                  f"total {results['total_seconds'] / 60:.1f} min."]
    if len(libs) > 1:
        lines.append("**The library was reinstalled during the run**: see library_mtime per run in the JSON.")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="1-5", help="corgipile seeds, e.g. 1-5 or 1,3,7 (default 1-5)")
    ap.add_argument("--only", default=None, help=f"comma-separated datasets (default all: {','.join(DATASETS)})")
    ap.add_argument("--models", default="logistic,svm")
    ap.add_argument("--no-shuffled", action="store_true", help="skip the runs on a shuffled copy")
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--svm-loss", default="hinge", choices=["hinge", "squared_hinge"])
    ap.add_argument("--params", default="{}",
                    help="extra corgipile params as JSON, e.g. '{\"learning_rate\": 0.001}' (default none: the defaults)")
    args = ap.parse_args()
    EXTRA_PARAMS.update(json.loads(args.params))
    global SVM_LOSS
    SVM_LOSS = args.svm_loss
    import sklearn
    seeds = parse_seeds(args.seeds)
    keys = args.only.split(",") if args.only else DATASETS
    for k in keys:
        if k not in DATASETS:
            sys.exit(f"unknown dataset {k!r} (known: {', '.join(DATASETS)})")
    models = args.models.split(",")
    started = time.perf_counter()
    version = retrying(setup_database)
    with connect() as c:
        lib = installed_library(c)
    head = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    results = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "git_head": head, "extversion": version,
               "library": lib, "sklearn_version": sklearn.__version__, "numpy_version": np.__version__,
               "seeds": seeds, "models": models, "datasets": []}
    for key in keys:
        results["datasets"].append(run_dataset(key, models, seeds, not args.no_shuffled))
    with connect() as c:
        results["library_at_end"] = installed_library(c)
        installed = records.server(c)
    results["total_seconds"] = time.perf_counter() - started
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1, default=str)
    print(report(results))
    records.append_record("defaults_vs_sklearn", figures(results), make_target="bench-defaults", results_file=args.out,
                          config={"seeds": seeds, "models": models, "datasets": keys, "shuffled": not args.no_shuffled,
                                  "svm_loss": args.svm_loss, "params": EXTRA_PARAMS}, **installed)
    log(f"done in {results['total_seconds']:.0f} s; wrote {args.out}")


if __name__ == "__main__":
    main()
