"""Fixtures for the integration tests: a fresh database on the running test cluster
(scripts/cluster.sh; PGHOST/PGPORT/PGUSER come from `make pytest`)."""

import os
import pathlib

import psycopg
import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
DATASETS = pathlib.Path(os.environ.get("CORGIPILE_DATASETS", REPO.parent / "shared" / "datasets"))
DBNAME = os.environ.get("CORGIPILE_TEST_DB", "corgipile_pytest")


@pytest.fixture(scope="session")
def dsn():
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DBNAME} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {DBNAME}")
    with psycopg.connect(dbname=DBNAME, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION corgipile")
    return f"dbname={DBNAME}"


@pytest.fixture
def conn(dsn):
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c


def scalar(conn, sql, params=None):
    return conn.execute(sql, params).fetchone()[0]


def start_training(conn, rel, model, params):
    """Runs corgipile_train (without NOTICEs) in a thread; returns (thread, result dict with
    "started", "ended" and "value" or "error")."""
    import threading
    import time

    from psycopg.types.json import Jsonb

    result = {}

    def run():
        result["started"] = time.monotonic()
        try:
            result["value"] = conn.execute("SELECT corgipile_train(%s::regclass, %s, %s)",
                                           (rel, model, Jsonb({"verbose": False, **params}))).fetchone()[0]
        except BaseException as e:  # noqa: BLE001 - reported to the test
            result["error"] = e
        result["ended"] = time.monotonic()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, result


def stop_if_running(killer, t, pid):
    """Never leave a training running on the shared cluster."""
    if t.is_alive():
        killer.execute("SELECT pg_terminate_backend(%s)", (pid,))
        t.join(timeout=30)


def cancel_and_join(killer, t, result, pid, timeout=60):
    """Cancels the training running in thread `t` (from start_training) on backend `pid` and
    waits for it to stop; returns the seconds from the cancel to the end of its statement."""
    import time

    cancelled_at = time.monotonic()
    assert scalar(killer, "SELECT pg_cancel_backend(%s)", (pid,))
    t.join(timeout=timeout)
    assert not t.is_alive(), f"training not stopped {timeout} s after pg_cancel_backend"
    return result["ended"] - cancelled_at


def wait_active(observer, pid, timeout=10.0, function="corgipile_train"):
    """Until backend `pid` runs a query calling `function` (a cancel sent while idle would be
    ignored)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if scalar(observer, "SELECT state = 'active' AND strpos(query, %s) > 0 FROM pg_stat_activity "
                            "WHERE pid = %s", (function, pid)):
            return
        time.sleep(0.01)
    raise AssertionError("training did not start")
