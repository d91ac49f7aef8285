"""Fixtures for the integration tests: a fresh database on the running test cluster
(scripts/cluster.sh; PGHOST/PGPORT/PGUSER come from `make pytest`)."""

import os
import pathlib

import psycopg
import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
DATASETS = pathlib.Path(os.environ.get("CORGIPILE_DATASETS", REPO.parent / "shared" / "datasets"))
DBNAME = os.environ.get("CORGIPILE_TEST_DB", "corgipile_pytest")
# `make pytest` (and so `make test`) sets CORGIPILE_REQUIRE_INPUTS=1: an input a test needs (a
# dataset, a contrib extension) that is missing is then a failure naming it, never a skip that
# would let CI pass without the check. A developer running a file by hand may still skip.
REQUIRE_INPUTS = os.environ.get("CORGIPILE_REQUIRE_INPUTS", "") not in ("", "0")


def missing_input(what):
    """A test cannot run because `what` (an input outside the repository) is absent: fails under
    CORGIPILE_REQUIRE_INPUTS=1 (make test), skips otherwise."""
    if REQUIRE_INPUTS:
        pytest.fail(f"required input missing: {what} (CORGIPILE_REQUIRE_INPUTS=1, as make test sets)",
                    pytrace=False)
    pytest.skip(f"{what} (set CORGIPILE_REQUIRE_INPUTS=1 to make this a failure)")


def dataset(*names):
    """Paths of files in DATASETS; a missing one is missing_input (a failure under make test)."""
    paths = [DATASETS / n for n in names]
    absent = [str(p) for p in paths if not p.exists()]
    if absent:
        missing_input("dataset file(s) not found: " + ", ".join(absent)
                      + " (CORGIPILE_DATASETS or ../shared/datasets)")
    return paths if len(paths) > 1 else paths[0]


def require_extension(conn, name):
    """The contrib extension `name` is installable on the server under test, else missing_input."""
    if not conn.execute("SELECT count(*) FROM pg_available_extensions WHERE name = %s", (name,)).fetchone()[0]:
        missing_input(f"{name} is not available in this server's installation")


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
