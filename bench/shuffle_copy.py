#!/usr/bin/env python3
"""A shuffled copy of a table three ways: plain CREATE TABLE AS (no shuffle, the floor), CREATE
TABLE AS ... ORDER BY random(), and corgipile_shuffle; then proof that the corgipile_shuffle copy
trains as well as the ORDER BY random() copy.

Timing: --rounds rounds (default 3); each round runs the three in a rotated order, each on its own
right after a DROP of the previous copy and a CHECKPOINT, so no run pays for the previous one's dirty
pages or WAL. Reported: median, min, max seconds per method (client side, the one statement only),
the ratios of the medians, and the WAL and temp-file bytes each statement wrote.

Accuracy: svm with {"shuffle": "no_shuffle", "epochs": 3, "seed": 1, "verbose": false, "average": false}, trained on the
ORDER BY random() copy, on the corgipile_shuffle copy and on the original (label-clustered) table, each
scored with corgipile_evaluate(model, original) ->> 'accuracy'. The two shuffled copies should agree
within about 0.3 points; the clustered table is the bad baseline.

Usage: bench/shuffle_copy.py [--rows 4500000] [--rounds 3] [--out FILE]
Needs PGHOST/PGPORT/PGUSER for a cluster with corgipile installed (make bench-shuffle does it).
Uses (and creates) the database corgipile_bench_shuffle; the table bench_clustered_{rows}x18 (built as
bench/epoch_times.py builds it) is built once and reused. Skips (exit 0, nothing written) when the data
directory's file system has less than 6x the table's size free."""

import argparse
import datetime
import json
import os
import shutil
import statistics
import time

import psycopg

import provenance
import records
from psycopg import sql
from psycopg.types.json import Jsonb

from cancel_latency import git_head, installed_library, machine
from epoch_times import make_table

DBNAME = "corgipile_bench_shuffle"
FEATURES = 18
DEFAULT_ROWS = 4_500_000
# pg_total_relation_size of bench_clustered_4500000x18 is 970,416,128 bytes: ~216 bytes a row. Used to
# estimate a table not built yet (for the free-disk check).
BYTES_PER_ROW = 216
DISK_FACTOR = 6
SHUFFLE_SEED = 1
SETSEED = 0.5
# The last iterate: averaged iterates (the default) hide what the order does.
TRAIN_PARAMS = {"shuffle": "no_shuffle", "epochs": 3, "seed": 1, "verbose": False, "average": False}


def connect(dbname=DBNAME):
    return psycopg.connect(dbname=dbname, autocommit=True)


def ensure_database():
    with connect("postgres") as c:
        if not c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DBNAME,)).fetchone():
            c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DBNAME)))


def setting(conn, name):
    """SHOW name; None for a name not defined (yet): corgipile's settings exist once this session
    has loaded the library."""
    return conn.execute("SELECT current_setting(%s, true)", (name,)).fetchone()[0]


def pretty(n):
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def data_directory(conn):
    """The data directory (temp files and the new tables go there: temp_tablespaces and
    default_tablespace are checked to be empty), or None if this role may not see it."""
    try:
        return setting(conn, "data_directory")
    except psycopg.Error:
        return None


def drop(conn, table):
    conn.execute(f"DROP TABLE IF EXISTS {table}")


def stats_bytes(conn):
    """(WAL insert position in bytes, temp bytes written in this database so far)."""
    # pg_stat_force_next_flush: this backend's pending temp-file counts are flushed when this
    # statement ends, so the next statement sees them.
    conn.execute("SELECT pg_stat_force_next_flush()")
    return conn.execute(
        "SELECT pg_current_wal_insert_lsn() - '0/0', temp_bytes FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()


def run_plain(conn, src, dst):
    return conn.execute(f"CREATE TABLE {dst} AS SELECT * FROM {src}").rowcount


def prepare_order_by(conn):
    conn.execute("SET synchronize_seqscans = off")
    conn.execute("SELECT setseed(%s)", (SETSEED,))


def run_order_by(conn, src, dst):
    return conn.execute(f"CREATE TABLE {dst} AS SELECT * FROM {src} ORDER BY random()").rowcount


def run_pile(conn, src, dst):
    return conn.execute("SELECT corgipile_shuffle(%s, %s, %s)", (src, dst, Jsonb({"seed": SHUFFLE_SEED}))).fetchone()[0]


METHODS = [
    # (key, label in the table, prepare (untimed), run (timed; returns the row count))
    ("plain", "(a) `CREATE TABLE c AS SELECT * FROM t` (plain copy, no shuffle)", None, run_plain),
    ("order_by", "(b) `CREATE TABLE c AS SELECT * FROM t ORDER BY random()`", prepare_order_by, run_order_by),
    ("pile", f"(c) `SELECT corgipile_shuffle('t', 'c', '{{\"seed\": {SHUFFLE_SEED}}}')`", None, run_pile),
]


def label_runs(conn, table):
    """Runs of equal labels in storage (ctid) order: 2 for the clustered table, about rows / 2 for
    a uniform shuffle of a half/half table."""
    return conn.execute(
        f"""SELECT count(*) FROM (SELECT label, lag(label) OVER (ORDER BY ctid) AS prev FROM {table}) s
            WHERE prev IS DISTINCT FROM label"""
    ).fetchone()[0]


def train_and_score(conn, train_table, score_table, name):
    p = {**TRAIN_PARAMS, "name": name}
    model_id = conn.execute("SELECT corgipile_train(%s, 'svm', %s)", (train_table, Jsonb(p))).fetchone()[0]
    acc = conn.execute("SELECT (corgipile_evaluate(%s, %s) ->> 'accuracy')::float8", (model_id, score_table)).fetchone()[0]
    return model_id, acc


def plan_summary(conn, query):
    """The node types of the plan, top down: 'Sort > Seq Scan'."""
    plan = conn.execute(f"EXPLAIN (FORMAT JSON) {query}").fetchone()[0][0]["Plan"]
    nodes = []
    while plan:
        nodes.append(plan["Node Type"])
        plan = (plan.get("Plans") or [None])[0]
    return " > ".join(nodes)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=DEFAULT_ROWS, help=f"rows of the table (default {DEFAULT_ROWS:,})")
    ap.add_argument("--rounds", type=int, default=3, help="timing rounds, each runs all three (default 3)")
    ap.add_argument("--out", help="default bench/results/shuffle_copy.md, or shuffle_copy_{rows}.md for other --rows")
    args = ap.parse_args()
    if args.out is None:
        args.out = ("bench/results/shuffle_copy.md" if args.rows == DEFAULT_ROWS
                    else f"bench/results/shuffle_copy_{args.rows}.md")
    table = f"bench_clustered_{args.rows}x{FEATURES}"
    copy = f"shuffle_copy_c_{args.rows}"
    copy_order_by = f"shuffle_copy_order_by_{args.rows}"
    copy_pile = f"shuffle_copy_pile_{args.rows}"
    started = time.perf_counter()
    head = git_head()  # at the start: the tree may move while the benchmark runs
    warnings = []

    ensure_database()
    with connect() as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS corgipile")
        # A database created by an older corgipile needs its SQL objects updated.
        conn.execute("ALTER EXTENSION corgipile UPDATE")
        for t in (copy, copy_order_by, copy_pile):  # left over by an interrupted run
            drop(conn, t)

        # Free disk: the table, a copy, the sort's or the piles' temp files, the WAL, and the two
        # copies kept for the accuracy part, with room to spare.
        exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()[0]
        size = (conn.execute("SELECT pg_total_relation_size(%s)", (table,)).fetchone()[0] if exists
                else args.rows * BYTES_PER_ROW)
        datadir = data_directory(conn)
        disk = shutil.disk_usage(datadir or "/")
        if disk.free < DISK_FACTOR * size:
            print(f"shuffle_copy: skipped: {pretty(disk.free)} free on the file system of {datadir or '/'}, "
                  f"less than {DISK_FACTOR}x the {'size' if exists else 'estimated size'} of {table} "
                  f"({pretty(size)} -> {pretty(DISK_FACTOR * size)} needed)", flush=True)
            return
        for name in ("temp_tablespaces", "default_tablespace"):
            if setting(conn, name):
                warnings.append(f"{name} = '{setting(conn, name)}': the free-disk check looked at the data directory only")

        t0 = time.perf_counter()
        make_table(conn, table, args.rows, FEATURES)
        build_s = time.perf_counter() - t0
        size = conn.execute("SELECT pg_total_relation_size(%s)", (table,)).fetchone()[0]
        print(f"table {table}: {pretty(size)} (ready in {build_s:.1f} s)", flush=True)

        pg_version = setting(conn, "server_version")
        ext_version = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'corgipile'").fetchone()[0]
        library = installed_library(conn)
        plans = {
            "plain": plan_summary(conn, f"SELECT * FROM {table}"),
            "order_by": plan_summary(conn, f"SELECT * FROM {table} ORDER BY random()"),
        }

        # synchronize_seqscans off for every method (a scan must start at block 0 for the plain copy
        # to be in storage order and for setseed to make ORDER BY random() repeatable).
        conn.execute("SET synchronize_seqscans = off")
        conn.execute(f"SELECT count(*) FROM {table}")  # warm the cache

        times = {key: [] for key, *_ in METHODS}
        wal = {key: [] for key, *_ in METHODS}
        temp = {key: [] for key, *_ in METHODS}
        for r in range(args.rounds):
            k = r % len(METHODS)
            for key, _label, prepare, run in METHODS[k:] + METHODS[:k]:
                drop(conn, copy)
                conn.execute("CHECKPOINT")
                if prepare:
                    prepare(conn)
                wal0, temp0 = stats_bytes(conn)
                t0 = time.perf_counter()
                n = run(conn, table, copy)
                secs = time.perf_counter() - t0
                wal1, temp1 = stats_bytes(conn)
                times[key].append(secs)
                wal[key].append(int(wal1 - wal0))
                temp[key].append(int(temp1 - temp0))
                if n != args.rows:
                    warnings.append(f"round {r + 1}, {key}: {n} rows copied, not {args.rows}")
                print(f"round {r + 1}: {key}: {secs:.3f} s (WAL {pretty(wal1 - wal0)}, temp {pretty(temp1 - temp0)})",
                      flush=True)
        drop(conn, copy)
        conn.execute("CHECKPOINT")

        # Accuracy: one copy each way (untimed), trained on in storage order, scored on the original.
        prepare_order_by(conn)
        run_order_by(conn, table, copy_order_by)
        n_pile = run_pile(conn, table, copy_pile)
        if n_pile != args.rows:
            warnings.append(f"accuracy copy: corgipile_shuffle returned {n_pile}, not {args.rows}")
        accuracy = []
        for what, t in (("`ORDER BY random()` copy", copy_order_by),
                        ("`corgipile_shuffle` copy", copy_pile),
                        ("original, clustered by label (no shuffle at all)", table)):
            t0 = time.perf_counter()
            model_id, acc = train_and_score(conn, t, table, f"shuffle_copy_{t}")
            runs = label_runs(conn, t)
            accuracy.append((what, t, model_id, acc, runs))
            print(f"{what}: model {model_id}, accuracy {acc:.4f}, label runs {runs:,} ({time.perf_counter() - t0:.1f} s)",
                  flush=True)
        for t in (copy_order_by, copy_pile):
            drop(conn, t)
        if installed_library(conn) != library:
            warnings.append(f"the installed library changed during the run ({library[0]} was {library[1]}, now "
                            f"{installed_library(conn)[1]}); this session kept the library installed at the start")
        free_after = shutil.disk_usage(datadir or "/").free
        # Read last: corgipile.max_buffer_memory is defined once the library is loaded.
        settings = {n: setting(conn, n) for n in ("shared_buffers", "wal_level", "work_mem", "maintenance_work_mem",
                                                   "max_parallel_workers_per_gather", "max_wal_size",
                                                   "corgipile.max_buffer_memory")}
        installed = records.server(conn)

    shuffled = accuracy[:2]
    gap = abs(shuffled[0][3] - shuffled[1][3]) * 100
    if gap > 0.3:
        warnings.append(f"the two shuffled copies' accuracies differ by {gap:.2f} points (> 0.3)")
    med = {key: statistics.median(v) for key, v in times.items()}
    elapsed = time.perf_counter() - started
    today = datetime.date.today().isoformat()
    lines = [
        "# Shuffled copy of a table: plain copy vs `ORDER BY random()` vs `corgipile_shuffle`",
        "",
        f"{today}, commit `{head}` at the start of the run, corgipile {ext_version} (library `{library[0]}` "
        f"installed {library[1]}), {machine()}, PostgreSQL {pg_version}; shared_buffers {settings['shared_buffers']}, "
        f"wal_level {settings['wal_level']}, work_mem {settings['work_mem']}, maintenance_work_mem "
        f"{settings['maintenance_work_mem']}, max_parallel_workers_per_gather {settings['max_parallel_workers_per_gather']}, "
        f"max_wal_size {settings['max_wal_size']}, corgipile.max_buffer_memory {settings['corgipile.max_buffer_memory']}; "
        f"database `{DBNAME}`.",
        "",
        f"`t` = `{table}`: {args.rows:,} rows x {FEATURES} float8 features (`id int, features float8[], label int`), "
        f"{pretty(size)}, clustered by label (every negative row, then every positive row), built as "
        "bench/epoch_times.py builds it. "
        f"{args.rounds} round(s); each round runs the three in a rotated order, each right after `DROP TABLE c` "
        "and `CHECKPOINT`, in one session with `synchronize_seqscans = off` "
        f"(and `SELECT setseed({SETSEED})` right before (b)). Seconds are client side, the one statement only. "
        "WAL = WAL bytes inserted during the statement, temp = bytes of temp files it wrote "
        "(`pg_stat_database.temp_bytes`), medians.",
        "",
        "| method | median s | min s | max s | ÷ (a) | WAL | temp |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, label, *_ in METHODS:
        v = times[key]
        lines.append(f"| {label} | {med[key]:.3f} | {min(v):.3f} | {max(v):.3f} | {med[key] / med['plain']:.2f} | "
                     f"{pretty(statistics.median(wal[key]))} | {pretty(statistics.median(temp[key]))} |")
    lines += [
        "",
        f"**(c) / (b) = {med['pile'] / med['order_by']:.2f}** (corgipile_shuffle takes {med['pile'] / med['order_by'] * 100:.0f}% "
        f"of `ORDER BY random()`'s time; {med['order_by'] / med['pile']:.2f}x faster); "
        f"**(c) / (a) = {med['pile'] / med['plain']:.2f}** (vs a plain copy). "
        f"Plans: (a) {plans['plain']}; (b) {plans['order_by']}.",
        "",
        "Per round (seconds, in the order run):",
        "",
    ]
    for r in range(args.rounds):
        k = r % len(METHODS)
        order = METHODS[k:] + METHODS[:k]
        lines.append(f"- round {r + 1}: " + ", ".join(f"{key} {times[key][r]:.3f}" for key, *_ in order))
    lines += [
        "",
        f"## Accuracy: svm `{json.dumps(TRAIN_PARAMS)}` on each table, "
        f"scored on `t` with `corgipile_evaluate(model, 't') ->> 'accuracy'`",
        "",
        f"Copies made once more, untimed: `ORDER BY random()` after `setseed({SETSEED})`, `corgipile_shuffle` with "
        f"seed {SHUFFLE_SEED}. Label runs = runs of equal labels in storage (ctid) order: 2 for `t`, about "
        f"{args.rows // 2:,} (rows / 2) for a uniform shuffle.",
        "",
        "| trained on | model id | accuracy on `t` | label runs in storage order |",
        "|---|---|---|---|",
    ]
    for what, _t, model_id, acc, runs in accuracy:
        lines.append(f"| {what} | {model_id} | {acc:.4f} | {runs:,} ({runs / (args.rows / 2):.3f} x rows/2) |")
    lines += [
        "",
        f"The shuffled copies differ by {gap:.2f} points of accuracy; the clustered baseline is "
        f"{(shuffled[1][3] - accuracy[2][3]) * 100:.2f} points below the corgipile_shuffle copy."
        if accuracy[2][3] <= shuffled[1][3] else
        f"Shuffled copies differ by {gap:.2f} points of accuracy; the clustered baseline is NOT below them "
        f"({accuracy[2][3]:.4f}).",
        "",
        f"Run time: {elapsed / 60:.1f} min ({build_s / 60:.1f} of it checking or building `t`). Free disk on the "
        f"data directory's file system: {pretty(disk.free)} at the start, {pretty(free_after)} at the end.",
    ]
    if warnings:
        lines += ["", "Warnings:", ""] + [f"- {w}" for w in warnings]
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    provenance.write(args.out, text, "bench-shuffle", DBNAME)
    records.append_record("shuffle_copy", {
        "methods": {key: {**records.median_range(times[key]), "div_plain": med[key] / med["plain"],
                          "wal_bytes": statistics.median(wal[key]), "temp_bytes": statistics.median(temp[key])}
                    for key, *_ in METHODS},
        "pile_div_order_by": med["pile"] / med["order_by"],
        "pile_div_plain": med["pile"] / med["plain"],
        "accuracy": {what: acc for what, _t, _m, acc, _r in accuracy},
        "label_runs": {what: runs for what, _t, _m, _a, runs in accuracy},
        "shuffled_copies_gap_points": gap,
        "warnings": len(warnings),
    }, make_target="bench-shuffle", results_file=args.out, config={"rows": args.rows, "rounds": args.rounds}, **installed)


if __name__ == "__main__":
    main()
