#!/usr/bin/env python3
"""How fast a running corgipile_train stops on pg_cancel_backend and on statement_timeout, for
a large dense table, softmax with many classes and a 1M-dimension sparse model, single- and
double-buffered.

Each measurement starts an (endless: 1000 epochs) training in a thread on one connection. For
pg_cancel_backend: after a random delay of 1.0-3.0 s (seeded) a second connection cancels it;
the latency is from right before pg_cancel_backend to right after the training's call raised
QueryCanceled. For statement_timeout: SET statement_timeout = '2s'; the latency is the time from
right before the statement to right after its QueryCanceled, minus 2 s. After every stop the
session must still answer SELECT 1 and corgipile.models must hold as many rows as before.

Usage: bench/cancel_latency.py [--repeat 5] [--seed 1] [--out FILE]
Needs PGHOST/PGPORT/PGUSER for a cluster with corgipile installed (make bench-cancel does it).
Uses (and creates) the database corgipile_bench_cancel; its tables are built once and reused."""

import argparse
import datetime
import json
import os
import random
import statistics
import threading
import time

import psycopg

import provenance
import records
from provenance import git_head, machine  # also imported from here by other scripts
from psycopg import sql
from psycopg.types.json import Jsonb

from epoch_times import make_table as make_clustered_table

DBNAME = "corgipile_bench_cancel"
TIMEOUT_S = 2.0
STOP_WAIT_S = 120.0  # a training that has not stopped by then is reported as "did not stop"
FEATURES = 18


def make_softmax_table(conn, table, rows, classes):
    """rows x 18 random features, label = i % classes (every class present)."""
    if _has_rows(conn, table, rows):
        return
    conn.execute(f"DROP TABLE IF EXISTS {table}")
    coords = ", ".join("random() * 2 - 1" for _ in range(FEATURES))
    conn.execute(
        f"""CREATE TABLE {table} AS
            SELECT i AS id, ARRAY[{coords}]::float8[] AS features, (i % {classes})::int AS label
            FROM generate_series(1, {rows}) i"""
    )
    conn.execute(f"VACUUM ANALYZE {table}")


def make_sparse_table(conn, table, rows, dims, nnz):
    """Per row exactly `nnz` distinct sorted random indices in [1, dims] and random values."""
    if _has_rows(conn, table, rows):
        return
    conn.execute(f"DROP TABLE IF EXISTS {table}")
    # nnz draws from [1, dims - nnz + 1], sorted, plus their rank (0 .. nnz-1): strictly
    # increasing, within [1, dims]. The sublinks refer to the outer row (0 * i) so they are run
    # once per row, not once for the whole query; OFFSET 0 keeps idx computed once per row.
    conn.execute(
        f"""CREATE TABLE {table} AS
            SELECT id, label, idx,
                   ARRAY(SELECT (CASE WHEN label = 1 THEN 0.2 ELSE -0.2 END) + random() - 0.5
                         FROM generate_series(1, cardinality(idx)))::float8[] AS val
            FROM (SELECT i AS id, (i % 2) AS label,
                         ARRAY(SELECT (x + row_number() OVER (ORDER BY x) - 1)::int4
                               FROM (SELECT 1 + floor(random() * ({dims} - {nnz} + 1))::int4 AS x
                                     FROM generate_series(1, {nnz} + 0 * i)) d
                               ORDER BY x) AS idx
                  FROM generate_series(1, {rows}) i OFFSET 0) s"""
    )
    conn.execute(f"VACUUM ANALYZE {table}")
    bad = conn.execute(
        f"""SELECT count(*) FROM {table}
            WHERE cardinality(idx) <> {nnz} OR idx[1] < 1 OR idx[{nnz}] > {dims}
               OR EXISTS (SELECT 1 FROM generate_subscripts(idx, 1) k WHERE k > 1 AND idx[k] <= idx[k - 1])"""
    ).fetchone()[0]
    assert bad == 0, f"{bad} rows of {table} do not have {nnz} strictly increasing indices in [1, {dims}]"


def _has_rows(conn, table, rows):
    exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()[0]
    return exists and conn.execute(f"SELECT count(*) = %s FROM {table}", (rows,)).fetchone()[0]


CASES = [
    {
        "name": "svm, 4.5M x 18 dense, clustered by label",
        "table": "bench_clustered_4500000x18",
        "model": "svm",
        "params": {},
        "make": lambda c: make_clustered_table(c, "bench_clustered_4500000x18", 4_500_000, FEATURES),
    },
    {
        "name": "softmax, 1,000 classes, 300k x 18",
        "table": "cancel_softmax_1000",
        "model": "softmax",
        "params": {},
        "make": lambda c: make_softmax_table(c, "cancel_softmax_1000", 300_000, 1_000),
    },
    {
        "name": "softmax, 60,000 classes, 120k x 18",
        "table": "cancel_softmax_60000",
        "model": "softmax",
        "params": {},
        "make": lambda c: make_softmax_table(c, "cancel_softmax_60000", 120_000, 60_000),
    },
    {
        "name": "svm, sparse 1M dims, 40 nnz/row, 200k rows",
        "table": "cancel_sparse_1m",
        "model": "svm",
        "params": {"features": {"indices": "idx", "values": "val"}, "n_features": 1_000_000, "l2": 1e-4, "batch_size": 64},
        "make": lambda c: make_sparse_table(c, "cancel_sparse_1m", 200_000, 1_000_000, 40),
    },
]


def connect(dbname=DBNAME):
    return psycopg.connect(dbname=dbname, autocommit=True)


def ensure_database():
    with connect("postgres") as c:
        if not c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DBNAME,)).fetchone():
            c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DBNAME)))


def model_count(conn):
    return conn.execute("SELECT count(*) FROM corgipile.models").fetchone()[0]


class Session:
    """The training connection; reopened if a stop ever leaves it unusable."""

    def __init__(self):
        self.conn = connect()
        self.conn.execute("SET max_parallel_workers_per_gather = 0")

    @property
    def pid(self):
        return self.conn.info.backend_pid

    def reopen(self):
        try:
            self.conn.close()
        except Exception:
            pass
        self.__init__()


def start_training(session, case, double_buffer):
    """Runs corgipile_train in a thread; returns (thread, result dict)."""
    params = {"epochs": 1000, "verbose": False, "seed": 1, "double_buffer": double_buffer, **case["params"]}
    result = {}

    def run():
        result["start"] = time.perf_counter()
        try:
            session.conn.execute("SELECT corgipile_train(%s, %s, %s)", (case["table"], case["model"], Jsonb(params)))
            result["end"] = time.perf_counter()
            result["outcome"] = "finished"
        except psycopg.errors.QueryCanceled:
            result["end"] = time.perf_counter()
            result["outcome"] = "canceled"
        except Exception as e:  # any other error is reported, not measured
            result["end"] = time.perf_counter()
            result["outcome"] = f"error: {type(e).__name__}: {e}".splitlines()[0]

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, result


def force_stop(killer, session, t):
    """A training that ignored the cancel: cancel again for a while, then terminate its backend."""
    for _ in range(10):
        killer.execute("SELECT pg_cancel_backend(%s)", (session.pid,))
        t.join(timeout=1.0)
        if not t.is_alive():
            return "stopped after repeated cancels"
    killer.execute("SELECT pg_terminate_backend(%s)", (session.pid,))
    t.join(timeout=30.0)
    return "terminated" if not t.is_alive() else "still running after pg_terminate_backend"


def after_stop_checks(killer, session, models_before, label, warnings):
    try:
        if session.conn.execute("SELECT 1").fetchone()[0] != 1:
            raise RuntimeError("SELECT 1 did not return 1")
    except Exception as e:
        warn(warnings, f"{label}: the session does not work after the stop ({type(e).__name__}: {e}); reconnecting")
        session.reopen()
    else:
        # The setting must not leak into the next measurement.
        session.conn.execute("RESET statement_timeout")
    after = model_count(killer)
    if after != models_before:
        warn(warnings, f"{label}: corgipile.models has {after} rows after the stop, {models_before} before")


def warn(warnings, msg):
    line = f"WARNING: {msg}"
    print(line, flush=True)
    warnings.append(line)


def measure_cancel(killer, session, case, double_buffer, rng, warnings, label):
    """One pg_cancel_backend measurement: (latency s or None, state when cancelled)."""
    models_before = model_count(killer)
    pid = session.pid
    t, result = start_training(session, case, double_buffer)
    time.sleep(rng.uniform(1.0, 3.0))
    state = killer.execute("SELECT phase, epoch FROM corgipile.progress WHERE pid = %s", (pid,)).fetchone()
    if not t.is_alive():
        warn(warnings, f"{label}: the training ended before the cancel ({result.get('outcome')})")
        after_stop_checks(killer, session, models_before, label, warnings)
        return None, None
    before = time.perf_counter()
    signalled = killer.execute("SELECT pg_cancel_backend(%s)", (pid,)).fetchone()[0]
    t.join(timeout=STOP_WAIT_S)
    latency = None
    if t.is_alive():
        how = force_stop(killer, session, t)
        warn(warnings, f"{label}: did not stop within {STOP_WAIT_S:.0f} s of pg_cancel_backend ({how})")
    elif result["outcome"] != "canceled":
        warn(warnings, f"{label}: the training ended with {result['outcome']} instead of QueryCanceled"
                       f" (pg_cancel_backend returned {signalled})")
    else:
        latency = result["end"] - before
    after_stop_checks(killer, session, models_before, label, warnings)
    return latency, state


def measure_timeout(killer, session, case, double_buffer, warnings, label):
    """One statement_timeout measurement: latency s (error time - start - 2 s) or None."""
    models_before = model_count(killer)
    session.conn.execute(f"SET statement_timeout = '{TIMEOUT_S:g}s'")
    t, result = start_training(session, case, double_buffer)
    t.join(timeout=TIMEOUT_S + STOP_WAIT_S)
    latency = None
    if t.is_alive():
        how = force_stop(killer, session, t)
        warn(warnings, f"{label}: did not stop within {STOP_WAIT_S:.0f} s of its statement_timeout ({how})")
    elif result["outcome"] != "canceled":
        warn(warnings, f"{label}: the training ended with {result['outcome']} instead of QueryCanceled")
    else:
        latency = result["end"] - result["start"] - TIMEOUT_S
    after_stop_checks(killer, session, models_before, label, warnings)
    return latency


def describe_states(states):
    """'training, epochs 1-3' from the (phase, epoch) rows seen right before the cancels."""
    seen = [s for s in states if s is not None]
    if not seen:
        return "not in corgipile.progress"
    phases = sorted({s[0] for s in seen})
    epochs = [s[1] for s in seen if s[1] is not None]
    text = ", ".join(phases)
    if epochs:
        lo, hi = min(epochs), max(epochs)
        text += f", epoch {lo}" if lo == hi else f", epochs {lo}–{hi}"
    if len(seen) < len(states):
        text += f" ({len(states) - len(seen)} not yet listed)"
    return text


def installed_library(conn):
    """(path, modification time) of the corgipile shared library the server loads."""
    libdir = conn.execute("SELECT setting FROM pg_config WHERE name = 'PKGLIBDIR'").fetchone()[0]
    path = os.path.join(libdir, "corgipile.so")
    try:
        mtime = datetime.datetime.fromtimestamp(os.stat(path).st_mtime, datetime.timezone.utc)
        return path, mtime.strftime("%Y-%m-%d %H:%M:%S UTC")
    except OSError:
        return path, "(not readable from this client)"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="measurements per case and mode (default 5)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the random cancel delays")
    ap.add_argument("--out", default="bench/results/cancel_latency.md")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    started = time.perf_counter()
    build_s = 0.0
    head = git_head()  # at the start: the tree may move while the benchmark runs

    ensure_database()
    with connect() as killer:
        killer.execute("CREATE EXTENSION IF NOT EXISTS corgipile")
        # A database created by an older corgipile needs its SQL objects updated.
        killer.execute("ALTER EXTENSION corgipile UPDATE")
        killer.execute("SET max_parallel_workers_per_gather = 0")
        sizes = {}
        for case in CASES:
            t0 = time.perf_counter()
            case["make"](killer)
            sizes[case["table"]] = killer.execute("SELECT pg_size_pretty(pg_table_size(%s))", (case["table"],)).fetchone()[0]
            build_s += time.perf_counter() - t0
            print(f"table {case['table']}: {sizes[case['table']]} (ready in {time.perf_counter() - t0:.1f} s)", flush=True)
        pg_version = killer.execute("SHOW server_version").fetchone()[0]
        ext_version = killer.execute("SELECT extversion FROM pg_extension WHERE extname = 'corgipile'").fetchone()[0]
        library = installed_library(killer)
        origin = provenance.line(killer, "bench-cancel")
        installed = records.server(killer)

        session = Session()
        warnings = []
        rows = []  # (case, stop by, double_buffer, latencies, n attempted, state text)
        for case in CASES:
            killer.execute(f"SELECT count(*) FROM {case['table']}")  # warm the cache
            for double_buffer in (True, False):
                lat, states = [], []
                for k in range(args.repeat):
                    label = f"{case['name']} / pg_cancel_backend / double_buffer={str(double_buffer).lower()} #{k + 1}"
                    latency, state = measure_cancel(killer, session, case, double_buffer, rng, warnings, label)
                    states.append(state)
                    if latency is not None:
                        lat.append(latency)
                    print(f"{label}: {'-' if latency is None else f'{latency:.3f} s'}"
                          f" (state: {state[0] + ', epoch ' + str(state[1]) if state else 'not listed'})", flush=True)
                rows.append((case, "pg_cancel_backend", double_buffer, lat, args.repeat, describe_states(states)))
            for double_buffer in (True, False):
                lat = []
                for k in range(args.repeat):
                    label = f"{case['name']} / statement_timeout / double_buffer={str(double_buffer).lower()} #{k + 1}"
                    latency = measure_timeout(killer, session, case, double_buffer, warnings, label)
                    if latency is not None:
                        lat.append(latency)
                    print(f"{label}: {'-' if latency is None else f'{latency:.3f} s'}", flush=True)
                rows.append((case, f"statement_timeout {TIMEOUT_S:g} s", double_buffer, lat, args.repeat, ""))
        session.conn.close()
        if installed_library(killer) != library:
            # The sessions keep the library they loaded; the results are of the old one.
            warn(warnings, f"the installed library changed during the run ({library[0]} was {library[1]}, "
                           f"now {installed_library(killer)[1]}); the results are of the library installed at the start")

    elapsed = time.perf_counter() - started
    today = datetime.date.today().isoformat()
    lines = [
        origin,
        "",
        f"Cancel latency of a running `corgipile_train` ({today}, commit `{head}` at the start of the run, "
        f"corgipile {ext_version}, library `{library[0]}` installed {library[1]}, {machine()}, "
        f"PostgreSQL {pg_version}, database `{DBNAME}`).",
        "",
        "Each training runs `epochs: 1000, verbose: false, seed: 1` and the case's params in a thread. "
        "**pg_cancel_backend**: after a random delay of 1.0–3.0 s (seed "
        f"{args.seed}) a second session calls `pg_cancel_backend(pid)`; latency = from right before that call "
        "to right after the training's client call raised `QueryCanceled` (client side, so one round trip "
        f"is included). **statement_timeout**: `SET statement_timeout = '{TIMEOUT_S:g}s'`; latency = time from "
        f"right before the statement to right after its `QueryCanceled`, minus {TIMEOUT_S:g} s. "
        "After every stop the session must answer `SELECT 1` and `corgipile.models` must hold as many rows "
        f"as before (warnings below otherwise). {args.repeat} measurements per row; "
        "\"state at cancel\" is what `corgipile.progress` showed right before the cancels.",
        "",
        "| case | stopped by | double_buffer | n | median s | min s | max s | state at cancel |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for case, how, double_buffer, lat, n, state in rows:
        if lat:
            stats = f"{statistics.median(lat):.3f} | {min(lat):.3f} | {max(lat):.3f}"
        else:
            stats = "— | — | —"
        count = f"{len(lat)}" if len(lat) == n else f"{len(lat)} of {n}"
        lines.append(f"| {case['name']} | {how} | {str(double_buffer).lower()} | {count} | {stats} | {state} |")
    lines += ["", "Cases (tables built once in the database, reused by later runs):", ""]
    for case in CASES:
        extra = f" with `{json.dumps(case['params'])}`" if case["params"] else ""
        lines.append(f"- {case['name']}: table `{case['table']}` ({sizes[case['table']]}), `{case['model']}`{extra}")
    lines += ["", f"Run time: {elapsed / 60:.1f} min ({build_s / 60:.1f} of it checking or building the tables)."]
    if warnings:
        lines += ["", "Warnings:", ""] + [f"- {w}" for w in warnings]
    else:
        lines += ["", "No warnings: every training stopped with QueryCanceled, every session answered "
                      "`SELECT 1` afterwards, and no model row was left behind."]
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    every = [x for *_, lat, _n, _s in rows for x in lat]
    records.append_record("cancel_latency", {
        "cases": {f"{case['name']} / {how} / double_buffer={str(double_buffer).lower()}":
                  {**(records.median_range(lat) if lat else {"median": None, "min": None, "max": None, "n": 0}),
                   "attempted": n}
                  for case, how, double_buffer, lat, n, _state in rows},
        "max_latency_s": max(every) if every else None,
        "stopped": len(every),
        "attempted": sum(n for *_, n, _s in rows),
        "warnings": len(warnings),
    }, make_target="bench-cancel", results_file=args.out, config={"repeat": args.repeat, "seed": args.seed}, **installed)


if __name__ == "__main__":
    main()
