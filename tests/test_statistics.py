"""The statistics pass before training: a sample of the blocks by default, every row on request.

What a user depends on:
* with default params a training of a big table reads a sample of its blocks for the means and
  scales (at least 10 MB, 5% of the pages and 50,000 rows), not the whole table: EXPLAIN ANALYZE
  says so ("Statistics Sample"), and its pages read show it;
* the model is as good: its scaling is within a few percent of the exact pass's and its
  accuracy within half a point;
* `"statistics": "exact"` reads every row; so does any training that learns more than means and
  scales (one-hot categories, class weights, a validation split, sparse arrays, networks), a
  table too small to sample (bit for bit the exact model), and a `where` that leaves fewer rows
  than the sample needs;
* parallel workers use the leader's sampled statistics; a wrong value is an ERROR (22023);
  the value is stored with the model's params.
"""

import pytest
from psycopg.types.json import Jsonb

from helpers import connect, scalar, train, train_error, train_with_workers

ROWS = 150_000
BASE = {"epochs": 2, "seed": 7, "verbose": False}


@pytest.fixture(scope="module")
def env(db):
    with connect(db) as c:
        # Label-clustered, features on scales 1 ... 10^4 (normalizing matters), ~20 MB.
        # No autovacuum: on PostgreSQL 16+ a CREATE TABLE AS leaves empty pages at the end of
        # the table (24 here), and a second VACUUM may truncate them between a test's size query
        # and its training (see test_a_vacuum_before_the_training_truncates_only_empty_pages).
        c.execute(f"""CREATE TABLE st WITH (autovacuum_enabled = off) AS SELECT i AS id,
                ARRAY[(s + random() - 0.5) * 10000, (s * 0.5 + random()) * 100, random() + s * 0.3,
                      random() * 50, (random() - 0.5) * 2 + s, random(), random() * 1000, s * 0.2 + random()]::float8[] AS features,
                (s > 0)::int AS label, (s + random() - 0.5) * 10000 AS x1, random() * 50 AS x2,
                (ARRAY['red', 'green', 'blue'])[1 + i % 3] AS colour
            FROM (SELECT i, CASE WHEN i <= {ROWS} / 2 THEN -1 ELSE 1 END AS s
                  FROM generate_series(1, {ROWS}) i) g ORDER BY i""")
        c.execute("CREATE TABLE st_small WITH (autovacuum_enabled = off) AS SELECT * FROM st WHERE id % 50 = 0")
        c.execute("VACUUM ANALYZE st")
        c.execute("VACUUM ANALYZE st_small")
    yield db


def pages(c, rel):
    return scalar(c, "SELECT pg_relation_size(%s::regclass) / current_setting('block_size')::int", (rel,))


def explain_fields(c, rel, model, params):
    lines = [r[0] for r in c.execute("SELECT * FROM corgipile_explain(%s::regclass, %s, %s, true)",
                                     (rel, model, Jsonb({**BASE, **params})))]
    def field(key):
        return [ln.split(": ", 1)[1] for ln in lines if ln.strip().startswith(key + ": ")]
    return field


def explain(c, rel, model, params):
    field = explain_fields(c, rel, model, params)
    return int(field("Pages Read")[0]), field("Statistics Sample")


def stored(c, model_id):
    return c.execute("SELECT standardizer, metrics, params, weights FROM corgipile.models WHERE id = %s",
                     (model_id,)).fetchone()


def test_default_samples_a_big_table(env):
    with connect(env) as c:
        n = pages(c, "st")
        assert n > 2000, n  # bigger than the 10 MB a sample reads at least
        read, sample = explain(c, "st", "svm", {})
        assert len(sample) == 1 and " of " in sample[0], sample
        sampled, blocks = (int(x) for x in sample[0].split(" blocks")[0].split(" of "))
        assert 0 < sampled < blocks
        # Two epochs of every page, and the statistics pass's sample: 1280 pages at least (10 MB),
        # fewer than the table.
        assert 2 * n + 1280 <= read < 3 * n, (read, n)
        exact_read, exact_sample = explain(c, "st", "svm", {"statistics": "exact"})
        assert exact_read == 3 * n and exact_sample == []


def test_sampled_model_is_as_good_as_exact(env):
    with connect(env) as c:
        sampled = stored(c, train(c, "st", "svm", BASE))
        exact = stored(c, train(c, "st", "svm", BASE, statistics="exact"))
        assert sampled[2]["statistics"] == "sample" and exact[2]["statistics"] == "exact"
        assert sampled[3] != exact[3]  # another scaling, another model
        # scale = 1 / standard deviation: means within 5% of a deviation, scales within 5%.
        for ms, me, ss, se in zip(sampled[0]["mean"], exact[0]["mean"], sampled[0]["scale"], exact[0]["scale"]):
            assert abs(ms - me) * se <= 0.05, (ms, me, se)
            assert abs(ss / se - 1) <= 0.05, (ss, se)
        assert abs(sampled[1]["accuracy"] - exact[1]["accuracy"]) <= 0.005, (sampled[1], exact[1])
        assert sampled[1]["accuracy"] > 0.9


def test_column_list_of_numbers_samples_one_hot_reads_every_row(env):
    with connect(env) as c:
        n = pages(c, "st")
        read, sample = explain(c, "st", "logistic", {"features": ["x1", "x2"]})
        assert sample and read < 3 * n
        read, sample = explain(c, "st", "logistic", {"features": ["x1", "colour"],
                                                     "preprocess": {"colour": {"encode": "hash"}}})
        assert sample and read < 3 * n  # hashed: no dictionary to learn
        read, sample = explain(c, "st", "logistic", {"features": ["x1", "colour"]})
        assert sample == [] and read == 3 * n  # a rare category could be missed by a sample


@pytest.mark.parametrize("model,params", [
    ("svm", {"class_weight": "balanced"}),
    ("svm", {"validation": {"fraction": 0.2}}),
    ("mlp", {"hidden": [4]}),
    ("svm", {"where": "id % 50 = 0"}),  # 3,000 rows: fewer than a sample needs
])
def test_what_needs_every_row_reads_every_row(env, model, params):
    with connect(env) as c:
        n = pages(c, "st")
        read, sample = explain(c, "st", model, params)
        if "where" in params:
            assert len(sample) == 1  # sampled, then read on to the end for want of rows
        else:
            assert sample == []
        assert read == 3 * n, (params, read, n)
        assert pages(c, "st") == n


def used_pages(c, rel):
    """The table's pages up to its last page holding a row."""
    return scalar(c, f"SELECT coalesce(max((ctid::text::point)[0])::int + 1, 0) FROM {rel}")


def test_a_vacuum_before_the_training_truncates_only_empty_pages(env):
    # The one short count (PostgreSQL 18, autovacuum on: 8,184 pages read where 3 x 2,752 were
    # expected) provoked: a CREATE TABLE AS on 16+ extends the table by many pages at once and
    # leaves those it did not fill empty at its end (2,752 pages, rows on 2,728). The first
    # VACUUM scans every page and truncates nothing (24 < 2,752 / 16); once the visibility map
    # says the other pages are all-visible, the next VACUUM scans only the last ones, finds no
    # row there and truncates the empty pages. A training after it reads 3 x 2,728 pages, and
    # every row.
    with connect(env) as c:
        # Commits flushed at once: VACUUM sets the visibility map only for rows whose inserting
        # commit is on disk (the test cluster commits asynchronously).
        c.execute("SET synchronous_commit = on")
        c.execute("DROP TABLE IF EXISTS st_tail")
        c.execute("CREATE TABLE st_tail WITH (autovacuum_enabled = off) AS SELECT * FROM st ORDER BY id")
        c.execute("VACUUM ANALYZE st_tail")
        before, used = pages(c, "st_tail"), used_pages(c, "st_tail")
        assert before == pages(c, "st")
        if int(scalar(c, "SHOW server_version_num")) >= 160000:
            assert used < before, (used, before)  # the empty pages this test is about
        c.execute("VACUUM st_tail")
        assert pages(c, "st_tail") == used  # the empty pages went, no row did
        field = explain_fields(c, "st_tail", "mlp", {"hidden": [4]})
        read = int(field("Pages Read")[0])
        assert field("Statistics Sample") == [] and read == 3 * used, (read, used, before)
        assert field("Tuples Per Epoch") == [str(ROWS)]
        c.execute("DROP TABLE st_tail")


def test_sparse_arrays_read_every_row(env):
    with connect(env) as c:
        c.execute("""CREATE TABLE IF NOT EXISTS st_sparse WITH (autovacuum_enabled = off) AS
                     SELECT id, ARRAY[1, 2 + id % 7] AS idx, ARRAY[x1, x2] AS val, label FROM st""")
        n = pages(c, "st_sparse")
        assert n > 1280
        read, sample = explain(c, "st_sparse", "svm", {"features": {"indices": "idx", "values": "val"}})
        assert sample == [] and read == 3 * n


def test_a_small_table_is_read_whole_and_gives_the_exact_model(env):
    with connect(env) as c:
        assert pages(c, "st_small") < 1280
        read, sample = explain(c, "st_small", "svm", {})
        assert read == 3 * pages(c, "st_small")
        sampled = stored(c, train(c, "st_small", "svm", BASE))
        exact = stored(c, train(c, "st_small", "svm", BASE, statistics="exact"))
        assert sampled[0] == exact[0] and sampled[3] == exact[3]


def test_workers_use_the_leaders_sample(env):
    with connect(env) as c:
        alone = stored(c, train(c, "st", "svm", BASE))
        c.execute("SET max_parallel_workers = 8")
        team = stored(c, train_with_workers(c, "st", "svm", BASE, workers=1))
        assert team[0] == alone[0]  # the same sample, the same scaling
        assert abs(team[1]["accuracy"] - alone[1]["accuracy"]) <= 0.01


def test_bad_value_is_an_error(env):
    with connect(env) as c:
        e = train_error(c, "st_small", "svm", BASE, statistics="fast")
        assert e.sqlstate == "22023"
        assert '"statistics"' in str(e) and "sample" in str(e), str(e)
        e = train_error(c, "st_small", "svm", BASE, statistics=0.1)
        assert e.sqlstate == "22023"
