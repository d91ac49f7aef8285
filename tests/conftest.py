"""Every shared pytest fixture of the integration tests, and the markers (pytest.ini registers
them). Plain helper functions are in tests/helpers.py, the builders of the tables several
suites train on in tests/tables.py.

The tests run against the running test cluster (scripts/cluster.sh; PGHOST/PGPORT/PGUSER come
from `make pytest`). Fixtures:

- dsn (session): the database CORGIPILE_TEST_DB (default corgipile_pytest), created afresh with
  the extension; most suites work in it, with tables named after the suite.
- conn: an autocommit connection to it.
- db (module): a database of the suite's own, <CORGIPILE_TEST_DB>_<suite> (test_cancel.py:
  corgipile_pytest_cancel), created with the extension before the suite's first test that asks
  for it and dropped after its last; it waits for the server first (a suite may crash-restart it).
- roles_env (module): in the dsn database, the ordinary roles helpers.ROLES_ENV_ALICE and
  ROLES_ENV_BOB (hard_alice, hard_bob) with CREATE on schema public, the 3000-row table
  hard_small (features, label, idx/val sparse pairs) and hard_other they may read; dropped, with
  their models and the hard_* tables of the suites that use it, after the module.
- roles_admin: a superuser connection to roles_env's database.

Markers (`pytest -m`; `make pytest-quick` runs -m "not slow and not own_cluster"):

- slow: a test (or a whole suite's module, via pytestmark) that takes many seconds.
- own_cluster: a test that starts PostgreSQL servers of its own besides the test cluster (shard
  servers, a cluster under `ulimit -v`), on ports derived from PGPORT or the
  CORGIPILE_HARDENING_*_PORT variables.
- restarts_server: a test that crash-restarts the test cluster (every session of it is lost).

Inputs outside the repository (helpers.missing_input): a missing LIBSVM dataset or contrib
extension fails its tests in CI (CI=true) or under CORGIPILE_REQUIRE_INPUTS=1, and skips them
elsewhere; pytest_terminal_summary then lists, at the end of the run, every suite skipped for a
missing input and why.
"""

import psycopg
import pytest

from helpers import (DATASETS, DBNAME, MISSING_INPUT, ROLES_ENV_ALICE, ROLES_ENV_BOB, ROLES_ENV_SMALL_ROWS,
                     connect, drop_role, wait_ready)
from tables import POINTS, points


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


def suite_dbname(module):
    """The `db` fixture's database for a test module: test_cancel -> <DBNAME>_cancel."""
    return f"{DBNAME}_{module.__name__.rsplit('.', 1)[-1].removeprefix('test_')}"


@pytest.fixture(scope="module")
def db(request):
    """A database of the suite's own with the extension; yields its dsn."""
    dbname = suite_dbname(request.module)
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


ROLES_ENV_ROLES = (ROLES_ENV_ALICE, ROLES_ENV_BOB)
# Tables the suites using roles_env create in its database (dropped with it).
ROLES_ENV_TABLES = ("hard_small", "hard_other", "hard_par_t", "hard_big", "hard_nan", "hard_div",
                    "hard_sparse_huge", "hard_wide", "hard_sm_classes", "hard_sm_70k", "hard_nf_bad")


@pytest.fixture(scope="module")
def roles_env(dsn):
    """Roles hard_alice and hard_bob, and small tables they may read."""
    with connect(dsn) as admin:
        for r in ROLES_ENV_ROLES:
            drop_role(admin, r)
            admin.execute(f"CREATE ROLE {r} LOGIN")
            admin.execute(f"GRANT CREATE, USAGE ON SCHEMA public TO {r}")
        points(admin, "hard_small", ROLES_ENV_SMALL_ROWS, features=POINTS + ("((i * 71) % 100) / 100.0", "(i % 7) / 7.0"),
               extra=["ARRAY[1, 3]::int4[] AS idx", f"ARRAY[{', '.join(POINTS)}]::float8[] AS val"])
        admin.execute("CREATE TABLE hard_other AS SELECT 1 AS x")
        admin.execute(f"GRANT SELECT ON hard_small, hard_other TO {ROLES_ENV_ALICE}, {ROLES_ENV_BOB}")
    yield dsn
    with connect(dsn) as admin:
        admin.execute("DELETE FROM corgipile.models WHERE trained_by IN (%s, %s)", ROLES_ENV_ROLES)
        for t in ROLES_ENV_TABLES:
            admin.execute(f"DROP TABLE IF EXISTS {t}")
        for r in ROLES_ENV_ROLES:
            drop_role(admin, r)


@pytest.fixture
def roles_admin(roles_env):
    with connect(roles_env) as c:
        yield c


MARKERS = {
    "slow": "takes many seconds (make pytest-quick leaves it out)",
    "own_cluster": "starts PostgreSQL servers of its own besides the test cluster (make pytest-quick leaves it out)",
    "restarts_server": "crash-restarts the test cluster: every session of it is lost",
}


def pytest_configure(config):
    for name, what in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {what}")


def skip_reason(report):
    """The reason of a skipped test's report ("Skipped: " dropped)."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Says loudly, at the end of the run, which suites' tests were skipped because an input
    outside the repository (a dataset, a contrib extension) is missing, and where to get it."""
    missing = {}
    for report in terminalreporter.stats.get("skipped", []):
        reason = skip_reason(report)
        if reason.startswith(MISSING_INPUT):
            missing.setdefault(reason.removeprefix(MISSING_INPUT), []).append(report.nodeid)
    if not missing:
        return
    tr = terminalreporter
    tests = sum(len(ids) for ids in missing.values())
    tr.section(f"{tests} TESTS SKIPPED: INPUTS MISSING (a failure in CI)", sep="!", red=True, bold=True)
    for what, ids in sorted(missing.items()):
        suites = sorted({i.split("::", 1)[0] for i in ids})
        tr.write_line(f"{len(ids)} test(s) of {', '.join(suites)}: {what}", red=True, bold=True)
    tr.write_line(f"Datasets are read from CORGIPILE_DATASETS (now {DATASETS}): the LIBSVM files ijcnn1, a9a "
                  "and w8a, see docs/development.md, \"Datasets\". With CI=true or CORGIPILE_REQUIRE_INPUTS=1 "
                  "a missing input fails its tests.", red=True)
