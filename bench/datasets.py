"""Benchmark datasets: generated label-clustered tables at the shapes of the paper's Table 2
(scaled to this machine) and the real LIBSVM datasets in three storage orders (paper §7.4.3).

Everything lives in the benchmark database; a table is reused when its COMMENT carries the same
generation signature (shape, seed, version), so reruns do not regenerate 4.5M-row tables.

Generated labels come from a hidden linear model plus Gaussian noise: for dense data
x_j ~ U(-1, 1), w ~ N(0, 1) scaled so that w.x has unit variance, label = (w.x + 0.5 N(0,1) > 0),
which caps the achievable accuracy near 85% (1 - arccos(1/sqrt(1.25))/pi)."""

import math
import os
import subprocess
import sys
from dataclasses import dataclass, field

import numpy as np

GEN_VERSION = 3
NOISE = 0.5
DATASET_DIR = os.environ.get("CORGIPILE_DATASETS", "/work/shared/datasets")
LOADER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", "load_libsvm.py")
VALIDATION_BYTES = 96 * 1024 * 1024  # the validation relation is held in memory by the trainer


@dataclass
class Dataset:
    name: str            # display name, e.g. "susy-like (clustered)"
    train: str           # training table (stored in the order named by `order`)
    test: str            # full test table (final test accuracy)
    val: str             # validation table for per-epoch accuracy (test rows, capped in size)
    rows: int
    n_features: int
    order: str           # clustered | shuffled | feature-ordered
    sparse: bool = False
    family: str = ""     # dataset without the order, e.g. "a9a"
    note: str = ""
    size: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def feature_params(self):
        if self.sparse:
            return {"features": {"indices": "idx", "values": "val"}, "n_features": self.n_features}
        return {}

    @property
    def scan_sql(self):
        col = "cardinality(val)" if self.sparse else "features[1]"
        return f"SELECT sum({col}) FROM {self.train}"


def _signature(conn, table):
    return conn.execute("SELECT obj_description(to_regclass(%s), 'pg_class')", (table,)).fetchone()[0]


def _reusable(conn, tables, sig):
    return all(_signature(conn, t) == sig for t in tables)


def _sign(conn, tables, sig):
    for t in tables:
        conn.execute(f"COMMENT ON TABLE {t} IS '{sig}'")
        conn.execute(f"VACUUM ANALYZE {t}")


def _size(conn, table):
    return conn.execute("SELECT pg_size_pretty(pg_total_relation_size(%s))", (table,)).fetchone()[0]


def _make_val(conn, test, val, row_bytes, sig):
    """Per-epoch validation relation: the first rows of the (randomly ordered) test table."""
    n = max(1000, min(50_000, VALIDATION_BYTES // row_bytes))
    conn.execute(f"DROP TABLE IF EXISTS {val}")
    conn.execute(f"CREATE TABLE {val} AS SELECT * FROM {test} ORDER BY id LIMIT {n}")
    _sign(conn, [val], sig)


def _log(msg):
    print(f"[datasets] {msg}", file=sys.stderr, flush=True)


def _session(conn, seed):
    conn.execute("SET max_parallel_workers_per_gather = 0")  # random() must run in one process
    conn.execute("SET work_mem = '1GB'")
    conn.execute("SELECT setseed(%s)", (seed,))


def dense_synthetic(conn, key, rows, n_features, test_rows, seed):
    """A label-clustered dense table (negatives first, then positives) and a random-order test
    table drawn from the same hidden model."""
    train, test, val = f"bench_{key}_{rows}_clustered", f"bench_{key}_{rows}_test", f"bench_{key}_{rows}_val"
    sig = f"corgipile-bench v{GEN_VERSION} dense rows={rows} d={n_features} test={test_rows} seed={seed}"
    if not _reusable(conn, [train, test, val], sig):
        rng = np.random.default_rng(seed)
        w = rng.standard_normal(n_features)
        w /= math.sqrt((w ** 2).sum() / 3.0)  # Var(w.x) = 1 for x ~ U(-1, 1)
        w_sql = "ARRAY[" + ",".join(f"{v:.6f}" for v in w) + "]::float8[]"
        for table, n, s in ((train, rows, seed), (test, test_rows, seed + 1)):
            _log(f"generating {table} ({n:,} x {n_features})")
            _session(conn, s / 1000.0)
            conn.execute(f"DROP TABLE IF EXISTS {table}")
            order = "ORDER BY label, id" if table == train else "ORDER BY id"
            # Box-Muller noise; 1 - random() is in (0, 1].
            conn.execute(f"""
                CREATE TABLE {table} AS
                SELECT id, (dot + {NOISE} * sqrt(-2 * ln(1 - random())) * cos(2 * pi() * random()) > 0)::int AS label,
                       features
                FROM (SELECT id, f AS features, (SELECT sum(a * b) FROM unnest(f, {w_sql}) u(a, b)) AS dot
                      FROM (SELECT i AS id, ARRAY(SELECT random() * 2 - 1 FROM generate_series(1, {n_features} + 0 * i))::float8[] AS f
                            FROM generate_series(1, {n}) i) g) h
                {order}""")
        _sign(conn, [train, test], sig)
        _make_val(conn, test, val, (n_features + 1) * 8, sig)
    return train, test, val


def sparse_synthetic(conn, key, rows, dims, nnz, test_rows, seed):
    """A criteo-like sparse table: ~nnz one-hot indices per row out of `dims`, skewed towards small
    indices (index = 1 + floor(dims * u^3), so some features are frequent), hidden weight of index
    k = sin(k * 78.233) * 2, label = (sum of hidden weights + noise > 0); stored label-clustered."""
    train, test, val = f"bench_{key}_{rows}_clustered", f"bench_{key}_{rows}_test", f"bench_{key}_{rows}_val"
    sig = f"corgipile-bench v{GEN_VERSION} sparse rows={rows} dims={dims} nnz={nnz} test={test_rows} seed={seed}"
    if not _reusable(conn, [train, test, val], sig):
        scale = math.sqrt(nnz * 2.0)  # std of the sum of nnz weights sin(.)*2 (variance 2 each)
        for table, n, s in ((train, rows, seed), (test, test_rows, seed + 1)):
            _log(f"generating {table} ({n:,} rows, {dims:,} dims, ~{nnz} non-zeros)")
            _session(conn, s / 1000.0)
            conn.execute(f"DROP TABLE IF EXISTS {table}")
            order = "ORDER BY label, id" if table == train else "ORDER BY id"
            conn.execute(f"""
                CREATE TABLE {table} AS
                SELECT id, (dot + {NOISE * scale} * sqrt(-2 * ln(1 - random())) * cos(2 * pi() * random()) > 0)::int AS label,
                       idx, val
                FROM (SELECT i AS id, s.idx, s.val, s.dot
                      FROM generate_series(1, {n}) i,
                      LATERAL (SELECT array_agg(k ORDER BY k)::int4[] AS idx, array_agg(1.0::float8) AS val,
                                      sum(sin(k * 78.233) * 2) AS dot
                               FROM (SELECT DISTINCT (1 + floor({dims} * power(random(), 3)))::int AS k
                                     FROM generate_series(1, {nnz} + 0 * i)) d) s) g
                {order}""")
        _sign(conn, [train, test], sig)
        _make_val(conn, test, val, nnz * 12 + 8, sig)
    return train, test, val


def synthetic(conn, spec, seed=42):
    """spec: dict(key, kind, rows, n_features, test_rows[, nnz])."""
    if spec["kind"] == "sparse":
        train, test, val = sparse_synthetic(conn, spec["key"], spec["rows"], spec["n_features"], spec["nnz"],
                                            spec["test_rows"], seed)
    else:
        train, test, val = dense_synthetic(conn, spec["key"], spec["rows"], spec["n_features"], spec["test_rows"], seed)
    return Dataset(name=f"{spec['key']} ({spec['rows']:,} x {spec['n_features']:,}, clustered)", train=train, test=test,
                   val=val, rows=spec["rows"], n_features=spec["n_features"], order="clustered",
                   sparse=spec["kind"] == "sparse", family=spec["key"], size=_size(conn, train),
                   note=spec.get("note", ""))


def _load_libsvm(conn, path, table, n_features):
    conn.execute(f"DROP TABLE IF EXISTS {table}")
    _log(f"loading {path} into {table}")
    subprocess.run([sys.executable, LOADER, path, table, "--n-features", str(n_features)], check=True,
                   stdout=subprocess.DEVNULL)


REAL = {
    # name: (train file, test file or None = hold out id % 5 = 0, n_features)
    "a9a": ("a9a.train.bz2", "a9a.test.bz2", 123),
    "ijcnn1": ("ijcnn1.train.bz2", "ijcnn1.test.bz2", 22),
    "w8a": ("w8a.bz2", None, 300),
}


def real(conn, name):
    """The real dataset `name` in three storage orders: shuffled, clustered by label, ordered by the
    feature most correlated with the label. Returns [Dataset, ...] sharing one test table."""
    train_file, test_file, d = REAL[name]
    raw, test, val = f"bench_{name}_raw", f"bench_{name}_test", f"bench_{name}_val"
    orders = {"shuffled": f"bench_{name}_shuffled", "clustered": f"bench_{name}_clustered",
              "feature-ordered": f"bench_{name}_featord"}
    sig = f"corgipile-bench v{GEN_VERSION} real {name}"
    if not _reusable(conn, [test, val, *orders.values()], sig):
        _load_libsvm(conn, os.path.join(DATASET_DIR, train_file), raw, d)
        if test_file:
            _load_libsvm(conn, os.path.join(DATASET_DIR, test_file), test, d)
        else:
            conn.execute(f"DROP TABLE IF EXISTS {test}")
            conn.execute(f"CREATE TABLE {test} AS SELECT * FROM {raw} WHERE id % 5 = 0")
            conn.execute(f"DELETE FROM {raw} WHERE id % 5 = 0")
        # The feature with the largest |correlation| with the label (paper §7.4.3 sorts by features).
        corr = conn.execute(f"""SELECT j, abs(coalesce(corr(features[j], label), 0)) c
                                FROM {raw}, generate_series(1, {d}) j GROUP BY j ORDER BY c DESC, j LIMIT 1""").fetchone()
        conn.execute("SELECT setseed(0.42)")
        ordering = {"shuffled": "md5(id::text)", "clustered": "label, id", "feature-ordered": f"features[{corr[0]}], id"}
        for order, table in orders.items():
            conn.execute(f"DROP TABLE IF EXISTS {table}")
            conn.execute(f"CREATE TABLE {table} AS SELECT * FROM {raw} ORDER BY {ordering[order]}")
            conn.execute(f"COMMENT ON COLUMN {table}.features IS 'ordered by features[{corr[0]}]'")
        conn.execute(f"DROP TABLE {raw}")
        _sign(conn, [test, *orders.values()], sig)
        conn.execute(f"DROP TABLE IF EXISTS {val}")
        conn.execute(f"CREATE TABLE {val} AS SELECT * FROM {test}")  # small: validate on the whole test set
        _sign(conn, [val], sig)
    feat = conn.execute("SELECT col_description(%s::regclass, 3)", (orders["feature-ordered"],)).fetchone()[0]
    rows = conn.execute(f"SELECT count(*) FROM {orders['shuffled']}").fetchone()[0]
    out = []
    for order, table in orders.items():
        note = feat if order == "feature-ordered" else ""
        out.append(Dataset(name=f"{name} ({order})", train=table, test=test, val=val, rows=rows, n_features=d,
                           order=order, family=name, note=note, size=_size(conn, table)))
    return out


def trace_table(conn, rows=1000):
    """A label-clustered table whose features[1] is the original row number (for corgipile_trace)."""
    table = f"bench_trace_{rows}"
    sig = f"corgipile-bench v{GEN_VERSION} trace rows={rows}"
    if not _reusable(conn, [table], sig):
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(f"""CREATE TABLE {table} AS
            SELECT i AS id, (i > {rows} / 2)::int AS label,
                   ARRAY[i::float8, (i > {rows} / 2)::int - 0.5, (i % 7)::float8 / 7] AS features
            FROM generate_series(1, {rows}) i ORDER BY i""")
        _sign(conn, [table], sig)
    return table
