"""Hardening: the server never restarts, whatever sizes a role asks for.

A throw-away PostgreSQL 15 cluster of its own, started under `ulimit -v` (about 4 GB of address
space per process), so that an unbounded allocation fails instead of waking the OOM killer. An
ordinary role then asks corgipile for absurd sizes: feature dimensions up to 2^31-1, sparse
indices up to 2147483647, softmax models of up to 70,000 classes, batches of a million, buffers
of a terabyte or 2^31 tuples, blocks of 2^31 pages, prediction vectors of up to 10^7 elements.
Any clean ERROR is acceptable; an internal error (SQLSTATE XX000), a lost connection or a server
restart is not. A restart is detected by an idle sentinel connection, pg_postmaster_start_time(),
the checkpointer's pid and the server log.

test_shard_round_requests_never_crash calls corgipile_shard_round (EXECUTE is granted to PUBLIC)
directly with hostile requests: fixed cases (10^7 class values, a 2^62-feature model, 10^11
features with 5e7 weights, 2e7 class weights, 10^6-deep nesting) then seeded random ones (huge
arrays in weights, extras and evaluate models, odd counts, deep nesting, hostile params, random
mutations of valid Statistics / Train / Evaluate requests), each within the statement timeout."""

import json
import math
import os
import random
import re
import subprocess
import time

import psycopg
import psycopg.errors as E
import pytest
from psycopg.types.json import Jsonb

PG_BIN = os.environ.get("CORGIPILE_PG_BIN", "/usr/lib/postgresql/15/bin")  # the major under test (make sets it)
PG_OS_USER = "postgres"
PORT = int(os.environ.get("CORGIPILE_HARDENING_PORT", "28917"))
VMEM_KB = 4_000_000  # ulimit -v of the server: about 4 GB of address space per process
DBNAME = "hardening"
ROLE = "fz"

SEED = int(os.environ.get("CORGIPILE_HARDENING_SEED", "20250611"))
CASES = int(os.environ.get("CORGIPILE_HARDENING_CASES", "150"))
TIME_BUDGET = 200.0  # seconds for the fuzz loop; it stops early (and says so) rather than overrun
STATEMENT_TIMEOUT = "20s"
HUGE_COEFFICIENT_CALLS = 2  # coefficients of models above 2^24 weights: each may take the whole timeout

# Lines of the server log that mean a backend died and the postmaster restarted (or will).
CRASH_RE = re.compile(
    r"terminated by signal|server process .* was terminated|server process .* exited with exit code"
    r"|terminating any other active server processes|all server processes terminated; reinitializing"
    r"|PANIC:"
)
MEMORY_SETTINGS = ("corgipile.max_model_memory", "corgipile.max_buffer_memory")


# ---------------------------------------------------------------------------------------------
# The throw-away cluster (started as scripts/cluster.sh does, plus ulimit -v)
# ---------------------------------------------------------------------------------------------

def as_pg(args, **kw):
    """Run a command as the postgres OS user, from a directory it can read."""
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    kw.setdefault("cwd", "/")
    if os.geteuid() == 0:
        args = ["runuser", "-u", PG_OS_USER, "--"] + list(args)
    elif os.environ.get("USER", "") != PG_OS_USER:
        args = ["sudo", "-u", PG_OS_USER, "--"] + list(args)
    return subprocess.run(args, **kw)


class Cluster:
    def __init__(self, port):
        r = as_pg(["mktemp", "-d", "/tmp/corgipile-hardening-XXXXXX"], check=True)
        self.dir = r.stdout.strip()
        assert self.dir.startswith("/tmp/corgipile-hardening-"), self.dir
        as_pg(["chmod", "755", self.dir], check=True)
        self.data = f"{self.dir}/data"
        self.log = f"{self.dir}/log"
        self.port = port
        self.log_offset = 0

    def init(self):
        r = as_pg([f"{PG_BIN}/initdb", "-D", self.data, "--auth=trust", "-U", "postgres", "-E", "UTF8",
                   "--locale=C.UTF-8"])
        assert r.returncode == 0, f"initdb failed: {r.stdout}\n{r.stderr}"
        conf = f"""
# ---- corgipile hardening fuzz cluster (tests/test_hardening_fuzz.py) ----
listen_addresses = ''
unix_socket_directories = '{self.dir}'
port = {self.port}
shared_buffers = 128MB
max_wal_size = 2GB
fsync = off
synchronous_commit = off
full_page_writes = off
huge_pages = off
"""
        r = as_pg(["tee", "-a", f"{self.data}/postgresql.conf"], input=conf)
        assert r.returncode == 0, r.stderr

    def start(self):
        # The limit is set in the shell that execs pg_ctl: the postmaster and every backend inherit it.
        cmd = (f"ulimit -v {VMEM_KB} && exec env -u RUST_BACKTRACE -u RUST_LIB_BACKTRACE "
               f"{PG_BIN}/pg_ctl start -D {self.data} -l {self.log} -w -t 120 -o '-p {self.port} -k {self.dir}'")
        r = as_pg(["bash", "-c", cmd])
        assert r.returncode == 0, f"server failed to start: {r.stdout}\n{r.stderr}\n{self.tail()}"

    def stop(self):
        as_pg([f"{PG_BIN}/pg_ctl", "stop", "-D", self.data, "-m", "fast", "-w"])

    def destroy(self):
        if self.dir.startswith("/tmp/corgipile-hardening-"):
            as_pg(["rm", "-rf", "--", self.dir])

    def read_log(self):
        try:
            with open(self.log, errors="replace") as f:
                return f.read()
        except PermissionError:
            return as_pg(["cat", self.log]).stdout
        except OSError:
            return ""

    def tail(self, n=40):
        return "\n".join(self.read_log().splitlines()[-n:])

    def new_log_lines(self):
        text = self.read_log()
        new, self.log_offset = text[self.log_offset:], len(text)
        return new.splitlines()

    def postmaster_pid(self):
        r = as_pg(["head", "-n", "1", f"{self.data}/postmaster.pid"])
        return int(r.stdout.strip())

    def connect(self, user="postgres", dbname=DBNAME, **kw):
        kw.setdefault("autocommit", True)
        kw.setdefault("connect_timeout", 10)
        return psycopg.connect(host=self.dir, port=self.port, user=user, dbname=dbname, **kw)

    def wait_ready(self, timeout=90.0):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                with self.connect(dbname="postgres") as c:
                    if c.execute("SELECT 1").fetchone()[0] == 1:
                        return
            except psycopg.Error as e:  # still restarting / in recovery
                last = e
            time.sleep(0.25)
        raise AssertionError(f"fuzz cluster not ready after {timeout} s: {last}\n{self.tail()}")


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(PORT)
    try:
        c.init()
        c.start()
        c.wait_ready()
        with open(f"/proc/{c.postmaster_pid()}/limits") as f:
            limits = f.read()
        m = re.search(r"Max address space\s+(\d+)", limits)
        assert m and int(m.group(1)) == VMEM_KB * 1024, f"ulimit -v not applied to the server:\n{limits}"
        with c.connect(dbname="postgres") as admin:
            admin.execute(f"CREATE DATABASE {DBNAME}")
        with c.connect() as admin:
            admin.execute("CREATE EXTENSION corgipile")
            admin.execute(f"CREATE ROLE {ROLE} LOGIN")
            admin.execute(f"CREATE SCHEMA {ROLE} AUTHORIZATION {ROLE}")
            admin.execute(f"GRANT USAGE ON SCHEMA public TO {ROLE}")
            admin.execute(f"ALTER ROLE {ROLE} SET search_path = {ROLE}, public")
        yield c
    finally:
        try:
            c.stop()
        finally:
            c.destroy()


class Watchdog:
    """Detects a server restart: an idle sentinel connection, the postmaster's start time, the
    checkpointer's pid (on PostgreSQL 15 pg_postmaster_start_time() does not change at a crash
    restart; the checkpointer, restarted with every other process, does), the log."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.sentinel = None
        self.start_time = None
        self.connect()
        cluster.new_log_lines()  # only what happens from now on counts

    def connect(self):
        self.sentinel = self.cluster.connect()
        self.start_time = self.sentinel.execute("SELECT pg_postmaster_start_time()").fetchone()[0]
        self.checkpointer = self._checkpointer(self.sentinel)

    @staticmethod
    def _checkpointer(c):
        return c.execute("SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'").fetchone()[0]

    def check(self):
        """None if the server is as it was; else a description of what happened."""
        problems = []
        try:
            assert self.sentinel.execute("SELECT 1").fetchone()[0] == 1
        except Exception as e:  # noqa: BLE001 - any failure of the sentinel is the finding
            problems.append(f"sentinel connection lost: {e!r}")
        try:
            with self.cluster.connect() as c:
                now = c.execute("SELECT pg_postmaster_start_time()").fetchone()[0]
                checkpointer = self._checkpointer(c)
            if now != self.start_time:
                problems.append(f"pg_postmaster_start_time changed: {self.start_time} -> {now}")
            if checkpointer != self.checkpointer:
                problems.append(f"checkpointer pid changed: {self.checkpointer} -> {checkpointer}")
        except psycopg.Error as e:
            problems.append(f"cannot connect: {e!r}")
        crash_lines = [line for line in self.cluster.new_log_lines() if CRASH_RE.search(line)]
        if crash_lines:
            problems.append("server log: " + " | ".join(crash_lines[:6]))
        return "; ".join(problems) or None

    def recover(self):
        self.cluster.wait_ready()
        try:
            self.sentinel.close()
        except Exception:  # noqa: BLE001
            pass
        self.connect()
        self.cluster.new_log_lines()

    def close(self):
        self.sentinel.close()


def fz_connect(cluster):
    c = cluster.connect(user=ROLE)
    c.execute(f"SET statement_timeout = '{STATEMENT_TIMEOUT}'")
    return c


def error_text(e):
    d = e.diag
    return " ".join(x for x in (d.message_primary, d.message_detail, d.message_hint) if x) or str(e)


def limit_problem(e):
    """A memory-limit error must be 54000 (naming the setting) or 53200."""
    text = error_text(e)
    names = any(s in text for s in MEMORY_SETTINGS)
    if names and e.sqlstate not in ("54000", "53200"):
        return f"names a memory setting but has SQLSTATE {e.sqlstate}"
    if e.sqlstate == "54000" and "memory" in text.lower() and not names:
        return "SQLSTATE 54000 memory error that names neither corgipile.max_model_memory nor max_buffer_memory"
    return None


def after_case(cluster, watchdog, conn, label, restarts):
    """After one fuzz case: record a restart (and recover from it), and return a usable session
    (a new one if the case broke it; the same one, checked, otherwise)."""
    problem = watchdog.check()
    if problem:
        restarts.append(f"{label}: {problem}")
        watchdog.recover()
    if problem or conn.broken or conn.closed:
        try:
            conn.close()
        except Exception:  # noqa: BLE001
            pass
        return fz_connect(cluster)
    assert conn.execute("SELECT 1").fetchone()[0] == 1, f"{label}: session unusable"
    return conn


# ---------------------------------------------------------------------------------------------
# Data (owned by the ordinary role, in its schema)
# ---------------------------------------------------------------------------------------------

class Tables:
    """Small tables, created on first use: a dense one, sparse ones by largest index, softmax ones by K."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.made = set()

    def _create(self, name, sql):
        if name in self.made:
            return name
        with fz_connect(self.cluster) as c:
            c.execute(f"DROP TABLE IF EXISTS {name}")
            c.execute(f"CREATE TABLE {name} AS {sql}")
            c.execute(f"ANALYZE {name}")
        self.made.add(name)
        return name

    def dense(self):
        # 4 features, binary int label, text label, numeric target.
        return self._create("dense4", """
            SELECT i, ARRAY[random(), random(), random(), random() + (i % 2)] AS features, i % 2 AS label,
                   CASE WHEN i % 2 = 0 THEN 'cat' ELSE 'dog' END AS tlabel, random() * 10 AS y
            FROM generate_series(1, 300) i""")

    def sparse(self, largest):
        # Rows with indices in 1..8 and every 20th row [1, largest]: the largest data index is `largest`.
        assert 10 <= largest <= 2**31 - 1
        return self._create(f"sp_{largest}", f"""
            SELECT i, (CASE WHEN i % 20 = 0 THEN ARRAY[1, {largest}] ELSE ARRAY[1 + i % 3, 4 + i % 5] END)::int4[] AS idx,
                   ARRAY[random(), random() + (i % 2)] AS val, i % 2 AS label,
                   CASE WHEN i % 2 = 0 THEN 'cat' ELSE 'dog' END AS tlabel, (i % 7)::float8 AS y
            FROM generate_series(1, 120) i""")

    def softmax(self, k):
        # Labels = row number mod k, at least k rows (so K = k distinct labels); dense and sparse features.
        rows = max(k, 60)
        return self._create(f"sm_{k}", f"""
            SELECT i, ARRAY[random(), random(), random(), random()] AS features,
                   ARRAY[1 + i % 7]::int4[] AS idx, ARRAY[1.0::float8] AS val,
                   i % {k} AS label, 'c' || (i % {k}) AS tlabel, (i % {k})::float8 AS y
            FROM generate_series(0, {rows - 1}) i""")


# ---------------------------------------------------------------------------------------------
# Random cases
# ---------------------------------------------------------------------------------------------

BIG_DIMS = [2**20, 2**26, 2**28, 2**30, 2**31 - 1]


def log_uniform(rng, lo, hi):
    """An integer in [lo, hi], uniform in log scale: every octave (around the limits too) is drawn."""
    return min(hi, max(lo, int(2 ** rng.uniform(math.log2(lo), math.log2(hi + 1)))))


def pick_n_features(rng):
    v = rng.choice([1] + BIG_DIMS + ["random"])
    return log_uniform(rng, 1, 2**31 - 1) if v == "random" else v


def pick_largest_index(rng):
    v = rng.choice([10, 1000, 2**20, 2**26, 2**28, 2**30, 2**31 - 2, 2**31 - 1, "random"])
    return log_uniform(rng, 10, 2**31 - 1) if v == "random" else v


def pick_buffer_size(rng):
    return rng.choice(["0.001%", "1%", "10%", "50%", "100%", "64kB", "1MB", "64GB", "1TB",
                       1, 100, 2**20, 2**31 - 1, 2**31])


def pick_block_size(rng):
    return rng.choice(["auto", 1, 8, 1000, 2**31 - 1, 2**31, "8kB", "1GB", "1TB"])


def random_training(rng, tables, for_op):
    """(table, model, params) of a training that asks for odd sizes."""
    model = rng.choice(["svm", "svm", "logistic", "logistic", "linear", "softmax", "softmax", "softmax"])
    shape = rng.choice(["dense", "sparse", "sparse", "softmax"]) if model != "softmax" else \
        rng.choice(["dense", "sparse", "softmax", "softmax", "softmax"])
    params = {"verbose": False, "epochs": rng.randint(1, 3), "seed": rng.randint(0, 2**40)}
    label = "y" if model == "linear" else rng.choice(["label", "label", "tlabel"])
    if shape == "dense":
        table = tables.dense()
        if rng.random() < 0.2:
            params["n_features"] = pick_n_features(rng)
    elif shape == "sparse":
        table = tables.sparse(pick_largest_index(rng))
        params["features"] = {"indices": "idx", "values": "val"}
        params["index_base"] = rng.choice([0, 1])
        if rng.random() < 0.7:
            params["n_features"] = pick_n_features(rng)
    else:
        k = rng.choice([2, 3, 10, 100, 1000, 3000, 70000])
        table = tables.softmax(k)
        sparse = rng.random() < 0.5
        # Training K >= 5000 classes on K rows of small features would run for minutes (K x rows x
        # (features + exp)): such trainings ask for a dimension that makes the model far too big.
        trains = for_op in ("train", "explain_analyze")
        if k > 3000 and trains:
            sparse = True
            params["n_features"] = rng.choice(BIG_DIMS + [log_uniform(rng, 2**20, 2**31 - 1)])
        elif sparse and rng.random() < 0.5:
            params["n_features"] = pick_n_features(rng)
            if k > 100 and trains and params["n_features"] < 2**20:
                params["n_features"] = rng.choice(BIG_DIMS)
        if sparse:
            params["features"] = {"indices": "idx", "values": "val"}
            params["index_base"] = rng.choice([0, 1])
    if label != "label":
        params["label"] = label
    if rng.random() < 0.5:
        params["batch_size"] = rng.choice([1, 2, 64, 1000, 1_000_000])
    if rng.random() < 0.5:
        params["buffer_size"] = pick_buffer_size(rng)
    if rng.random() < 0.4:
        params["block_size"] = pick_block_size(rng)
    if rng.random() < 0.5:
        params["double_buffer"] = rng.random() < 0.5
    if rng.random() < 0.25:
        params["normalize"] = rng.random() < 0.7
    if rng.random() < 0.2 and model != "linear":
        params["class_weight"] = "balanced"
    if rng.random() < 0.2:
        params["l2"] = rng.choice([1e-4, 0.1])
    return table, model, params


def dense_arg(rng, n_features):
    choices = [0, 1, 3, 4, 1000, 10**6, 10**7, rng.randint(0, 10**7)]
    if n_features is not None and n_features <= 10**7:
        choices += [n_features, n_features, n_features + 1]
    return rng.choice(choices)


def sparse_arg(rng):
    indices = rng.choice([[], [0], [1], [0, 2147483647], [1, 2147483646], [2147483646], [2147483647],
                          [1, 2, 2147483646, 2147483647], [-1], [5, 3], [0, 1, 2, 3]])
    values = [1.0] * len(indices)
    if rng.random() < 0.1:
        values = values + [1.0]
    return indices, values


class Fuzz:
    def __init__(self, cluster, tables, rng):
        self.cluster = cluster
        self.tables = tables
        self.rng = rng
        self.models = []  # dicts: id, n_features, n_outputs, table, params
        self.huge_coefficients = 0

    def remember(self, conn, model_id, table, params):
        row = conn.execute("SELECT n_features, n_outputs FROM corgipile.models WHERE id = %s", (model_id,)).fetchone()
        assert row is not None, f"model {model_id} returned but not visible to its owner"
        self.models.append({"id": model_id, "n_features": row[0], "n_outputs": row[1], "table": table,
                            "params": params})

    def pick_model(self):
        if not self.models or self.rng.random() < 0.05:
            return {"id": self.rng.choice([-1, 0, 2**62]), "n_features": None, "n_outputs": 1, "table": None,
                    "params": {}}
        return self.rng.choice(self.models)

    def next_case(self):
        """(description, sql, args, on_success) of the next random case."""
        rng = self.rng
        op = rng.choices(["train", "explain", "explain_analyze", "trace", "evaluate", "predict", "coefficients"],
                         [34, 6, 8, 6, 10, 28, 8])[0]
        if op in ("evaluate", "predict", "coefficients") and not self.models:
            op = "train"
        if op == "train":
            table, model, params = random_training(rng, self.tables, op)
            return ({"op": op, "table": table, "model": model, "params": params},
                    "SELECT corgipile_train(%s, %s, %s)", (table, model, Jsonb(params)),
                    lambda conn, rows: self.remember(conn, rows[0][0], table, params))
        if op in ("explain", "explain_analyze"):
            table, model, params = random_training(rng, self.tables, op)
            analyze = op == "explain_analyze"
            fmt = rng.choice(["text", "text", "json"])
            return ({"op": op, "table": table, "model": model, "params": params, "format": fmt},
                    "SELECT count(*) FROM corgipile_explain(%s, %s, %s, %s, %s)",
                    (table, model, Jsonb(params), analyze, fmt), None)
        if op == "trace":
            table, _, params = random_training(rng, self.tables, op)
            if params.get("label") == "tlabel":
                params["label"] = "label"
            return ({"op": op, "table": table, "params": params},
                    "SELECT count(*) FROM corgipile_trace(%s, %s)", (table, Jsonb(params)), None)
        m = self.pick_model()
        if op == "evaluate":
            table = m["table"] if m["table"] and rng.random() < 0.7 else \
                rng.choice([self.tables.dense(), self.tables.softmax(rng.choice([2, 10, 1000])),
                            self.tables.sparse(pick_largest_index(rng))])
            params = {}
            if rng.random() < 0.5:
                params["buffer_size"] = pick_buffer_size(rng)
            if rng.random() < 0.4:
                params["block_size"] = pick_block_size(rng)
            if m["params"].get("label") and rng.random() < 0.8:
                params["label"] = m["params"]["label"]
            return ({"op": op, "model": m["id"], "table": table, "params": params},
                    "SELECT corgipile_evaluate(%s::bigint, %s, %s)", (m["id"], table, Jsonb(params)), None)
        if op == "coefficients":
            weights = (m["n_features"] or 0) * (m["n_outputs"] or 1)
            if weights > 2**24:
                if self.huge_coefficients >= HUGE_COEFFICIENT_CALLS:
                    small = [x for x in self.models if x["n_features"] * x["n_outputs"] <= 2**24]
                    m = rng.choice(small) if small else {"id": -1}
                else:
                    self.huge_coefficients += 1
            return ({"op": op, "model": m["id"]},
                    "SELECT count(*) FROM corgipile_model_coefficients(%s::bigint)", (m["id"],), None)
        # predict family
        fn = rng.choice(["corgipile_predict", "corgipile_predict_class", "corgipile_predict_proba",
                         "corgipile_decision_function"])
        wrap = "cardinality({})" if fn == "corgipile_predict_proba" else "{}"
        if rng.random() < 0.6:
            n = dense_arg(rng, m["n_features"])
            value = rng.choice(["0.5", "0.5", "1e300", "-3"])
            call = wrap.format(f"{fn}(%s::bigint, array_fill({value}::float8, ARRAY[%s::int4]))")
            return ({"op": fn, "model": m["id"], "dense_length": n, "value": value},
                    f"SELECT {call}", (m["id"], n), None)
        indices, values = sparse_arg(rng)
        call = wrap.format(f"{fn}(%s::bigint, %s::int4[], %s::float8[])")
        return ({"op": fn, "model": m["id"], "indices": indices, "values": values},
                f"SELECT {call}", (m["id"], indices, values), None)


def test_server_never_restarts(cluster):
    rng = random.Random(SEED)
    tables = Tables(cluster)
    fuzz = Fuzz(cluster, tables, rng)
    watchdog = Watchdog(cluster)
    conn = fz_connect(cluster)
    internal, restarts, lost, bad_limits = [], [], [], []
    out_of_memory = []  # 53200: allowed, but worth seeing (an allocation hit the ulimit)
    by_state = {}  # sqlstate -> [count, first message]
    stats = {"cases": 0, "ok": 0, "errors": 0, "timeouts": 0}
    slowest = []
    started = time.monotonic()
    try:
        for case in range(CASES):
            if time.monotonic() - started > TIME_BUDGET:
                print(f"hardening fuzz: time budget reached after {case} cases")
                break
            desc, sql, args, on_success = fuzz.next_case()
            label = f"case {case}: {json.dumps(desc)}"
            stats["cases"] += 1
            t0 = time.monotonic()
            try:
                rows = conn.execute(sql, args).fetchall()
                stats["ok"] += 1
                if on_success:
                    on_success(conn, rows)
            except psycopg.Error as e:
                if conn.broken or conn.closed or e.sqlstate is None:
                    lost.append(f"{label}: {e!r}")
                else:
                    stats["errors"] += 1
                    state = e.sqlstate
                    entry = by_state.setdefault(state, [0, error_text(e)[:160]])
                    entry[0] += 1
                    if isinstance(e, E.QueryCanceled):
                        stats["timeouts"] += 1
                    if state.startswith("XX"):
                        internal.append(f"{label}: {state} {error_text(e)[:300]}")
                    if state == "53200":
                        out_of_memory.append(f"{label}: {error_text(e)[:200]}")
                    problem = limit_problem(e)
                    if problem:
                        bad_limits.append(f"{label}: {problem}: {state} {error_text(e)[:300]}")
            elapsed = time.monotonic() - t0
            slowest.append((elapsed, case, desc["op"]))
            conn = after_case(cluster, watchdog, conn, label, restarts)
    finally:
        conn.close()
        watchdog.close()
    elapsed = time.monotonic() - started
    slowest.sort(reverse=True)
    print(f"\nhardening fuzz: {stats['cases']} cases in {elapsed:.1f} s: {stats['ok']} succeeded, "
          f"{stats['errors']} clean errors ({stats['timeouts']} statement timeouts), {len(fuzz.models)} models")
    for state, (count, message) in sorted(by_state.items()):
        print(f"  {state} x{count}: {message}")
    if fuzz.models:
        big = max(fuzz.models, key=lambda m: m["n_features"] * m["n_outputs"])
        print(f"  largest model trained: {big['n_features']} features x {big['n_outputs']} outputs")
    for line in out_of_memory:
        print(f"  out of memory (53200) in {line}")
    print("  slowest cases: " + ", ".join(f"#{c} {op} {t:.1f}s" for t, c, op in slowest[:6]))
    failures = []
    if restarts:
        failures.append("SERVER RESTARTED:\n  " + "\n  ".join(restarts))
    if lost:
        failures.append("connection lost:\n  " + "\n  ".join(lost))
    if internal:
        failures.append("internal errors (SQLSTATE XX000):\n  " + "\n  ".join(internal))
    if bad_limits:
        failures.append("memory-limit errors of the wrong shape:\n  " + "\n  ".join(bad_limits))
    if failures:
        pytest.fail("\n".join(failures) + "\n--- server log (tail) ---\n" + cluster.tail(60), pytrace=False)
    assert stats["cases"] >= 60, "too few cases ran within the time budget"
    assert stats["ok"] >= 15 and stats["errors"] >= 15, f"fuzz distribution degenerate: {stats}"


# ---------------------------------------------------------------------------------------------
# Deterministic cases
# ---------------------------------------------------------------------------------------------

def expect_memory_limit(conn, sql, args, setting=None):
    """The call fails with a clean limit error: 54000 (naming `setting` when given) or 53200."""
    with pytest.raises(psycopg.Error) as info:
        conn.execute(sql, args).fetchall()
    e = info.value
    assert not conn.broken, f"connection lost: {e!r}"
    assert e.sqlstate in ("54000", "53200"), f"{e.sqlstate}: {error_text(e)}"
    if e.sqlstate == "54000" and setting:
        assert setting in error_text(e), error_text(e)
    assert conn.execute("SELECT 1").fetchone()[0] == 1
    return e


def test_oversized_models_and_buffers_are_refused(cluster):
    tables = Tables(cluster)
    watchdog = Watchdog(cluster)
    sparse = {"indices": "idx", "values": "val"}
    train = "SELECT corgipile_train(%s, %s, %s)"
    try:
        with fz_connect(cluster) as c:
            sp = tables.sparse(2**31 - 2)
            # 2^31-1 features: 16 GB of weights, more than a float8[] in the catalog can hold (a
            # size limit of its own; it need not name a setting).
            expect_memory_limit(c, train, (sp, "svm", Jsonb({"features": sparse, "n_features": 2**31 - 1,
                                                              "verbose": False, "epochs": 1})))
            # The same size inferred from the data: largest index 2147483646 in base 0.
            expect_memory_limit(c, train, (sp, "logistic", Jsonb({"features": sparse, "index_base": 0,
                                                                   "verbose": False, "epochs": 1})))
            # 10^8 features: storable (< 2^27 weights) but far above the 512MB default of max_model_memory.
            expect_memory_limit(c, train, (sp, "svm", Jsonb({"features": sparse, "n_features": 100_000_000,
                                                              "verbose": False, "epochs": 1})),
                                "corgipile.max_model_memory")
            # ... inferred from the data.
            expect_memory_limit(c, train, (tables.sparse(100_000_000), "svm",
                                           Jsonb({"features": sparse, "verbose": False, "epochs": 1})),
                                "corgipile.max_model_memory")
            # 70,000 classes (more than softmax supports) x 2^20 features (beyond the catalog).
            expect_memory_limit(c, train, (tables.softmax(70000), "softmax",
                                           Jsonb({"features": sparse, "n_features": 2**20, "verbose": False,
                                                  "epochs": 1})))
            # A terabyte of buffer.
            expect_memory_limit(c, train, (tables.dense(), "svm",
                                           Jsonb({"buffer_size": "1TB", "verbose": False, "epochs": 1})),
                                "corgipile.max_buffer_memory")
            # 2^31-1 tuples of buffer on a 300-row table: a buffer larger than the table may hold just
            # the table (a model) or be refused as too big (a limit error); anything else is wrong.
            try:
                c.execute(train, (tables.dense(), "svm", Jsonb({"buffer_size": 2**31 - 1, "verbose": False,
                                                                "epochs": 1})))
            except psycopg.Error as e:
                assert not c.broken and e.sqlstate in ("54000", "53200"), f"{e.sqlstate}: {error_text(e)}"
                assert limit_problem(e) is None, error_text(e)
        problem = watchdog.check()
        assert problem is None, problem
    finally:
        watchdog.close()


def test_softmax_classes_times_n_features_checked_before_allocation(cluster):
    """Sparse softmax with an n_features param: the model is n_features x K, K known only from the
    label column. It must be refused (54000) once K x n_features is too big, before it is
    allocated: not trained past corgipile.max_model_memory, nor stopped only by an allocation
    failing at the ulimit (53200) or by the statement timeout."""
    tables = Tables(cluster)
    watchdog = Watchdog(cluster)
    sparse = {"indices": "idx", "values": "val"}
    failures = []
    try:
        for k, n_features, setting in [
            (3000, 2**20, None),  # 3.1e9 weights: beyond what the catalog can store
            (60000, 1000, "corgipile.max_model_memory"),  # 6e7 weights: 1.4 GB to train, limit 512MB
        ]:
            table = tables.softmax(k)
            with fz_connect(cluster) as c:
                pid = c.execute("SELECT pg_backend_pid()").fetchone()[0]
                t0 = time.monotonic()
                try:
                    c.execute("SELECT corgipile_train(%s, 'softmax', %s)",
                              (table, Jsonb({"features": sparse, "n_features": n_features, "verbose": False,
                                             "epochs": 1, "seed": 1})))
                    outcome, e = "a model", None
                except psycopg.Error as err:
                    assert not c.broken, f"connection lost: {err!r}"
                    outcome, e = f"{err.sqlstate}: {error_text(err)[:220]}", err
                with open(f"/proc/{pid}/status") as f:
                    peak = next(line.split()[1] for line in f if line.startswith("VmHWM"))
                what = (f"softmax K={k} x n_features={n_features}: {outcome} after {time.monotonic() - t0:.1f} s, "
                        f"backend peak RSS {int(peak) // 1024} MB")
                print("\n  " + what)
                if e is None or e.sqlstate != "54000" or (setting and setting not in error_text(e)):
                    failures.append(what)
        problem = watchdog.check()
        assert problem is None, problem
    finally:
        watchdog.close()
    assert not failures, "not refused before allocation:\n  " + "\n  ".join(failures)


def catalog_sized(cluster, table_sql, model, params, predict_calls):
    """Train a big model with corgipile.max_model_memory raised to 2GB, then RESET the setting and use it."""
    watchdog = Watchdog(cluster)
    outcomes = []
    try:
        with cluster.connect() as c:
            c.execute(f"SET statement_timeout = '{STATEMENT_TIMEOUT}'")
            c.execute(table_sql)
            c.execute("LOAD '$libdir/corgipile'")
            assert c.execute("SELECT current_setting('corgipile.max_model_memory', true)").fetchone()[0], \
                "the setting corgipile.max_model_memory does not exist"
            c.execute("SET corgipile.max_model_memory = '2GB'")
            t0 = time.monotonic()
            model_id = c.execute("SELECT corgipile_train(%s, %s, %s)",
                                 (params.pop("table"), model, Jsonb(params))).fetchone()[0]
            outcomes.append(f"train: model {model_id} in {time.monotonic() - t0:.1f} s")
            n_features, n_outputs, size = c.execute(
                "SELECT n_features, n_outputs, pg_column_size(weights) FROM corgipile.models WHERE id = %s",
                (model_id,)).fetchone()
            outcomes.append(f"n_features {n_features} x n_outputs {n_outputs}, weights stored in {size} bytes")
            c.execute("RESET corgipile.max_model_memory")
            assert watchdog.check() is None
            for what, sql, args in predict_calls(model_id):
                t0 = time.monotonic()
                try:
                    row = c.execute(sql, args).fetchone()
                    outcomes.append(f"{what}: {str(row[0])[:60]} ({time.monotonic() - t0:.1f} s)")
                except psycopg.Error as e:
                    assert not c.broken, f"{what}: connection lost: {e!r}\n{cluster.tail()}"
                    assert not (e.sqlstate or "XX").startswith("XX"), f"{what}: internal error {e.sqlstate}: {e}"
                    problem = limit_problem(e)
                    assert problem is None, f"{what}: {problem}: {error_text(e)}"
                    outcomes.append(f"{what}: ERROR {e.sqlstate} {error_text(e)[:120]} ({time.monotonic() - t0:.1f} s)")
                problem = watchdog.check()
                assert problem is None, f"{what}: {problem}\n{cluster.tail()}"
                assert c.execute("SELECT 1").fetchone()[0] == 1
            c.execute("SELECT corgipile_drop_model(%s::bigint)", (model_id,))
    finally:
        print("\n  " + "\n  ".join(outcomes))
        watchdog.close()


def test_catalog_sized_sparse_model_survives_reset(cluster):
    """A sparse svm of 20,000,000 features (160 MB of weights), trained under a raised limit."""
    n = 20_000_000
    catalog_sized(
        cluster,
        f"""CREATE TABLE big_sparse AS SELECT i,
                   ARRAY[1 + i % 5, 1000 + i % 7, {n} - i % 3]::int4[] AS idx,
                   ARRAY[random(), random(), random() + (i % 2)] AS val, i % 2 AS label
            FROM generate_series(1, 2000) i""",
        "svm",
        {"table": "big_sparse", "features": {"indices": "idx", "values": "val"}, "n_features": n,
         "epochs": 2, "verbose": False, "seed": 1},
        lambda m: [
            ("predict sparse", "SELECT corgipile_predict(%s::bigint, ARRAY[1, 20000000]::int4[], ARRAY[1.0, 2.0])", (m,)),
            ("predict dense", "SELECT corgipile_predict(%s::bigint, array_fill(0.5::float8, ARRAY[20000000]))", (m,)),
            ("decision_function", "SELECT corgipile_decision_function(%s::bigint, ARRAY[3]::int4[], ARRAY[1.0])", (m,)),
            ("evaluate", "SELECT corgipile_evaluate(%s::bigint, 'big_sparse')", (m,)),
            ("coefficients", "SELECT count(*) FROM corgipile_model_coefficients(%s::bigint)", (m,)),
        ],
    )


def test_catalog_sized_softmax_survives_reset(cluster):
    """A softmax of 4,000 classes x 4,000 features (128 MB of weights; one non-zero per row keeps it quick)."""
    k = 4000
    catalog_sized(
        cluster,
        f"""CREATE TABLE big_softmax AS SELECT i, ARRAY[1 + i % {k}]::int4[] AS idx, ARRAY[1.0::float8] AS val,
                   i % {k} AS label FROM generate_series(0, {k - 1}) i""",
        "softmax",
        {"table": "big_softmax", "features": {"indices": "idx", "values": "val"}, "n_features": k,
         "epochs": 1, "verbose": False, "seed": 1},
        lambda m: [
            ("predict dense", "SELECT corgipile_predict(%s::bigint, array_fill(0.5::float8, ARRAY[4000]))", (m,)),
            ("predict_proba", "SELECT cardinality(corgipile_predict_proba(%s::bigint, ARRAY[7]::int4[], ARRAY[1.0]))", (m,)),
            ("evaluate", "SELECT corgipile_evaluate(%s::bigint, 'big_softmax') - 'per_class'", (m,)),
            ("coefficients", "SELECT count(*) FROM corgipile_model_coefficients(%s::bigint)", (m,)),
        ],
    )


# ---------------------------------------------------------------------------------------------
# corgipile_shard_round: hostile requests. EXECUTE on it is granted to PUBLIC (it reads only what
# the caller may SELECT and stores nothing), so any role can send it any request text.
# ---------------------------------------------------------------------------------------------

SHARD_ROUND_SEED = int(os.environ.get("CORGIPILE_SHARD_ROUND_SEED", str(SEED + 1)))
SHARD_ROUND_CASES = int(os.environ.get("CORGIPILE_SHARD_ROUND_CASES", "140"))
SHARD_ROUND_BUDGET = 60.0  # seconds for the loop; it stops early (and says so) rather than overrun
SHARD_ROUND_LIMIT = 20.0 + 10.0  # every call returns within the statement timeout (and some slack)
SHARD_ROUND_SQL = "SELECT corgipile_shard_round(%s::regclass, %s, %s::jsonb, %s)"
# JSON numbers a request may hold where a count or an index goes.
ODD_NUMBERS = [-1, 0, 1, 2**31 - 1, 2**31, 2**32, 2**53, 2**62, 2**63 - 1, 2**63, 2**64 - 1, 2**64,
               10**11, 10**30, -2**63, 1e308, -1e308, 1.5, 1e-320]


def json_array(n, item="0"):
    """The text of a JSON array of n copies of `item` (built as text: n may be 5e7)."""
    return "[]" if n <= 0 else "[" + (item + ",") * (n - 1) + item + "]"


def with_raw(doc, raw):
    """json.dumps(doc), then each "@@k@@" string replaced by the raw JSON text raw[k]."""
    text = json.dumps(doc)
    for k, fragment in enumerate(raw):
        text = text.replace(f'"@@{k}@@"', fragment, 1)
    return text


class ShardRoundFuzz:
    """Requests for corgipile_shard_round: valid ones (one per phase) and hostile variations."""

    def __init__(self, cluster, rng):
        self.rng = rng
        with fz_connect(cluster) as c:
            self.version = c.execute(
                "SELECT extversion FROM pg_extension WHERE extname = 'corgipile'").fetchone()[0]
            c.execute("DROP TABLE IF EXISTS sr_tab")
            c.execute("""CREATE TABLE sr_tab AS SELECT i, random() + (i % 2) AS x1, random() AS x2,
                                (ARRAY['red', 'green', 'blue', 'cyan'])[1 + i % 4] AS color, i % 2 AS label
                         FROM generate_series(1, 400) i""")
            model_id = c.execute("SELECT corgipile_train('sr_tab', 'logistic', %s)",
                                 (Jsonb({"features": ["x1", "x2", "color"], "epochs": 1, "verbose": False,
                                         "seed": 1}),)).fetchone()[0]
        with cluster.connect() as admin:
            kind, n_features, weights, bias, mapping, prep = admin.execute(
                "SELECT model_type, n_features, weights, bias, label_mapping, preprocessing FROM corgipile.models "
                "WHERE id = %s", (model_id,)).fetchone()
        self.dense_table = Tables(cluster).dense()
        base = {"version": self.version, "epoch": 1, "round": 0, "rounds": 1,
                "extras": {"standardizer": None, "class_weights": None, "label_values": None}, "evaluate": None}
        self.templates = {
            "Statistics": (self.dense_table, "svm", {"features": "features", "label": "label", "only": True},
                           {**base, "phase": "Statistics", "n_features": 0, "weights": [], "bias": []}),
            "Train": (self.dense_table, "svm", {"features": "features", "label": "label", "only": True},
                      {**base, "phase": "Train", "n_features": 4, "weights": [0.1, -0.2, 0.3, 0.0], "bias": [0.05],
                       "extras": {"standardizer": {"mean": [0.5] * 4, "scale": [2.0] * 4, "center": True},
                                  "class_weights": [1.0, 1.5], "label_values": [0.0, 1.0]}}),
            "Evaluate": ("sr_tab", kind, {"features": ["x1", "x2", "color"], "label": "label", "only": True},
                         {**base, "phase": "Evaluate", "n_features": n_features, "weights": [], "bias": [],
                          "evaluate": {"model": {"kind": kind, "n_features": n_features, "n_outputs": 1,
                                                 "weights": list(weights), "bias": list(bias)},
                                       "classes": mapping.get("classes", []), "preprocessing": prep}}),
        }

    def template(self, phase=None):
        phase = phase or self.rng.choice(list(self.templates))
        table, model, params, request = self.templates[phase]
        return table, model, json.loads(json.dumps(params)), json.loads(json.dumps(request))

    def big(self, item="0"):
        """A large array length: at most ~100 MB of text of `item`s."""
        return min(self.rng.choice([10**5, 10**6, 10**7, 2 * 10**7, 5 * 10**7]), 10**8 // (len(item) + 1))

    def fixed_cases(self):
        """Cases every run makes, whatever the seed: (description, table, model, params, request)."""
        out = []
        table, model, params, req = self.template("Evaluate")
        req["evaluate"]["classes"] = "@@0@@"  # 10^7 class values (40 MB)
        out.append(({"kind": "fixed", "what": "evaluate with 10^7 classes"}, table, model, json.dumps(params),
                    with_raw(req, [json_array(10**7, '"c"')])))
        table, model, params, req = self.template("Evaluate")
        req["evaluate"]["model"].update(n_features=2**62, weights=[])
        out.append(({"kind": "fixed", "what": "evaluate model of 2^62 features"}, table, model, json.dumps(params),
                    json.dumps(req)))
        table, model, params, req = self.template("Train")
        req.update(n_features=10**11, weights="@@0@@")
        out.append(({"kind": "fixed", "what": "train 10^11 features, 5e7 weights (100 MB)"}, table, model,
                    json.dumps(params), with_raw(req, [json_array(5 * 10**7)])))
        table, model, params, req = self.template("Train")
        req["extras"]["class_weights"] = "@@0@@"
        out.append(({"kind": "fixed", "what": "2e7 class weights"}, table, model, json.dumps(params),
                    with_raw(req, [json_array(2 * 10**7, "1.5")])))
        table, model, params, req = self.template("Statistics")
        out.append(({"kind": "fixed", "what": "request nested 10^6 deep"}, table, model, json.dumps(params),
                     "[" * 10**6 + "]" * 10**6))
        return out

    def next_case(self):
        """(description, table, model, params text, request text)."""
        rng = self.rng
        kind = rng.choice(["huge_weights", "n_features", "extras", "evaluate", "deep", "mutation", "mutation",
                           "mutation", "counters", "params"])
        table, model, params, req = self.template()
        raw = []
        desc = {"kind": kind, "phase": req["phase"]}
        if kind == "huge_weights":
            table, model, params, req = self.template("Train")
            item = rng.choice(["0", "1e300", "-0.5"])
            n = self.big(item)
            req["n_features"] = rng.choice([n, 4, 2**62, 10**11])
            raw.append(json_array(n, item))
            req["weights"] = "@@0@@"
            desc.update(phase="Train", weights=n, n_features=req["n_features"])
        elif kind == "n_features":
            req["n_features"] = rng.choice(ODD_NUMBERS)
            if req["evaluate"] and rng.random() < 0.7:
                req["evaluate"]["model"]["n_features"] = rng.choice(ODD_NUMBERS)
                if rng.random() < 0.5:
                    req["evaluate"]["model"]["weights"] = []
            desc["n_features"] = req["n_features"]
        elif kind == "extras":
            table, model, params, req = self.template("Train")
            n = self.big("0.5,2")  # the standardizer's two arrays together
            what = rng.choice(["class_weights", "standardizer", "standardizer_mismatch", "label_values"])
            if what == "class_weights":
                raw.append(json_array(n, "1.5"))
                req["extras"]["class_weights"] = "@@0@@"
            elif what.startswith("standardizer"):
                raw += [json_array(n, "0.5"), json_array(n if what == "standardizer" else 3, "2")]
                req["extras"]["standardizer"] = {"mean": "@@0@@", "scale": "@@1@@", "center": True}
                if rng.random() < 0.5:
                    req["n_features"] = n
            else:
                req["extras"]["label_values"] = rng.choice([[1e308, -1e308], [0.0, 0.0], [1, 2, 3], [], None, "x"])
            desc.update(phase="Train", extras=what, n=n)
        elif kind == "evaluate":
            table, model, params, req = self.template("Evaluate")
            ev = req["evaluate"]
            n = self.big("0.25")
            what = rng.choice(["weights", "n_outputs", "classes", "categories", "prep_n_features", "prep_rows"])
            if what == "weights":
                raw.append(json_array(n, "0.25"))
                ev["model"]["weights"] = "@@0@@"
                ev["model"]["n_features"] = rng.choice([n, ev["model"]["n_features"], 2**62])
            elif what == "n_outputs":
                ev["model"]["n_outputs"] = rng.choice(ODD_NUMBERS)
            elif what == "classes":
                raw.append(json_array(n, '"c"'))
                ev["classes"] = "@@0@@"
            elif what == "categories":
                # Every list inside the preprocessing becomes a list of n strings (or numbers); at
                # most 2e6 each, so that all of them stay under ~100 MB.
                n = min(n, 2 * 10**6)
                def blow(node):
                    if isinstance(node, dict):
                        return {key: blow(v) for key, v in node.items()}
                    if isinstance(node, list):
                        raw.append(json_array(n, f'"cat{len(raw)}"') if not node or isinstance(node[0], str)
                                   else json_array(n, "1"))
                        return f"@@{len(raw) - 1}@@"
                    return node
                ev["preprocessing"]["columns"] = [blow(col) for col in ev["preprocessing"]["columns"]]
            elif what == "prep_n_features":
                ev["preprocessing"]["n_features"] = rng.choice(ODD_NUMBERS)
            else:
                ev["preprocessing"]["rows"] = rng.choice(ODD_NUMBERS)
            desc.update(phase="Evaluate", evaluate=what, n=n)
        elif kind == "deep":
            depth = rng.choice([200, 10_000, 1_000_000])
            nest = "[" * depth + "0" + "]" * depth
            where = rng.choice(["weights", "extras", "request", "params"])
            if where == "request":
                desc.update(deep=where, depth=depth)
                return desc, table, model, json.dumps(params), nest
            if where == "params":
                desc.update(deep=where, depth=depth)
                return desc, table, model, '{"features": ' + nest + "}", json.dumps(req)
            raw.append(nest)
            req[where] = "@@0@@"
            desc.update(deep=where, depth=depth)
        elif kind == "counters":
            for key in rng.sample(["epoch", "round", "rounds"], rng.randint(1, 3)):
                req[key] = rng.choice(ODD_NUMBERS)
            desc.update(epoch=req["epoch"], round=req["round"], rounds=req["rounds"])
        elif kind == "params":
            params[rng.choice(["n_features", "buffer_size", "block_size", "batch_size", "epochs", "sync",
                               "label", "features", "workers"])] = rng.choice(
                ODD_NUMBERS + ["1TB", "", "x" * 1000, {"indices": "features", "values": "features"}, [], None])
            desc["params"] = params
        else:  # random mutations of a valid request
            desc["mutations"] = []
            for _ in range(rng.randint(1, 4)):
                desc["mutations"].append(self.mutate(req))
            if rng.random() < 0.2:
                model = rng.choice(["svm", "logistic", "linear", "softmax", "bogus"])
                desc["model"] = model
        return desc, table, model, json.dumps(params), with_raw(req, raw)

    def mutate(self, doc):
        """One random change somewhere in doc (in place); returns what it did."""
        rng = self.rng
        paths = []

        def walk(node, path):
            if isinstance(node, dict):
                for key, v in node.items():
                    paths.append(path + [key])
                    walk(v, path + [key])
            elif isinstance(node, list):
                for i, v in enumerate(node[:8]):
                    paths.append(path + [i])
                    walk(v, path + [i])
        walk(doc, [])
        path = rng.choice(paths)
        parent = doc
        for p in path[:-1]:
            parent = parent[p]
        key = path[-1]
        action = rng.choice(["replace", "replace", "replace", "delete", "add", "grow"])
        if action == "delete":
            del parent[key]
        elif action == "add" and isinstance(parent, dict):
            parent[rng.choice(["extra", "weights", "phase", "n_features", "evaluate"])] = rng.choice(ODD_NUMBERS)
        elif action == "grow" and isinstance(parent[key], list):
            parent[key] = parent[key] * rng.choice([2, 1000, 100_000])
        elif rng.random() < 0.7 and isinstance(parent[key], (int, float)) and not isinstance(parent[key], bool):
            parent[key] = rng.choice(ODD_NUMBERS)  # same type: gets past the parser, reaches the checks
        elif rng.random() < 0.7 and isinstance(parent[key], list):
            parent[key] = [rng.choice(ODD_NUMBERS) for _ in parent[key]] + [rng.choice(ODD_NUMBERS)] * rng.randint(0, 2)
        else:
            parent[key] = rng.choice(ODD_NUMBERS + [None, True, "", "Train", "Evaluate", "Statistics", "x" * 10000,
                                                    [], {}, [None], {"a": [1, 2]}, [[0.5]] * 3])
        return f"{action} {'/'.join(map(str, path))}"


def test_shard_round_requests_never_crash(cluster):
    """corgipile_shard_round called directly by an ordinary role with hostile requests (sizes of
    tens to a hundred MB: big weights arrays, n_features of 10^11 and 2^62, negative numbers, huge
    class lists, category lists and standardizer arrays, an evaluate model with huge arrays, deep
    nesting, random mutations of valid requests of every phase, hostile params). Any clean ERROR is
    acceptable; XX000, a lost connection, a server restart (sentinel, checkpointer pid, the log's
    crash lines) or a call running past the statement timeout is not."""
    rng = random.Random(SHARD_ROUND_SEED)
    fuzz = ShardRoundFuzz(cluster, rng)
    watchdog = Watchdog(cluster)
    conn = fz_connect(cluster)
    internal, restarts, lost, slow, slowest = [], [], [], [], []
    by_state = {}
    stats = {"cases": 0, "ok": 0, "errors": 0}
    started = time.monotonic()
    try:
        # The valid requests work: the fuzz starts from requests a coordinator would send.
        for phase in fuzz.templates:
            table, model, params, req = fuzz.template(phase)
            reply = json.loads(conn.execute(SHARD_ROUND_SQL, (table, model, json.dumps(params),
                                                              json.dumps(req))).fetchone()[0])
            assert reply["rows"] > 0, (phase, reply)
        fixed = fuzz.fixed_cases()
        for case in range(SHARD_ROUND_CASES):
            if time.monotonic() - started > SHARD_ROUND_BUDGET:
                print(f"shard round fuzz: time budget reached after {case} cases")
                break
            desc, table, model, params, request = fixed.pop(0) if fixed else fuzz.next_case()
            label = f"case {case}: {json.dumps(desc)[:300]} ({len(request)} bytes)"
            stats["cases"] += 1
            t0 = time.monotonic()
            try:
                conn.execute(SHARD_ROUND_SQL, (table, model, params, request)).fetchall()
                stats["ok"] += 1
            except psycopg.Error as e:
                if conn.broken or conn.closed or e.sqlstate is None:
                    lost.append(f"{label}: {e!r}")
                else:
                    stats["errors"] += 1
                    entry = by_state.setdefault(e.sqlstate, [0, []])
                    entry[0] += 1
                    if len(entry[1]) < 3 and error_text(e)[:60] not in [m[:60] for m in entry[1]]:
                        entry[1].append(error_text(e)[:140])
                    if e.sqlstate.startswith("XX"):
                        internal.append(f"{label}: {e.sqlstate} {error_text(e)[:300]}")
            elapsed = time.monotonic() - t0
            slowest.append((elapsed, case, desc["kind"], len(request)))
            if elapsed > SHARD_ROUND_LIMIT:
                slow.append(f"{label}: {elapsed:.1f} s")
            conn = after_case(cluster, watchdog, conn, label, restarts)
    finally:
        conn.close()
        watchdog.close()
    print(f"\nshard round fuzz: {stats['cases']} cases in {time.monotonic() - started:.1f} s: "
          f"{stats['ok']} succeeded, {stats['errors']} clean errors")
    for state, (count, texts) in sorted(by_state.items()):
        print(f"  {state} x{count}: " + " | ".join(texts))
    slowest.sort(reverse=True)
    print("  slowest cases: " + ", ".join(f"#{c} {k} ({n // 1_000_000} MB) {t:.1f}s" for t, c, k, n in slowest[:6]))
    failures = []
    if restarts:
        failures.append("SERVER RESTARTED:\n  " + "\n  ".join(restarts))
    if lost:
        failures.append("connection lost:\n  " + "\n  ".join(lost))
    if internal:
        failures.append("internal errors (SQLSTATE XX000):\n  " + "\n  ".join(internal))
    if slow:
        failures.append(f"calls past the statement timeout ({STATEMENT_TIMEOUT}):\n  " + "\n  ".join(slow))
    if failures:
        pytest.fail("\n".join(failures) + "\n--- server log (tail) ---\n" + cluster.tail(40), pytrace=False)
    assert stats["cases"] >= 40, "too few cases ran within the time budget"
    assert stats["errors"] >= 20, f"fuzz distribution degenerate: {stats}"
