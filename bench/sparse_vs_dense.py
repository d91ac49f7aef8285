#!/usr/bin/env python3
"""Per-tuple training time of a sparse model with 1,000,000 dimensions (~40 non-zeros per row)
next to a dense 40-feature model, same rows, same run, single- and double-buffered (lazy
regularization must make the dimension cost nothing).

Usage: bench/sparse_vs_dense.py [--rows 300000] [--out FILE]   (PGHOST/PGPORT/PGUSER set)"""

import argparse
import statistics

import psycopg
from psycopg.types.json import Jsonb

DIMS, NNZ = 1_000_000, 40
MODES = (("single-buffered", False), ("double-buffered", True))
MODELS = (
    ("dense, 40 features", "bench_dense", {}),
    ("sparse, 40 dimensions", "bench_sparse40", {"features": {"indices": "idx", "values": "val"}, "n_features": NNZ}),
    ("sparse, 1,000,000 dimensions", "bench_sparse", {"features": {"indices": "idx", "values": "val"}, "n_features": DIMS}),
)


def make_tables(c, rows):
    """bench_sparse (1M dims), bench_sparse40 and bench_dense: the same values three ways.

    Each table is written once by CREATE TABLE AS, so all three are compact (an UPDATE would
    leave the sparse table with dead tuples and more pages than the others to scan)."""
    c.execute("DROP TABLE IF EXISTS bench_sparse, bench_dense, bench_sparse40")
    c.execute("SELECT setseed(0.3)")
    # Sparse: per row, ~40 distinct sorted indices drawn from 1..1,000,000 and values around +-1.
    # The sublinks refer to the outer row (i, idx, label): an uncorrelated one would be run
    # once, giving every row the same indices. OFFSET 0 keeps idx computed once per row.
    c.execute(f"""CREATE TABLE bench_sparse AS
        SELECT id, label, idx,
               ARRAY(SELECT (CASE WHEN label = 1 THEN 0.2 ELSE -0.2 END) + random() - 0.5
                     FROM generate_series(1, cardinality(idx))) AS val
        FROM (SELECT i AS id, (i % 2) AS label,
                     ARRAY(SELECT DISTINCT (1 + floor(random() * {DIMS}))::int4
                           FROM generate_series(1, {NNZ} + 0 * i) ORDER BY 1) AS idx
              FROM generate_series(1, {rows}) i OFFSET 0) s""")
    c.execute(f"""CREATE TABLE bench_dense AS SELECT id, label, val[1:{NNZ}] || array_fill(0.0::float8, ARRAY[{NNZ} - cardinality(val)]) AS features
                  FROM bench_sparse""")
    # The same values as a sparse model over 40 dimensions: isolates the cost of the dimension.
    c.execute(f"""CREATE TABLE bench_sparse40 AS SELECT id, label, ARRAY(SELECT generate_series(1, cardinality(val)))::int4[] AS idx, val
                  FROM bench_sparse""")
    c.execute("VACUUM ANALYZE bench_sparse, bench_dense, bench_sparse40")
    distinct = c.execute("SELECT count(DISTINCT idx) FROM bench_sparse").fetchone()[0]
    assert distinct > rows * 0.99, f"sparse rows should have their own indices, got {distinct} distinct"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=300_000)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--l2", type=float, default=1e-4)
    ap.add_argument("--reuse", action="store_true", help="keep the tables of a previous run")
    ap.add_argument("--out", default="bench/results/sparse_vs_dense.md")
    args = ap.parse_args()
    with psycopg.connect(autocommit=True) as c:
        c.execute("CREATE EXTENSION IF NOT EXISTS corgipile")
        # A database created by an older corgipile needs its SQL objects updated.
        c.execute("ALTER EXTENSION corgipile UPDATE")
        reuse = args.reuse and c.execute("SELECT to_regclass('bench_sparse40') IS NOT NULL").fetchone()[0]
        if not reuse:
            make_tables(c, args.rows)
        # Rounds interleave the six trainings, so a slow spell of this shared machine hits
        # every model alike; ratios are taken within a round.
        results = {}  # (mode, name) -> [per round: ns per tuple of each epoch]
        for _ in range(args.rounds):
            for mode, double in MODES:
                for name, table, params in MODELS:
                    p = {"epochs": args.epochs, "seed": 1, "verbose": False, "l2": args.l2, "double_buffer": double, **params}
                    model_id = c.execute("SELECT corgipile_train(%s, 'logistic', %s)", (table, Jsonb(p))).fetchone()[0]
                    results.setdefault((mode, name), []).append([r[0] / r[1] * 1e9 for r in c.execute(
                        "SELECT seconds, tuples FROM corgipile.epochs WHERE model_id = %s ORDER BY epoch", (model_id,))])
                    c.execute("SELECT corgipile_drop_model(%s)", (model_id,))
    lines = [f"{args.rows:,} rows, ~{NNZ} non-zeros per row (each row its own random indices), logistic, "
             f"l2 = {args.l2}, {args.epochs} epochs, {args.rounds} interleaved rounds; epoch time (training pass, "
             "scan included) per tuple, over all epochs of all rounds.", "",
             "| mode | model | median ns per tuple | range |", "|---|---|---|---|"]
    for (mode, name), rounds in results.items():
        v = [x for r in rounds for x in r]
        lines.append(f"| {mode} | {name} | {statistics.median(v):.0f} | {min(v):.0f}–{max(v):.0f} |")
    lines += ["", "Ratios of the per-round medians (median of the rounds, range):", ""]
    for mode, _ in MODES:
        dense, sparse40, sparse = ([statistics.median(r) for r in results[mode, name]] for name, _, _ in MODELS)
        for label, num, den in (("sparse 1M ÷ dense 40", sparse, dense), ("sparse 1M ÷ sparse 40", sparse, sparse40)):
            ratios = [a / b for a, b in zip(num, den)]
            lines.append(f"- {mode}: {label} = **{statistics.median(ratios):.2f}** ({min(ratios):.2f}–{max(ratios):.2f})")
    text = "\n".join(lines) + "\n"
    print(text)
    with open(args.out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
