"""Shared helpers for the reliability and security suites (tests/test_reliability_*.py).

Each suite works in its own database `rel_<name>` on the running test cluster (PGHOST/PGPORT/PGUSER
from `scripts/cluster.sh env`), created by `database_fixture(name)` and dropped afterwards."""

import os
import subprocess
import time

import psycopg
import pytest
from psycopg.types.json import Jsonb

PG_BIN = os.environ.get("CORGIPILE_PG_BIN", "/usr/lib/postgresql/15/bin")  # the major under test (make sets it)
SERVER_LOG = os.environ.get("CORGIPILE_CLUSTER_DIR", "/tmp/corgipile-cluster") + "/log"


def connect(dsn, **kw):
    kw.setdefault("autocommit", True)
    return psycopg.connect(dsn, **kw)


def scalar(conn, sql, params=None):
    return conn.execute(sql, params).fetchone()[0]


def parallel_guc(conn):
    """The setting that forces a parallel plan: PostgreSQL 16 renamed force_parallel_mode."""
    return "force_parallel_mode" if int(scalar(conn, "SHOW server_version_num")) < 160000 else "debug_parallel_query"


def wait_ready(timeout=60.0):
    """Wait until the server accepts connections and runs a query (after a crash restart)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        r = subprocess.run([f"{PG_BIN}/pg_isready", "-q"], capture_output=True)
        if r.returncode == 0:
            try:
                with psycopg.connect(dbname="postgres", autocommit=True, connect_timeout=5) as c:
                    if c.execute("SELECT 1").fetchone()[0] == 1:
                        return time.monotonic()
            except psycopg.Error as e:  # still in recovery
                last = e
        time.sleep(0.25)
    raise AssertionError(f"server not ready after {timeout} s: {last}")


def database_fixture(name, scope="module"):
    """A pytest fixture creating database rel_<name> with the extension; yields its dsn."""
    dbname = f"rel_{name}"

    @pytest.fixture(scope=scope)
    def _db():
        wait_ready(60)
        with psycopg.connect(dbname="postgres", autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)")
            admin.execute(f"CREATE DATABASE {dbname}")
        with psycopg.connect(dbname=dbname, autocommit=True) as c:
            c.execute("CREATE EXTENSION corgipile")
        yield f"dbname={dbname}"
        try:
            wait_ready(60)
            with psycopg.connect(dbname="postgres", autocommit=True) as admin:
                admin.execute(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)")
        except Exception:  # never fail a test because of cleanup
            pass

    return _db


def train(conn, table, model="svm", params=None):
    p = {"verbose": False}
    p.update(params or {})
    return scalar(conn, "SELECT corgipile_train(%s, %s, %s)", (table, model, Jsonb(p)))


def catalog_counts(conn):
    """(models, epochs) as the superuser sees them."""
    return conn.execute(
        "SELECT (SELECT count(*) FROM corgipile.models), (SELECT count(*) FROM corgipile.epochs)"
    ).fetchone()


def assert_catalog_consistent(conn):
    orphans_m = scalar(conn, """SELECT count(*) FROM corgipile.models m
                                WHERE NOT EXISTS (SELECT 1 FROM corgipile.epochs e WHERE e.model_id = m.id)""")
    orphans_e = scalar(conn, """SELECT count(*) FROM corgipile.epochs e
                                WHERE NOT EXISTS (SELECT 1 FROM corgipile.models m WHERE m.id = e.model_id)""")
    assert (orphans_m, orphans_e) == (0, 0), f"models without epochs: {orphans_m}, epochs without model: {orphans_e}"


def proc_status(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k] = v.strip()
    return out


def status_kb(pid, key):
    return int(proc_status(pid)[key].split()[0])


def threads(pid):
    return int(proc_status(pid)["Threads"])


def server_crashes():
    """Number of crash restarts in the server log: the postmaster reinitialises after any
    backend dies abnormally (a signal, an abort, an unexpected exit code)."""
    try:
        with open(SERVER_LOG, errors="replace") as f:
            return sum(1 for line in f
                       if "terminated by signal" in line or "all server processes terminated; reinitializing" in line)
    except OSError:
        return 0
