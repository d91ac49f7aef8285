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


def used_pages(c, table):
    return scalar(c, f"SELECT coalesce(max((ctid::text::point)[0])::int + 1, 0) FROM {table}")


def bulk(c, table, rows):
    """A table made by CREATE TABLE AS: on PostgreSQL 16+ it ends in pages left empty."""
    c.execute(f"DROP TABLE IF EXISTS {table} CASCADE")
    c.execute(f"""CREATE TABLE {table} WITH (autovacuum_enabled = off) AS
                  SELECT i AS id, ((i * 37) % 100) / 10.0 + (i % 2) * 3 AS x,
                         (ARRAY['red', 'green', 'blue'])[1 + i % 3] AS color, i % 2 AS label
                  FROM generate_series(1, {rows}) i""")


def test_the_empty_pages_a_bulk_insert_leaves_count_as_added(env, admin):
    # PostgreSQL 16+ extends a table by many pages at once for CREATE TABLE AS (and COPY) and
    # leaves the pages it did not fill empty at the end. A VACUUM enters them in the free space
    # map, so rows appended later go there first: a model records its table's pages up to the
    # last one in use, and its "since" reads them as added (it counted the empty pages, and
    # took 1,095 of 6,000 rows appended there for old ones).
    new = int(scalar(admin, "SHOW server_version_num")) >= 160000
    bulk(admin, "inc_e", 200_000)
    admin.execute("VACUUM inc_e")
    used = used_pages(admin, "inc_e")
    size = scalar(admin, "SELECT pg_relation_size('inc_e') / current_setting('block_size')::int")
    if new:
        assert used < size, (used, size)  # the empty pages this test is about
    first = train(admin, "inc_e", "logistic", {"features": FEATURES, "epochs": 1, "seed": 1, "name": "inc_e"})
    assert read_of(admin, first)["pages"] == used
    fill(admin, "inc_e", 200_001, 206_000)
    if new:  # the appended rows went into the empty pages first
        assert scalar(admin, "SELECT min((ctid::text::point)[0]) FROM inc_e WHERE id > 200000") < size
    expected = scalar(admin, f"SELECT count(*) FROM inc_e WHERE ctid >= '({used - 1},0)'::tid")
    assert expected >= 6000
    second = train(admin, "inc_e", "logistic", {"since": "inc_e", "replay": 0, "epochs": 1, "seed": 1})
    assert rows_trained(admin, second) == expected
    # A VACUUM that truncates those pages (it does once the visibility map lets it skip the
    # others) changes nothing "since" reads: the table did not shrink below what was read.
    admin.execute("SET synchronous_commit = on")  # VACUUM sets the visibility map for rows committed to disk
    bulk(admin, "inc_f", 200_000)
    admin.execute("VACUUM inc_f")
    used = used_pages(admin, "inc_f")
    train(admin, "inc_f", "logistic", {"features": FEATURES, "epochs": 1, "seed": 1, "name": "inc_f"})
    admin.execute("VACUUM inc_f")
    assert scalar(admin, "SELECT pg_relation_size('inc_f') / current_setting('block_size')::int") == used
    notices = []
    admin.add_notice_handler(lambda d: notices.append(d.message_primary))
    m = train(admin, "inc_f", "logistic", {"since": "inc_f", "replay": 0, "epochs": 1, "seed": 1})
    assert rows_trained(admin, m) == scalar(admin, f"SELECT count(*) FROM inc_f WHERE ctid >= '({used - 1},0)'::tid")
    assert any("no page was added" in n for n in notices), notices
    admin.execute("RESET synchronous_commit")


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
