#!/usr/bin/env python3
"""corgipile's mlp / mlp_regression against scikit-learn's MLPClassifier / MLPRegressor, in one run.

1. Accuracy (R² for regression), default network params but --epochs, training tables stored
   clustered by label (CREATE TABLE .. AS .. ORDER BY label, id):
     corgipile mlp (hidden [64], relu, adam 0.001, batch 32, constant schedule, normalize)
     scikit-learn MLPClassifier(hidden_layer_sizes=(64,), solver="adam", batch_size=32,
       learning_rate_init=0.001, alpha=0, max_iter=--epochs, shuffle=True, early_stopping=False,
       tol=0, n_iter_no_change > max_iter: it runs every epoch) on the same preprocessing
     corgipile logistic (the linear model; every dataset here has two classes) with the same epochs
   Datasets: ijcnn1, a9a, w8a (bench/defaults_vs_sklearn.py's sparse tables, loading and
   MaxAbsScaler preprocessing, reused by import); mixed_nl, a generated mixed-type table (raw-scale
   numbers, booleans, text categories, 5% NULLs) whose label is non-linear in its columns (an XOR of
   the signs of income and balance, an age band, a tenure x membership threshold, region effects
   that flip sign with has_card, product effects; defaults_vs_sklearn's mixed_a/mixed_b labels come
   from a logistic model, linear in the encoded features, so they cannot show what a network adds);
   reg_nl, a generated regression table (8 raw-scale float8[] features, the target a sum of
   sin, product, threshold and square terms plus noise), mlp_regression vs MLPRegressor vs linear.
2. The CorgiPile point: the same mlp on the clustered table with shuffle "corgipile" (the
   default), on a fully shuffled copy (ORDER BY md5(id)), and with "no_shuffle" on the clustered table.
3. Speed, on bench/epoch_times.py's label-clustered dense table (--rows x 18 float8[]): an mlp
   epoch (corgipile.epochs.seconds: reading included) vs MLPClassifier.partial_fit over the same rows
   already in memory (standardized), interleaved rounds; the dense layers' GFLOP/s (2(d·h + h·k)
   flops forward and twice that backward per row).
4. Prediction, the mlp vs a logistic model trained on the same table, each against the scan both
   pay (the issue's target: a network's prediction within 2x the linear model's): from a float8[]
   over the speed table (SELECT sum(corgipile_predict(id, features)) FROM t vs SELECT
   sum(features[1])), and from a whole row over mixed_nl's training rows repeated --predict-copies
   times (SELECT sum(corgipile_predict(id, t)) FROM t vs SELECT sum(num_nonnulls(t.*))), both
   models trained on mixed_nl's training table. Reported: µs per row, mlp / logistic, and the same
   ratio net of the scan.
5. Memory: VmHWM (peak resident set) of a backend that trained an mlp vs one that only scanned
   the table and one that trained a logistic model, beside the model's size.

Usage: bench/mlp_vs_sklearn.py [--epochs 20] [--seeds 1-3] [--rows 4500000] [--rounds 3]
                               [--only ijcnn1,a9a,...] [--skip-speed] [--no-perf]
                               [--predict-copies 20] [--predict-only --out FILE]
Needs PGHOST/PGPORT/PGUSER (make bench-mlp sets them). Uses the database corgipile_defaults (the
tables of bench-defaults are reused) and creates the speed and whole-row prediction tables there. Writes
bench/results/mlp_vs_sklearn.md and .json."""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
from psycopg.types.json import Jsonb
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import r2_score
from sklearn.neural_network import MLPClassifier, MLPRegressor
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler

import defaults_vs_sklearn as dvs
import provenance
import records
from cancel_latency import installed_library
from epoch_times import make_table

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "results", "mlp_vs_sklearn")
HIDDEN = 64
BATCH = 32

# A mixed-type table with a non-linear label: defaults_vs_sklearn generates its columns (the
# weights there are 0: the label it draws is replaced, see nonlinear_label).
MIXED_NL = {
    "seed": 33, "train": 50_000, "test": 20_000, "positive": 0.30, "null": 0.05, "signal": 1.0,
    "nonlinear": 1,
    "numbers": {
        "income": ("lognormal_dollars", (50_000, 0.6), 0.0),
        "age": ("int_uniform", (18, 90), 0.0),
        "tenure_days": ("int_exponential", (900,), 0.0),
        "balance": ("normal_dollars", (0, 15_000), 0.0),
    },
    "flags": {"is_member": (0.3, 0.0), "has_card": (0.6, 0.0)},
    "text": {"region": (5, 1.0, 0.0), "product": (300, 1.05, 0.0)},
}
REG_ROWS = (50_000, 20_000)
CLASSIFICATION = ["ijcnn1", "a9a", "w8a", "mixed_nl"]
DATASETS = CLASSIFICATION + ["reg_nl"]


def log(msg):
    print(f"[mlp {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- generated tables

_generate_mixed = dvs.generate_mixed


def nonlinear_label(spec):
    """defaults_vs_sklearn's columns and rows for spec, the label redrawn from a non-linear
    function of the complete (pre-NULL) values; returns what generate_mixed returns."""
    cols, train_rows, test_rows, _ = _generate_mixed(spec)
    rng = np.random.default_rng(spec["seed"] + 1000)
    n = spec["train"] + spec["test"]

    def z(name):
        v = cols[name][1].astype(float)
        return (v - v.mean()) / v.std()

    def codes(name):
        return np.unique(cols[name][1], return_inverse=True)[1]

    region, product = codes("region"), codes("product")
    member, card = cols["is_member"][1], cols["has_card"][1]
    age, tenure = cols["age"][1], cols["tenure_days"][1]
    f = 1.6 * np.sign(z("income") * z("balance"))            # XOR: no linear model sees it
    f += 1.2 * np.where((age >= 30) & (age <= 55), 1.0, -1.0)  # a band, not monotone
    f += 1.5 * ((tenure > 900) & member)                       # threshold x flag
    f += np.array([1.0, -1.0, 0.8, -0.6, 0.0])[region] * np.where(card, 1.0, -1.0)  # flips with has_card
    f += rng.normal(0.0, 0.6, product.max() + 1)[product]      # product effects
    f *= spec["signal"]
    lo, hi = -20.0, 20.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if (1 / (1 + np.exp(-(f + mid)))).mean() > spec["positive"] else (mid, hi)
    prob = 1 / (1 + np.exp(-(f + lo)))
    label = rng.random(n) < prob
    for i, r in enumerate(train_rows + test_rows):
        r["label"] = bool(label[i])
    test = slice(spec["train"], None)
    from sklearn.metrics import roc_auc_score
    oracle_auc = float(roc_auc_score(label[test], prob[test]))
    return cols, train_rows, test_rows, oracle_auc


def generate_mixed(spec):
    return nonlinear_label(spec) if spec.get("nonlinear") else _generate_mixed(spec)


# defaults_vs_sklearn's loader and reader look these up by name at call time.
dvs.generate_mixed = generate_mixed
dvs.MIXED["mixed_nl"] = MIXED_NL


def reg_tables():
    """reg_nl: id, features float8[8] (raw scales), label float8; train clustered by label."""
    train, test, shuffled = dvs.names("reg_nl")
    sig = f"mlp_vs_sklearn reg_nl v1 {REG_ROWS}"
    with dvs.connect() as conn:
        if dvs.reusable(conn, [train, test, shuffled], sig):
            return train, test, shuffled
        log("generating reg_nl")
        rng = np.random.default_rng(44)
        n = sum(REG_ROWS)
        X = np.column_stack([
            np.round(50_000 * rng.lognormal(0, 0.5, n), 2),  # dollars
            rng.integers(18, 91, n).astype(float),            # years
            rng.normal(0, 1_000, n),
            rng.uniform(0, 1, n),
            rng.uniform(-5, 5, n),
            rng.normal(100, 20, n),
            rng.exponential(30, n),
            rng.uniform(-1, 1, n),                            # noise feature
        ])
        Z = (X - X.mean(0)) / X.std(0)
        y = (2 * np.sin(1.5 * Z[:, 0]) + Z[:, 1] * Z[:, 2] + 1.5 * (Z[:, 3] > 0.5) + 0.7 * Z[:, 4] ** 2
             + 0.5 * Z[:, 5] - 0.8 * np.abs(Z[:, 6]) + rng.normal(0, 0.3, n))
        raw = "dvs_reg_nl_raw"
        for t, rows in ((raw, range(REG_ROWS[0])), (test, range(REG_ROWS[0], n))):
            conn.execute(f"DROP TABLE IF EXISTS {t}")
            conn.execute(f"CREATE TABLE {t} (id bigint, features float8[], label float8)")
            with conn.cursor() as cur, cur.copy(f"COPY {t} (id, features, label) FROM STDIN") as cp:
                for i in rows:
                    cp.write_row([i + 1, X[i].tolist(), float(y[i])])
        dvs.cluster(conn, raw, train, shuffled)
        dvs.sign(conn, [train, test, shuffled], sig)
    return train, test, shuffled


def read_dense(conn, table, label_type=float):
    rows = conn.execute(f"SELECT features, label FROM {table} ORDER BY id").fetchall()
    return np.array([r[0] for r in rows], dtype=float), np.array([label_type(r[1]) for r in rows])


def read_dataset(key):
    if key == "reg_nl":
        train, test, shuffled = reg_tables()
        with dvs.connect() as c:
            Xtr, ytr = read_dense(c, train)
            Xte, yte = read_dense(c, test)
        shape = f"{len(ytr):,} train / {len(yte):,} test rows x 8 raw-scale float8[] features"
        return train, test, shuffled, (Xtr, ytr, Xte, yte, "dense", None, None), shape, None
    return dvs.read_dataset(key)


# ---------------------------------------------------------------- the three learners

def corgipile_params(key, seed, epochs, **extra):
    p = {"label": "label", "features": "features"} if key == "reg_nl" else dvs.corgipile_params(key, seed)
    if key in dvs.LIBSVM:
        # Without n_features a sparse mlp fails (0.5.0 at 62fa20d: "internal error: entered unreachable
        # code: a network's widths are checked before training"): the network's input width is read
        # from n_features only; linear models grow with the indices they see.
        p["n_features"] = dvs.LIBSVM[key][2]
    return {**p, "epochs": epochs, "seed": seed, "verbose": False, **extra}


def corgipile_run(train, test, kind, params):
    with dvs.connect() as c:
        t0 = time.perf_counter()
        mid = c.execute("SELECT corgipile_train(%s, %s, %s)", (train, kind, Jsonb(params))).fetchone()[0]
        secs = time.perf_counter() - t0
        ev = c.execute("SELECT corgipile_evaluate(%s, %s)", (mid, test)).fetchone()[0]
        layers, n_epochs, epoch_secs = c.execute(
            """SELECT layers, (SELECT count(*) FROM corgipile.epochs e WHERE e.model_id = m.id),
                      (SELECT array_agg(seconds ORDER BY epoch) FROM corgipile.epochs e WHERE e.model_id = m.id)
               FROM corgipile.models m WHERE id = %s""", (mid,)).fetchone()
        c.execute("SELECT corgipile_drop_model(%s)", (mid,))
    score = ev.get("r2") if kind in ("mlp_regression", "linear") else ev.get("accuracy")
    return {"score": score, "seconds": secs, "epochs": n_epochs, "epoch_seconds": epoch_secs,
            "layers": layers, "params": params, "evaluate": ev}


def sklearn_run(data, regression, seed, epochs):
    Xtr, ytr, Xte, yte, kind, num_idx, text_idx = data
    if kind == "sparse":
        # scikit-learn's MLP on a CSR matrix took 85 s a fit on w8a (20 epochs) against ~10 s dense:
        # the same values, densified (at most 300 columns here).
        Xtr, Xte = Xtr.toarray(), Xte.toarray()
    pre = StandardScaler() if kind == "dense" else \
        dvs.sklearn_pipeline(kind, "logistic", num_idx, text_idx).named_steps["pre"]
    cls = MLPRegressor if regression else MLPClassifier
    net = cls(hidden_layer_sizes=(HIDDEN,), activation="relu", solver="adam", batch_size=BATCH,
              learning_rate_init=0.001, alpha=0.0, max_iter=epochs, shuffle=True, early_stopping=False,
              tol=0.0, n_iter_no_change=epochs + 1, random_state=seed)
    pipe = Pipeline([("pre", pre), ("clf", net)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        t0 = time.perf_counter()
        pipe.fit(Xtr, ytr)
        secs = time.perf_counter() - t0
    score = r2_score(yte, pipe.predict(Xte)) if regression else pipe.score(Xte, yte)
    return {"score": float(score), "seconds": secs, "epochs": int(net.n_iter_)}


def med(xs):
    xs = [x for x in xs if x is not None]
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)} if xs else None


def run_dataset(key, seeds, epochs):
    train, test, shuffled, data, shape, oracle = dvs.retrying(read_dataset, key)
    regression = key == "reg_nl"
    net, lin = ("mlp_regression", "linear") if regression else ("mlp", "logistic")
    arms = {
        "corgipile mlp": lambda s: corgipile_run(train, test, net, corgipile_params(key, s, epochs)),
        "sklearn MLP": lambda s: sklearn_run(data, regression, s, epochs),
        "corgipile linear": lambda s: corgipile_run(train, test, lin, corgipile_params(key, s, epochs)),
        "corgipile mlp, shuffled copy": lambda s: corgipile_run(shuffled, test, net, corgipile_params(key, s, epochs)),
        "corgipile mlp, no_shuffle": lambda s: corgipile_run(
            train, test, net, corgipile_params(key, s, epochs, shuffle="no_shuffle")),
    }
    runs = {a: [] for a in arms}
    for seed in seeds:  # interleaved: every arm once per seed
        for arm, fn in arms.items():
            r = dvs.retrying(fn, seed) if arm.startswith("corgipile") else fn(seed)
            runs[arm].append(r)
            log(f"{key} seed {seed} {arm}: {'R²' if regression else 'acc'} {r['score']:.4f} {r['seconds']:.2f} s")
    summary = {a: {"score": med([r["score"] for r in rs]), "seconds": med([r["seconds"] for r in rs])}
               for a, rs in runs.items()}
    return {"dataset": key, "shape": shape, "oracle": oracle, "regression": regression, "train": train,
            "test": test, "shuffled": shuffled, "runs": runs, "summary": summary}


# ---------------------------------------------------------------- speed and memory

def read_speed_rows(conn, table, rows, chunk=500_000):
    """The table's (features, label) in id order, read by COPY in chunks of ids and parsed by numpy."""
    parts = []
    for lo in range(1, rows + 1, chunk):
        buf = bytearray()
        with conn.cursor() as cur, cur.copy(f"COPY (SELECT features, label FROM {table} WHERE id >= {lo} AND "
                                            f"id < {lo + chunk} ORDER BY id) TO STDOUT") as cp:
            for data in cp:
                buf += data
        text = buf.decode().translate(str.maketrans("\t\n", ",,", "{}"))
        parts.append(np.fromstring(text, dtype=float, sep=",").reshape(-1, 19))
    m = np.concatenate(parts)
    return m[:, :18], m[:, 18].astype(int)


def status(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmHWM", "VmRSS", "RssAnon", "RssShmem", "RssFile"):
                out[k] = int(v.split()[0])  # kB
    return out


def perf_profile(pid, seconds, path):
    subprocess.run(["perf", "record", "-F", "499", "-g", "-p", str(pid), "-o", path, "--", "sleep", str(seconds)],
                   capture_output=True)


def perf_top(path, n=18):
    r = subprocess.run(["perf", "report", "-i", path, "--no-children", "--sort", "dso,symbol", "--stdio",
                        "--percent-limit", "1", "-g", "none"], capture_output=True, text=True)
    lines = [re.sub(r"\s+-\s+-\s*$", "", ln) for ln in r.stdout.splitlines() if ln.strip() and not ln.startswith("#")]
    return lines[:n]


def speed_and_memory(rows, rounds, epochs, do_perf):
    table = f"bench_clustered_{rows}x18"
    out = {"table": table, "rows": rows}
    with dvs.connect() as conn:
        conn.execute("SET max_parallel_workers_per_gather = 0")
        t0 = time.perf_counter()
        make_table(conn, table, rows, 18)
        out["table_build_seconds"] = time.perf_counter() - t0
        out["table_size"] = conn.execute("SELECT pg_size_pretty(pg_table_size(%s))", (table,)).fetchone()[0]
        log(f"speed table {table} ready ({out['table_size']}, {out['table_build_seconds']:.0f} s)")
        X, y = read_speed_rows(conn, table, rows)
    Xs = StandardScaler().fit_transform(X)
    mlp_params = {"label": "label", "features": "features", "epochs": epochs, "seed": 1, "verbose": False}
    corg, skl, floor = [], [], []
    mlp_id = None
    for rnd in range(rounds):
        with dvs.connect() as c:
            c.execute("SET max_parallel_workers_per_gather = 0")
            t0 = time.perf_counter()
            c.execute(f"SELECT sum(features[1]) FROM {table}")
            floor.append(time.perf_counter() - t0)
            if mlp_id is not None:
                c.execute("SELECT corgipile_drop_model(%s)", (mlp_id,))
            mlp_id = c.execute("SELECT corgipile_train(%s, 'mlp', %s)",
                               (table, Jsonb({**mlp_params, "seed": rnd + 1}))).fetchone()[0]
            secs = [r[0] for r in c.execute("SELECT seconds FROM corgipile.epochs WHERE model_id = %s ORDER BY epoch",
                                            (mlp_id,))]
            layers = c.execute("SELECT layers FROM corgipile.models WHERE id = %s", (mlp_id,)).fetchone()[0]
        corg += secs
        net = MLPClassifier(hidden_layer_sizes=(HIDDEN,), solver="adam", batch_size=BATCH, learning_rate_init=0.001,
                            alpha=0.0, shuffle=True, random_state=rnd + 1)
        t0 = time.perf_counter()
        net.partial_fit(Xs, y, classes=[0, 1])
        skl.append(time.perf_counter() - t0)
        log(f"speed round {rnd + 1}: corgipile mlp epochs {', '.join(f'{s:.2f}' for s in secs)} s; "
            f"sklearn partial_fit epoch {skl[-1]:.2f} s; scan {floor[-1]:.2f} s")
    d, h, k = layers[0], layers[1], layers[-1]
    flops_row = 3 * 2 * (d * h + h * k)
    sk_flops_row = 3 * 2 * (d * h + h * 1)  # scikit-learn: one logistic output for two classes
    out.update({"layers": layers, "corgipile_epoch_seconds": corg, "sklearn_epoch_seconds": skl,
                "scan_seconds": floor, "flops_per_row": flops_row, "sklearn_flops_per_row": sk_flops_row})
    cm, sm = statistics.median(corg), statistics.median(skl)
    out["corgipile_us_per_row"] = 1e6 * cm / rows
    out["sklearn_us_per_row"] = 1e6 * sm / rows
    out["corgipile_gflops"] = flops_row * rows / cm / 1e9
    out["sklearn_gflops"] = sk_flops_row * rows / sm / 1e9

    log_id = array_predict(out, table, mlp_id, rounds)

    # Memory: each in a fresh backend, VmHWM read after the statement.
    mem = {}
    for name, q in [("scan only", f"SELECT sum(features[1]) FROM {table}"),
                    ("mlp training (1 epoch)", None), ("logistic training (1 epoch)", None)]:
        with dvs.connect() as c:
            c.execute("SET max_parallel_workers_per_gather = 0")
            pid = c.execute("SELECT pg_backend_pid()").fetchone()[0]
            before = status(pid)
            if q:
                c.execute(q)
            else:
                kind = "mlp" if name.startswith("mlp") else "logistic"
                mid = c.execute("SELECT corgipile_train(%s, %s, %s)",
                                (table, kind, Jsonb({**mlp_params, "epochs": 1}))).fetchone()[0]
                mem[name + " params"] = c.execute("SELECT params FROM corgipile.models WHERE id = %s",
                                                  (mid,)).fetchone()[0]
                c.execute("SELECT corgipile_drop_model(%s)", (mid,))
            mem[name] = {"before": before, "after": status(pid)}
        log(f"memory {name}: VmHWM {mem[name]['after']['VmHWM'] / 1024:.1f} MiB")
    n_params = sum(layers[i] * layers[i + 1] + layers[i + 1] for i in range(len(layers) - 1))
    out["memory"] = mem
    out["n_params"] = n_params
    out["model_bytes_adam"] = n_params * 8 * 3
    out["activation_bytes"] = BATCH * sum(layers) * 8 * 2  # values and their gradients

    if do_perf and shutil.which("perf"):
        path = "/tmp/corgipile-bench-mlp.perf.data"
        with dvs.connect() as c:
            pid = c.execute("SELECT pg_backend_pid()").fetchone()[0]
            th = threading.Thread(target=perf_profile, args=(pid, 8, path))
            th.start()
            time.sleep(0.5)
            mid = c.execute("SELECT corgipile_train(%s, 'mlp', %s)",
                            (table, Jsonb({**mlp_params, "epochs": max(epochs, 3)}))).fetchone()[0]
            th.join()
            c.execute("SELECT corgipile_drop_model(%s)", (mid,))
        out["perf_top"] = perf_top(path)
        log("perf:\n" + "\n".join(out["perf_top"]))
    with dvs.connect() as c:
        for m in (mlp_id, log_id):
            c.execute("SELECT corgipile_drop_model(%s)", (m,))
    return out


def timed_interleaved(stmts, rounds):
    """Every statement once per round, in a rotated order, no parallel workers: seconds per statement."""
    times = {k: [] for k in stmts}
    names = list(stmts)
    with dvs.connect() as c:
        c.execute("SET max_parallel_workers_per_gather = 0")
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                t0 = time.perf_counter()
                c.execute(stmts[name])
                times[name].append(time.perf_counter() - t0)
    return times


def array_predict(out, table, mlp_id, rounds):
    """Prediction from a float8[]: the mlp vs a logistic model of the same table vs a plain scan."""
    with dvs.connect() as c:
        log_id = c.execute("SELECT corgipile_train(%s, 'logistic', %s)",
                           (table, Jsonb({"label": "label", "features": "features", "epochs": 1, "seed": 1,
                                          "verbose": False}))).fetchone()[0]
    stmts = {"mlp": f"SELECT sum(corgipile_predict({mlp_id}, features)) FROM {table}",
             "logistic": f"SELECT sum(corgipile_predict({log_id}, features)) FROM {table}",
             "scan": f"SELECT sum(features[1]) FROM {table}"}
    pred = timed_interleaved(stmts, rounds)
    log("predict (array): " + ", ".join(f"{k} {statistics.median(v):.2f} s" for k, v in pred.items()))
    out["predict_seconds"] = pred
    out["predict_statements"] = stmts
    return log_id


def mixed_predict(rounds, epochs, copies):
    """Prediction from a whole row of the mixed-type table (mixed_nl; its training rows repeated
    `copies` times, so a statement runs long enough to time): mlp vs logistic, both trained on
    mixed_nl's training table, vs a scan that builds the same row value."""
    train = dvs.retrying(dvs.load_mixed_tables, "mixed_nl")[0]
    table = f"mlp_predict_mixed_x{copies}"
    with dvs.connect() as c:
        n_train = c.execute(f"SELECT count(*) FROM {train}").fetchone()[0]
        exists = c.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()[0]
        if not (exists and c.execute(f"SELECT count(*) = %s FROM {table}", (n_train * copies,)).fetchone()[0]):
            c.execute(f"DROP TABLE IF EXISTS {table}")
            c.execute(f"CREATE TABLE {table} AS SELECT t.* FROM generate_series(1, {copies}) g, {train} t")
            c.execute(f"VACUUM ANALYZE {table}")
        rows = c.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        ids, layers = {}, {}
        for kind in ("mlp", "logistic"):
            ids[kind] = c.execute("SELECT corgipile_train(%s, %s, %s)",
                                  (train, kind, Jsonb(corgipile_params("mixed_nl", 1, epochs)))).fetchone()[0]
            layers[kind], n_features = c.execute("SELECT layers, n_features FROM corgipile.models WHERE id = %s",
                                                 (ids[kind],)).fetchone()
    stmts = {"mlp": f"SELECT sum(corgipile_predict({ids['mlp']}, t)) FROM {table} t",
             "logistic": f"SELECT sum(corgipile_predict({ids['logistic']}, t)) FROM {table} t",
             "scan": f"SELECT sum(num_nonnulls(t.*)) FROM {table} t"}
    pred = timed_interleaved(stmts, rounds)
    log("predict (row): " + ", ".join(f"{k} {statistics.median(v):.2f} s" for k, v in pred.items()))
    with dvs.connect() as c:
        for m in ids.values():
            c.execute("SELECT corgipile_drop_model(%s)", (m,))
    return {"table": table, "rows": rows, "copies": copies, "train": train, "epochs": epochs,
            "layers": layers["mlp"], "n_features": n_features, "predict_seconds": pred,
            "predict_statements": stmts}


# ---------------------------------------------------------------- report

def fr(s, digits=4, scale=1.0):
    if s is None:
        return "–"
    m, lo, hi = s["median"] * scale, s["min"] * scale, s["max"] * scale
    return f"{m:.{digits}f} ({lo:.{digits}f}–{hi:.{digits}f})" if s["n"] > 1 else f"{m:.{digits}f}"


def report(res):
    e, seeds = res["epochs"], res["seeds"]
    L = [f"All numbers measured by `bench/mlp_vs_sklearn.py` in one run on commit {res['git_head']} "
         f"(corgipile {res['extversion']}, release build, PostgreSQL 15 copy), scikit-learn {res['sklearn_version']}. "
         f"Total {res['total_seconds'] / 60:.1f} min on a shared 2-core machine (other test suites were running: "
         "timings are noisy; arms are interleaved, medians with (min–max) over runs).", "",
         f"## 1. Accuracy, default network params, {e} epochs{'' if e == 20 else ' (not the default 20)'}, tables clustered by label", "",
         f"Seeds {seeds} (corgipile `seed`, scikit-learn `random_state`); test accuracy (R² for reg_nl); "
         "corgipile params: label, features, epochs, seed only (hidden [64], relu, adam 0.001, batch 32, constant "
         "schedule, normalize true, l2 0). scikit-learn: MLPClassifier/MLPRegressor(hidden_layer_sizes=(64,), "
         "solver=adam, batch_size=32, learning_rate_init=0.001, alpha=0, max_iter=epochs, shuffle=True, "
         "early_stopping=False, tol=0, n_iter_no_change>epochs) after the same preprocessing as bench-defaults "
         "(MaxAbsScaler on sparse, the CSR matrix densified for speed; mean-impute + StandardScaler + OneHotEncoder(max_categories=102) on mixed; "
         "StandardScaler on reg_nl). corgipile linear = logistic (linear for reg_nl), same epochs, its own defaults.", "",
         "| dataset | corgipile mlp | sklearn MLP | gap (pts) | corgipile linear | corgipile mlp s | sklearn s | corgipile linear s |",
         "|---|---|---|---|---|---|---|---|"]
    for d in res["datasets"]:
        s = d["summary"]
        mult = 1 if d["regression"] else 100
        gap = mult * (s["corgipile mlp"]["score"]["median"] - s["sklearn MLP"]["score"]["median"])
        L.append(f"| {d['dataset']}{' (R²)' if d['regression'] else ''} | {fr(s['corgipile mlp']['score'])} | "
                 f"{fr(s['sklearn MLP']['score'])} | {gap:+.{3 if d['regression'] else 2}f} | "
                 f"{fr(s['corgipile linear']['score'])} | {fr(s['corgipile mlp']['seconds'], 2)} | "
                 f"{fr(s['sklearn MLP']['seconds'], 2)} | {fr(s['corgipile linear']['seconds'], 2)} |")
    L += [""] + [f"- {d['dataset']}: {d['shape']}" + (f"; {d['oracle']}" if d.get("oracle") else "")
                 for d in res["datasets"]]
    L += ["", "gap = corgipile mlp − sklearn MLP (medians; points of accuracy, or R² for reg_nl). "
              "corgipile seconds: the corgipile_train statement (statistics pass + epochs); sklearn: fit of "
              "the pipeline on data already in memory.", "",
          "## 2. The CorgiPile point: same mlp, clustered vs shuffled storage", "",
          "| dataset | corgipile shuffle on clustered (default) | full shuffled copy (ORDER BY md5(id)) | no_shuffle on clustered |",
          "|---|---|---|---|"]
    for d in res["datasets"]:
        s = d["summary"]
        L.append(f"| {d['dataset']} | {fr(s['corgipile mlp']['score'])} | {fr(s['corgipile mlp, shuffled copy']['score'])} | "
                 f"{fr(s['corgipile mlp, no_shuffle']['score'])} |")
    sp = res.get("speed")
    if sp and "corgipile_epoch_seconds" in sp:
        mem = sp["memory"]
        cm, sm = statistics.median(sp["corgipile_epoch_seconds"]), statistics.median(sp["sklearn_epoch_seconds"])
        L += ["", f"## 3. Speed: one mlp epoch on `{sp['table']}` ({sp['rows']:,} rows x 18 float8[], {sp['table_size']}, "
                  "clustered by label; bench/epoch_times.py's table)", "",
              (f"{sp['rows']:,} rows, as bench-epochs" if sp["rows"] == 4_500_000 else
               f"{sp['rows']:,} rows, not the 4.5M of bench-epochs: time budget") +
              f" (building the table took {sp['table_build_seconds']:.0f} s, 0 if it existed). Layers {sp['layers']}, batch 32, adam; "
              f"{res['speed_epochs']} epochs x {res['rounds']} rounds for corgipile (shuffle corgipile, one backend, no "
              "parallel workers), one MLPClassifier.partial_fit epoch per round over the same rows standardized in "
              "memory, interleaved.", "",
              "| what | median s (range) | µs / row | GFLOP/s in the dense layers |", "|---|---|---|---|",
              f"| corgipile mlp epoch (reading included) | {cm:.2f} ({min(sp['corgipile_epoch_seconds']):.2f}–"
              f"{max(sp['corgipile_epoch_seconds']):.2f}) | {sp['corgipile_us_per_row']:.2f} | {sp['corgipile_gflops']:.2f} |",
              f"| sklearn MLPClassifier.partial_fit epoch (in memory) | {sm:.2f} ({min(sp['sklearn_epoch_seconds']):.2f}–"
              f"{max(sp['sklearn_epoch_seconds']):.2f}) | {sp['sklearn_us_per_row']:.2f} | {sp['sklearn_gflops']:.2f} |",
              f"| `SELECT sum(features[1])` (scan floor) | {statistics.median(sp['scan_seconds']):.2f} | "
              f"{1e6 * statistics.median(sp['scan_seconds']) / sp['rows']:.2f} | |", "",
              f"corgipile / sklearn epoch time: **{cm / sm:.2f}x**. FLOPs per row: corgipile {sp['flops_per_row']:,} "
              f"(3 x 2(d·h + h·k), k = {sp['layers'][-1]} softmax outputs), sklearn {sp['sklearn_flops_per_row']:,} "
              "(one logistic output for two classes)."]
    if sp:
        L += [""] + predict_report(sp, res.get("mixed_predict"))
    if sp and "memory" in sp:
        mem = sp["memory"]
        L += ["", "## 5. Memory", "",
              "Each statement in a fresh backend; /proc/<pg_backend_pid()>/status read after it (kB → MiB). VmHWM is "
              "the peak resident set, which includes the shared buffers the backend touched (RssShmem).", "",
              "| backend | VmHWM MiB | VmRSS MiB | RssAnon MiB | RssShmem MiB | VmHWM − scan-only's |", "|---|---|---|---|---|---|"]
        base = mem["scan only"]["after"]["VmHWM"]
        for k in ("scan only", "mlp training (1 epoch)", "logistic training (1 epoch)"):
            a = mem[k]["after"]
            L.append(f"| {k} | {a['VmHWM'] / 1024:.1f} | {a['VmRSS'] / 1024:.1f} | {a['RssAnon'] / 1024:.1f} | "
                     f"{a['RssShmem'] / 1024:.1f} | {(a['VmHWM'] - base) / 1024:+.1f} |")
        bp = mem.get("mlp training (1 epoch) params", {})
        L += ["", f"Model: {sp['n_params']:,} parameters → {sp['model_bytes_adam'] / 1024:.1f} KiB with Adam's two "
                  f"moments (x 8 bytes x 3); batch activations and their gradients ≈ {sp['activation_bytes'] / 1024:.1f} KiB. "
                  f"The training's shuffle buffer (buffer_size {bp.get('buffer_size')!r}, block_size "
                  f"{bp.get('block_size')!r}) holds decoded rows and dominates any difference."]
    if sp and sp.get("perf_top"):
        L += ["", "## perf profile of the backend during an mlp training (8 s, `perf report --no-children --sort dso,symbol`)",
              "", "```"] + sp["perf_top"] + ["```"]
    L += ["", "Raw numbers: bench/results/mlp_vs_sklearn.json."]
    return "\n".join(L) + "\n"


def figures(res):
    """The figures of report(res) (or of predict_only_report), for the run's record (bench/records.py)."""
    out = {}
    for d in res["datasets"]:
        s = d["summary"]
        mult = 1 if d["regression"] else 100
        out[d["dataset"]] = {
            **{f"{arm} score": s[arm]["score"] for arm in s if "score" in s[arm]},
            **{f"{arm} s": s[arm]["seconds"] for arm in s if "seconds" in s[arm]},
            "gap": mult * (s["corgipile mlp"]["score"]["median"] - s["sklearn MLP"]["score"]["median"]),
            "gap_unit": "R2" if d["regression"] else "points"}
    sp = res.get("speed")
    if sp and "corgipile_epoch_seconds" in sp:
        cm, sm = statistics.median(sp["corgipile_epoch_seconds"]), statistics.median(sp["sklearn_epoch_seconds"])
        out["speed"] = {"corgipile_epoch_s": records.median_range(sp["corgipile_epoch_seconds"]),
                        "sklearn_epoch_s": records.median_range(sp["sklearn_epoch_seconds"]),
                        "scan_s": records.median_range(sp["scan_seconds"]),
                        "corgipile_div_sklearn": cm / sm, "corgipile_gflops": sp["corgipile_gflops"],
                        "sklearn_gflops": sp["sklearn_gflops"], "corgipile_us_per_row": sp["corgipile_us_per_row"],
                        "sklearn_us_per_row": sp["sklearn_us_per_row"]}
    for key, case in (("predict_array", sp), ("predict_row", res.get("mixed_predict"))):
        if case and "predict_seconds" in case:
            total, net, pm = ratios(case)
            out[key] = {"mlp_div_logistic": total, "net_of_scan_mlp_div_logistic": net,
                        "target_within_2x": "PASS" if total <= 2 else "FAIL",
                        **{f"{k}_s": records.median_range(v) for k, v in case["predict_seconds"].items()}}
    if sp and "memory" in sp:
        base = sp["memory"]["scan only"]["after"]["VmHWM"]
        out["memory_vmhwm_over_scan_mib"] = {k: (sp["memory"][k]["after"]["VmHWM"] - base) / 1024
                                             for k in ("mlp training (1 epoch)", "logistic training (1 epoch)")}
    return out


def predict_only(rows, rounds, epochs):
    """Section 4's array case alone: the speed table, an mlp of `epochs` epochs, the predictions."""
    table = f"bench_clustered_{rows}x18"
    with dvs.connect() as c:
        make_table(c, table, rows, 18)
        mlp_id = c.execute("SELECT corgipile_train(%s, 'mlp', %s)",
                           (table, Jsonb({"label": "label", "features": "features", "epochs": epochs, "seed": 1,
                                          "verbose": False}))).fetchone()[0]
        layers = c.execute("SELECT layers FROM corgipile.models WHERE id = %s", (mlp_id,)).fetchone()[0]
    out = {"table": table, "rows": rows, "layers": layers}
    log_id = array_predict(out, table, mlp_id, rounds)
    with dvs.connect() as c:
        for m in (mlp_id, log_id):
            c.execute("SELECT corgipile_drop_model(%s)", (m,))
    return out


def predict_only_report(res):
    return "\n".join([f"Section 4 of bench/mlp_vs_sklearn.py alone (--predict-only) on commit {res['git_head']} "
                      f"(corgipile {res['extversion']}), {res['rounds']} rounds.", ""]
                     + predict_report(res["speed"], res.get("mixed_predict"))) + "\n"

def mul_adds(layers):
    return sum(layers[i] * layers[i + 1] for i in range(len(layers) - 1))


def predict_rows(case, rows, with_range=True):
    """Table rows of one prediction case: statement, median s (range), µs/row."""
    out = []
    for k in ("mlp", "logistic", "scan"):
        v = case["predict_seconds"][k]
        m = statistics.median(v)
        out.append(f"| `{case['predict_statements'][k]}` ({k}) | {m:.2f} ({min(v):.2f}–{max(v):.2f}) | "
                   f"{1e6 * m / rows:.3f} |")
    return out


def ratios(case):
    pm = {k: statistics.median(v) for k, v in case["predict_seconds"].items()}
    return pm["mlp"] / pm["logistic"], (pm["mlp"] - pm["scan"]) / max(pm["logistic"] - pm["scan"], 1e-9), pm


def predict_report(sp, mixed):
    """Section 4: mlp vs logistic prediction per row, from an array and from a whole row."""
    rows = sp["rows"]
    total, net, pm = ratios(sp)
    d, layers = sp["layers"][0], sp["layers"]
    work = mul_adds(layers) / d  # a logistic model's decision: d multiply-adds
    us = {k: 1e6 * v / rows for k, v in pm.items()}
    L = ["## 4. Prediction: mlp vs logistic, per row", "",
         "The target: a network's prediction within 2x the linear model's. Every statement over every row, no "
         "parallel workers, interleaved in a rotated order; the scan is the floor both predictions pay.", "",
         f"### From a float8[] (`{sp['table']}`, {rows:,} rows x {d}; mlp layers {layers}, logistic on the same table)", "",
         "| statement | median s (range) | µs / row |", "|---|---|---|"] + predict_rows(sp, rows) + [
         "", f"mlp / logistic: **{total:.2f}x** ({'within' if total <= 2 else 'not within'} 2x); net of the scan "
             f"(mlp − scan) / (logistic − scan): **{net:.2f}x**.", "",
         f"The arithmetic: the logistic model's decision is {d} multiply-adds per row; the network's is "
         f"{' + '.join(f'{layers[i]}·{layers[i + 1]}' for i in range(len(layers) - 1))} = {mul_adds(layers):,} "
         f"multiply-adds plus {sum(layers[1:-1])} activations, {work:.0f}x the logistic model's. Net of the scan the "
         f"network costs {us['mlp'] - us['scan']:.3f} µs per row against the logistic model's "
         f"{us['logistic'] - us['scan']:.3f} µs: {net:.1f}x the time for {work:.0f}x the arithmetic"
         + (". Within 2x of the whole statement only because reading the row is most of the logistic model's time."
            if total <= 2 else
            f". 2x of the whole statement leaves the network {max(2 * us['logistic'] - us['scan'], 0):.3f} µs per "
            f"row beyond the scan, {mul_adds(layers) / max(2 * us['logistic'] - us['scan'], 1e-9) / 1e3:.1f} "
            "multiply-adds per ns on one core.")]
    if mixed:
        mt, mn, mpm = ratios(mixed)
        mrows = mixed["rows"]
        mus = {k: 1e6 * v / mrows for k, v in mpm.items()}
        ml = mixed["layers"]
        L += ["", f"### From a whole row (`{mixed['table']}`: mixed_nl's training table `{mixed['train']}` x "
                  f"{mixed['copies']}, {mrows:,} rows; text, boolean and numeric columns with NULLs)", "",
              f"Both models trained on `{mixed['train']}` ({mixed['epochs']} epochs, params as in section 1; "
              f"{mixed['n_features']} encoded features, mlp layers {ml}). The scan builds the same row value the "
              "row form receives (`num_nonnulls(t.*)` deforms every column); the predictions also look up the "
              "model's columns and encode the row (categories, imputation) before the arithmetic.", "",
              "| statement | median s (range) | µs / row |", "|---|---|---|"] + predict_rows(mixed, mrows) + [
              "", f"mlp / logistic: **{mt:.2f}x** ({'within' if mt <= 2 else 'not within'} 2x); net of the scan: "
                  f"**{mn:.2f}x** ({mus['mlp'] - mus['scan']:.3f} vs {mus['logistic'] - mus['scan']:.3f} µs per row; "
                  f"the encoded row is sparse (one-hot categories), so the network's first layer reads only its "
                  f"non-zeros: at most {mul_adds(ml):,} multiply-adds against the logistic model's at most "
                  f"{mixed['n_features']}; encoding the row is the same for both)."]
    return L


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=20, help="epochs of part 1-2 (default 20: corgipile's default)")
    ap.add_argument("--seeds", default="1-3")
    ap.add_argument("--only", default=None, help=f"datasets (default {','.join(DATASETS)})")
    ap.add_argument("--rows", type=int, default=4_500_000, help="rows of the speed table")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--speed-epochs", type=int, default=2)
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--no-perf", action="store_true")
    ap.add_argument("--predict-copies", type=int, default=20,
                    help="copies of mixed_nl's training rows in the table of the whole-row prediction (default 20)")
    ap.add_argument("--predict-only", action="store_true",
                    help="only section 4 (prediction): no accuracy, epoch speed or memory; write with --out elsewhere")
    ap.add_argument("--out", default=OUT, help="results path without extension")
    args = ap.parse_args()
    import sklearn
    started = time.perf_counter()
    version = dvs.retrying(dvs.setup_database)
    with dvs.connect() as c:
        lib = installed_library(c)
        origin = provenance.line(c, "bench-mlp")
    head = subprocess.run(["git", "-C", dvs.REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    res = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "git_head": head, "extversion": version, "library": lib,
           "sklearn_version": sklearn.__version__, "numpy_version": np.__version__, "epochs": args.epochs,
           "seeds": dvs.parse_seeds(args.seeds), "rounds": args.rounds, "speed_epochs": args.speed_epochs,
           "datasets": []}
    if args.predict_only:
        res["speed"] = predict_only(args.rows, args.rounds, args.speed_epochs)
    else:
        for key in (args.only.split(",") if args.only else DATASETS):
            res["datasets"].append(run_dataset(key, res["seeds"], args.epochs))
        if not args.skip_speed:
            res["speed"] = speed_and_memory(args.rows, args.rounds, args.speed_epochs, not args.no_perf)
    if args.predict_only or not args.skip_speed:
        res["mixed_predict"] = mixed_predict(args.rounds, args.epochs, args.predict_copies)
    with dvs.connect() as c:
        res["library_at_end"] = installed_library(c)
        installed = records.server(c)
    res["total_seconds"] = time.perf_counter() - started
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(res, f, indent=1, default=str)
    text = origin + "\n\n" + (predict_only_report(res) if args.predict_only else report(res))
    if res["library_at_end"] != lib:
        text += "\n**The library was reinstalled during the run.**\n"
    with open(args.out + ".md", "w") as f:
        f.write(text)
    print(text)
    records.append_record("mlp_vs_sklearn_predict" if args.predict_only else "mlp_vs_sklearn", figures(res),
                          make_target="bench-mlp", results_file=args.out + ".md",
                          config={"epochs": args.epochs, "seeds": res["seeds"], "datasets": [d["dataset"] for d in res["datasets"]],
                                  "rows": args.rows, "rounds": args.rounds, "speed_epochs": args.speed_epochs,
                                  "skip_speed": args.skip_speed, "predict_copies": args.predict_copies}, **installed)
    log(f"done in {res['total_seconds']:.0f} s")


if __name__ == "__main__":
    main()
