#!/usr/bin/env python3
"""Defaults that train enough: corgipile's default network against its 0.5.0 default and scikit-learn.

The table (generated here, numpy seed --data-seed): 22 classes read from 3 numeric columns on raw
scales, as an accelerometer's (x·9.81, y·3 + 1, z·100 + 50 of points uniform in a cube), the class
of a point that of the nearest of 132 random centres (6 per class: each class is a union of
cells a network must carve out), 30% of labels redrawn at random. 75,000 rows: the first 60,000
the training table (stored clustered by label, as tables often are), the rest the test table.
On 60,000 rows scikit-learn's MLPClassifier(64) reaches 0.52 with early stopping (136 epochs) and
0.39 after 20 epochs: a fixed 20 epochs, corgipile's default before, undertrains it.

Arms, each scored on the test table (accuracy), --seeds seeds each:
  corgipile mlp, default         {"features": [...], "label": "activity"}: since this change a
                                 network holds out 10% and stops on it ("patience": "auto", at
                                 most 200 epochs), keeping its best epoch
  corgipile mlp, 20 epochs       the same with "epochs": 20 (the 0.5.0 default's epochs; a
                                 network's default buffer now holds at least 16 MB of the table,
                                 here all of it: with 0.5.0's 10% buffer this arm measured
                                 0.2883, the records of builds before 41c28a6)
  sklearn MLP(64), early stop    MLPClassifier((64,), early_stopping=True) on standardized rows
  sklearn MLP(64), 20 epochs     the same with max_iter=20 and no early stopping
A big table (--big-rows, 4,500,000; 0 skips it): bench-ple's table of 18 float8 columns (f_k
uniform in [0, k) plus 0.3 for the positive class, a boolean label, stored clustered by label):
the default mlp must not pay 200 passes. Reported: epochs run, the epoch of the model kept,
seconds, held-out accuracy (the validation rows' measure stored with the model), one seed.
Seconds: the corgipile_train statement; the sklearn fit on rows in memory. Epochs: corgipile's
epochs_run, sklearn's n_iter_.

Usage: bench/stopping_defaults.py [--seeds 3] [--big-rows 4500000] [--out bench/results/stopping_defaults.md]
Writes the results file and one record (bench/results/runs/stopping_defaults.jsonl)."""
import argparse
import os
import statistics
import sys
import time
import warnings

import numpy as np
import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import records  # noqa: E402

DBNAME = "corgipile_bench_defaults"
COLUMNS = ["ax", "ay", "az"]
TRAIN_ROWS = 60_000


def log(msg):
    print(f"[defaults {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def generate(n=75_000, seed=7, k=22, cells=6, noise=0.3):
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-1, 1, (k * cells, 3))
    x = rng.uniform(-1, 1, (n, 3))
    y = (((x[:, None, :] - centres[None, :, :]) ** 2).sum(-1).argmin(1) % k)
    flip = rng.random(n) < noise
    y[flip] = rng.integers(0, k, flip.sum())
    return x * np.array([9.81, 3.0, 100.0]) + np.array([0.0, 1.0, 50.0]), y


def setup(x, y, sig):
    with psycopg.connect(dbname="postgres", autocommit=True) as c:
        if not c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DBNAME,)).fetchone():
            c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DBNAME)))
    conn = psycopg.connect(dbname=DBNAME, autocommit=True)
    conn.execute("SET client_min_messages = warning")
    conn.execute("CREATE EXTENSION IF NOT EXISTS corgipile")
    conn.execute("ALTER EXTENSION corgipile UPDATE")
    made = conn.execute("SELECT obj_description(to_regclass('acc_train'), 'pg_class')").fetchone()[0]
    if made != sig:
        for table, rows in (("acc_train", range(TRAIN_ROWS)), ("acc_test", range(TRAIN_ROWS, len(y)))):
            conn.execute(f"DROP TABLE IF EXISTS {table}")
            conn.execute(f"CREATE TABLE {table} (id int, ax float8, ay float8, az float8, activity int)")
            order = sorted(rows, key=lambda i: (y[i], i)) if table == "acc_train" else list(rows)
            with conn.cursor().copy(f"COPY {table} FROM STDIN") as cp:
                for i in order:
                    cp.write_row((i, *map(float, x[i]), int(y[i])))
            conn.execute(f"VACUUM ANALYZE {table}")
        conn.execute(sql.SQL("COMMENT ON TABLE acc_train IS {}").format(sql.Literal(sig)))
    return conn


def corgipile_arm(conn, params, seed):
    p = dict(params, features=COLUMNS, label="activity", seed=seed, verbose=False)
    start = time.time()
    model = conn.execute("SELECT corgipile_train('acc_train', 'mlp', %s)", (Jsonb(p),)).fetchone()[0]
    seconds = time.time() - start
    acc = float(conn.execute("SELECT corgipile_evaluate(%s, 'acc_test')->>'accuracy'", (model,)).fetchone()[0])
    epochs = conn.execute("SELECT (metrics->>'epochs_run')::int FROM corgipile.models WHERE id = %s",
                          (model,)).fetchone()[0]
    return acc, epochs, seconds


def big_table(conn, rows):
    """The default mlp on a big table: (epochs run, best epoch, seconds, validation accuracy)."""
    conn.execute("DROP TABLE IF EXISTS big")
    conn.execute("SELECT setseed(0.5)")
    cols = ", ".join(f"(random() * {k} + (i % 2) * 0.3)::float8 AS f{k}" for k in range(1, 19))
    conn.execute(f"CREATE TABLE big AS SELECT i AS id, (i % 2 = 1) AS y, {cols} "
                 f"FROM generate_series(1, {rows}) i ORDER BY i % 2, i")
    conn.execute("VACUUM ANALYZE big")
    p = {"label": "y", "features": [f"f{k}" for k in range(1, 19)], "seed": 1, "verbose": False}
    start = time.time()
    model = conn.execute("SELECT corgipile_train('big', 'mlp', %s)", (Jsonb(p),)).fetchone()[0]
    seconds = time.time() - start
    metrics = conn.execute("SELECT metrics FROM corgipile.models WHERE id = %s", (model,)).fetchone()[0]
    conn.execute("DROP TABLE big")
    validation = metrics.get("validation") or {}
    return (metrics.get("epochs_run"), metrics.get("best_epoch"), seconds,
            validation.get("accuracy") if isinstance(validation, dict) else None, metrics)


def sklearn_arm(x, y, xt, yt, seed, early):
    from sklearn.neural_network import MLPClassifier
    from sklearn.preprocessing import StandardScaler
    s = StandardScaler().fit(x)
    kw = dict(early_stopping=True, max_iter=200) if early else dict(max_iter=20, n_iter_no_change=10_000)
    start = time.time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = MLPClassifier((64,), random_state=seed, **kw).fit(s.transform(x), y)
    return m.score(s.transform(xt), yt), m.n_iter_, time.time() - start


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--big-rows", type=int, default=4_500_000)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "stopping_defaults.md"))
    args = ap.parse_args()
    x, y = generate()
    conn = setup(x, y, "stopping_defaults v1 seed 7")
    xt, yt = x[TRAIN_ROWS:], y[TRAIN_ROWS:]
    xs, ys = x[:TRAIN_ROWS], y[:TRAIN_ROWS]
    arms = {
        "corgipile mlp, default": lambda s: corgipile_arm(conn, {}, s),
        "corgipile mlp, 20 epochs": lambda s: corgipile_arm(conn, {"epochs": 20}, s),
        "sklearn MLP(64), early stop": lambda s: sklearn_arm(xs, ys, xt, yt, s, True),
        "sklearn MLP(64), 20 epochs": lambda s: sklearn_arm(xs, ys, xt, yt, s, False),
    }
    results = {}
    for name, run in arms.items():
        results[name] = []
        for seed in range(1, args.seeds + 1):
            acc, epochs, seconds = run(seed)
            log(f"{name} seed {seed}: accuracy {acc:.4f}, {epochs} epochs, {seconds:.1f} s")
            results[name].append((acc, epochs, seconds))
    lines = [
        "# Defaults that train enough: 22 classes, 3 columns (`make bench-stopping`)",
        "",
        f"Generated by `bench/stopping_defaults.py` (see its docstring); {args.seeds} seeds, medians "
        "(min–max). Training table 60,000 rows stored clustered by label, test table 15,000 rows.",
        "",
        "| arm | test accuracy | epochs | seconds |",
        "|---|---|---|---|",
    ]
    figures = {}
    for name, rs in results.items():
        acc, ep, sec = ([r[i] for r in rs] for i in range(3))
        lines.append(f"| {name} | {statistics.median(acc):.4f} ({min(acc):.4f}–{max(acc):.4f}) | "
                     f"{statistics.median(ep):g} ({min(ep)}–{max(ep)}) | {statistics.median(sec):.1f} |")
        key = name.replace(",", "").replace("(", "").replace(")", "").replace(" ", "_").lower()
        figures[key] = {"accuracy": records.median_range(acc), "epochs": records.median_range(ep),
                        "seconds": records.median_range(sec)}
    if args.big_rows:
        epochs, best, seconds, accuracy, metrics = big_table(conn, args.big_rows)
        log(f"big table: {epochs} epochs, best {best}, {seconds:.0f} s, metrics {metrics}")
        lines += ["", f"A big table: the default mlp on {args.big_rows:,} rows × 18 float8 columns stored clustered by "
                  "label (bench-ple's table), seed 1.", "",
                  "| epochs run | epoch kept | seconds | validation accuracy |", "|---|---|---|---|",
                  f"| {epochs} | {best} | {seconds:.0f} | {accuracy} |"]
        figures["big_table"] = {"rows": args.big_rows, "epochs": epochs, "best_epoch": best, "seconds": seconds,
                                "validation_accuracy": accuracy}
    text = "\n".join(lines) + "\n"
    print(text)
    with open(args.out, "w") as f:
        f.write(text)
    records.append_record("stopping_defaults", figures, conn=conn, results_file=args.out,
                          make_target="bench-stopping", config={"seeds": args.seeds, "rows": TRAIN_ROWS, "big_rows": args.big_rows})


if __name__ == "__main__":
    main()
