#!/usr/bin/env python3
"""Where an epoch's CPU time goes: the scan floor and a training, each split by the threads and
processes that spend it, next to the wall time, measured side by side in one run.

Usage: bench/cpu_budget.py [--rows 4500000] [--features 18] [--epochs 5] [--rounds 3] [--out FILE]

The table is bench-epochs' (label-clustered, float8[] features; made if missing). CPU seconds
are read from /proc (utime + stime) before and after each statement, so the bench must run on
the server's machine: the backend's own thread; the backend's other threads (a training's SGD
thread, and on PostgreSQL 15 the read-ahead hint thread); the server's I/O worker processes
(PostgreSQL 18's default `io_method = worker` reads pages on them); and the whole machine. An
epoch can be no shorter than the CPU time it needs divided by the machine's CPUs: that bound,
next to the floor's wall time, is what the hardware allows. Training: svm, `normalize` off (no
statistics pass), double buffered; per epoch = the statement's totals ÷ epochs. Medians (ranges)
over rounds; the floor twice before each training. Needs PGHOST/PGPORT/PGUSER for a cluster
with corgipile installed (make bench-cpu does it)."""

import os
import statistics
import time

import psycopg
from psycopg.types.json import Jsonb

import provenance
import records
from epoch_times import prepare, table_args

HZ = os.sysconf("SC_CLK_TCK")
CPUS = len(os.sched_getaffinity(0))  # the CPUs this process may use (as the server, here)


def cpu_seconds(path):
    """utime + stime of /proc/<pid>[/task/<tid>]/stat, in seconds (a process's counts include
    its threads, those that have exited too)."""
    with open(path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / HZ


def machine_busy():
    """CPU seconds the whole machine has spent not idle (user, nice, system, irq, softirq, steal)."""
    with open("/proc/stat") as f:
        t = [int(x) for x in f.readline().split()[1:9]]
    return (sum(t) - t[3] - t[4]) / HZ


def measure(conn, pid, io_workers, sql, params=None, out=None):
    """(wall s, backend thread, backend's other threads, I/O workers, machine) for one statement;
    its first value appended to `out`."""
    def snap():
        whole = cpu_seconds(f"/proc/{pid}/stat")
        main = cpu_seconds(f"/proc/{pid}/task/{pid}/stat")
        io = sum(cpu_seconds(f"/proc/{w}/stat") for w in io_workers)
        return time.perf_counter(), main, whole - main, io, machine_busy()
    a = snap()
    value = conn.execute(sql, params).fetchone()[0]
    b = snap()
    if out is not None:
        out.append(value)
    wall, main, others, io, machine = (y - x for x, y in zip(a, b))
    # The process and its thread are read a moment apart: a clock tick (10 ms) may fall between.
    return wall, main, max(others, 0.0), io, machine


def main():
    args = table_args(__doc__.splitlines()[0], 5, "bench/results/cpu_budget.md")
    with psycopg.connect(autocommit=True) as conn:
        table, size = prepare(conn, args)
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        io_workers = [r[0] for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'io worker'")]
        io_method = conn.execute(
            "SELECT coalesce((SELECT setting FROM pg_settings WHERE name = 'io_method'), 'sync (before 18)')"
        ).fetchone()[0]
        params = {"epochs": args.epochs, "seed": 1, "verbose": False, "normalize": False}
        train = "SELECT corgipile_train(%s, 'svm', %s)"
        models = []
        measure(conn, pid, io_workers, train, (table, Jsonb(dict(params, epochs=1))), models)  # warm
        floors, epochs = [], []
        for _ in range(args.rounds):
            f = [measure(conn, pid, io_workers, f"SELECT sum(features[1]) FROM {table}") for _ in range(2)]
            floors.append(min(f, key=lambda m: m[0]))
            e = measure(conn, pid, io_workers, train, (table, Jsonb(params)), models)
            epochs.append(tuple(x / args.epochs for x in e))
        for model_id in models:
            conn.execute("SELECT corgipile_drop_model(%s)", (model_id,))
        server = conn.execute("SHOW server_version").fetchone()[0]
        origin = provenance.line(conn, "bench-cpu")
        installed = records.server(conn)

    def cell(runs, k):
        v = [r[k] for r in runs]
        return f"{statistics.median(v):.3f} ({min(v):.3f}–{max(v):.3f})"

    def bound(runs):
        return [r[4] / CPUS for r in runs]

    floor_wall = statistics.median(r[0] for r in floors)
    lines = [
        origin,
        "",
        f"Table `{table}`: {args.rows:,} rows x {args.features} float8 features, {size}; PostgreSQL {server}, "
        f"`io_method` {io_method}, {CPUS} CPUs, parallel workers off. The floor is `SELECT sum(features[1])`; "
        f"the training svm, CorgiPile, double buffered, `normalize` off, {args.epochs} epochs, shown per epoch. "
        f"Seconds, medians (ranges) of {args.rounds} rounds. CPU bound = the machine's busy CPU seconds ÷ {CPUS} "
        "CPUs: no schedule could finish sooner.",
        "",
        "| | wall s | backend thread CPU s | backend's other threads CPU s | I/O workers CPU s "
        "| whole machine CPU s | CPU bound s | wall ÷ floor wall | CPU bound ÷ floor wall |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, runs in (("scan floor", floors), ("training, per epoch", epochs)):
        b = bound(runs)
        lines.append(
            f"| {name} | {cell(runs, 0)} | {cell(runs, 1)} | {cell(runs, 2)} | {cell(runs, 3)} | {cell(runs, 4)} "
            f"| {statistics.median(b):.3f} | {statistics.median(r[0] for r in runs) / floor_wall:.2f} "
            f"| {statistics.median(b) / floor_wall:.2f} |")
    provenance.write_report(lines, args.out)
    columns = ("wall_s", "backend_thread_cpu_s", "backend_other_threads_cpu_s", "io_workers_cpu_s", "machine_cpu_s")
    records.append_record("cpu_budget", {
        name: {**{col: records.median_range([r[k] for r in runs]) for k, col in enumerate(columns)},
               "cpu_bound_s": statistics.median(bound(runs)),
               "wall_div_floor_wall": statistics.median(r[0] for r in runs) / floor_wall,
               "cpu_bound_div_floor_wall": statistics.median(bound(runs)) / floor_wall}
        for name, runs in (("scan floor", floors), ("training, per epoch", epochs))
    }, make_target="bench-cpu", results_file=args.out,
        config={"rows": args.rows, "features": args.features, "epochs": args.epochs, "rounds": args.rounds,
                "io_method": io_method, "cpus": CPUS}, **installed)


if __name__ == "__main__":
    main()
