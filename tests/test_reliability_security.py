"""Security: table and column privileges, row-level security, params as identifiers (no SQL
injection), and the catalog's per-role isolation."""

import psycopg
import psycopg.errors as E
import pytest

from reliability_helpers import catalog_counts, connect, database_fixture, scalar, train

db = database_fixture("security")
ROLES = ["rel_sec_none", "rel_sec_cols", "rel_sec_full", "rel_sec_rls", "rel_sec_a", "rel_sec_b"]


@pytest.fixture(scope="module")
def setup(db):
    with connect(db) as c:
        for r in ROLES:
            c.execute(f"DROP ROLE IF EXISTS {r}")
            c.execute(f"CREATE ROLE {r}")
        c.execute("""CREATE TABLE t AS SELECT i AS id, ARRAY[random(), random() + (i % 2), random()] AS features,
                     (i % 2) AS label, (i % 3 = 0) AS mine FROM generate_series(1, 30000) i ORDER BY i""")
        c.execute("GRANT SELECT (features) ON t TO rel_sec_cols")
        c.execute("GRANT SELECT (features, label) ON t TO rel_sec_full")
        c.execute("ALTER TABLE t ENABLE ROW LEVEL SECURITY")
        c.execute("CREATE POLICY only_mine ON t FOR SELECT TO rel_sec_rls USING (mine)")
        c.execute("GRANT SELECT ON t TO rel_sec_rls, rel_sec_a, rel_sec_b")
        c.execute("CREATE POLICY all_rows ON t FOR SELECT TO rel_sec_full, rel_sec_a, rel_sec_b USING (true)")
        # The same visible rows, in the same physical order (t was loaded in id order).
        c.execute("CREATE TABLE only_mine AS SELECT * FROM t WHERE mine ORDER BY id")
        c.execute("GRANT SELECT ON only_mine TO rel_sec_rls")
    yield db
    # Roles are cluster-wide: drop the database (and with it every grant and policy) first.
    with connect("dbname=postgres") as admin:
        admin.execute("DROP DATABASE IF EXISTS rel_security WITH (FORCE)")
        for r in ROLES:
            admin.execute(f"DROP ROLE IF EXISTS {r}")


@pytest.fixture
def conn(setup):
    with connect(setup) as c:
        yield c
        c.execute("RESET ROLE")


def as_role(conn, role):
    conn.execute(f"SET ROLE {role}")


def test_no_select_privilege(conn):
    before = catalog_counts(conn)
    as_role(conn, "rel_sec_none")
    with pytest.raises(E.InsufficientPrivilege):
        train(conn, "t", "svm", {"epochs": 1})
    with pytest.raises(E.InsufficientPrivilege):
        conn.execute("SELECT * FROM corgipile_explain('t', 'svm')")
    with pytest.raises(E.InsufficientPrivilege):
        conn.execute("SELECT * FROM corgipile_explain('t', 'svm', '{}', true)")
    conn.execute("RESET ROLE")
    assert catalog_counts(conn) == before


def test_column_privileges(conn):
    as_role(conn, "rel_sec_cols")  # features only: the label is not readable
    with pytest.raises(E.InsufficientPrivilege):
        train(conn, "t", "svm", {"epochs": 1})
    with pytest.raises(E.InsufficientPrivilege):
        train(conn, "t", "svm", {"epochs": 1, "label": "id"})  # id not granted either
    conn.execute("RESET ROLE")


def test_column_privileges_on_features_and_label_suffice(conn):
    as_role(conn, "rel_sec_full")  # features and label: enough (id and mine are not needed)
    assert scalar(conn, "SELECT count(*) FROM (SELECT label, features FROM ONLY t) s") == 30000
    model_id = train(conn, "t", "svm", {"epochs": 1, "seed": 1})
    assert scalar(conn, "SELECT rows_trained FROM corgipile.models WHERE id = %s", (model_id,)) == 30000
    with pytest.raises(E.InsufficientPrivilege):
        train(conn, "t", "svm", {"epochs": 1, "features": "features", "label": "mine"})


def weights(conn, model_id):
    return conn.execute("SELECT weights, bias, rows_trained FROM corgipile.models WHERE id = %s",
                        (model_id,)).fetchone()


@pytest.mark.parametrize("double_buffer", [True, False])
def test_row_level_security(conn, double_buffer):
    params = {"epochs": 3, "seed": 7, "shuffle": "no_shuffle", "double_buffer": double_buffer}
    policy_rows = scalar(conn, "SELECT count(*) FROM t WHERE mine")
    all_model = train(conn, "t", "svm", params)  # superuser: RLS bypassed, all rows
    as_role(conn, "rel_sec_rls")
    assert scalar(conn, "SELECT count(*) FROM t") == policy_rows
    rls_model = train(conn, "t", "svm", params)
    copy_model = train(conn, "only_mine", "svm", params)
    w_rls, w_copy = weights(conn, rls_model), weights(conn, copy_model)
    conn.execute("RESET ROLE")
    w_all = weights(conn, all_model)
    print(f"RLS: rows_trained {w_rls[2]} (policy rows {policy_rows}, all {w_all[2]})")
    assert w_rls[2] == policy_rows and w_all[2] == 30000
    assert w_rls[:2] != w_all[:2]
    # no_shuffle visits rows in storage order; only_mine holds the policy's rows in the same order
    # (both tables were loaded in id order and never updated), learning rate depends only on the
    # epoch, so the model is bit-identical.
    assert w_rls == w_copy


@pytest.mark.parametrize("name", ['label"; DROP TABLE t; --', "label); DROP TABLE t; --", "label' OR '1'='1"])
def test_param_names_are_identifiers(conn, name):
    for key in ("label", "features"):
        with pytest.raises(E.UndefinedColumn):
            train(conn, "t", "svm", {"epochs": 1, key: name})
        assert scalar(conn, "SELECT 1") == 1
    assert scalar(conn, "SELECT count(*) FROM t") == 30000


def test_relation_name_is_not_sql(conn):
    with pytest.raises(psycopg.Error):
        conn.execute("SELECT corgipile_train(%s, 'svm')", ("t; DROP TABLE t",))
    assert scalar(conn, "SELECT count(*) FROM t") == 30000


def test_catalog_isolation_between_roles(conn):
    as_role(conn, "rel_sec_a")
    a_model = train(conn, "t", "svm", {"epochs": 1, "seed": 1})
    assert scalar(conn, "SELECT count(*) FROM corgipile.models WHERE id = %s", (a_model,)) == 1
    assert scalar(conn, "SELECT count(*) FROM corgipile.epochs WHERE model_id = %s", (a_model,)) == 1
    conn.execute("RESET ROLE")
    as_role(conn, "rel_sec_b")
    assert scalar(conn, "SELECT count(*) FROM corgipile.models WHERE trained_by <> current_user") == 0
    assert scalar(conn, "SELECT count(*) FROM corgipile.models WHERE id = %s", (a_model,)) == 0
    assert scalar(conn, "SELECT count(*) FROM corgipile.epochs WHERE model_id = %s", (a_model,)) == 0
    # Only corgipile's functions write the catalog; to them, A's model does not exist for B.
    for sql in ("DELETE FROM corgipile.models WHERE id = %s", "DELETE FROM corgipile.epochs WHERE model_id = %s"):
        with pytest.raises(E.InsufficientPrivilege):
            conn.execute(sql, (a_model,))
    with pytest.raises(E.UndefinedObject):
        conn.execute("SELECT corgipile_drop_model(%s::bigint)", (a_model,))
    with pytest.raises(E.UndefinedObject):
        conn.execute("SELECT corgipile_predict(%s, ARRAY[1, 2, 3]::float8[])", (a_model,))
    assert scalar(conn, "SELECT 1") == 1
    # B cannot change A's model (no UPDATE privilege on the catalog).
    with pytest.raises(E.InsufficientPrivilege):
        conn.execute("UPDATE corgipile.models SET weights = weights WHERE id = %s", (a_model,))
    conn.execute("RESET ROLE")
    # The superuser sees all, and A's model is intact.
    assert scalar(conn, "SELECT trained_by FROM corgipile.models WHERE id = %s", (a_model,)) == "rel_sec_a"
    assert scalar(conn, "SELECT count(*) FROM corgipile.epochs WHERE model_id = %s", (a_model,)) == 1
    assert scalar(conn, "SELECT corgipile_predict(%s, ARRAY[1, 2, 3]::float8[])", (a_model,)) in (0, 1)
    as_role(conn, "rel_sec_a")
    assert scalar(conn, "SELECT corgipile_predict(%s, ARRAY[1, 2, 3]::float8[])", (a_model,)) in (0, 1)
