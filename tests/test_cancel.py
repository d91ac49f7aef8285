"""Cancel and statement_timeout stop a training within a second (README, Security and limits), leave no model row,
and leave the session usable."""

import threading
import time

import psycopg
import pytest

from conftest import cancel_and_join, scalar


@pytest.fixture(scope="module")
def big(dsn):
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(
            """CREATE TABLE cancel_me AS SELECT ARRAY[random(), random(), random(), random()] AS features,
                      (i % 2) AS label FROM generate_series(1, 300000) i"""
        )
    return dsn


@pytest.mark.parametrize("double_buffer", [True, False])
def test_pg_cancel_backend_stops_training(big, dsn, double_buffer):
    models_before = None
    with psycopg.connect(big, autocommit=True) as victim, psycopg.connect(dsn, autocommit=True) as killer:
        models_before = scalar(killer, "SELECT count(*) FROM corgipile.models")
        pid = scalar(victim, "SELECT pg_backend_pid()")
        result = {}

        def run():
            started = time.monotonic()
            try:
                victim.execute(
                    "SELECT corgipile_train('cancel_me', 'logistic', %s)",
                    (psycopg.types.json.Jsonb({"epochs": 1_000_000, "verbose": False, "double_buffer": double_buffer}),),
                )
            except psycopg.Error as e:
                result["error"] = e
            result["ended"] = time.monotonic()
            result["started"] = started

        t = threading.Thread(target=run)
        t.start()
        time.sleep(2.0)
        assert t.is_alive(), "training should still be running"
        latency = cancel_and_join(killer, t, result, pid, timeout=10)
        assert isinstance(result.get("error"), psycopg.errors.QueryCanceled)
        # From pg_cancel_backend to the ERROR at the client (conftest.cancel_and_join).
        print(f"\ncancel latency logistic double_buffer={double_buffer}: {latency:.3f} s")
        assert latency < 1.0, f"cancel took {latency:.3f} s"
        assert scalar(killer, "SELECT count(*) FROM corgipile.models") == models_before
        # The session goes on working, and can train again.
        assert scalar(victim, "SELECT 1") == 1


def test_statement_timeout_stops_training(big, conn):
    before = scalar(conn, "SELECT count(*) FROM corgipile.models")
    conn.execute("SET statement_timeout = '1500ms'")
    started = time.monotonic()
    with pytest.raises(psycopg.errors.QueryCanceled):
        conn.execute("SELECT corgipile_train('cancel_me', 'svm', '{\"epochs\": 1000000, \"verbose\": false}')")
    elapsed = time.monotonic() - started
    conn.execute("RESET statement_timeout")
    print(f"\nstatement_timeout latency svm: {elapsed - 1.5:.3f} s")
    assert elapsed - 1.5 < 1.0, f"the ERROR came {elapsed - 1.5:.3f} s after the statement_timeout"
    assert scalar(conn, "SELECT count(*) FROM corgipile.models") == before
    model_id = scalar(conn, "SELECT corgipile_train('cancel_me', 'svm', '{\"epochs\": 1, \"verbose\": false}')")
    assert model_id is not None


def test_no_worker_threads_left_behind(big, conn):
    """After cancelled trainings the backend runs a single thread again (workers were joined)."""
    pid = scalar(conn, "SELECT pg_backend_pid()")
    for _ in range(3):
        conn.execute("SET statement_timeout = '300ms'")
        with pytest.raises(psycopg.errors.QueryCanceled):
            conn.execute("SELECT corgipile_train('cancel_me', 'svm', '{\"epochs\": 1000000, \"verbose\": false}')")
        conn.execute("RESET statement_timeout")
    with open(f"/proc/{pid}/status") as f:
        threads = next(int(line.split()[1]) for line in f if line.startswith("Threads:"))
    assert threads == 1
