"""Fuzzing: whatever a role throws at corgipile, the server never restarts and every failure is a
clean ERROR.

1. Property test, on the shared test cluster (a database of the suite's own, the db fixture):
   random params and random malformed tables thrown at corgipile_train and corgipile_predict.
   Every call returns a model id or raises a clean psycopg.Error (never a dropped connection), the
   server stays up, and every model produced is well-shaped.

2. Absurd sizes, on a throw-away PostgreSQL cluster of its own (helpers.Cluster; marked
   own_cluster), started under `ulimit -v` (about 4 GB of address space per process), so that an
   unbounded allocation fails instead of waking the OOM killer. An ordinary role then asks
   corgipile for absurd sizes: feature dimensions up to 2^31-1, sparse indices up to 2147483647,
   softmax models of up to 70,000 classes, batches of a million, buffers of a terabyte or 2^31
   tuples, blocks of 2^31 pages, prediction vectors of up to 10^7 elements. Any clean ERROR is
   acceptable; an internal error (SQLSTATE XX000), a lost connection or a server restart is not.
   A restart is detected by an idle sentinel connection, pg_postmaster_start_time(), the
   checkpointer's pid and the server log.

   test_shard_round_requests_never_crash calls corgipile_shard_round (EXECUTE is granted to PUBLIC)
   directly with hostile requests: fixed cases (10^7 class values, a 2^62-feature model, 10^11
   features with 5e7 weights, 2e7 class weights, 10^6-deep nesting) then seeded random ones (huge
   arrays in weights, extras and evaluate models, odd counts, deep nesting, hostile params, random
   mutations of valid Statistics / Train / network Train / Evaluate requests), each within the
   statement timeout. The random trainings of (1) and (2) include networks (mlp,
   mlp_regression: up to 16 hidden layers, widths up to 65,536, adam or sgd).
"""

import json
import math
import os
import random
import re
import time

import psycopg
import psycopg.errors as E
import pytest
from psycopg.types.json import Jsonb

from helpers import CRASH_RE, SHARD_PROTOCOL, VMEM_KB, Cluster, connect, scalar, server_crashes

# =============================================================================================
# 1. Property test on the shared cluster
# =============================================================================================

PROPERTY_SEED = 20240505
PROPERTY_CASES = 500
PROPERTY_TIME_BUDGET = 50.0  # seconds; the loop stops early (and says so) rather than overrun

VALID_KEYS = ["features", "label", "epochs", "learning_rate", "decay", "l2", "batch_size", "tolerance",
              "seed", "shuffle", "block_size", "buffer_size", "double_buffer", "verbose"]


def random_json(rng, depth=0):
    kind = rng.choice(["int", "float", "str", "bool", "null", "list", "dict", "big", "neg", "numstr"])
    if kind == "int":
        return rng.choice([0, 1, 2, 3, 7, 64, 1000, 2**31, 2**63 - 1, 2**63, 2**64, 10**30])
    if kind == "float":
        return rng.choice([0.0, 0.5, 1e-300, 5e-324, 1.0, 1.5, 0.999999, 1e6, 1e300, 1.7976931348623157e308])
    if kind == "str":
        return rng.choice(["", "auto", "corgipile", "no_shuffle", "block_only", "10%", "100%", "0.5%", "1MB",
                           "512kB", "1TB", "8B", "NaN", "Infinity", "-1", "features", "label", "x",
                           "é\u2603", "a" * 300, "10 MB", "10mb", " 10MB", "1e3"])
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "big":
        return rng.choice([10**9, 10**18, 10**100, 1e308])
    if kind == "neg":
        return rng.choice([-1, -0.0, -1e-9, -(2**63), -1e308])
    if kind == "numstr":
        return rng.choice(["1", "0", "3.5", "-2", "1e9"])
    if depth > 1:
        return None
    if kind == "list":
        return [random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(["a", "epochs", ""]): random_json(rng, depth + 1) for _ in range(rng.randint(0, 2))}


def plausible(rng, key):
    """A mostly-valid value for `key` (so that many cases get past validation and train)."""
    return {
        "features": lambda: rng.choice(["features", "features", "x", "label", "nope"]),
        "label": lambda: rng.choice(["label", "label", "x", "features", "nope"]),
        "epochs": lambda: rng.choice([1, 2, 3, 5]),
        "learning_rate": lambda: rng.choice([1e-4, 0.01, 0.5, 10.0, 1e6]),
        "decay": lambda: rng.choice([0.5, 0.95, 1]),
        "l2": lambda: rng.choice([0, 1e-4, 1.0, 1e6]),
        "batch_size": lambda: rng.choice([1, 2, 7, 1000, 1_000_000]),
        "tolerance": lambda: rng.choice([0, 1e-9, 1.0, 1e300]),
        "seed": lambda: rng.choice([None, 0, 1, 2**63 - 1]),
        "shuffle": lambda: rng.choice(["corgipile", "block_only", "no_shuffle"]),
        "block_size": lambda: rng.choice(["auto", 1, 3, "8kB", "1MB", "1TB"]),
        "buffer_size": lambda: rng.choice(["10%", "100%", "0.001%", 1, 2, 17, "1B", "64kB", "1MB"]),
        "double_buffer": lambda: rng.random() < 0.5,
        "verbose": lambda: False,
    }[key]()


def random_params(rng):
    """(params, odd): odd when a random (mostly invalid) value or key was used."""
    params, odd = {}, False
    for key in rng.sample(VALID_KEYS, rng.randint(0, 6)):
        if rng.random() < 0.85:
            params[key] = plausible(rng, key)
        else:
            params[key], odd = random_json(rng), True
    if rng.random() < 0.05:
        params[rng.choice(["epoch", "lr", "Seed", "unknown", "", "features "])] = random_json(rng)
        odd = True
    if rng.random() < 0.03:
        return rng.choice([[], "x", 1, None, [params]]), True  # not an object
    # Keep valid trainings short: epochs within the accepted range but large would run for long.
    if isinstance(params.get("epochs"), int) and not isinstance(params.get("epochs"), bool) \
            and 5 < params["epochs"] <= 1_000_000:
        params["epochs"] = 5
    params.setdefault("verbose", False)
    return params, odd


def random_table(rng):
    """(ftype, ltype, dims, rows, defective): rows (features, label) from a small pool of shapes."""
    ftype = rng.choice(["float8[]", "float4[]"])
    ltype = rng.choice(["int", "smallint", "bigint", "float8", "real", "numeric", "boolean"])
    dims = rng.choice([1, 2, 3, 5, 50])
    n = rng.choice([0, 1, 2, 3, 5, 10, 40, 200, 2000])
    defect_rate = rng.choice([0.0, 0.0, 0.0, 0.0, 0.02, 0.2, 0.6, 1.0])
    huge = 3e38 if ftype == "float4[]" else 1e308
    classes = rng.choice([[0, 1], [0, 1], [0, 1], [-1, 1], [3, 7], [1], [0, 1, 2]])
    if ltype == "boolean":
        classes = [c % 2 == 1 for c in classes][:2]
    rows = []
    for _ in range(n):
        feats = [rng.uniform(-3, 3) for _ in range(dims)]
        label = rng.choice(classes)
        if rng.random() < defect_rate:
            d = rng.choice(["null_features", "empty", "short", "long", "null_elem", "nan", "inf", "huge",
                            "null_label", "tiny"])
            if d == "null_features":
                feats = None
            elif d == "empty":
                feats = []
            elif d == "short":
                feats = feats[:-1]
            elif d == "long":
                feats = feats + [1.0]
            elif d == "null_elem":
                feats[rng.randrange(dims)] = None
            elif d == "nan":
                feats[rng.randrange(dims)] = float("nan")
            elif d == "inf":
                feats[rng.randrange(dims)] = rng.choice([float("inf"), float("-inf")])
            elif d == "huge":
                feats = [rng.choice([huge, -huge]) for _ in range(dims)]
            elif d == "null_label":
                label = None
            elif d == "tiny":
                feats = [5e-324 for _ in range(dims)] if ftype == "float8[]" else [1e-45] * dims
        rows.append((feats, label))
    defective = n == 0 or defect_rate > 0 or len(set(classes)) != 2
    return ftype, ltype, dims, rows, defective


def literal(feats, ftype):
    if feats is None:
        return None
    items = []
    for v in feats:
        if v is None:
            items.append("NULL")
        elif math.isnan(v):
            items.append("NaN")
        elif math.isinf(v):
            items.append("Infinity" if v > 0 else "-Infinity")
        else:
            items.append(repr(v))
    return "{" + ",".join(items) + "}"


def check_model(conn, model_id, params, rows):
    m = conn.execute("""SELECT n_features, cardinality(weights), rows_trained, rows_skipped,
                               (SELECT bool_and(w = w AND w NOT IN ('Infinity', '-Infinity')) FROM unnest(weights) w)
                        FROM corgipile.models WHERE id = %s""", (model_id,)).fetchone()
    assert m is not None, f"model {model_id} returned but not stored"
    n_features, cardinality, trained, skipped, finite = m
    assert n_features == cardinality
    assert finite, "non-finite weights stored"
    assert trained + skipped == len(rows)
    epochs = [r[0] for r in conn.execute("SELECT epoch FROM corgipile.epochs WHERE model_id = %s ORDER BY epoch",
                                         (model_id,))]
    asked = params.get("epochs", 20)
    assert 1 <= len(epochs) <= asked and epochs == list(range(1, len(epochs) + 1)), (epochs, asked)
    tuples = {r[0] for r in conn.execute("SELECT tuples FROM corgipile.epochs WHERE model_id = %s", (model_id,))}
    assert tuples == {trained}
    if params.get("features", "features") == "features" and params.get("label", "label") == "label":
        used = [f for f, l in rows if l is not None and f]
        assert trained == len(used)
        assert {len(f) for f in used} == {n_features}
    return n_features


@pytest.mark.slow
def test_fuzz_train_and_predict(db):
    rng = random.Random(PROPERTY_SEED)
    crashes = server_crashes()
    stats = {"cases": 0, "models": 0, "errors": 0, "bad_inputs": 0, "predicts": 0, "timeouts": 0}
    error_classes = {}
    internal = []  # (case, message, params) of XX000 internal errors
    started = time.monotonic()
    with connect(db) as conn:
        conn.execute("SET statement_timeout = '3s'")
        for case in range(PROPERTY_CASES):
            if time.monotonic() - started > PROPERTY_TIME_BUDGET:
                print(f"fuzz: time budget reached after {case} cases")
                break
            ftype, ltype, dims, rows, defective = random_table(rng)
            params, odd_params = random_params(rng)
            model = rng.choice(["svm", "logistic", "svm", "logistic", "linear_svm"])
            conn.execute("DROP TABLE IF EXISTS fz")
            conn.execute(f"CREATE TABLE fz (id serial, features {ftype}, label {ltype}, x int DEFAULT 1)")
            if rows:
                with conn.cursor() as cur:
                    cur.executemany(f"INSERT INTO fz (features, label) VALUES (%s::{ftype}, %s::{ltype})",
                                    [(literal(f, ftype), l) for f, l in rows])
            stats["cases"] += 1
            if defective or odd_params or model not in ("svm", "logistic"):
                stats["bad_inputs"] += 1
            model_id = None
            try:
                model_id = scalar(conn, "SELECT corgipile_train('fz', %s, %s)", (model, Jsonb(params)))
            except psycopg.Error as e:
                assert not conn.closed and not conn.broken, f"case {case}: connection lost: {e!r}"
                stats["errors"] += 1
                if isinstance(e, E.QueryCanceled):
                    stats["timeouts"] += 1
                    print(f"fuzz: case {case} hit the 3 s statement_timeout: {len(rows)} rows x {dims} "
                          f"({ftype}), params {json.dumps(params)}")
                error_classes[type(e).__name__] = error_classes.get(type(e).__name__, 0) + 1
                if (e.sqlstate or "XX").startswith("XX"):
                    internal.append((case, str(e).splitlines()[0], json.dumps(params)))
            assert scalar(conn, "SELECT 1") == 1, f"case {case}: session unusable"
            if model_id is not None:
                if not isinstance(params, dict):
                    pytest.fail(f"case {case}: non-object params {params!r} accepted")
                stats["models"] += 1
                n_features = check_model(conn, model_id, params, rows)
                # Predict: right shape works and returns one of the two classes; wrong shapes error cleanly.
                for arr in ([0.5] * n_features, [0.5] * (n_features + 1), [], [1e308] * n_features,
                            [float("nan")] * n_features, None):
                    stats["predicts"] += 1
                    try:
                        p = scalar(conn, "SELECT corgipile_predict(%s, %s::float8[])",
                                   (model_id, literal(arr, "float8[]")))
                        if arr is None:
                            assert p is None
                        else:
                            assert len(arr) == n_features and all(math.isfinite(v) for v in arr)
                            labels = conn.execute("SELECT label_mapping FROM corgipile.models WHERE id = %s",
                                                  (model_id,)).fetchone()[0]
                            assert p is not None and math.isfinite(p), (p, labels)
                    except psycopg.Error as e:
                        assert not conn.broken, f"case {case}: predict dropped the connection: {e!r}"
                        assert arr is not None and (len(arr) != n_features or not all(map(math.isfinite, arr))), \
                            f"case {case}: predict failed on a valid vector: {e!r}"
                if rng.random() < 0.3:
                    conn.execute("DELETE FROM corgipile.models WHERE id = %s", (model_id,))
            if rng.random() < 0.1:
                stats["predicts"] += 1
                with pytest.raises(psycopg.Error):
                    conn.execute("SELECT corgipile_predict(%s, ARRAY[1]::float8[])", (rng.choice([-5, 0, 10**15]),))
                assert scalar(conn, "SELECT 1") == 1
    elapsed = time.monotonic() - started
    print(f"fuzz: {stats['cases']} cases in {elapsed:.1f} s: {stats['bad_inputs']} with bad input, "
          f"{stats['models']} models trained, {stats['errors']} clean errors ({stats['timeouts']} timeouts), "
          f"{stats['predicts']} predict calls; error classes {error_classes}")
    assert server_crashes() == crashes, "a backend crashed during the fuzz run (see the server log)"
    # Every error must be a clean one: an internal error (SQLSTATE XX000) is a bug.
    for case, message, params in internal:
        print(f"fuzz: internal error in case {case}: {message}  params={params}")
    assert not internal, f"internal errors (SQLSTATE XX000) instead of clean errors: {internal}"
    assert stats["cases"] >= 100, "too few cases ran within the time budget"
    assert stats["models"] >= 50 and stats["errors"] >= 50, "fuzz distribution degenerate"


# =============================================================================================
# 2. Absurd sizes on a cluster of its own (ulimit -v)
# =============================================================================================

PORT = int(os.environ.get("CORGIPILE_HARDENING_PORT", "28917"))
OWN_DB = "hardening"  # the database on the cluster of its own
ROLE = "fz"

SEED = int(os.environ.get("CORGIPILE_HARDENING_SEED", "20250611"))
CASES = int(os.environ.get("CORGIPILE_HARDENING_CASES", "150"))
TIME_BUDGET = 200.0  # seconds for the fuzz loop; it stops early (and says so) rather than overrun
STATEMENT_TIMEOUT = "20s"
HUGE_COEFFICIENT_CALLS = 2  # coefficients of models above 2^24 weights: each may take the whole timeout

MEMORY_SETTINGS = ("corgipile.max_model_memory", "corgipile.max_buffer_memory")


# ---------------------------------------------------------------------------------------------
# The throw-away cluster (started as scripts/cluster.sh does, plus ulimit -v)
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster():
    c = Cluster(PORT, OWN_DB)
    try:
        c.init()
        c.start()
        c.wait_ready()
        with open(f"/proc/{c.postmaster_pid()}/limits") as f:
            limits = f.read()
        m = re.search(r"Max address space\s+(\d+)", limits)
        assert m and int(m.group(1)) == VMEM_KB * 1024, f"ulimit -v not applied to the server:\n{limits}"
        with c.connect(dbname="postgres") as admin:
            admin.execute(f"CREATE DATABASE {OWN_DB}")
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
    if rng.random() < 0.25:
        # A network over the same shapes: widths from 1 to the largest allowed, up to 16 layers.
        model = "mlp_regression" if model == "linear" else "mlp"
        # (16 layers stay narrow: 16 of 1,024 fit the default limit and would train for the
        # whole statement timeout; two of 65,536 are refused at once.)
        layers = rng.choice([1, 1, 2, 3, 16])
        widths = [1, 8, 64] if layers == 16 else [1, 8, 64, 1024, 65536]
        params["hidden"] = [rng.choice(widths) for _ in range(layers)]
        params["activation"] = rng.choice(["relu", "tanh"])
        params["optimizer"] = rng.choice(["adam", "sgd"])
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


@pytest.mark.own_cluster
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


@pytest.mark.own_cluster
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
            # Networks, as the same ordinary role: 16 layers of 65,536 (2^36 weights), two of them
            # with batches of a million rows (activations beyond any memory), a sparse first
            # layer 2^31 wide inferred from the data: refused before anything of them exists.
            for table, model, params in (
                    (tables.dense(), "mlp", {"hidden": [65536] * 16}),
                    (tables.dense(), "mlp_regression", {"label": "y", "hidden": [65536, 65536],
                                                         "batch_size": 1_000_000}),
                    (sp, "mlp", {"features": sparse, "index_base": 0, "hidden": [64]}),
                    (tables.sparse(100_000_000), "mlp", {"features": sparse, "hidden": [64]})):
                e = expect_memory_limit(c, train, (table, model, Jsonb({**params, "verbose": False,
                                                                         "epochs": 1})))
                assert e.sqlstate == "54000", f"{model} {params}: {e.sqlstate} {error_text(e)}"
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


@pytest.mark.own_cluster
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


@pytest.mark.own_cluster
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


@pytest.mark.own_cluster
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
        with fz_connect(cluster) as c:
            # The dense table's mark (what a sharded training records of a shard's table).
            mark = dict(zip(("system", "database", "relid", "filenode", "pages"), c.execute(
                """SELECT (SELECT system_identifier FROM pg_control_system()),
                          (SELECT oid FROM pg_database WHERE datname = current_database()),
                          %s::regclass::oid, pg_relation_filenode(%s::regclass)::oid,
                          pg_relation_size(%s::regclass) / current_setting('block_size')::int""",
                (self.dense_table,) * 3).fetchone()))
        base = {"version": self.version, "protocol": SHARD_PROTOCOL, "epoch": 1, "round": 0, "rounds": 1,
                "extras": {"standardizer": None, "class_weights": None, "label_values": None}, "evaluate": None}
        self.templates = {
            "Statistics": (self.dense_table, "svm", {"features": "features", "label": "label", "only": True},
                           {**base, "phase": "Statistics", "n_features": 0, "weights": [], "bias": []}),
            "Train": (self.dense_table, "svm", {"features": "features", "label": "label", "only": True},
                      {**base, "phase": "Train", "n_features": 4,
                       "learners": [{"weights": [0.1, -0.2, 0.3, 0.0], "bias": [0.05]}],
                       "extras": {"standardizer": {"mean": [0.5] * 4, "scale": [2.0] * 4, "center": True},
                                  "class_weights": [1.0, 1.5], "label_values": [0.0, 1.0]}}),
            # A network round: hidden [4] over 4 features and 2 classes, 30 parameters.
            "TrainNetwork": (self.dense_table, "mlp",
                             {"features": "features", "label": "label", "only": True, "hidden": [4]},
                             {**base, "phase": "Train", "n_features": 4, "learners": [{"weights": [0.1] * 30, "bias": []}],
                              "training": 7, "network": {"classes": [0, 1], "target_mean": 0.0,
                                          "target_scale": 1.0}}),
            "Evaluate": ("sr_tab", kind, {"features": ["x1", "x2", "color"], "label": "label", "only": True},
                         {**base, "phase": "Evaluate", "n_features": n_features, "weights": [], "bias": [],
                          "evaluate": {"model": {"kind": kind, "n_features": n_features,
                                                 "n_outputs": 1, "weights": list(weights),
                                                 "bias": list(bias), "layers": None, "activation": None},
                                       "classes": mapping.get("classes", []), "preprocessing": prep}}),
            # A list of feature columns: its statistics round (in the coordinator's time zone),
            # and a training round that encodes with the coordinator's preprocessing.
            "StatisticsColumns": ("sr_tab", "logistic",
                                  {"features": ["x1", "x2", "color"], "label": "label", "only": True},
                                  {**base, "phase": "Statistics", "n_features": 0, "weights": [], "bias": [],
                                   "zone": "Europe/Zurich"}),
            "TrainColumns": ("sr_tab", "logistic", {"features": ["x1", "x2", "color"], "label": "label", "only": True},
                             {**base, "phase": "Train", "n_features": n_features,
                              "learners": [{"weights": [0.1] * n_features, "bias": [0.0]}], "preprocessing": prep}),
            # Per-group models (shard protocol 7): the statistics round counts the groups; a
            # training round numbers them by the coordinator's keys, a learner per group.
            "StatisticsGroups": ("sr_tab", "logistic",
                                 {"features": ["x1", "x2", "color"], "label": "label", "only": True,
                                  "group_by": "color", "name": "sr_groups"},
                                 {**base, "phase": "Statistics", "n_features": 0, "weights": [], "bias": []}),
            "TrainGroups": ("sr_tab", "logistic",
                            {"features": ["x1", "x2", "color"], "label": "label", "only": True,
                             "group_by": "color", "name": "sr_groups"},
                            {**base, "phase": "Train", "n_features": n_features, "groups": ["red", "cyan"],
                             "learners": [{"weights": [0.1] * n_features, "bias": [0.0], "group": g}
                                          for g in (None, 0, 1)], "preprocessing": prep}),
            # A training round "since" a model: the shards' marks (this table's among them).
            "TrainSince": (self.dense_table, "svm",
                           {"features": "features", "label": "label", "only": True, "since": 1, "replay": 0.5},
                           {**base, "phase": "Train", "n_features": 4,
                            "learners": [{"weights": [0.1, -0.2, 0.3, 0.0], "bias": [0.05]}], "marks": [{**mark, "system": mark["system"] ^ 1}, mark]}),
            # A Newton pass of "inference": every row summed at the coordinator's coefficients.
            "Inference": (self.dense_table, "logistic",
                          {"features": "features", "label": "label", "only": True, "inference": True},
                          {**base, "phase": "Inference", "n_features": 4,
                           "extras": {"standardizer": None, "class_weights": None, "label_values": [0.0, 1.0]},
                           "inference": {"weights": [0.1, -0.2, 0.3, 0.0], "bias": 0.05}}),
            # A validation round: the epoch's model scored on the rows this backend held out.
            "Validate": (self.dense_table, "svm", {"features": "features", "label": "label", "only": True},
                         {**base, "phase": "Validate", "training": 9, "n_features": 4,
                          "extras": {"standardizer": None, "class_weights": None, "label_values": [0.0, 1.0]},
                          "learners": [{"score": {"model": {"kind": "svm", "n_features": 4, "n_outputs": 1,
                                                            "weights": [0.1, -0.2, 0.3, 0.0], "bias": [0.05],
                                                            "layers": None, "activation": None},
                                                  "classes": [], "preprocessing": None}}]}),
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
            req["learners"][0]["weights"] = "@@0@@"
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
            if where == "weights":
                req["learners"] = [{"weights": "@@0@@"}]
            else:
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
                model = rng.choice(["svm", "logistic", "linear", "softmax", "mlp", "mlp_regression", "bogus"])
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
            parent[rng.choice(["extra", "learners", "weights", "phase", "n_features", "evaluate"])] = rng.choice(ODD_NUMBERS)
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


@pytest.mark.own_cluster
def test_shard_round_requests_never_crash(cluster):
    """corgipile_shard_round called directly by an ordinary role with hostile requests (sizes of
    tens to a hundred MB: big weights arrays, n_features of 10^11 and 2^62, negative numbers, huge
    class lists, category lists and standardizer arrays, an evaluate model with huge arrays, deep
    nesting, random mutations of valid requests of every phase — per-group rounds too — hostile
    params). Any clean ERROR is
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
            if phase == "Validate":  # no rows held out by this backend for training 9: none scored
                assert reply["learners"][0]["validation"]["rows"] == 0, reply
            else:
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
