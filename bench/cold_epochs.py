#!/usr/bin/env python3
"""Epochs read from storage: the cold scan floor, a cold no_shuffle epoch and cold corgipile
epochs per block size; and the same warm.

Cold, before every statement: the server is restarted (empty shared_buffers) and every
segment file of the table and of its TOAST table is dropped from the OS page cache
(CHECKPOINT first, then posix_fadvise(POSIX_FADV_DONTNEED) on each file; the bench must be able
to open the data directory's files, i.e. run as root or as the server's OS user). Warm: the
same statements right after one untimed run, nothing evicted.

Warm here means in the OS page cache: a table larger than a quarter of shared_buffers is read
through a small ring of buffers, so it does not stay in shared_buffers.

Timed: the scan floor `SELECT sum(features[1]) FROM t` client side; an epoch = corgipile.epochs
.seconds of epoch 1 of `corgipile_train(t, 'svm', {"epochs": 1, "normalize": false, ...})`.
`normalize` is off so that the epoch is the training's first read of the table: with it, the
statistics pass would read the whole table first and the timed epoch would find it in the OS
cache (a warm epoch timed as a cold one). Every training is double-buffered (the default), so
corgipile and no_shuffle are compared like for like. Medians of --rounds.

Usage: bench/cold_epochs.py [--rows 4500000] [--rounds 3] [--out FILE]
       (make bench-cold; needs the test cluster of scripts/cluster.sh, which it restarts)."""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import time

import psycopg

import provenance
import records
from cancel_latency import git_head, installed_library, machine
from epoch_times import make_table

DBNAME = "corgipile_bench_cold"
FEATURES = 18
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# normalize off: no statistics pass reads (and caches) the table before the timed epoch.
BASE = {"epochs": 1, "seed": 1, "verbose": False, "average": False, "normalize": False, "double_buffer": True}


def connect(dbname=DBNAME):
    # No parallel plans: the scan floor is one process reading, as corgipile's epoch is (and as
    # every other benchmark's floor). With the default max_parallel_workers_per_gather = 2 the
    # floor was a Parallel Seq Scan of three processes (0.197 s against 0.387 s in one process).
    return psycopg.connect(dbname=dbname, autocommit=True, options="-c max_parallel_workers_per_gather=0")


def floor_plan(conn, table):
    """The scan floor's plan, top to bottom node types: it must read in one process."""
    plan = conn.execute(f"EXPLAIN (FORMAT JSON) SELECT sum(features[1]) FROM {table}").fetchone()[0][0]["Plan"]
    nodes = []
    while plan:
        nodes.append(plan["Node Type"])
        plan = (plan.get("Plans") or [None])[0]
    if "Gather" in nodes or "Gather Merge" in nodes:
        raise SystemExit(f"the scan floor of {table} is a parallel plan: {nodes}")
    return nodes


def restart():
    subprocess.run([os.path.join(REPO, "scripts", "cluster.sh"), "restart"], check=True,
                   stdout=subprocess.DEVNULL)


def table_files(conn, table):
    """Every segment file of the table's main fork and of its TOAST table's."""
    datadir = conn.execute("SHOW data_directory").fetchone()[0]
    rels = [table]
    toast = conn.execute("SELECT reltoastrelid::regclass::text FROM pg_class WHERE oid = %s::regclass "
                         "AND reltoastrelid <> 0", (table,)).fetchone()
    if toast:
        rels.append(toast[0])
    files = []
    for rel in rels:
        base = os.path.join(datadir, conn.execute("SELECT pg_relation_filepath(%s)", (rel,)).fetchone()[0])
        seg = 0
        while os.path.exists(base if seg == 0 else f"{base}.{seg}"):
            files.append(base if seg == 0 else f"{base}.{seg}")
            seg += 1
    return files


def evict(files):
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def run_floor(conn, table):
    started = time.perf_counter()
    conn.execute(f"SELECT sum(features[1]) FROM {table}")
    return time.perf_counter() - started


def run_epoch(conn, table, params):
    model = conn.execute("SELECT corgipile_train(%s, 'svm', %s)", (table, json.dumps(params))).fetchone()[0]
    seconds = conn.execute("SELECT seconds FROM corgipile.epochs WHERE model_id = %s AND epoch = 1",
                           (model,)).fetchone()[0]
    conn.execute("SELECT corgipile_drop_model(%s)", (model,))
    return seconds


def measure(table, files, cases, rounds, cold):
    """{case name: [seconds per round]}; cases rotate their order each round."""
    times = {name: [] for name, _ in cases}
    for r in range(rounds):
        order = cases[r % len(cases):] + cases[:r % len(cases)]
        for name, run in order:
            if cold:
                with connect() as c:
                    c.execute("CHECKPOINT")
                restart()
                evict(files)
            else:
                with connect() as c:
                    run(c)  # warm-up, untimed
            with connect() as c:
                times[name].append(run(c))
            print(f"{'cold' if cold else 'warm'} round {r + 1}: {name}: {times[name][-1]:.3f} s", flush=True)
    return times


def targets(results):
    """Issue #35's cold targets (≤ 1.0× cold no_shuffle, ≤ 1.2× the cold scan floor, on both
    tables), PASS/FAIL from this run's medians (block size auto)."""
    out = ["## Targets (cold, block size auto)", "", "| target | result | measured |", "|---|---|---|"]
    for name, rows, mb, cold, times in results:
        if not cold:
            continue
        floor = statistics.median(times["scan floor: SELECT sum(features[1])"])
        nos = statistics.median(times["no_shuffle epoch"])
        cp = statistics.median(times["corgipile epoch, block auto"])
        checks = [("corgipile epoch ≤ 1.0 × cold no_shuffle", cp / nos, 1.0),
                  ("corgipile epoch ≤ 1.2 × cold scan floor", cp / floor, 1.2)]
        for what, ratio, limit in checks:
            out.append(f"| {rows:,} rows ({mb:.0f} MB): {what} | {'PASS' if ratio <= limit else 'FAIL'} | {ratio:.2f}× |")
    return out + [""]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4_500_000)
    ap.add_argument("--small-rows", type=int, default=150_000, help="the small table (~30 MB)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="bench/results/cold_epochs.md")
    args = ap.parse_args()
    started = time.time()
    with connect("postgres") as c:
        if not c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DBNAME,)).fetchone():
            c.execute(f"CREATE DATABASE {DBNAME}")
    with connect() as c:
        c.execute("CREATE EXTENSION IF NOT EXISTS corgipile")
        c.execute("SET client_min_messages = warning")
        tables, plans = [], {}
        for rows in (args.rows, args.small_rows):
            name = f"bench_clustered_{rows}x{FEATURES}"
            make_table(c, name, rows, FEATURES)
            mb = c.execute("SELECT pg_total_relation_size(%s) / 1048576.0", (name,)).fetchone()[0]
            tables.append((name, rows, float(mb), table_files(c, name)))
            plans[name] = floor_plan(c, name)
        settings = {k: c.execute(f"SHOW {k}").fetchone()[0]
                    for k in ("shared_buffers", "server_version")}
        lib, lib_time = installed_library(c)
        origin = provenance.line(c, "bench-cold")
        installed = records.server(c)
    results = []
    for name, rows, mb, files in tables:
        cases = [("scan floor: SELECT sum(features[1])", lambda c, t=name: run_floor(c, t)),
                 ("no_shuffle epoch", lambda c, t=name: run_epoch(c, t, dict(BASE, shuffle="no_shuffle")))]
        for block in ("auto", "1MB", "10MB"):
            params = dict(BASE) if block == "auto" else dict(BASE, block_size=block)
            cases.append((f"corgipile epoch, block {block}", lambda c, t=name, p=params: run_epoch(c, t, p)))
        for cold in (True, False):
            times = measure(name, files, cases, args.rounds, cold)
            results.append((name, rows, mb, cold, times))
    restart()
    lines = ["# Epochs from storage (cold) and from memory (warm)", "", origin, "",
             f"{datetime.date.today()}, commit `{git_head()}`, library `{lib}` installed {lib_time}, {machine()}; "
             f"PostgreSQL {settings['server_version']}, shared_buffers {settings['shared_buffers']}.", "",
             "Cold = server restarted and the table's files dropped from the OS page cache before each "
             "statement; warm = after one untimed run. Median (min–max) seconds of "
             f"{args.rounds} rounds, cases in rotated order. An epoch is `corgipile.epochs.seconds` of a "
             "1-epoch svm training with `normalize` off (no statistics pass reads the table first) and "
             "double buffering (both strategies); the scan floor: client side. Ratios are to the scan floor and to "
             "no_shuffle of the same table and state. Every statement runs with "
             "`max_parallel_workers_per_gather = 0`: the floor's plan is "
             + "; ".join(f"`{t}`: {' → '.join(n)}" for t, n in plans.items()) + ".", ""]
    for name, rows, mb, cold, times in results:
        floor = statistics.median(times["scan floor: SELECT sum(features[1])"])
        nos = statistics.median(times["no_shuffle epoch"])
        lines += [f"## `{name}` ({rows:,} rows, {mb:.0f} MB), {'cold' if cold else 'warm'}", "",
                  "| case | median s | min–max | ÷ scan floor | ÷ no_shuffle |", "|---|---|---|---|---|"]
        for case, ts in times.items():
            m = statistics.median(ts)
            lines.append(f"| {case} | {m:.3f} | {min(ts):.3f}–{max(ts):.3f} | {m / floor:.2f} | {m / nos:.2f} |")
        lines.append("")
    lines += targets(results)
    lines.append(f"Run time: {(time.time() - started) / 60:.1f} min.")
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    figures = {}
    for name, rows, mb, cold, times in results:
        floor = statistics.median(times["scan floor: SELECT sum(features[1])"])
        nos = statistics.median(times["no_shuffle epoch"])
        figures[f"{rows} rows, {'cold' if cold else 'warm'}"] = {
            case: {**records.median_range(ts), "div_floor": statistics.median(ts) / floor,
                   "div_no_shuffle": statistics.median(ts) / nos} for case, ts in times.items()}
    figures["floor_plan"] = {t: " > ".join(n) for t, n in plans.items()}
    figures["table_mb"] = {str(rows): mb for _name, rows, mb, cold, _t in results if cold}
    figures["targets"] = records.pass_fail(targets(results))
    records.append_record("cold_epochs", figures, make_target="bench-cold", results_file=args.out,
                          config={"rows": args.rows, "small_rows": args.small_rows, "rounds": args.rounds,
                                  "floor_workers": 0}, **installed)


if __name__ == "__main__":
    main()
