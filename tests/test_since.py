"""Incremental training: `"since": <model>` reads only the pages added to the table since that
model was trained (from the last page it read), plus a `replay` sample of the older blocks, and
continues from that model.

What a user depends on:
* every training of one table records what it read (`metrics->'read'`: table, pages, file);
* with `replay` 0 the rows trained are exactly those from the model's last page on (so every
  appended row, and no older one beyond that page); with a replay fraction, those plus a share
  of the older rows near it; parallel workers read the same rows;
* it continues the model (`warm_start`), as the next version of its name;
* a table rewritten since (VACUUM FULL, TRUNCATE, a column type change) is read whole, with a
  NOTICE; a dropped feature column, another table, a partitioned table, a model that recorded
  nothing are ERRORs before any work;
* EXPLAIN says what an incremental scan reads.
"""

import pytest
from psycopg.types.json import Jsonb

from helpers import connect, describe, models_count, rows_trained, scalar, train, train_error

FEATURES = ["x", "color"]


@pytest.fixture(scope="module")
def env(db):
    yield db


@pytest.fixture
def admin(env):
    with connect(env) as c:
        yield c


def fill(c, table, first, last):
    c.execute(f"""INSERT INTO {table} SELECT i, ((i * 37) % 100) / 10.0 + (i % 2) * 3,
                         (ARRAY['red', 'green', 'blue'])[1 + i % 3], i % 2
                  FROM generate_series({first}, {last}) i""")


def fresh(c, table, rows=5000):
    c.execute(f"DROP TABLE IF EXISTS {table} CASCADE")
    c.execute(f"CREATE TABLE {table} (id int, x float8, color text, label int)")
    fill(c, table, 1, rows)


def read_of(c, model):
    return scalar(c, "SELECT metrics->'read' FROM corgipile.models WHERE id = %s", (model,))


def test_since_reads_what_was_added_and_continues_the_model(env, admin):
    fresh(admin, "inc_a")
    first = train(admin, "inc_a", "logistic", {"features": FEATURES, "epochs": 2, "seed": 1, "name": "inc_a"})
    read = read_of(admin, first)
    pages = scalar(admin, "SELECT pg_relation_size('inc_a') / current_setting('block_size')::int")
    assert read["pages"] == pages and read["relid"] == scalar(admin, "SELECT 'inc_a'::regclass::oid")
    fill(admin, "inc_a", 5001, 5600)
    expected = scalar(admin, f"SELECT count(*) FROM inc_a WHERE ctid >= '({pages - 1},0)'::tid")
    assert expected >= 600
    second = train(admin, "inc_a", "logistic", {"since": "inc_a", "replay": 0, "epochs": 2, "seed": 1})
    assert rows_trained(admin, second) == expected
    version, warm, since = admin.execute(
        "SELECT version, (params->>'warm_start')::bigint, params->>'since' FROM corgipile.models WHERE id = %s",
        (second,)).fetchone()
    assert (version, warm, since) == (2, first, "inc_a")
    assert read_of(admin, second)["pages"] > pages
    # The same with two processes.
    fill(admin, "inc_a", 5601, 6000)
    p3 = read_of(admin, second)["pages"]
    expected = scalar(admin, f"SELECT count(*) FROM inc_a WHERE ctid >= '({p3 - 1},0)'::tid")
    third = train(admin, "inc_a", "logistic", {"since": "inc_a", "replay": 0, "epochs": 2, "seed": 1, "workers": 1})
    assert rows_trained(admin, third) == expected


def test_replay_reads_a_share_of_the_older_rows(env, admin):
    fresh(admin, "inc_b", 20000)
    train(admin, "inc_b", "logistic", {"features": FEATURES, "epochs": 1, "seed": 1, "name": "inc_b",
                                       "block_size": 2})
    fill(admin, "inc_b", 20001, 21000)
    total = scalar(admin, "SELECT count(*) FROM inc_b")
    none = train(admin, "inc_b", "logistic", {"since": "inc_b", "replay": 0, "epochs": 1, "seed": 1,
                                              "block_size": 2, "name": "inc_b_none"})
    half = train(admin, "inc_b", "logistic", {"since": "inc_b", "replay": 0.5, "epochs": 1, "seed": 1,
                                              "block_size": 2, "name": "inc_b_half"})
    new, replayed = rows_trained(admin, none), rows_trained(admin, half) - rows_trained(admin, none)
    old = total - new
    assert 0.4 * old < replayed < 0.6 * old, (new, replayed, old)
    # EXPLAIN says what an epoch reads.
    plan = "\n".join(r[0] for r in admin.execute(
        "SELECT * FROM corgipile_explain('inc_b', 'logistic', %s)",
        (Jsonb({"since": "inc_b", "features": FEATURES, "block_size": 2}),)))
    assert "Since: page" in plan and "older ones (0.1) per epoch" in plan, plan


def test_rewritten_or_emptied_tables_are_read_whole(env, admin):
    fresh(admin, "inc_c")
    train(admin, "inc_c", "logistic", {"features": FEATURES, "epochs": 1, "seed": 1, "name": "inc_c"})
    admin.execute("DELETE FROM inc_c WHERE id % 3 = 0")
    admin.execute("VACUUM FULL inc_c")
    notices = []
    admin.add_notice_handler(lambda d: notices.append(d.message_primary))
    m = train(admin, "inc_c", "logistic", {"since": "inc_c", "epochs": 1, "seed": 1})
    assert rows_trained(admin, m) == scalar(admin, "SELECT count(*) FROM inc_c")
    assert any("rewritten" in n for n in notices), notices
    # A column type change rewrites the table too; adding a column does not.
    admin.execute("ALTER TABLE inc_c ALTER COLUMN label TYPE bigint")
    m = train(admin, "inc_c", "logistic", {"since": "inc_c", "epochs": 1, "seed": 1})
    assert rows_trained(admin, m) == scalar(admin, "SELECT count(*) FROM inc_c")
    admin.execute("ALTER TABLE inc_c ADD COLUMN note text")
    fill_sql = """INSERT INTO inc_c (id, x, color, label) SELECT i, i % 10, 'red', i % 2
                  FROM generate_series(90001, 90300) i"""
    admin.execute(fill_sql)
    m2 = train(admin, "inc_c", "logistic", {"since": "inc_c", "replay": 0, "epochs": 1, "seed": 1})
    assert rows_trained(admin, m2) < scalar(admin, "SELECT count(*) FROM inc_c") / 2
    admin.execute("TRUNCATE inc_c")
    e = train_error(admin, "inc_c", "logistic", {"since": "inc_c", "epochs": 1})
    assert e is not None and e.sqlstate == "P0002", describe(e)
    fill(admin, "inc_c", 1, 500)
    m3 = train(admin, "inc_c", "logistic", {"since": "inc_c", "epochs": 1, "seed": 1})
    assert rows_trained(admin, m3) == 500


def test_refusals(env, admin):
    fresh(admin, "inc_d")
    fresh(admin, "inc_other")
    train(admin, "inc_d", "logistic", {"features": FEATURES, "epochs": 1, "seed": 1, "name": "inc_d"})
    admin.execute("DROP TABLE IF EXISTS inc_parts")
    admin.execute("CREATE TABLE inc_parts (id int, x float8, color text, label int) PARTITION BY RANGE (id)")
    admin.execute("CREATE TABLE inc_parts_a PARTITION OF inc_parts FOR VALUES FROM (MINVALUE) TO (MAXVALUE)")
    fill(admin, "inc_parts", 1, 2000)
    parts = train(admin, "inc_parts", "logistic", {"features": FEATURES, "epochs": 1, "seed": 1, "name": "inc_p"})
    assert read_of(admin, parts) is None
    cases = [
        ("inc_other", {"since": "inc_d"}, "22023"),                       # another table
        ("inc_parts", {"since": "inc_p"}, "0A000"),                       # partitioned
        ("inc_d", {"since": "inc_d", "replay": 2}, "22023"),
        ("inc_d", {"replay": 0.5}, "22023"),                              # replay without since
        ("inc_d", {"since": "inc_d", "folds": 3}, "0A000"),               # not yet: one table
        ("inc_d", {"since": "no_such_model"}, None),
    ]
    for table, params, code in cases:
        before = models_count(admin)
        e = train_error(admin, table, "logistic", dict(params, epochs=1))
        assert e is not None and not e.sqlstate.startswith("XX"), f"{params}: {describe(e)}"
        if code:
            assert e.sqlstate == code, f"{params}: {describe(e)}"
        assert models_count(admin) == before
    # A feature column dropped since: named.
    admin.execute("ALTER TABLE inc_d DROP COLUMN color")
    e = train_error(admin, "inc_d", "logistic", {"since": "inc_d", "epochs": 1})
    assert e is not None and e.sqlstate == "42703" and "color" in e.diag.message_primary, describe(e)
