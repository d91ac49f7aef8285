"""Tables distributed by Citus are refused before any work (src/request/citus.rs). On a Citus
node the table a user names is a shell whose own pages are empty or hold stale rows; corgipile
reads a table's own pages, so it would train on nothing, or on the rows from before
create_distributed_table, without a word.

Citus cannot be installed here: the suite makes a stand-in of the one catalog the check reads,
pg_catalog.pg_dist_partition with Citus's columns, in its own database, the way Citus's install
script makes it: CREATE TABLE in a schema of its own, then ALTER TABLE ... SET SCHEMA pg_catalog
(CREATE TABLE pg_catalog.x is refused even to a superuser without allow_system_table_mods;
moving a table there needs CREATE on pg_catalog, which only superusers have). The stand-in is
dropped after the suite (and the suite's database with it).

Checks: a "distributed" (hash) table, a reference table, a view over a distributed table and a
partitioned table with a distributed partition are refused with 0A000 naming the table, before
any model row is stored, by every function that reads a relation's pages (train, explain, trace,
evaluate, the evaluation tables, feature importance, shuffle); an ordinary table and a
partition that is not distributed still train; a hostile role's look-alikes (a table named
pg_dist_partition in its own schema first on its search_path, a temporary one) change nothing,
it cannot move one into pg_catalog, and the check does not depend on SELECT on the catalog;
a catalog of another shape is an ERROR, never a pass.
"""

import pytest
from psycopg.types.json import Jsonb

from helpers import connect, describe, drop_role, error_of, models_count, rows_trained, scalar, train, train_error

HOSTILE = "citus_mallory"
ROWS = 2000
COLUMNS = {"features": ["x1", "x2"], "label": "label", "epochs": 2, "seed": 5}
ROW_SQL = f"""SELECT i AS id, (i % 2) * 2 - 1 + ((i * 37) % 100) / 100.0 AS x1, ((i * 53) % 100) / 100.0 AS x2,
                     i % 2 AS label FROM generate_series(1, {ROWS}) i"""
# Citus's pg_dist_partition (citus--*.sql and later upgrade scripts; src/include/distributed/
# pg_dist_partition.h): the columns it has had since Citus 11.
CATALOG_COLUMNS = """logicalrelid regclass NOT NULL, partmethod "char" NOT NULL, partkey text,
                     colocationid integer DEFAULT 0 NOT NULL, repmodel "char" DEFAULT 'c' NOT NULL,
                     autoconverted boolean DEFAULT false"""


@pytest.fixture(scope="module")
def env(db):
    with connect(db) as admin:
        drop_role(admin, HOSTILE)
        admin.execute(f"CREATE ROLE {HOSTILE} LOGIN")
        admin.execute(f"CREATE SCHEMA {HOSTILE} AUTHORIZATION {HOSTILE}")
        admin.execute(f"GRANT USAGE ON SCHEMA public TO {HOSTILE}")
        for t in ("cg_plain", "cg_dist", "cg_ref"):
            admin.execute(f"CREATE TABLE {t} AS {ROW_SQL}")
        admin.execute("CREATE TABLE cg_parted (id int, x1 float8, x2 float8, label int) PARTITION BY RANGE (id)")
        admin.execute("CREATE TABLE cg_parted_1 PARTITION OF cg_parted FOR VALUES FROM (1) TO (1001)")
        admin.execute("CREATE TABLE cg_parted_2 PARTITION OF cg_parted FOR VALUES FROM (1001) TO (2001)")
        admin.execute(f"INSERT INTO cg_parted {ROW_SQL}")
        admin.execute("CREATE VIEW cg_dist_view AS SELECT id, x1, x2, label FROM cg_dist WHERE id > 10")
        admin.execute(f"GRANT SELECT ON cg_plain, cg_dist, cg_ref, cg_parted, cg_dist_view TO {HOSTILE}")
        # The stand-in, made as Citus's install script makes it.
        admin.execute("CREATE SCHEMA citus_standin")
        admin.execute(f"CREATE TABLE citus_standin.pg_dist_partition ({CATALOG_COLUMNS})")
        admin.execute("ALTER TABLE citus_standin.pg_dist_partition SET SCHEMA pg_catalog")
        admin.execute("DROP SCHEMA citus_standin")
        admin.execute("GRANT SELECT ON pg_catalog.pg_dist_partition TO PUBLIC")  # as Citus does
        # A hash-distributed table, a reference table, and a partition distributed with its
        # parent's colocation group (as create_distributed_table on cg_parted would record it).
        admin.execute("""INSERT INTO pg_catalog.pg_dist_partition (logicalrelid, partmethod, partkey, colocationid, repmodel)
                         VALUES ('cg_dist', 'h', 'id', 1, 's'), ('cg_ref', 'n', NULL, 2, 't'),
                                ('cg_parted_2', 'h', 'id', 1, 's')""")
    yield db
    with connect(db) as admin:
        admin.execute("DROP TABLE IF EXISTS pg_catalog.pg_dist_partition")
        admin.execute("DELETE FROM corgipile.models WHERE trained_by = %s", (HOSTILE,))
        drop_role(admin, HOSTILE)
        assert scalar(admin, "SELECT count(*) FROM pg_class WHERE relname = 'pg_dist_partition'") == 0


@pytest.fixture
def admin(env):
    with connect(env) as c:
        yield c


def assert_refused(e, shown, subject, kind):
    """`e` is the Citus ERROR for `shown`, naming `subject` as distributed (`kind`)."""
    assert e is not None and e.sqlstate == "0A000", describe(e)
    assert e.diag.message_primary.startswith(f"cannot {shown}: {subject} is distributed by Citus ({kind})"), describe(e)
    hint = e.diag.message_hint or ""
    assert "postgres_fdw sharded table" in hint and "docs/scale-out.md" in hint, describe(e)
    assert f"CREATE TABLE ... AS SELECT * FROM public.{shown.split()[-1]}." in hint, describe(e)


def test_distributed_table_is_refused_before_any_work(admin):
    before = models_count(admin)
    e = train_error(admin, "cg_dist", "logistic", COLUMNS)
    assert_refused(e, "read cg_dist", "it", "a hash-distributed table")
    assert models_count(admin) == before, "a model row was stored"
    # Every function that reads a relation's pages.
    model = train(admin, "cg_plain", "logistic", COLUMNS)
    reads = {
        "corgipile_explain": ("SELECT * FROM corgipile_explain('cg_dist', 'logistic', %s)", (Jsonb(COLUMNS),)),
        "corgipile_trace": ("SELECT count(*) FROM corgipile_trace('cg_dist', %s)", (Jsonb({"label": "label"}),)),
        "corgipile_evaluate": ("SELECT corgipile_evaluate(%s::bigint, 'cg_dist')", (model,)),
        "corgipile_confusion_matrix": ("SELECT count(*) FROM corgipile_confusion_matrix(%s::bigint, 'cg_dist')", (model,)),
        "corgipile_roc_curve": ("SELECT count(*) FROM corgipile_roc_curve(%s::bigint, 'cg_dist')", (model,)),
        "corgipile_calibration": ("SELECT count(*) FROM corgipile_calibration(%s::bigint, 'cg_dist')", (model,)),
        "corgipile_feature_importance":
            ("SELECT count(*) FROM corgipile_feature_importance(%s::bigint, 'cg_dist')", (model,)),
        "corgipile_train with a validation relation":
            ("SELECT corgipile_train('cg_plain', 'logistic', %s)", (Jsonb({**COLUMNS, "validation": {"relation": "cg_dist"}}),)),
    }
    for what, (sql, params) in reads.items():
        e = error_of(admin, sql, params)
        assert e is not None and e.sqlstate == "0A000" and "cg_dist: it is distributed by Citus" in str(e), \
            f"{what}: {describe(e)}"
    e = error_of(admin, "SELECT corgipile_shuffle('cg_dist', 'cg_dist_shuffled')")
    assert_refused(e, "shuffle cg_dist", "it", "a hash-distributed table")
    assert scalar(admin, "SELECT to_regclass('cg_dist_shuffled')") is None
    assert models_count(admin) == before + 1, "only the model of cg_plain is stored"


def test_reference_table_is_refused(admin):
    # A reference table's rows are in its shard (cg_ref_<shardid>) on every node, the
    # coordinator's placement included: the table named is a shell there too.
    assert_refused(train_error(admin, "cg_ref", "logistic", COLUMNS), "read cg_ref", "it", "a reference table")


def test_view_over_a_distributed_table_is_refused(admin):
    e = train_error(admin, "cg_dist_view", "logistic", COLUMNS)
    assert_refused(e, "read view cg_dist_view", "its table cg_dist", "a hash-distributed table")


def test_partition_of_a_partitioned_table_is_refused(admin):
    before = models_count(admin)
    e = train_error(admin, "cg_parted", "logistic", COLUMNS)
    assert_refused(e, "read cg_parted", "its partition cg_parted_2", "a hash-distributed table")
    assert_refused(train_error(admin, "cg_parted_2", "logistic", COLUMNS), "read cg_parted_2", "it",
                   "a hash-distributed table")
    assert models_count(admin) == before
    # The partition Citus does not list is an ordinary table.
    m = train(admin, "cg_parted_1", "logistic", COLUMNS)
    assert rows_trained(admin, m) == 1000


def test_ordinary_table_still_trains(admin):
    m = train(admin, "cg_plain", "logistic", COLUMNS)
    assert rows_trained(admin, m) == ROWS
    assert scalar(admin, "SELECT corgipile_evaluate(%s::bigint, 'cg_plain')", (m,))["rows_scored"] == ROWS
    assert scalar(admin, "SELECT corgipile_shuffle('cg_plain', 'cg_plain_shuffled')") == ROWS
    admin.execute("DROP TABLE cg_plain_shuffled")


def test_hostile_lookalikes_change_nothing(env, admin):
    with connect(env, user=HOSTILE) as mallory:
        # A look-alike in its own schema, first on its search_path, that lists the ordinary
        # table and leaves out the distributed one; and an empty temporary one (pg_temp is
        # searched before pg_catalog for an unqualified name).
        mallory.execute(f"CREATE TABLE {HOSTILE}.pg_dist_partition ({CATALOG_COLUMNS})")
        mallory.execute(f"INSERT INTO {HOSTILE}.pg_dist_partition (logicalrelid, partmethod) VALUES ('cg_plain', 'h')")
        mallory.execute(f"CREATE TEMPORARY TABLE pg_dist_partition ({CATALOG_COLUMNS})")
        mallory.execute(f"SET search_path = {HOSTILE}, public")
        assert scalar(mallory, "SELECT count(*) FROM pg_dist_partition") == 0, "the temporary look-alike shadows"
        # Neither can join the real catalog's schema.
        e = error_of(mallory, f"ALTER TABLE {HOSTILE}.pg_dist_partition SET SCHEMA pg_catalog")
        assert e is not None and e.sqlstate == "42501", describe(e)
        e = error_of(mallory, "CREATE TABLE pg_catalog.pg_dist_shard (x int)")
        assert e is not None and e.sqlstate == "42501", describe(e)
        m = train(mallory, "cg_plain", "logistic", COLUMNS)
        assert rows_trained(mallory, m) == ROWS, "the look-alike made an ordinary table fail"
        assert_refused(train_error(mallory, "cg_dist", "logistic", COLUMNS), "read cg_dist", "it",
                       "a hash-distributed table")
        # The check reads the catalog itself: no SELECT on it is needed.
        admin.execute("REVOKE SELECT ON pg_catalog.pg_dist_partition FROM PUBLIC")
        try:
            assert_refused(train_error(mallory, "cg_dist", "logistic", COLUMNS), "read cg_dist", "it",
                           "a hash-distributed table")
        finally:
            admin.execute("GRANT SELECT ON pg_catalog.pg_dist_partition TO PUBLIC")
    # A superuser with the look-alike first on the search path: the same.
    admin.execute(f"SET search_path = {HOSTILE}, public")
    assert rows_trained(admin, train(admin, "cg_plain", "logistic", COLUMNS)) == ROWS
    assert_refused(train_error(admin, "cg_dist", "logistic", COLUMNS), "read cg_dist", "it", "a hash-distributed table")


def test_catalog_of_another_shape_is_an_error(admin):
    admin.execute("ALTER TABLE pg_catalog.pg_dist_partition RENAME COLUMN logicalrelid TO relation")
    try:
        e = train_error(admin, "cg_plain", "logistic", COLUMNS)
        assert e is not None and e.sqlstate == "55000", describe(e)
        assert "pg_dist_partition" in e.diag.message_primary and "logicalrelid" in e.diag.message_primary, describe(e)
    finally:
        admin.execute("ALTER TABLE pg_catalog.pg_dist_partition RENAME COLUMN relation TO logicalrelid")
