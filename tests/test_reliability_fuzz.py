"""Property test: random params and random malformed tables thrown at corgipile_train and
corgipile_predict. Every call returns a model id or raises a clean psycopg.Error (never a dropped
connection), the server stays up, and every model produced is well-shaped."""

import json
import math
import random
import time

import psycopg
import psycopg.errors as E
import pytest
from psycopg.types.json import Jsonb

from reliability_helpers import connect, database_fixture, scalar, server_crashes

db = database_fixture("fuzz")

SEED = 20240505
CASES = 500
TIME_BUDGET = 50.0  # seconds; the loop stops early (and says so) rather than overrun

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


def test_fuzz_train_and_predict(db):
    rng = random.Random(SEED)
    crashes = server_crashes()
    stats = {"cases": 0, "models": 0, "errors": 0, "bad_inputs": 0, "predicts": 0, "timeouts": 0}
    error_classes = {}
    internal = []  # (case, message, params) of XX000 internal errors
    started = time.monotonic()
    with connect(db) as conn:
        conn.execute("SET statement_timeout = '3s'")
        for case in range(CASES):
            if time.monotonic() - started > TIME_BUDGET:
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
