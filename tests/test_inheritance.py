"""A table with inheritance children: a SELECT reads the children too, so reading the parent
alone is never silent. corgipile does not read children yet: an ERROR, unless "only": true
asks for the parent's own rows (as FROM ONLY)."""

import psycopg
import psycopg.errors as E
import pytest

from conftest import scalar

TRAIN = '{"features": "f", "label": "y", "verbose": false, "epochs": 1%s}'


@pytest.fixture(scope="module")
def family(dsn):
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS inh_parent CASCADE")
        c.execute("CREATE TABLE inh_parent (id int, f float8[], y int)")
        c.execute("CREATE TABLE inh_child () INHERITS (inh_parent)")
        c.execute("INSERT INTO inh_parent SELECT i, ARRAY[i % 3, i % 5]::float8[], i % 2 FROM generate_series(1, 300) i")
        c.execute("INSERT INTO inh_child SELECT i, ARRAY[i % 3, i % 5]::float8[], i % 2 FROM generate_series(1, 700) i")
    yield "inh_parent"
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP TABLE inh_parent CASCADE")


@pytest.mark.parametrize("sql", [
    "SELECT corgipile_train('inh_parent', 'svm', %s)",
    "SELECT count(*) FROM corgipile_explain('inh_parent', 'svm', %s)",
    "SELECT count(*) FROM corgipile_trace('inh_parent', %s)",
])
def test_parent_with_children_is_an_error_not_a_partial_read(conn, family, sql):
    with pytest.raises(E.FeatureNotSupported, match="1 inheritance children") as err:
        conn.execute(sql, (TRAIN % "",))
    assert '"only": true' in err.value.diag.message_hint


def test_only_reads_the_parents_own_rows(conn, family):
    model = scalar(conn, "SELECT corgipile_train('inh_parent', 'svm', %s)", (TRAIN % ', "only": true',))
    assert scalar(conn, "SELECT rows_trained FROM corgipile.models WHERE id = %s", (model,)) == 300
    assert scalar(conn, "SELECT count(*) FROM corgipile_trace('inh_parent', %s)", (TRAIN % ', "only": true',)) == 300
    with pytest.raises(E.FeatureNotSupported):
        conn.execute("SELECT corgipile_evaluate(%s, 'inh_parent')", (model,))
    assert scalar(conn, """SELECT corgipile_evaluate(%s, 'inh_parent', '{"only": true}') ->> 'rows_scored'""", (model,)) == "300"
    # A child alone has no children: read as usual.
    child = scalar(conn, "SELECT corgipile_train('inh_child', 'svm', %s)", (TRAIN % "",))
    assert scalar(conn, "SELECT rows_trained FROM corgipile.models WHERE id = %s", (child,)) == 700
