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
