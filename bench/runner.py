"""Running one measurement: a corgipile training, a Shuffle Once copy, the scikit-learn export path,
or a plain scan. Each in-database run uses a FRESH connection, so the backend's peak memory
(VmHWM from /proc/<pid>/status) belongs to that run alone."""

import statistics
import json
import time

import numpy as np
import psycopg
from psycopg.types.json import Jsonb

SKIP_SHUFFLE_ERROR = 'invalid value for parameter "shuffle"'


def connect(**kw):
    return psycopg.connect(autocommit=True, **kw)


def vm_hwm_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


class Skipped(Exception):
    pass


def summary(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)} if xs else None


def scan_floor(ds, repeat=3):
    """A plain sequential scan touching the feature arrays, parallel workers off (warm cache)."""
    with connect() as c:
        pid = c.execute("SELECT pg_backend_pid()").fetchone()[0]
        c.execute("SET max_parallel_workers_per_gather = 0")
        c.execute(ds.scan_sql)  # warm
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            c.execute(ds.scan_sql)
            times.append(time.perf_counter() - t0)
        return {"seconds": times, "vm_hwm_mb": vm_hwm_mb(pid)}


def train(ds, model, params, epochs, seed, relation=None):
    """corgipile_train with per-epoch validation on ds.val; returns the per-epoch record, final
    train/test accuracy (corgipile_evaluate) and the backend's VmHWM."""
    relation = relation or ds.train
    # The last iterate, as the paper's SGD returns it: averaging the iterates (the default since
    # 0.4.0) hides much of what the tuple order does, which is what the harness compares.
    p = {"epochs": epochs, "seed": seed, "verbose": False, "average": False,
         "validation": {"relation": ds.val}, **ds.feature_params, **params}
    with connect() as c:
        pid = c.execute("SELECT pg_backend_pid()").fetchone()[0]
        t0 = time.perf_counter()
        try:
            mid = c.execute("SELECT corgipile_train(%s, %s, %s)", (relation, model, Jsonb(p))).fetchone()[0]
        except psycopg.errors.Error as e:
            if SKIP_SHUFFLE_ERROR in str(e):
                raise Skipped(str(e).splitlines()[0]) from None
            raise
        wall = time.perf_counter() - t0
        hwm = vm_hwm_mb(pid)
        ep = c.execute("""SELECT seconds, accuracy, validation_accuracy, coalesce(validation_seconds, 0)
                          FROM corgipile.epochs WHERE model_id = %s ORDER BY epoch""", (mid,)).fetchall()
        test_acc = c.execute("SELECT (corgipile_evaluate(%s, %s)->>'accuracy')::float8", (mid, ds.test)).fetchone()[0]
        train_acc = c.execute("SELECT (corgipile_evaluate(%s, %s)->>'accuracy')::float8", (mid, relation)).fetchone()[0]
    return {"epoch_seconds": [r[0] for r in ep], "progressive_acc": [r[1] for r in ep],
            "val_acc": [r[2] for r in ep], "train_acc": train_acc, "test_acc": test_acc,
            "wall": wall, "vm_hwm_mb": hwm, "model_id": mid,
            # The statement's time outside its epochs and the validation passes: statistics
            # pass, planning, storing (part of end-to-end times).
            "overhead": max(0.0, wall - sum(r[0] + r[3] for r in ep))}


def shuffle_once_copy(ds, seed):
    """MADlib/Bismarck's Shuffle Once: a fully shuffled copy of the table (timed)."""
    copy = f"{ds.train}_so"
    with connect() as c:
        c.execute(f"DROP TABLE IF EXISTS {copy}")
        c.execute("SET max_parallel_workers_per_gather = 0")
        # A synchronized scan of a big table starts where the last scan stopped: the rows would
        # meet random() in a different order every run, and the seed would not fix the copy.
        c.execute("SET synchronize_seqscans = off")
        c.execute("SELECT setseed(%s)", (seed / 1000.0,))
        t0 = time.perf_counter()
        c.execute(f"CREATE TABLE {copy} AS SELECT * FROM {ds.train} ORDER BY random()")
        secs = time.perf_counter() - t0
    return copy, secs


def pile_shuffle_copy(ds, seed):
    """Shuffle Once with corgipile_shuffle (the two-pass pile shuffle) instead of a sort (timed)."""
    copy = f"{ds.train}_pile"
    with connect() as c:
        c.execute(f"DROP TABLE IF EXISTS {copy}")
        t0 = time.perf_counter()
        c.execute("SELECT corgipile_shuffle(%s, %s, %s)", (ds.train, copy, json.dumps({"seed": seed})))
        secs = time.perf_counter() - t0
    return copy, secs


def drop(table):
    with connect() as c:
        c.execute(f"DROP TABLE IF EXISTS {table}")


def export(ds, table, chunk=50_000):
    """What a scikit-learn user does: pull the table through psycopg into numpy (or scipy CSR)."""
    t0 = time.perf_counter()
    with psycopg.connect() as c:  # a server-side cursor needs a transaction
        n = c.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        y = np.empty(n)
        with c.cursor(name="export", binary=True) as cur:
            if ds.sparse:
                import scipy.sparse as sp
                cur.execute(f"SELECT label, idx, val FROM {table}")
                indptr, indices, data, i = [0], [], [], 0
                while rows := cur.fetchmany(chunk):
                    for label, idx, val in rows:
                        y[i] = label
                        indices.extend(idx)
                        data.extend(val)
                        indptr.append(len(indices))
                        i += 1
                X = sp.csr_matrix((np.asarray(data), np.asarray(indices) - 1, np.asarray(indptr)),
                                  shape=(n, ds.n_features))
            else:
                X = np.empty((n, ds.n_features))
                cur.execute(f"SELECT label, features FROM {table}")
                i = 0
                while rows := cur.fetchmany(chunk):
                    X[i:i + len(rows)] = [r[1] for r in rows]
                    y[i:i + len(rows)] = [r[0] for r in rows]
                    i += len(rows)
    return X, y, time.perf_counter() - t0


def export_all(ds):
    """Train (timed: it is part of the scikit-learn path), validation and test sets."""
    X, y, secs = export(ds, ds.train)
    Xv, yv, _ = export(ds, ds.val)
    Xt, yt, _ = export(ds, ds.test)
    return {"X": X, "y": y, "Xv": Xv, "yv": yv, "Xt": Xt, "yt": yt, "export_seconds": secs}


def sklearn_run(data, model, epochs, seed, ceiling_max_cells, nnz_per_row):
    """SGDClassifier(shuffle=True) epoch by epoch with partial_fit (timed), per-epoch validation
    accuracy (not timed); the converged LogisticRegression / LinearSVC test accuracy as a ceiling
    on small data."""
    from sklearn.linear_model import SGDClassifier

    X, y = data["X"], data["y"]
    clf = SGDClassifier(loss="hinge" if model == "svm" else "log_loss", shuffle=True, random_state=seed)
    classes = np.unique(y)
    secs, val_acc = [], []
    for _ in range(epochs):
        t0 = time.perf_counter()
        clf.partial_fit(X, y, classes=classes)
        secs.append(time.perf_counter() - t0)
        val_acc.append(float(clf.score(data["Xv"], data["yv"])))
    out = {"export_seconds": data["export_seconds"], "epoch_seconds": secs, "val_acc": val_acc,
           "train_acc": float(clf.score(X, y)), "test_acc": float(clf.score(data["Xt"], data["yt"])),
           "ceiling": None}
    cells = X.shape[0] * nnz_per_row
    if X.shape[0] <= 1_000_000 and cells <= ceiling_max_cells:
        from sklearn.linear_model import LogisticRegression
        from sklearn.svm import LinearSVC
        ceil = LogisticRegression(max_iter=1000) if model == "logistic" else LinearSVC(max_iter=5000)
        t0 = time.perf_counter()
        ceil.fit(X, y)
        out["ceiling"] = float(ceil.score(data["Xt"], data["yt"]))
        out["ceiling_seconds"] = time.perf_counter() - t0
    else:
        out["ceiling_note"] = f"skipped: {X.shape[0]:,} rows x {nnz_per_row} values (limits 1M rows, {ceiling_max_cells:,} cells)"
    return out


def trace_exists():
    with connect() as c:
        return c.execute("SELECT EXISTS (SELECT 1 FROM pg_proc WHERE proname = 'corgipile_trace')").fetchone()[0]


def trace(table, params):
    with connect() as c:
        try:
            rows = c.execute("SELECT position, label, first_feature FROM corgipile_trace(%s, %s)",
                             (table, Jsonb(params))).fetchall()
        except psycopg.errors.Error as e:
            if SKIP_SHUFFLE_ERROR in str(e):
                raise Skipped(str(e).splitlines()[0]) from None
            raise
    return rows
