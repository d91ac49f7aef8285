#!/usr/bin/env python3
"""What piecewise-linear encoding costs: an epoch and the statistics pass, with and without it.

The table (generated in SQL, setseed 0.5): --rows rows (4,500,000 as bench-mlp's speed table) of
18 float8 columns f1..f18 (f_k uniform in [0, k) plus 0.3 for the positive class) and a boolean
label, stored clustered by label. Arms, interleaved over --rounds rounds (each a fresh training
of --epochs epochs, seed 1, default params otherwise):
  mlp, plain       {"features": [f1..f18], "preprocess": {"*": {"encode": "none"}}}: each column
                   one standardized feature (a network's default before piecewise-linear bins)
  mlp, ple         the same with "preprocess": {"*": {"encode": "ple"}} (16 bins each: 288
                   features, about 150 of them non-zero in a row; a network's default now)
  logistic, plain / logistic, ple   the same two for the linear model
Edges from a sample: a linear model's statistics pass reads a sample of the blocks (at least 5%,
`"statistics": "sample"`, the default) where the table is big; its quantile sketch then sees the
sample only. On a second table (--band-rows rows, 2,000,000: x exponential with mean 30, y = x in
[20, 45), 10% of labels flipped, stored clustered by label) logistic with "ple" on x is trained
with "statistics": "sample" and "exact" (--rounds seeds each) and evaluated on a held-out table
of 200,000 rows: accuracy, and each inner edge's rank error against the exact quantile.
Figures: an epoch's seconds (corgipile.epochs.seconds, reading included; the median over a
training's epochs, then over rounds), the statistics pass's seconds (metrics
statistics_seconds) and its share of a plain and of a ple epoch; the ple / plain ratio of an
epoch per kind. Targets (#54): ple adds at most 30% to an epoch; the statistics pass with the
sketches at most 0.15 of an epoch.

Usage: bench/ple_cost.py [--rows 4500000] [--rounds 3] [--epochs 2] [--out bench/results/ple_cost.md]
Writes the results file and one record (bench/results/runs/ple_cost.jsonl)."""
import argparse
import os
import statistics
import sys
import time

import psycopg
from psycopg.types.json import Jsonb

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import provenance  # noqa: E402
import records  # noqa: E402

DBNAME = "corgipile_bench_ple"
FEATURES = [f"f{k}" for k in range(1, 19)]
ARMS = [("mlp", "plain"), ("mlp", "ple"), ("logistic", "plain"), ("logistic", "ple")]


def log(msg):
    print(f"[ple-cost {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def setup(rows):
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DBNAME} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {DBNAME}")
    conn = psycopg.connect(dbname=DBNAME, autocommit=True)
    conn.execute("CREATE EXTENSION corgipile")
    conn.execute("SELECT setseed(0.5)")
    cols = ", ".join(f"(random() * {k} + (i % 2) * 0.3)::float8 AS f{k}" for k in range(1, 19))
    start = time.time()
    conn.execute(f"CREATE TABLE t AS SELECT i AS id, (i % 2 = 1) AS y, {cols} "
                 f"FROM generate_series(1, {rows}) i ORDER BY i % 2, i")
    conn.execute("VACUUM ANALYZE t")
    log(f"table of {rows} rows in {time.time() - start:.0f} s")
    return conn


def band(conn, rows):
    conn.execute("SELECT setseed(0.25)")
    for name, n in (("band", rows), ("band_test", 200_000)):
        conn.execute(f"""CREATE TABLE {name} AS SELECT i AS id, x,
                            ((x >= 20 AND x < 45) <> (random() < 0.1)) AS y
                         FROM (SELECT i, -30 * ln(1 - random()) AS x FROM generate_series(1, {n}) i) s
                         ORDER BY ((x >= 20 AND x < 45) <> (random() < 0.1)), i""")
    conn.execute("VACUUM ANALYZE band")
    conn.execute("VACUUM ANALYZE band_test")


def edges_from(conn, statistics_pass, seed):
    params = {"label": "y", "features": ["x"], "preprocess": {"x": {"encode": "ple"}}, "epochs": 3,
              "seed": seed, "statistics": statistics_pass, "verbose": False}
    m = conn.execute("SELECT corgipile_train('band', 'logistic', %s)", (Jsonb(params),)).fetchone()[0]
    acc = conn.execute("SELECT (corgipile_evaluate(%s, 'band_test')->>'accuracy')::float8", (m,)).fetchone()[0]
    edges = conn.execute("SELECT preprocessing->'columns'->0->'edges' FROM corgipile.models WHERE id = %s",
                         (m,)).fetchone()[0]
    bins = len(edges) - 1
    ranks = conn.execute("SELECT array_agg((SELECT count(*) FILTER (WHERE x < e)::float8 / count(*) FROM band) ORDER BY k) "
                         "FROM unnest(%s::float8[]) WITH ORDINALITY u(e, k)", (edges[1:-1],)).fetchone()[0]
    worst = max(abs(r - (t + 1) / bins) for t, r in enumerate(ranks))
    conn.execute("SELECT corgipile_drop_model(%s)", (m,))
    return acc, worst


def run(conn, kind, encoding, epochs):
    # Each arm says its encoding: a network's default is "ple", a linear model's "none".
    params = {"label": "y", "features": FEATURES, "epochs": epochs, "seed": 1, "verbose": False,
              "preprocess": {"*": {"encode": encoding if encoding == "ple" else "none"}}}
    m = conn.execute("SELECT corgipile_train('t', %s, %s)", (kind, Jsonb(params))).fetchone()[0]
    stats, n_features = conn.execute("SELECT (metrics->>'statistics_seconds')::float8, n_features "
                                     "FROM corgipile.models WHERE id = %s", (m,)).fetchone()
    epochs_s = [r[0] for r in conn.execute("SELECT seconds FROM corgipile.epochs WHERE model_id = %s ORDER BY epoch",
                                           (m,))]
    conn.execute("SELECT corgipile_drop_model(%s)", (m,))
    return statistics.median(epochs_s), stats, n_features


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4_500_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--band-rows", type=int, default=2_000_000)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "ple_cost.md"))
    args = ap.parse_args()
    conn = setup(args.rows)
    results = {arm: [] for arm in ARMS}
    widths = {}
    for r in range(1, args.rounds + 1):
        for kind, enc in ARMS:
            epoch, stats, width = run(conn, kind, enc, args.epochs)
            widths[(kind, enc)] = width
            results[(kind, enc)].append((epoch, stats))
            log(f"round {r} {kind} {enc}: epoch {epoch:.2f} s, statistics {stats:.2f} s, {width} features")
    med = {a: (statistics.median(e for e, _ in rs), statistics.median(s for _, s in rs)) for a, rs in results.items()}
    lines = [
        "# What piecewise-linear encoding costs (`make bench-ple`)",
        "",
        f"Generated by `bench/ple_cost.py` (see its docstring): {args.rows:,} rows × 18 float8 columns stored "
        f"clustered by label; {args.rounds} rounds of a {args.epochs}-epoch training per arm, interleaved; "
        "medians (min–max) over rounds of a training's median epoch.",
        "",
        "| kind | encoding | features | epoch s | statistics pass s | statistics / plain epoch | statistics / this epoch |",
        "|---|---|---|---|---|---|---|",
    ]
    figures = {}
    for kind, enc in ARMS:
        rs = results[(kind, enc)]
        ep, st = [e for e, _ in rs], [s for _, s in rs]
        plain_epoch = med[(kind, "plain")][0]
        lines.append(f"| {kind} | {enc} | {widths[(kind, enc)]} | {statistics.median(ep):.2f} ({min(ep):.2f}–{max(ep):.2f}) | "
                     f"{statistics.median(st):.2f} ({min(st):.2f}–{max(st):.2f}) | "
                     f"{statistics.median(st) / plain_epoch:.2f} | {statistics.median(st) / statistics.median(ep):.2f} |")
        figures[f"{kind}_{enc}"] = {"epoch_seconds": records.median_range(ep), "statistics_seconds": records.median_range(st),
                                    "features": widths[(kind, enc)]}
    lines += ["", "| target | result | measured |", "|---|---|---|"]
    for kind in ("mlp", "logistic"):
        ratio = med[(kind, "ple")][0] / med[(kind, "plain")][0]
        figures[f"{kind}_epoch_ratio"] = ratio
        lines.append(f"| {kind}: a ple epoch at most 1.3× a plain one | {'PASS' if ratio <= 1.3 else 'FAIL'} | {ratio:.2f}× |")
        share = med[(kind, "ple")][1] / med[(kind, "plain")][0]
        figures[f"{kind}_statistics_share"] = share
        lines.append(f"| {kind}: statistics pass with sketches at most 0.15 of a plain epoch | "
                     f"{'PASS' if share <= 0.15 else 'FAIL'} | {share:.2f} |")
    band(conn, args.band_rows)
    lines += ["", f"Edges from a sample: logistic with \"ple\" on x, {args.band_rows:,} rows stored clustered by label, "
              "held-out accuracy on 200,000 rows; medians (min–max) over seeds.", "",
              "| statistics pass | test accuracy | worst edge rank error |", "|---|---|---|"]
    for how in ("sample", "exact"):
        rs = [edges_from(conn, how, seed) for seed in range(1, args.rounds + 1)]
        acc, err = [a for a, _ in rs], [e for _, e in rs]
        log(f"band, statistics {how}: accuracy {acc}, worst rank error {err}")
        lines.append(f"| {how} | {statistics.median(acc):.4f} ({min(acc):.4f}–{max(acc):.4f}) | "
                     f"{statistics.median(err):.4f} ({min(err):.4f}–{max(err):.4f}) |")
        figures[f"band_{how}"] = {"accuracy": records.median_range(acc), "worst_rank_error": records.median_range(err)}
    text = "\n".join(lines) + "\n"
    print(text)
    provenance.write(args.out, text, "bench-ple", dbname=DBNAME)
    records.append_record("ple_cost", figures, conn=conn, results_file=args.out, make_target="bench-ple",
                          config={"rows": args.rows, "rounds": args.rounds, "epochs": args.epochs,
                                  "band_rows": args.band_rows})


if __name__ == "__main__":
    main()
