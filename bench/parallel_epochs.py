#!/usr/bin/env python3
"""Epoch time and accuracy of parallel training ("workers") against one process, side by side in
one run: configurations rotated over several rounds on the label-clustered 4.5M x 18 table, with
medians and ranges, and the per-tuple costs of reading/decoding and of SGD that bound scaling.

Usage: bench/parallel_epochs.py [--rows 4500000] [--features 18] [--epochs 3] [--rounds 3] [--out FILE]
Needs PGHOST/PGPORT/PGUSER for a cluster with corgipile installed (make bench-parallel does it)."""

import argparse
import os
import re
import statistics

import psycopg

import provenance
import records
from psycopg.types.json import Jsonb

from epoch_times import make_table

CONFIGS = [
    ("1 process, double buffer (default)", {"workers": 0, "double_buffer": True}),
    ("1 process, single buffer", {"workers": 0, "double_buffer": False}),
    ("workers 1, double buffer", {"workers": 1, "double_buffer": True}),
    ("workers 1, single buffer", {"workers": 1, "double_buffer": False}),
    ("workers 2, double buffer", {"workers": 2, "double_buffer": True}),
    ("workers 2, single buffer", {"workers": 2, "double_buffer": False}),
]


def train(conn, table, epochs, params):
    p = {"epochs": epochs, "seed": 1, "verbose": False, **params}
    model_id = conn.execute("SELECT corgipile_train(%s, 'svm', %s)", (table, Jsonb(p))).fetchone()[0]
    secs = [r[0] for r in conn.execute(
        "SELECT seconds FROM corgipile.epochs WHERE model_id = %s ORDER BY epoch", (model_id,))]
    acc = conn.execute(f"SELECT (corgipile_evaluate({model_id}, '{table}')->>'accuracy')::float8").fetchone()[0]
    return secs, acc


def explain_value(lines, label):
    for line in lines:
        m = re.search(rf"{label}: ([0-9.]+)", line)
        if m:
            return float(m.group(1))
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4_500_000)
    ap.add_argument("--features", type=int, default=18)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="bench/results/parallel_epochs.md")
    args = ap.parse_args()
    table = f"bench_clustered_{args.rows}x{args.features}"
    results = {name: ([], []) for name, _ in CONFIGS}
    with psycopg.connect(autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS corgipile")
        conn.execute("ALTER EXTENSION corgipile UPDATE")
        conn.execute("SET max_parallel_workers_per_gather = 0")
        make_table(conn, table, args.rows, args.features)
        conn.execute(f"SELECT count(*) FROM {table}")  # warm the cache
        for r in range(args.rounds):
            # Rotated, so that no configuration always runs first or last in a round.
            order = CONFIGS[r % len(CONFIGS):] + CONFIGS[: r % len(CONFIGS)]
            for name, params in order:
                secs, acc = train(conn, table, args.epochs, params)
                results[name][0].extend(secs)
                results[name][1].append(acc)
        # The SGD step's own cost: the SGD thread's busy time in a double-buffered EXPLAIN
        # ANALYZE run (EXPLAIN reads rows through the executor, which costs the reader more,
        # not the SGD thread).
        p = {"epochs": args.epochs, "seed": 1, "double_buffer": True}
        lines = [r[0] for r in conn.execute(
            "SELECT * FROM corgipile_explain(%s, 'svm', %s, true)", (table, Jsonb(p)))]
        busy = explain_value(lines, "Worker Busy")
        tuples = explain_value(lines, "Tuples Per Epoch")
        server = conn.execute("SHOW server_version").fetchone()[0]
        installed = records.server(conn)
    cores = os.cpu_count()
    base = statistics.median(results[CONFIGS[0][0]][0])
    base_acc = statistics.median(results[CONFIGS[0][0]][1])
    out = [
        f"Table `{table}`: {args.rows:,} rows x {args.features} float8 features, clustered by label; svm, "
        f"{args.epochs} epochs, default block and buffer sizes; {args.rounds} rounds, configurations rotated; "
        f"PostgreSQL {server}, {cores} cores. Accuracy: `corgipile_evaluate` on the whole table.",
        "",
        "| configuration | epoch median s | range s | ÷ 1 process (default) | accuracy (median) | Δ accuracy, points |",
        "|---|---|---|---|---|---|",
    ]
    for name, _ in CONFIGS:
        secs, accs = results[name]
        m = statistics.median(secs)
        a = statistics.median(accs)
        out.append(f"| {name} | {m:.3f} | {min(secs):.3f}–{max(secs):.3f} | {m / base:.2f} | {a:.4f} | "
                   f"{100 * (a - base_acc):+.2f} |")
    two = min((statistics.median(results[n][0]), n) for n, _ in CONFIGS if n.startswith("workers 2"))
    two_acc = statistics.median(results[two[1]][1])
    ok = two[0] / base <= 0.85 and abs(two_acc - base_acc) <= 0.005
    sgd_ns = 1e9 * busy / (tuples * args.epochs) if busy and tuples else float("nan")
    # One single-buffered process does everything on one thread: what is not SGD is reading,
    # decoding and shuffling.
    single_ns = 1e9 * statistics.median(results[CONFIGS[1][0]][0]) / args.rows
    reader_ns = single_ns - sgd_ns
    out += [
        "",
        "| target (issue #16) | result | measured |",
        "|---|---|---|",
        f"| `\"workers\": 2` epoch ≤ 0.85 × one process, accuracy within 0.5 points | {'PASS' if ok else 'FAIL'} | "
        f"{two[0] / base:.2f}× ({two[1]}), {100 * (two_acc - base_acc):+.2f} points |",
        "",
        f"Per-tuple costs: one single-buffered process {single_ns:.0f} ns/tuple in all, of which the SGD step "
        f"{sgd_ns:.0f} ns (the SGD thread's busy time, EXPLAIN ANALYZE) and reading, decoding and shuffling "
        f"{reader_ns:.0f} ns.",
    ]
    text = "\n".join(out) + "\n"
    print(text)
    provenance.write(args.out, text, "bench-parallel")
    finite = lambda x: x if x == x else None  # noqa: E731  (NaN when EXPLAIN showed no busy time)
    records.append_record("parallel_epochs", {
        "configs": {name: {**records.median_range(results[name][0]),
                           "div_one_process": statistics.median(results[name][0]) / base,
                           "accuracy": statistics.median(results[name][1]),
                           "accuracy_delta_points": 100 * (statistics.median(results[name][1]) - base_acc)}
                    for name, _ in CONFIGS},
        "workers2_best_div_one_process": two[0] / base,
        "workers2_best": two[1],
        "workers2_accuracy_delta_points": 100 * (two_acc - base_acc),
        "targets": records.pass_fail(out),
        "single_buffer_ns_per_tuple": single_ns,
        "sgd_ns_per_tuple": finite(sgd_ns),
        "reader_ns_per_tuple": finite(reader_ns),
    }, make_target="bench-parallel", results_file=args.out,
        config={"rows": args.rows, "features": args.features, "epochs": args.epochs, "rounds": args.rounds}, **installed)


if __name__ == "__main__":
    main()
