"""The training tables more than one suite builds, in one place: `from tables import points, uniform`.
Helpers of other kinds are in tests/helpers.py, fixtures in tests/conftest.py.

A builder writes `CREATE TABLE name AS SELECT ... FROM generate_series(start, start + n - 1) i`
and returns the table's name (a *_sql one returns the SELECT, for a table on a shard server).
The rows are exactly those the suites built with their own SQL before (the suites assert
accuracies, and some compare models bit for bit): a builder's SQL is the SQL it replaced, and a
change to one changes the data of every suite that calls it.
Deterministic builders compute every value from the row number i; those that call random()
give the rows of the session's random sequence: unseeded (the suites that never seeded it), or
after `seed=` (setseed) or a setseed of the caller's, whose sequence then goes on into the
tables built after it in the same session.

Builders: points (id, a float8[] of features, a two-class label i % 2, extra columns), with the
feature sets POINTS, STEPS, NOISY and uniform(); three_classes; blobs and blobs_sql (Gaussian
blobs); regression and regression_sql (a linear target over Gaussian features); bad_label (one
NaN or infinite label); raw_scale (features and a target in the millions); replicate (a table's
rows k times); churn (a churn-like table of every encodable column type). SQL fragments: GAUSS (a standard
normal), hashed_xy and XY (two hashed coordinates)."""

# ---------------------------------------------------------------------------------------------
# The core

def series(columns, n, *, start=1, order_by=None):
    """SELECT `columns` (SQL expressions of the row number i) FROM generate_series(start,
    start + n - 1) i, ORDER BY `order_by` if given."""
    sql = f"SELECT {', '.join(columns)} FROM generate_series({start}, {start + n - 1}) i"
    return sql if order_by is None else f"{sql} ORDER BY {order_by}"


def create(conn, name, select, *, seed=None, replace=False):
    """CREATE TABLE name AS `select`; `seed`: setseed(seed) first (in conn's session);
    `replace`: DROP TABLE IF EXISTS name first. Returns name."""
    if replace:
        conn.execute(f"DROP TABLE IF EXISTS {name}")
    if seed is not None:
        conn.execute(f"SELECT setseed({seed})")
    conn.execute(f"CREATE TABLE {name} AS {select}")
    return name


# ---------------------------------------------------------------------------------------------
# Two classes, array features

# The features of points(): deterministic, the first one separates the classes (-1 + [0, 1)
# against 1 + [0, 1)), the second is noise. conftest.py's hard_small, test_hardening4,
# test_views, test_where.
POINTS = ("(i % 2) * 2 - 1 + ((i * 37) % 100) / 100.0", "((i * 53) % 100) / 100.0")
# The same with steps of 1/7 and 1/5 (test_grants, test_name_locks).
STEPS = ("(i % 2) * 2 - 1 + (i % 7) / 7.0", "(i % 5) / 5.0")
# Random ones (unseeded: new rows every run), the first separating the classes
# (test_dump_restore, test_security).
NOISY = ("(i % 2) * 2 - 1 + random()", "random()")


def uniform(width, signal=None):
    """`width` features random() (uniform in [0, 1), unseeded); the `signal`-th one (1-based)
    plus the class i % 2, so that it alone tells the label; none without `signal` (nothing to
    learn: tables for the reading, cancelling and errors of a training)."""
    return tuple("random() + (i % 2)" if k == signal else "random()" for k in range(1, width + 1))


def points(conn, name, n=2000, *, features=POINTS, label="(i % 2)", extra=(), start=1, order_by=None,
           id=True, seed=None, replace=False):
    """`id` (i; left out with id=False), `features` float8[] (ARRAY[features]: SQL expressions of
    i, by default POINTS), `label` (by default i % 2), then the `extra` columns ("expr AS name"),
    for i from `start` to start + n - 1, stored in generate_series order or ORDER BY `order_by`."""
    columns = (["i AS id"] if id else []) + [f"ARRAY[{', '.join(features)}]::float8[] AS features",
                                             f"{label} AS label", *extra]
    return create(conn, name, series(columns, n, start=start, order_by=order_by), seed=seed, replace=replace)


def three_classes(conn, name="pts", n=3000):
    """points with labels 0, 1, 2 (i % 3; the first feature centred on the label - 1), a boolean
    `flag` (label = 1), stored clustered by label: the table of test_tabular's and test_upgrade's
    models as an older version wrote them."""
    return points(conn, name, n, features=("(i % 3) - 1 + (i % 7) / 7.0", "(i % 5) / 5.0"), label="(i % 3)",
                  extra=["(i % 3 = 1) AS flag"], order_by="i % 3")


# ---------------------------------------------------------------------------------------------
# Gaussian data (random(): seed the session for the same rows every run)

# A standard normal number (Box-Muller; 1 - random() is in (0, 1]: ln never sees 0).
GAUSS = "sqrt(-2 * ln(1 - random())) * cos(2 * pi() * random())"


def blobs_sql(n, label="random() < 0.5", *, start=1, mean=0.6, dims=10):
    """SELECT of n Gaussian-blob rows (id, label, features float8[dims]): class means -mean and
    +mean on every axis; `label` gives the class (0/1) from i and random(); stored clustered by
    label (ORDER BY label, id). For tables on a shard server, built from SQL (test_shards)."""
    return f"""SELECT i AS id, y AS label,
                      ARRAY(SELECT (CASE WHEN y = 1 THEN {mean} ELSE -{mean} END) + {GAUSS}
                            FROM generate_series(1, {dims}) k WHERE i > 0)::float8[] AS features
               FROM (SELECT i, ({label})::int AS y FROM generate_series({start}, {start + n - 1}) i) s
               ORDER BY y, i"""


def blobs(conn, name, n, label="random() < 0.5", *, start=1, mean=0.6, dims=10, seed=None, replace=False):
    """The table of blobs_sql (two Gaussian blobs, Bayes accuracy ~0.97 with the defaults)."""
    return create(conn, name, blobs_sql(n, label, start=start, mean=mean, dims=dims), seed=seed, replace=replace)


def regression_sql(n, *, start=1, shift=None, label_first=False):
    """SELECT of n rows (id, features float8[10], label float8; label first with label_first):
    features standard normal (plus `shift` on every axis), label = sum(features[k] * k / 10) +
    0.5 * a standard normal (R2 ~0.95), stored ordered by label."""
    x = GAUSS if shift is None else f"{shift} + {GAUSS}"
    label = "(SELECT sum(features[k] * k / 10.0) FROM generate_series(1, 10) k) + 0.5 * g AS label"
    columns = f"id, {label}, features" if label_first else f"id, features, {label}"
    return f"""SELECT {columns}
               FROM (SELECT i AS id, {GAUSS} AS g,
                            ARRAY(SELECT {x} FROM generate_series(1, 10) k WHERE i > 0)::float8[] AS features
                     FROM generate_series({start}, {start + n - 1}) i) s
               ORDER BY label"""


def regression(conn, name, n, *, start=1, shift=None, label_first=False, seed=None, replace=False):
    """The table of regression_sql."""
    return create(conn, name, regression_sql(n, start=start, shift=shift, label_first=label_first), seed=seed,
                  replace=replace)


# ---------------------------------------------------------------------------------------------
# Hashed coordinates (deterministic)

def hashed_xy(scale=500.0, x="x", y="y"):
    """Two columns `x`, `y` from hashes of i, in (-1000/scale, 1000/scale): with the default scale
    in (-2, 2). A select-list fragment."""
    return f"(hashint4(i) % 1000) / {scale} AS {x}, (hashint4(i * 7 + 3) % 1000) / {scale} AS {y}"


# x and y in (-2, 2): the coordinates of test_mlp's and test_search's non-linear tables.
XY = hashed_xy()


# ---------------------------------------------------------------------------------------------
# Tables for errors

def bad_label(conn, name, n=1000, *, row=500, value="NaN"):
    """id, features float8[2] (the label separates them), label float8 0/1 (i % 2) but `value`
    ('NaN', '-Infinity', ...) at i = `row`: a training reaches the bad label after some rows."""
    label = f"(CASE WHEN i = {row} THEN '{value}'::float8 ELSE (i % 2)::float8 END) AS label"
    return create(conn, name, series(["i AS id", "ARRAY[i % 3, (i % 2) + 0.5]::float8[] AS features", label], n))


def raw_scale(conn, name, n=2000, *, extra=()):
    """id, features float8[3] on raw scales up to the millions, label float8 up to ~2e9 (a
    regression on them diverges without normalize), then the `extra` columns."""
    features = "ARRAY[i * 1000.0, (i % 7) * 1e4, (i % 13) * 1e5]::float8[] AS features"
    return create(conn, name, series(["i AS id", features, "(i * 1e6 + (i % 11) * 1e7)::float8 AS label", *extra], n))


# ---------------------------------------------------------------------------------------------
# Others

def replicate(conn, name, source, times):
    """Every row of `source` `times` times (a bigger table of the same rows, for parallel
    workers)."""
    return create(conn, name, f"SELECT s.* FROM {source} s, generate_series(1, {times}) g")


def churn(conn, name, n=4000):
    """A churn-like table of every kind of encodable column, with a learnable label `churned`
    (boolean): state text (10 values, NULL every 37th row), intl yes/no text, plan an enum
    (the type <name>_plan, made afresh), autopay boolean, income int4 dollars (NULL every 11th
    row), age int2, minutes numeric, calls int8, score float4, usage float4[2]. Drops the table
    first. Deterministic (hashes of i)."""
    conn.execute(f"DROP TABLE IF EXISTS {name}")
    conn.execute(f"DROP TYPE IF EXISTS {name}_plan")
    conn.execute(f"CREATE TYPE {name}_plan AS ENUM ('basic', 'plus', 'premium')")
    conn.execute(f"""
        CREATE TABLE {name} AS
        WITH base AS (
          SELECT i,
                 CASE WHEN i % 37 = 0 THEN NULL
                      ELSE (ARRAY['CA','NY','TX','FL','WA','IL','OH','GA','NC','MI'])[1 + (hashint4(i) & 1023) % 10] END AS state,
                 CASE WHEN hashint4(i * 7 + 1) % 3 = 0 THEN 'yes' ELSE 'no' END AS intl,
                 (ARRAY['basic','plus','premium'])[1 + (hashint4(i * 13 + 5) & 1023) % 3]::{name}_plan AS plan,
                 (hashint4(i * 17 + 3) & 1) = 1 AS autopay,
                 CASE WHEN i % 11 = 0 THEN NULL ELSE 20000 + (hashint4(i * 19 + 7) & 65535) END AS income,
                 (18 + (hashint4(i * 23 + 11) & 1023) % 60)::int2 AS age,
                 ((hashint4(i * 29 + 13) & 4095) / 100.0)::numeric(8,2) AS minutes,
                 (hashint4(i * 43 + 5) & 255)::int8 AS calls,
                 ((hashint4(i * 47 + 9) & 1023) / 1023.0)::float4 AS score,
                 ARRAY[((hashint4(i * 31) & 1023) / 1023.0)::float4, ((hashint4(i * 37) & 1023) / 1023.0)::float4] AS usage
          FROM generate_series(1, {n}) i)
        SELECT i AS id, state, intl, plan, autopay, income, age, minutes, calls, score, usage,
          ((CASE state WHEN 'CA' THEN 1.5 WHEN 'NY' THEN -1.5 WHEN 'TX' THEN 1.0 ELSE 0 END)
           + (CASE WHEN intl = 'yes' THEN 1.2 ELSE -0.4 END)
           + (CASE plan WHEN 'basic' THEN 0.8 WHEN 'premium' THEN -0.8 ELSE 0 END)
           + (CASE WHEN autopay THEN -0.7 ELSE 0.3 END)
           - coalesce((income - 52000) / 20000.0, 0)
           + (minutes - 20) / 8.0
           + 2 * (usage[1] - 0.5)
           + ((hashint4(i * 41 + 17) & 1023) / 1023.0 - 0.5)) > 0 AS churned
        FROM base""")
    return name


def export_arrays_sql(lo, hi):
    """Rows lo..hi of the exports' array table (test_export, test_onnx): f float8[5] and a binary
    (y2), a three-class text (yk) and a number (yr) label."""
    return f"""
        SELECT i AS id, ARRAY[sin(i), cos(i * 1.3) * 4, (i % 17)::float8, sqrt(i) / 10, (i % 2)::float8]::float8[] AS f,
               sin(i) + cos(i * 1.3) > 0.3 AS y2,
               (ARRAY['low', 'mid', 'high'])[1 + i % 3] AS yk,
               sin(i) * 3 + (i % 17) * 0.2 AS yr
        FROM generate_series({lo}, {hi}) i"""
