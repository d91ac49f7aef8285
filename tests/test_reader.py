"""Reader equivalence: a training gives the same model whichever way BlockShuffle reads the rows.

BlockShuffle reads a table in one of two ways (commit dafaaba, src/exec/block_shuffle.rs):

* the page reader (`fetch_columns`): when `plain_columns` finds that the training query's
  target list is plain columns of the table and any qual reads only user columns (the page
  reader then evaluates it: `PageFilter`, src/exec/block_shuffle/filter.rs), each page is read in
  heapam page mode and the columns are deformed from the page by our own deformer
  (src/exec/page_reader.rs); a tuple with fewer attributes than needed (a column added later)
  goes to PostgreSQL's deforming through a slot (`deform_slowly`);
* the executor path (`fetch`: ExecScan + heap_getnextslot): everything else.

Both must hand SGD the same rows in the same order, so the same seed must give a bit-identical
model. Every test here trains the same table with the same params twice and compares the stored
models exactly in SQL (`a.weights = b.weights AND a.bias = b.bias`, rows_trained, rows_skipped):

* as the table's owner (the superuser; row-level security does not apply to it): no qual, so
  the page reader, when the query's columns are plain (see the last paragraph);
* as the role rd_reader, which has SELECT on the table and is subject to row-level security
  with one policy that lets it see every row.

Why the role's training goes through the executor path: the page reader takes quals that read
user columns only; a qual that reads a system column (here `ctid`) leaves `plain_columns` None,
and TupleShuffle only calls `fetch_columns` when `plain_columns` is Some (`direct` in
src/exec/tuple_shuffle/mod.rs); otherwise it pulls rows with ExecProcNode, i.e. ExecScan over
`fetch`. The policy's USING expression becomes that qual. NOT `USING (true)`, though: the
planner folds a constant-true security qual away (make_ands_implicit turns TRUE into an empty
list), the scan then has no qual and the role would take the page reader too — checked by hand
with gdb on the backend (USING (true): 3 calls of heap_getnextslot for the whole training, as
for the owner; with a column in the policy: one per row and pass). So the policy below refers to
a column, `ctid <> '(0,0)'::tid`, which is true of every row (line pointer offsets start at 1)
and which no planner simplifies (PostgreSQL 17+ drops `col IS NOT NULL` on columns it knows are
not null, system columns included, so that form is avoided). Each comparison also checks the
plans: the role's BlockShuffle shows the policy as its `Filter:`, the owner's shows none.

Which queries are plain for the owner (src/input.rs builds the SELECT): float8[]/float4[]
feature arrays, float8 columns in a column list, int4[] sparse indices, and boolean, integer,
float and text labels are referenced as they are. An integer[]/numeric[] feature array is cast
to float8[] (and a numeric label or a non-float8 feature column to float8): such a query is not
plain, so both trainings take the executor path; those cases are kept (the model must still be
the same with and without a qual) and say so. TupleShuffle reads at most 4 plain columns
directly (MAX_COLUMNS: the label and up to 3 features), so column lists here stay that short.
Checked by hand with gdb for every owner training below: heap_getnextslot is called 3 times in
all (not per row), and in the added-column cases slot_getsomeattrs_int once per old tuple and
pass (the slow path); for the integer[]/numeric[] cases, once per row (executor path).
"""

import json
import threading
import time

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from helpers import scalar, train

ROLE = "rd_reader"
# True of every row, and not constant-folded away (see the module docstring).
ALWAYS_TRUE = "ctid <> '(0,0)'::tid"
# Small buffers and blocks, so that every table is many blocks of a couple of pages and
# several buffers per epoch.
BASE = {"epochs": 2, "seed": 424242, "verbose": False, "buffer_size": 300, "block_size": 2}


# ----------------------------------------------------------------------------------------------
# helpers


def drop_role(admin):
    if scalar(admin, "SELECT count(*) FROM pg_roles WHERE rolname = %s", (ROLE,)):
        admin.execute("DELETE FROM corgipile.models WHERE trained_by = %s", (ROLE,))
        admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(ROLE)))
        admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(ROLE)))


@pytest.fixture(scope="module")
def reader(dsn):
    """The role that trains through the executor path; dropped at the end even on failure."""
    with psycopg.connect(dsn, autocommit=True) as admin:
        drop_role(admin)
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(ROLE)))
    try:
        yield ROLE
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            drop_role(admin)


@pytest.fixture
def admin(dsn, reader):
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c


def open_to_reader(admin, table):
    """SELECT for rd_reader, row-level security on, one policy letting it see every row."""
    admin.execute(f"GRANT SELECT ON {table} TO {ROLE}")
    admin.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
    admin.execute(f"CREATE POLICY rd_every_row ON {table} FOR SELECT TO {ROLE} USING ({ALWAYS_TRUE})")


def fresh(admin, table, ddl):
    admin.execute(f"DROP TABLE IF EXISTS {table} CASCADE")
    admin.execute(ddl)


def filters(c, table, model, params):
    """The Filter lines of the training's plan (EXPLAIN without running it)."""
    lines = [r[0] for r in c.execute("SELECT * FROM corgipile_explain(%s::regclass, %s, %s)",
                                     (table, model, Jsonb(params)))]
    return [line.strip() for line in lines if line.strip().startswith("Filter:")]


def both_paths(dsn, table, model, extra, trained, skipped=0):
    """Trains `table` as its owner (page reader when the query is plain) and as rd_reader
    (executor path), with the same params; asserts the two models are bit-identical and both
    trained `trained` rows and skipped `skipped`. Returns the two model ids."""
    params = dict(BASE, **extra)
    with psycopg.connect(dsn, autocommit=True) as owner, \
            psycopg.connect(dsn, user=ROLE, autocommit=True) as role:
        assert filters(owner, table, model, params) == [], "the owner's scan has a qual"
        role_filters = filters(role, table, model, params)
        assert len(role_filters) == 1 and "ctid" in role_filters[0], (
            f"rd_reader's scan should have the policy as its qual, got {role_filters}")
        a = train(owner, table, model, params, defaults={})
        b = train(role, table, model, params, defaults={})
        same, rows_a, rows_b, skip_a, skip_b, nonzero, w_a, w_b, b_a, b_b = owner.execute(
            """SELECT a.weights = b.weights AND a.bias = b.bias,
                      a.rows_trained, b.rows_trained, a.rows_skipped, b.rows_skipped,
                      (SELECT bool_or(w <> 0) FROM unnest(a.weights) w),
                      a.weights::text, b.weights::text, a.bias::text, b.bias::text
               FROM corgipile.models a, corgipile.models b WHERE a.id = %s AND b.id = %s""",
            (a, b)).fetchone()
    where = f"corgipile_train('{table}', '{model}', '{json.dumps(params)}')"
    assert (rows_a, skip_a) == (rows_b, skip_b), (
        f"{where}: page reader trained/skipped {rows_a}/{skip_a} rows, executor path {rows_b}/{skip_b}")
    assert (rows_a, skip_a) == (trained, skipped), (
        f"{where}: trained/skipped {rows_a}/{skip_a} rows, the table has {trained}/{skipped}")
    assert same, (f"{where}: the models differ\n owner (page reader): weights {w_a[:300]} bias {b_a}"
                  f"\n rd_reader (executor): weights {w_b[:300]} bias {b_b}")
    assert nonzero, f"{where}: an all-zero model proves little"
    return a, b


def both_paths_validation(dsn, t, visible):
    """both_paths with a held-out fraction; returns how many rows were held out."""
    params = {"validation": {"fraction": 0.25}}
    with psycopg.connect(dsn, autocommit=True) as owner:
        # The rows held out are those whose ctid hashes below the fraction: train once to
        # learn how many there are, then compare both paths with that count.
        probe = train(owner, t, "logistic", dict(BASE, **params), defaults={})
        trained = scalar(owner, "SELECT rows_trained FROM corgipile.models WHERE id = %s", (probe,))
    both_paths(dsn, t, "logistic", params, trained)
    return visible - trained


def hot_updates(admin, table):
    """pg_stat_user_tables.n_tup_hot_upd, once this backend's counts are flushed."""
    admin.execute("SELECT pg_stat_force_next_flush()")
    admin.execute("SELECT 1")  # the end of this transaction flushes
    admin.execute("SELECT pg_stat_clear_snapshot()")
    return scalar(admin, "SELECT n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = %s::regclass",
                  (table,))


class TrainingPair:
    """Two trainings of `table` with the same params, run in threads: one as the owner (page
    reader), one as rd_reader (executor path). The constructor returns once both statements
    have their snapshot (backend_xmin) and are past the statistics pass (corgipile shows its
    progress in pg_stat_activity.query), so what the caller does next happens mid-training."""

    def __init__(self, dsn, admin, table, params):
        self.admin = admin
        self.results, self.errors, pids = {}, {}, {}

        def run(who, user):
            try:
                with psycopg.connect(dsn, user=user, autocommit=True) as c:
                    pids[who] = scalar(c, "SELECT pg_backend_pid()")
                    self.results[who] = train(c, table, "logistic", params, defaults={})
            except Exception as e:  # reported by the main thread
                self.errors[who] = e

        self.threads = {who: threading.Thread(target=run, args=(who, user))
                        for who, user in (("owner", "postgres"), ("reader", ROLE))}
        for th in self.threads.values():
            th.start()
        deadline = time.monotonic() + 30
        while len(pids) < 2 or scalar(admin, """SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)
                                                AND state = 'active' AND backend_xmin IS NOT NULL
                                                AND query LIKE 'corgipile:%%training%%'""",
                                      (list(pids.values()),)) < 2:
            assert time.monotonic() < deadline and not self.errors, (
                f"the trainings did not start: {self.errors}")
            time.sleep(0.005)

    def running(self):
        return [who for who, th in self.threads.items() if th.is_alive()]

    def check_still_running(self, what):
        still = self.running()
        assert still == ["owner", "reader"], (
            f"only {still} were still training when {what} ({self.results}): more epochs")

    def check_same_model(self, rows, during):
        """Waits for both; asserts both read `rows` rows (their snapshot's) and are bit-identical."""
        for th in self.threads.values():
            th.join(120)
        assert not self.errors, f"a training failed: {self.errors}"
        owner_id, reader_id = self.results["owner"], self.results["reader"]
        same, rows_a, rows_b = self.admin.execute(
            """SELECT a.weights = b.weights AND a.bias = b.bias, a.rows_trained, b.rows_trained
               FROM corgipile.models a, corgipile.models b WHERE a.id = %s AND b.id = %s""",
            (owner_id, reader_id)).fetchone()
        assert (rows_a, rows_b) == (rows, rows), "the trainings should read their snapshot's rows"
        assert same, (f"page reader (model {owner_id}) and executor path (model {reader_id}) differ"
                      f" under {during}")


def count(admin, table, where="true"):
    return scalar(admin, f"SELECT count(*) FROM {table} WHERE {where}")


# Deterministic feature values (no random(): a failure reproduces with the same data).
def dense(n):
    """SQL for a float8[] of n elements of row i, its first element separating the classes."""
    return (f"ARRAY[(i % 2) * 2 - 1 + sin(i * 0.7)]::float8[] || "
            f"ARRAY(SELECT sin(i * 0.37 + k * 1.3) FROM generate_series(2, {n}) k)::float8[]")


# ----------------------------------------------------------------------------------------------
# 1. HOT updates and dead tuples


@pytest.mark.parametrize("vacuum", [False, True], ids=["no_vacuum", "vacuum"])
def test_hot_updates_and_dead_tuples(dsn, admin, vacuum):
    """HOT chains (fillfactor 50: updated versions stay on their page), deleted rows, with and
    without a VACUUM: only the visible version of each row is read, in the same order."""
    t = f"rd_hot_{'vac' if vacuum else 'novac'}"
    fresh(admin, t, f"CREATE TABLE {t} (id int PRIMARY KEY, note text, features float8[], label int)"
                    " WITH (fillfactor = 50, autovacuum_enabled = false)")
    admin.execute(f"INSERT INTO {t} SELECT i, 'n' || i, {dense(4)}, i % 2 FROM generate_series(1, 3000) i")
    hot_before = hot_updates(admin, t)
    # Non-indexed columns only: HOT updates (twice for some rows: chains of three versions).
    admin.execute(f"UPDATE {t} SET note = note || 'u', features = features || ARRAY[]::float8[],"
                  f" label = 1 - label WHERE id % 3 = 0")
    admin.execute(f"UPDATE {t} SET features[2] = features[2] + 0.5 WHERE id % 6 = 0")
    admin.execute(f"DELETE FROM {t} WHERE id % 5 = 0")
    admin.execute(f"DELETE FROM {t} WHERE id BETWEEN 1000 AND 1100")  # whole pages of dead rows
    assert hot_updates(admin, t) - hot_before >= 1000, "the updates were not HOT"
    if vacuum:
        admin.execute(f"VACUUM {t}")
    open_to_reader(admin, t)
    visible = count(admin, t)
    assert visible == 3000 - 600 - 80  # ids 1000..1100: 101, of which 21 multiples of 5
    both_paths(dsn, t, "logistic", {}, visible)
    # A held-out fraction picks rows by their tuple id: the page reader sets that id itself.
    held_out = both_paths_validation(dsn, t, visible)
    assert 0 < held_out < visible


# ----------------------------------------------------------------------------------------------
# 2. TOASTed, compressed and short arrays


def hex_text(n_md5):
    """Incompressible text (pglz finds no repeats in md5 hex) of 32 * n_md5 characters, row i."""
    return f"(SELECT string_agg(md5((i * 1000 + k)::text), '') FROM generate_series(1, {n_md5}) k)"


@pytest.mark.parametrize("storage", ["external", "main", "extended"])
def test_toasted_and_compressed_arrays(dsn, admin, storage):
    """400-element float8[] features: out of line (EXTERNAL: a TOAST pointer in the page),
    compressed in line (MAIN, compressible values), or a mix of both (EXTENDED, every other
    row compressible); a text column before them holds TOAST pointers, long (4-byte header)
    and short (1-byte header) values; the label comes after the features, so every row's
    varlena forms must be stepped over to reach it."""
    t = f"rd_toast_{storage}"
    fresh(admin, t, f"CREATE TABLE {t} (id int, blob text, features float8[], label int)"
                    " WITH (autovacuum_enabled = false)")
    admin.execute(f"ALTER TABLE {t} ALTER COLUMN features SET STORAGE {storage}")
    compressible = ("ARRAY[(i % 2) * 2 - 1 + sin(i * 0.7)]::float8[]"
                    " || array_fill((i % 4)::float8, ARRAY[399])")
    features = {"external": dense(400),
                "main": compressible,
                "extended": f"CASE WHEN i % 2 = 0 THEN {compressible} ELSE {dense(400)} END"}[storage]
    admin.execute(f"""INSERT INTO {t} SELECT i,
                        CASE i % 3 WHEN 0 THEN {hex_text(100)} WHEN 1 THEN {hex_text(5)} ELSE 'b' || i END,
                        {features}, i % 2
                      FROM generate_series(1, 1500) i""")
    toast_bytes = scalar(admin, "SELECT pg_relation_size(reltoastrelid) FROM pg_class WHERE oid = %s::regclass", (t,))
    compressed = count(admin, t, "pg_column_compression(features) IS NOT NULL")
    heap_pages = scalar(admin, "SELECT pg_relation_size(%s::regclass) / 8192", (t,))
    assert toast_bytes > 0  # the long blobs at least
    if storage == "external":
        assert compressed == 0 and heap_pages < 100  # 1500 rows of 3.2 kB features in line: 750 pages
    elif storage == "main":
        assert compressed == 1500 and heap_pages < 100
    else:
        assert compressed == 750 and heap_pages < 100
    assert count(admin, t, "pg_column_size(blob) < 127") == 500  # short text: 1-byte headers
    open_to_reader(admin, t)
    both_paths(dsn, t, "logistic", {}, 1500)
    both_paths(dsn, t, "svm", {"normalize": False, "buffer_size": 97, "block_size": 1}, 1500)


def test_short_float4_arrays_after_a_nullable_column(dsn, admin):
    """float4[] of 3 elements: stored with a 1-byte varlena header (unaligned, right after the
    preceding column); a nullable int2 and a short text before them."""
    t = "rd_short"
    fresh(admin, t, f"CREATE TABLE {t} (id int, s int2, tag text, features float4[], label bool)")
    admin.execute(f"""INSERT INTO {t} SELECT i, CASE WHEN i % 4 = 0 THEN NULL ELSE i % 300 END,
                        repeat('t', i % 7), ARRAY[(i % 2) * 2 - 1 + sin(i), cos(i), sin(i * 0.3)]::float4[],
                        i % 2 = 1
                      FROM generate_series(1, 3000) i""")
    # 24 bytes of array header and dimensions + 12 of data: 33 with a 1-byte header, 36 without.
    assert count(admin, t, "pg_column_size(features) = 33") == 3000
    open_to_reader(admin, t)
    both_paths(dsn, t, "logistic", {}, 3000)
    both_paths(dsn, t, "linear", {"label": "s", "normalize": False}, 2250, 750)


def same_models(c, a, b, what, trained=3000):
    same, rows, w_a, w_b = c.execute(
        """SELECT x.weights = y.weights AND x.bias = y.bias AND x.rows_trained = y.rows_trained
                  AND x.rows_skipped = y.rows_skipped, x.rows_trained, x.weights::text, y.weights::text
           FROM corgipile.models x, corgipile.models y WHERE x.id = %s AND y.id = %s""", (a, b)).fetchone()
    assert same, f"{what}: the models differ\n short headers: {w_a[:300]}\n 4-byte headers: {w_b[:300]}"
    assert rows == trained, f"{what}: {rows} rows trained, expected {trained}"


def test_short_and_long_array_headers_give_the_same_model(dsn, admin):
    """Arrays of up to 127 bytes are stored with a 1-byte varlena header, which the reader
    widens to the 4-byte form in a buffer on the stack (no palloc per row); with STORAGE PLAIN
    the same values are stored with 4-byte headers and read in place. Dense float8[] and
    float4[] (the longest short array, 13 float8, and the shortest that is never short, 14) and
    sparse int4[] + float8[] give bit-identical models from both tables; empty arrays are
    skipped, and NULL elements and two dimensions refused, alike."""
    rows = """SELECT i AS id, ARRAY[(i % 2) * 2 - 1 + sin(i), cos(i * 0.7), (i % 13) / 13.0]::float8[] AS f8,
                      ARRAY[sin(i * 0.3), (i % 2)::float4, cos(i)]::float4[] AS f4,
                      ARRAY[1 + i % 5, 7 + i % 11]::int4[] AS idx, ARRAY[(i % 2) * 1.5, (i % 3) / 3.0]::float8[] AS val,
                      array_fill(sin(i)::float8, ARRAY[12]) || ((i % 2) * 2 - 1)::float8 AS f13,
                      array_fill(cos(i)::float8, ARRAY[13]) || ((i % 2) * 2 - 1)::float8 AS f14,
                      i % 2 AS label
               FROM generate_series(1, 3000) i"""
    with psycopg.connect(dsn, autocommit=True) as c:
        fresh(admin, "rd_hdr_short", f"CREATE TABLE rd_hdr_short AS {rows}")
        fresh(admin, "rd_hdr_long", "CREATE TABLE rd_hdr_long AS TABLE rd_hdr_short WITH NO DATA")
        for col in ("f8", "f4", "idx", "val", "f13", "f14"):
            admin.execute(f"ALTER TABLE rd_hdr_long ALTER COLUMN {col} SET STORAGE PLAIN")
        # COPY forms rows with the table's own descriptor, which says PLAIN: 4-byte headers (an
        # INSERT ... SELECT forms them with its projection's, which packs them).
        with admin.cursor().copy("COPY rd_hdr_short TO STDOUT") as out:
            data = b"".join(bytes(chunk) for chunk in out)
        with admin.cursor().copy("COPY rd_hdr_long FROM STDIN") as into:
            into.write(data)
        # 24 bytes of array header and dimensions + the data: 3 bytes less with a 1-byte header.
        # 13 float8 (128 bytes) is the longest array stored short; 14 (136) never is.
        short = ("pg_column_size(f8) = 45 AND pg_column_size(f4) = 33 AND pg_column_size(idx) = 29"
                 " AND pg_column_size(val) = 37 AND pg_column_size(f13) = 125 AND pg_column_size(f14) = 136")
        long = ("pg_column_size(f8) = 48 AND pg_column_size(f4) = 36 AND pg_column_size(idx) = 32"
                " AND pg_column_size(val) = 40 AND pg_column_size(f13) = 128 AND pg_column_size(f14) = 136")
        assert count(admin, "rd_hdr_short", short) == 3000
        assert count(admin, "rd_hdr_long", long) == 3000
        # Rows per page differ between the two tables, so blocks hold other rows: compare in
        # table order, without the statistics pass's sample of blocks.
        same_order = dict(BASE, shuffle="no_shuffle", normalize=False)
        for model, params in (("logistic", {"features": "f8"}), ("logistic", {"features": "f13"}),
                              ("svm", {"features": "f14"}),
                              ("svm", {"features": "f4"}),
                              ("logistic", {"features": {"indices": "idx", "values": "val"}, "n_features": 20})):
            a = train(c, "rd_hdr_short", model, dict(same_order, **params), defaults={})
            b = train(c, "rd_hdr_long", model, dict(same_order, **params), defaults={})
            same_models(c, a, b, f"{model} {params}")
        # Skipped and refused arrays, short and long alike.
        for t in ("rd_hdr_short", "rd_hdr_long"):
            admin.execute(f"UPDATE {t} SET f8 = '{{}}' WHERE id % 7 = 0")
        a = train(c, "rd_hdr_short", "logistic", dict(same_order, features="f8"), defaults={})
        b = train(c, "rd_hdr_long", "logistic", dict(same_order, features="f8"), defaults={})
        same_models(c, a, b, "empty arrays", 3000 - 3000 // 7)
        assert scalar(c, "SELECT rows_skipped FROM corgipile.models WHERE id = %s", (a,)) == 3000 // 7
        for bad, problem in (("ARRAY[1, NULL, 2]::float8[]", "contains NULL elements"),
                             ("ARRAY[[1, 2], [3, 4]]::float8[]", "has 2 dimensions")):
            errors = []
            for t in ("rd_hdr_short", "rd_hdr_long"):
                admin.execute(f"UPDATE {t} SET f8 = {bad} WHERE id = 100")
                with pytest.raises(psycopg.errors.DataException) as e:
                    train(c, t, "logistic", dict(same_order, features="f8"), defaults={})
                # "row at ctid (p,o): ...": the rows sit at other places in the two tables.
                errors.append(e.value.diag.message_primary.split(": ", 1)[1])
            assert errors[0] == errors[1] and problem in errors[0], errors


@pytest.mark.parametrize("array_type", ["integer[]", "numeric[]"])
def test_integer_and_numeric_arrays(dsn, admin, array_type):
    """integer[] and numeric[] features (README: accepted). The training query casts them to
    float8[], so it is not plain: the owner's training takes the executor path too (without a
    qual), and this compares the executor path with and without a qual."""
    t = "rd_" + array_type.strip("[]")
    fresh(admin, t, f"CREATE TABLE {t} (id int, features {array_type}, label int)")
    elems = "ARRAY[(i % 2) * 20 - 10 + i % 7, i % 13, i % 5]" if array_type == "integer[]" else \
        "ARRAY[((i % 2) * 2 - 1 + sin(i))::numeric(12, 6), (i % 13)::numeric / 7, 1e20::numeric + i]"
    admin.execute(f"INSERT INTO {t} SELECT i, {elems}::{array_type}, i % 2 FROM generate_series(1, 3000) i")
    open_to_reader(admin, t)
    both_paths(dsn, t, "logistic", {}, 3000)


# ----------------------------------------------------------------------------------------------
# 3. NULLs


def test_nulls_before_the_features_and_skipped_rows(dsn, admin):
    """NULLs in columns before the features (the null bitmap decides where every later column
    starts), NULL labels and NULL features (rows skipped), NULL column-list features (imputed);
    every shuffle strategy."""
    t = "rd_nulls"
    fresh(admin, t, f"CREATE TABLE {t} (id int, s int2, note text, a float8, b float8,"
                    f" features float8[], label int)")
    admin.execute(f"""INSERT INTO {t} SELECT i,
                        CASE WHEN i % 4 = 0 THEN NULL ELSE i END,
                        CASE WHEN i % 3 = 0 THEN NULL ELSE repeat('x', i % 200) END,
                        CASE WHEN i % 5 = 0 THEN NULL ELSE (i % 2) * 2 - 1 + sin(i) END,
                        CASE WHEN i % 9 = 0 THEN NULL ELSE cos(i) END,
                        CASE WHEN i % 11 = 0 THEN NULL ELSE {dense(5)} END,
                        CASE WHEN i % 13 = 0 THEN NULL ELSE i % 2 END
                      FROM generate_series(1, 3000) i""")
    open_to_reader(admin, t)
    skipped = count(admin, t, "features IS NULL OR label IS NULL")
    assert skipped == 3000 // 11 + 3000 // 13 - 3000 // 143
    for shuffle in ("corgipile", "block_only", "no_shuffle", "sliding_window", "mrs"):
        both_paths(dsn, t, "logistic", {"shuffle": shuffle}, 3000 - skipped, skipped)
    # Column list: NULL numbers are imputed (the row is kept), NULL labels skipped.
    no_label = count(admin, t, "label IS NULL")
    both_paths(dsn, t, "logistic", {"features": ["a", "b"]}, 3000 - no_label, no_label)


def test_null_bitmap_of_many_columns(dsn, admin):
    """130 columns, NULLs scattered over all of them: a 17-byte null bitmap, and the features
    and label far into it (their null bits in its last bytes)."""
    t = "rd_many"
    cols = ", ".join(f"c{k} int2" for k in range(1, 128))
    fresh(admin, t, f"CREATE TABLE {t} (id int, {cols}, features float8[], label int)")
    values = ", ".join(f"CASE WHEN (i + {k}) % {3 + k % 5} = 0 THEN NULL ELSE i % {k + 10} END"
                       for k in range(1, 128))
    admin.execute(f"""INSERT INTO {t} SELECT i, {values},
                        CASE WHEN i % 19 = 0 THEN NULL ELSE {dense(3)} END,
                        CASE WHEN i % 23 = 0 THEN NULL ELSE i % 2 END
                      FROM generate_series(1, 3000) i""")
    open_to_reader(admin, t)
    skipped = count(admin, t, "features IS NULL OR label IS NULL")
    both_paths(dsn, t, "logistic", {}, 3000 - skipped, skipped)


def test_a_long_list_of_float8_and_text_columns(dsn, admin):
    """40 feature columns, float8 and text (read as they are, no cast: the page reader's path),
    NULLs among them (imputed); the label last."""
    t = "rd_long_list"
    cols = ", ".join(f"c{k} {'text' if k % 5 == 0 else 'float8'}" for k in range(40))
    fresh(admin, t, f"CREATE TABLE {t} (id int, {cols}, label int)")
    values = ", ".join(
        f"CASE WHEN (i + {k}) % 13 = 0 THEN NULL ELSE "
        + (f"'v' || ((i * {k + 1}) % 7) END" if k % 5 == 0 else f"((i * {k + 3}) % 101) / 7.0 END")
        for k in range(40))
    admin.execute(f"""INSERT INTO {t} SELECT i, {values}, CASE WHEN i % 29 = 0 THEN NULL ELSE i % 2 END
                      FROM generate_series(1, 3000) i""")
    open_to_reader(admin, t)
    no_label = count(admin, t, "label IS NULL")
    both_paths(dsn, t, "logistic", {"features": [f"c{k}" for k in range(40)]}, 3000 - no_label, no_label)


# ----------------------------------------------------------------------------------------------
# 4. dropped and reordered columns


def test_dropped_and_reordered_columns(dsn, admin):
    """Dropped columns (text, int8, int2, numeric) between the ones read: old tuples still hold
    their bytes, newer ones a NULL; the label after the features; a column list in the
    opposite order to the table's."""
    t = "rd_dropped"
    fresh(admin, t, f"CREATE TABLE {t} (id int, d_text text, a float8, d_i8 int8, features float8[],"
                    f" d_i2 int2, b float8, d_num numeric, label int4)")
    admin.execute(f"""INSERT INTO {t} SELECT i,
                        CASE WHEN i % 10 = 0 THEN NULL ELSE repeat('d', i % 300) END,
                        (i % 2) * 2 - 1 + sin(i), i * 1000000007::int8, {dense(3)}, i % 100,
                        cos(i), i * 1.5, i % 2
                      FROM generate_series(1, 1500) i""")
    admin.execute(f"ALTER TABLE {t} DROP COLUMN d_text, DROP COLUMN d_i8, DROP COLUMN d_i2")
    admin.execute(f"""INSERT INTO {t} (id, a, features, b, d_num, label) SELECT i,
                        (i % 2) * 2 - 1 + sin(i), {dense(3)}, cos(i), i * 1.5, i % 2
                      FROM generate_series(1501, 3000) i""")
    admin.execute(f"ALTER TABLE {t} DROP COLUMN d_num")
    admin.execute(f"""INSERT INTO {t} (id, a, features, b, label) SELECT i,
                        (i % 2) * 2 - 1 + sin(i), {dense(3)}, cos(i), i % 2
                      FROM generate_series(3001, 3500) i""")
    open_to_reader(admin, t)
    both_paths(dsn, t, "logistic", {}, 3500)
    both_paths(dsn, t, "logistic", {"features": ["b", "a"]}, 3500)
    both_paths(dsn, t, "linear", {"features": ["b"], "label": "a"}, 3500)


# ----------------------------------------------------------------------------------------------
# 5. columns added after the rows (fewer attributes in old tuples: PostgreSQL's deforming)


def test_added_columns_with_and_without_default(dsn, admin):
    """ADD COLUMN x float8 DEFAULT 1.5 after 2000 rows: those tuples have fewer attributes and
    x's value is the stored "missing" default; some of them updated afterwards (full tuples),
    more rows inserted. x as a feature, an added column as the label, and an added array
    column without a default (NULL in old tuples: those rows are skipped)."""
    t = "rd_added"
    fresh(admin, t, f"CREATE TABLE {t} (id int, a float8, label int)")
    admin.execute(f"INSERT INTO {t} SELECT i, (i % 2) * 2 - 1 + sin(i), i % 2 FROM generate_series(1, 2000) i")
    admin.execute(f"ALTER TABLE {t} ADD COLUMN x float8 DEFAULT 1.5")
    admin.execute(f"ALTER TABLE {t} ADD COLUMN y float8 DEFAULT -2.25")
    admin.execute(f"ALTER TABLE {t} ADD COLUMN g float8[]")
    assert scalar(admin, "SELECT bool_and(atthasmissing) FROM pg_attribute WHERE attrelid = %s::regclass"
                         " AND attname IN ('x', 'y')", (t,))
    admin.execute(f"UPDATE {t} SET a = a + 0.125 WHERE id % 7 = 0")
    admin.execute(f"""INSERT INTO {t} SELECT i, (i % 2) * 2 - 1 + sin(i), i % 2, cos(i) * 3, sin(i * 0.1) * 4,
                        {dense(3)} FROM generate_series(2001, 3000) i""")
    assert count(admin, t, "x = 1.5") == 2000 and count(admin, t, "g IS NULL") == 2000
    open_to_reader(admin, t)
    both_paths(dsn, t, "logistic", {"features": ["a", "x"]}, 3000)
    both_paths(dsn, t, "linear", {"features": ["x", "a"], "label": "y"}, 3000)
    both_paths(dsn, t, "logistic", {"features": "g"}, 1000, 2000)


# ----------------------------------------------------------------------------------------------
# 6. sparse features, text labels


def test_sparse_features_and_text_labels(dsn, admin):
    """{"indices", "values"} pairs (int4[] and float8[], some empty, some NULL: skipped) with a
    two-class text label (logistic), a three-class one (softmax), and long ones (svm)."""
    t = "rd_sparse"
    fresh(admin, t, f"CREATE TABLE {t} (id int, idx int[], label text, val float8[], colour text,"
                    f" long_label text, ext_label text)")
    admin.execute(f"ALTER TABLE {t} ALTER COLUMN ext_label SET STORAGE EXTERNAL")
    admin.execute(f"""INSERT INTO {t} SELECT i,
                        CASE WHEN i % 17 = 0 THEN NULL WHEN i % 29 = 0 THEN '{{}}'
                             ELSE ARRAY[1 + i % 2, 3 + i % 5, 10 + i % 40] END,
                        CASE WHEN i % 2 = 0 THEN 'cat' ELSE 'dog' END,
                        CASE WHEN i % 29 = 0 AND i % 17 <> 0 THEN '{{}}'
                             ELSE ARRAY[1.0, sin(i), cos(i)] END,
                        (ARRAY['red', 'green', 'blue'])[1 + i % 3],
                        CASE WHEN i % 2 = 0 THEN repeat('cat', 50) ELSE repeat('dog', 1000) END,
                        CASE WHEN i % 2 = 0 THEN repeat('cat', 50) ELSE repeat('dog', 1000) END
                      FROM generate_series(1, 3000) i""")
    # The long labels: 150 characters in line (4-byte header); 3000 compressed in line, or
    # (ext_label, STORAGE EXTERNAL) out of line.
    assert count(admin, t, "pg_column_compression(long_label) IS NOT NULL") == 1500
    assert count(admin, t, "pg_column_compression(ext_label) IS NOT NULL") == 0
    assert scalar(admin, "SELECT pg_relation_size(reltoastrelid) FROM pg_class WHERE oid = %s::regclass", (t,)) > 0
    open_to_reader(admin, t)
    skipped = count(admin, t, "idx IS NULL")
    assert skipped == 3000 // 17
    sparse = {"features": {"indices": "idx", "values": "val"}, "n_features": 60}
    both_paths(dsn, t, "logistic", sparse, 3000 - skipped, skipped)
    both_paths(dsn, t, "softmax", dict(sparse, label="colour"), 3000 - skipped, skipped)
    both_paths(dsn, t, "svm", dict(sparse, label="long_label"), 3000 - skipped, skipped)
    both_paths(dsn, t, "svm", dict(sparse, label="ext_label"), 3000 - skipped, skipped)


# ----------------------------------------------------------------------------------------------
# 7. a partitioned table


def test_partitioned_table(dsn, admin):
    """Range partitions: one as the parent, one with another column order, one with a dropped
    column, one attached after a column was added to the parent with a default; deleted rows."""
    t = "rd_part"
    fresh(admin, t, f"CREATE TABLE {t} (id int, note text, features float8[], label int) PARTITION BY RANGE (id)")
    admin.execute(f"CREATE TABLE {t}_1 PARTITION OF {t} FOR VALUES FROM (1) TO (1001)")
    admin.execute(f"DROP TABLE IF EXISTS {t}_2, {t}_3, {t}_4")
    admin.execute(f"CREATE TABLE {t}_2 (label int, features float8[], note text, id int)")
    admin.execute(f"ALTER TABLE {t} ATTACH PARTITION {t}_2 FOR VALUES FROM (1001) TO (2001)")
    admin.execute(f"CREATE TABLE {t}_3 (id int, gone int8, note text, features float8[], label int)")
    admin.execute(f"ALTER TABLE {t}_3 DROP COLUMN gone")
    admin.execute(f"ALTER TABLE {t} ATTACH PARTITION {t}_3 FOR VALUES FROM (2001) TO (3001)")
    admin.execute(f"INSERT INTO {t} SELECT i, repeat('p', i % 150), {dense(4)}, i % 2 FROM generate_series(1, 3000) i")
    admin.execute(f"ALTER TABLE {t} ADD COLUMN x float8 DEFAULT 1.5")
    admin.execute(f"CREATE TABLE {t}_4 (x float8, id int, note text, features float8[], label int)")
    admin.execute(f"ALTER TABLE {t} ATTACH PARTITION {t}_4 FOR VALUES FROM (3001) TO (4001)")
    admin.execute(f"INSERT INTO {t} SELECT i, 'q', {dense(4)}, i % 2, cos(i) FROM generate_series(3001, 3600) i")
    admin.execute(f"DELETE FROM {t} WHERE id % 10 = 3")
    open_to_reader(admin, t)
    visible = count(admin, t)
    assert visible == 3600 - 360
    both_paths(dsn, t, "logistic", {}, visible)
    both_paths(dsn, t, "logistic", {"features": ["x"]}, visible)


# ----------------------------------------------------------------------------------------------
# wide rows, no NULLs


def test_wide_null_free_rows_with_float4_features(dsn, admin):
    """Twenty-odd NOT NULL columns of assorted storage (by-value 1/2/4/8 bytes, fixed-length by
    reference, short and long varlenas) before float4[] features, more after them, the labels
    last (int2 -1/1, int8 +-5e9: negative by-value datums): no null bitmap, and every alignment
    rule between the first column and the labels."""
    t = "rd_wide"
    fresh(admin, t, f"""CREATE TABLE {t} (
        id int4 NOT NULL, flag bool NOT NULL, ch "char" NOT NULL, s int2 NOT NULL, big int8 NOT NULL,
        t1 text NOT NULL, u uuid NOT NULL, r float4 NOT NULL, ts timestamptz NOT NULL,
        nm name NOT NULL, t2 varchar(400) NOT NULL, iv interval NOT NULL, pt point NOT NULL,
        mac macaddr NOT NULL, n numeric NOT NULL, d date NOT NULL, bt bytea NOT NULL,
        s2 int2 NOT NULL, features float4[] NOT NULL, t3 text NOT NULL, f8 float8 NOT NULL,
        label int2 NOT NULL, label8 int8 NOT NULL)""")
    admin.execute(f"""INSERT INTO {t} SELECT i, i % 3 = 0, chr(65 + i % 26)::"char", i % 1000,
                        i * 7919::int8, repeat('a', i % 130), md5(i::text)::uuid, i / 7.0,
                        '2020-01-01'::timestamptz + i * interval '1 minute', 'name' || i,
                        repeat('v', i % 400), i * interval '1 second', point(i, -i),
                        ('08:00:2b:01:02:' || lpad(to_hex(i % 256), 2, '0'))::macaddr,
                        i * 1.25, '2020-01-01'::date + i, decode(repeat('ab', i % 90), 'hex'),
                        i % 7, ARRAY[(i % 2) * 2 - 1 + sin(i), cos(i), sin(i * 0.5), i % 3]::float4[],
                        repeat('z', i % 50), cos(i * 0.2), (i % 2) * 2 - 1,
                        CASE WHEN i % 2 = 0 THEN -5000000000 ELSE 5000000000 END
                      FROM generate_series(1, 3000) i""")
    assert scalar(admin, "SELECT avg(pg_column_size(r.*)) FROM rd_wide r") > 300
    open_to_reader(admin, t)
    both_paths(dsn, t, "logistic", {}, 3000)
    both_paths(dsn, t, "svm", {"label": "flag"}, 3000)
    both_paths(dsn, t, "svm", {"label": "label8"}, 3000)  # negative by-value labels
    both_paths(dsn, t, "linear", {"features": ["f8"], "label": "r"}, 3000)


# ----------------------------------------------------------------------------------------------
# 8. DELETE and VACUUM while trainings run


@pytest.mark.parametrize("kind", ["narrow", "toasted"])
@pytest.mark.slow
def test_concurrent_delete_update_and_vacuum(dsn, admin, kind):
    """Two trainings of the same table, one per path, run while another connection deletes half
    of the rows, updates a quarter (new versions on new pages) and vacuums the table: both
    finish, both read the rows of their snapshot (taken before the DELETE), so they give the
    same model; the server is still up afterwards; after another VACUUM has removed the dead
    rows both paths agree again, on the remaining rows. "toasted": the features are TOAST
    pointers, detoasted while the TOAST table is vacuumed too."""
    t = f"rd_concurrent_{kind}"
    fresh(admin, t, f"CREATE TABLE {t} (id int, features float8[], label int) WITH (autovacuum_enabled = false)")
    if kind == "narrow":
        n, epochs = 300_000, 50  # 3-5 s per training
        features = "ARRAY[(i % 2) * 2 - 1 + sin(i * 0.7), cos(i), sin(i * 0.3)]"
    else:
        n, epochs = 20_000, 30
        admin.execute(f"ALTER TABLE {t} ALTER COLUMN features SET STORAGE EXTERNAL")
        features = "ARRAY[(i % 2) * 2 - 1 + sin(i * 0.7), cos(i)] || array_fill((i % 7)::float8, ARRAY[298])"
    admin.execute(f"INSERT INTO {t} SELECT i, {features}, i % 2 FROM generate_series(1, {n}) i")
    admin.execute(f"VACUUM ANALYZE {t}")
    open_to_reader(admin, t)
    params = dict(BASE, epochs=epochs, buffer_size="5%", block_size=8)
    both = TrainingPair(dsn, admin, t, params)
    admin.execute(f"DELETE FROM {t} WHERE id % 4 < 2")  # half, both classes
    admin.execute(f"UPDATE {t} SET features[1] = features[1] + 0.5 WHERE id % 4 = 2")
    admin.execute(f"VACUUM {t}")
    both.check_still_running("the VACUUM ended")
    both.check_same_model(n, "a concurrent DELETE + UPDATE + VACUUM")
    with psycopg.connect(dsn, autocommit=True) as c:  # the server is up
        assert scalar(c, f"SELECT count(*) FROM {t}") == n // 2
    admin.execute(f"VACUUM {t}")
    both_paths(dsn, t, "logistic", {"epochs": 2}, n // 2)


@pytest.mark.slow
def test_no_page_read_past_a_truncation(dsn, admin):
    """The pages read (and, from PostgreSQL 17, read ahead by the read stream) are those the
    table had when the training began, and none of them can disappear while it runs.

    The second half of the table is deleted before the trainings begin, so its pages hold only
    rows no snapshot sees. Mid-training another connection vacuums the table: VACUUM empties
    those pages and gets to its truncation phase, but cutting them off needs an ACCESS
    EXCLUSIVE lock, which the trainings' ACCESS SHARE lock denies (VACUUM gives up after 5 s):
    the table keeps its size while they run, and every epoch reads the empty tail pages (if
    they were cut, reading them would fail). Both paths give the same model. Once the
    trainings have ended a VACUUM does truncate the table, and the next trainings read the
    shorter table (no page past its new end) and agree again."""
    t = "rd_truncated"
    n = 300_000
    fresh(admin, t, f"CREATE TABLE {t} (id int, features float8[], label int) WITH (autovacuum_enabled = false)")
    features = "ARRAY[(i % 2) * 2 - 1 + sin(i * 0.7), cos(i), sin(i * 0.3)]"
    admin.execute(f"INSERT INTO {t} SELECT i, {features}, i % 2 FROM generate_series(1, {n}) i")
    admin.execute(f"VACUUM ANALYZE {t}")
    admin.execute(f"DELETE FROM {t} WHERE id > {n // 2}")
    open_to_reader(admin, t)
    size = lambda: scalar(admin, "SELECT pg_relation_size(%s::regclass)", (t,))  # noqa: E731
    began = size()
    # Enough epochs that both trainings outlast VACUUM's 5 s wait for its lock on a fast machine
    # (250 were not, once epochs got faster).
    both = TrainingPair(dsn, admin, t, dict(BASE, epochs=750, buffer_size="5%", block_size=8))
    vacuum_error, truncation_tried = [], threading.Event()

    def vacuum():
        # A page a reader has pinned when VACUUM reaches it cannot be pruned (no cleanup
        # lock), and its dead rows keep VACUUM from truncating the pages before it: with
        # PostgreSQL 17+'s read-ahead pinning pages ahead of the readers, one pass can miss
        # its truncation. Each pass prunes what it could lock, so a few passes get there.
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                for _ in range(8):
                    c.execute(f"VACUUM {t}")
                    if truncation_tried.wait(0.2):
                        break
        except Exception as e:  # reported by the main thread
            vacuum_error.append(e)

    vacuuming = threading.Thread(target=vacuum)
    vacuuming.start()
    phases, sizes = set(), set()
    while both.running() == ["owner", "reader"] and vacuuming.is_alive():
        phases.update(r[0] for r in admin.execute(
            "SELECT phase FROM pg_stat_progress_vacuum WHERE relid = %s::regclass", (t,)))
        if "truncating heap" in phases:
            truncation_tried.set()
        sizes.add(size())
        time.sleep(0.01)
    both.check_still_running("VACUUM had given up truncating")
    vacuuming.join(60)
    assert not vacuum_error, vacuum_error
    assert "truncating heap" in phases, f"VACUUM never tried to truncate (phases seen: {phases})"
    assert sizes == {began}, f"the table changed size under the trainings: {sizes} (began {began})"
    both.check_same_model(n // 2, "a VACUUM trying to truncate the table")
    admin.execute(f"VACUUM {t}")
    assert size() < began * 0.6, f"VACUUM should truncate the empty tail once nobody trains: {size()} of {began} bytes"
    both_paths(dsn, t, "logistic", {"epochs": 2}, n // 2)
