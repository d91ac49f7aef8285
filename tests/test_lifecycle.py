"""Living with models: names and versions per role, deployment, coefficient export checked
against scikit-learn, and the progress a running training shows to other sessions."""

import threading
import time

import numpy as np
import psycopg
import pytest
from sklearn.linear_model import LinearRegression

from helpers import scalar, train


@pytest.fixture(scope="module")
def pts(dsn):
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS life_pts")
        c.execute("""CREATE TABLE life_pts AS SELECT i AS id, ARRAY[(i % 2) * 2 - 1 + (i % 13) / 13.0, (i % 7) / 7.0]::float8[] AS features,
                     (i % 2) AS label FROM generate_series(1, 4000) i ORDER BY i % 2""")
        c.execute("GRANT SELECT ON life_pts TO PUBLIC")
    return "life_pts"


def test_versions_deploy_and_predict_by_name(pts, conn):
    conn.execute("SELECT corgipile_drop_model('life') FROM corgipile.model_summary WHERE name = 'life' LIMIT 1")
    v1 = train(conn, pts, "logistic", {"name": "life", "epochs": 1, "seed": 1})
    v2 = train(conn, pts, "logistic", {"name": "life", "epochs": 3, "seed": 2})
    assert conn.execute("SELECT version, deployed FROM corgipile.model_summary WHERE name = 'life' ORDER BY version").fetchall() == \
        [(1, False), (2, True)]
    by_name = "SELECT corgipile_decision_function('life', features) FROM life_pts ORDER BY id LIMIT 50"
    by_id = "SELECT corgipile_decision_function(%s, features) FROM life_pts ORDER BY id LIMIT 50"
    assert conn.execute(by_name).fetchall() == conn.execute(by_id, (v2,)).fetchall()
    # Deploying in a transaction takes effect for the next statement of that transaction.
    with conn.transaction():
        assert scalar(conn, "SELECT corgipile_deploy('life', %s)", (v1,)) == v1
        assert conn.execute(by_name).fetchall() == conn.execute(by_id, (v1,)).fetchall()
    # A newer training does not override a pin; unpinning follows the newest again.
    v3 = train(conn, pts, "logistic", {"name": "life", "epochs": 2, "seed": 3})
    assert scalar(conn, "SELECT id FROM corgipile.model_summary WHERE name = 'life' AND deployed") == v1
    assert scalar(conn, "SELECT corgipile_deploy('life')") == v3
    # Dropping the deployed version falls back to the newest remaining one.
    assert scalar(conn, "SELECT corgipile_drop_model(%s)", (v3,)) == 1
    assert scalar(conn, "SELECT id FROM corgipile.model_summary WHERE name = 'life' AND deployed") == v2
    assert scalar(conn, "SELECT corgipile_drop_model('life')") == 2
    with pytest.raises(psycopg.errors.UndefinedObject):
        conn.execute("SELECT corgipile_predict('life', ARRAY[1.0, 2.0])")


def test_model_argument_may_change_from_row_to_row(pts, conn):
    """The per-call model cache compares the argument itself: rows naming different models (by
    name, by an id in text, or by id) each get their own model's prediction."""
    conn.execute("SELECT corgipile_drop_model(name) FROM corgipile.model_summary WHERE name IN ('row_a', 'row_b') GROUP BY name")
    a = train(conn, pts, "logistic", {"name": "row_a", "epochs": 1, "seed": 1})
    b = train(conn, pts, "svm", {"name": "row_b", "epochs": 2, "seed": 2})
    conn.execute("DROP TABLE IF EXISTS life_which")
    conn.execute("""CREATE TABLE life_which AS
                    SELECT p.id, p.features, CASE WHEN p.id %% 3 = 0 THEN 'row_a' WHEN p.id %% 3 = 1 THEN 'row_b' ELSE %s::text END AS model,
                           CASE WHEN p.id %% 2 = 0 THEN %s::bigint ELSE %s::bigint END AS model_id
                    FROM life_pts p WHERE p.id <= 300""", (str(a), a, b))
    got = conn.execute("""SELECT count(*) FILTER (WHERE corgipile_decision_function(model, features) =
                                 corgipile_decision_function(CASE model WHEN 'row_b' THEN %s ELSE %s END, features)),
                                 count(*) FILTER (WHERE corgipile_decision_function(model_id, features) =
                                 corgipile_decision_function(model_id::text, features)),
                                 count(*) FROM life_which""", (b, a)).fetchone()
    assert got == (300, 300, 300)
    # A long (compressed) text argument is read like any other: no such model.
    conn.execute("ALTER TABLE life_which ADD COLUMN long_name text")
    conn.execute("UPDATE life_which SET long_name = repeat('n', 10000) WHERE id = 1")
    assert scalar(conn, "SELECT pg_column_compression(long_name) FROM life_which WHERE id = 1") is not None
    with pytest.raises(psycopg.errors.UndefinedObject):
        conn.execute("SELECT corgipile_predict(long_name, features) FROM life_which WHERE id = 1")
    conn.execute("SELECT corgipile_drop_model('row_a'), corgipile_drop_model('row_b')")


def test_model_name_that_is_not_utf8_is_an_error(dsn, conn):
    """In a SQL_ASCII database a text argument may hold any bytes."""
    conn.execute("DROP DATABASE IF EXISTS corgipile_ascii")
    conn.execute("CREATE DATABASE corgipile_ascii TEMPLATE template0 ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C'")
    try:
        with psycopg.connect(dbname="corgipile_ascii", autocommit=True) as c:
            c.execute("CREATE EXTENSION corgipile")
            with pytest.raises(psycopg.errors.CharacterNotInRepertoire, match="not valid UTF-8"):
                c.execute("SELECT corgipile_predict(convert_from('\\x636166e9', 'SQL_ASCII'), ARRAY[1.0]::float8[])")
    finally:
        conn.execute("DROP DATABASE corgipile_ascii")


def test_concurrent_trainings_of_one_name_never_clash(pts, dsn, conn):
    conn.execute("SELECT corgipile_drop_model('race') FROM corgipile.model_summary WHERE name = 'race' LIMIT 1")
    ids, errors = [], []

    def run(seed):
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                ids.append(train(c, pts, "svm", {"name": "race", "epochs": 2, "seed": seed}))
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # A training that finds the name being trained fails at once (55P03), before any work,
    # instead of clashing or waiting after its training; the others get distinct versions.
    assert all(isinstance(e, psycopg.errors.LockNotAvailable) for e in errors), errors
    assert len(ids) + len(errors) == 4 and ids
    versions = conn.execute("SELECT version FROM corgipile.model_summary WHERE name = 'race' ORDER BY version").fetchall()
    assert versions == [(v,) for v in range(1, len(ids) + 1)]
    # Once nobody holds the name, the next training gets the next version.
    train(conn, pts, "svm", {"name": "race", "epochs": 1})
    assert scalar(conn, "SELECT max(version) FROM corgipile.model_summary WHERE name = 'race'") == len(ids) + 1


def test_names_belong_to_their_role(pts, dsn, conn):
    for role in ("life_alice", "life_bob"):
        conn.execute(f"DROP OWNED BY {role}" if scalar(conn, "SELECT count(*) FROM pg_roles WHERE rolname = %s", (role,)) else "SELECT 1")
        conn.execute(f"DROP ROLE IF EXISTS {role}")
        conn.execute(f"CREATE ROLE {role} LOGIN")
    ids = {}
    for role, epochs in (("life_alice", 1), ("life_bob", 2)):
        with psycopg.connect(dsn, user=role, autocommit=True) as c:
            ids[role] = train(c, pts, "svm", {"name": "shared_name", "epochs": epochs})
            # Each role sees version 1 of its own "shared_name" only.
            assert c.execute("SELECT id, version FROM corgipile.model_summary WHERE name = 'shared_name'").fetchall() == [(ids[role], 1)]
    with psycopg.connect(dsn, user="life_alice", autocommit=True) as c:
        with pytest.raises(psycopg.errors.UndefinedObject):
            c.execute("SELECT corgipile_deploy('shared_name', %s)", (ids["life_bob"],))
        with pytest.raises(psycopg.errors.UndefinedObject):
            c.execute("SELECT corgipile_drop_model(%s)", (ids["life_bob"],))
        assert scalar(c, "SELECT corgipile_drop_model('shared_name')") == 1
    with psycopg.connect(dsn, user="life_bob", autocommit=True) as c:
        assert scalar(c, "SELECT count(*) FROM corgipile.model_summary WHERE name = 'shared_name'") == 1
        c.execute("SELECT corgipile_drop_model('shared_name')")
    for role in ("life_alice", "life_bob"):
        conn.execute(f"DROP ROLE {role}")


def test_coefficients_match_scikit_learn(dsn, conn):
    """Linear regression with known coefficients: the exported coefficients equal the ones
    scikit-learn fits on the same rows (and reproduce corgipile_predict exactly)."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(5000, 3)) * [1.0, 2.0, 0.5] + [0.0, 3.0, -1.0]
    y = x @ [1.5, -2.0, 4.0] + 0.7 + rng.normal(scale=0.1, size=5000)
    conn.execute("DROP TABLE IF EXISTS life_reg, life_reg_sorted")
    conn.execute("CREATE TABLE life_reg (id int, a float8, b float8, c float8, y float8)")
    with conn.cursor().copy("COPY life_reg FROM STDIN") as cp:
        for i, (row, t) in enumerate(zip(x, y)):
            cp.write_row((i, *row, t))
    # Stored sorted by the target: the clustered case.
    conn.execute("CREATE TABLE life_reg_sorted AS SELECT * FROM life_reg ORDER BY y")
    model = train(conn, "life_reg_sorted", "linear", {"features": ["a", "b", "c"], "label": "y", "normalize": True,
                                                       "epochs": 10, "seed": 4, "learning_rate": 0.01})
    rows = conn.execute("SELECT class, feature, feature_index, coefficient FROM corgipile_model_coefficients(%s)",
                        (model,)).fetchall()
    assert [r[:3] for r in rows] == [(None, "a", 1), (None, "b", 2), (None, "c", 3), (None, "(intercept)", None)]
    ours = np.array([r[3] for r in rows])
    sk = LinearRegression().fit(x, y)
    reference = np.append(sk.coef_, sk.intercept_)
    assert np.allclose(ours, reference, atol=0.05), (ours, reference)
    # The export is the model: w·x + b reproduces corgipile_predict.
    a, b, c = 0.3, -1.2, 2.0
    assert scalar(conn, "SELECT corgipile_predict(%s, ARRAY[%s, %s, %s])", (model, a, b, c)) == pytest.approx(
        ours[0] * a + ours[1] * b + ours[2] * c + ours[3], rel=1e-12)


def test_progress_is_visible_from_another_session(dsn, conn):
    conn.execute("DROP TABLE IF EXISTS life_big")
    conn.execute("""CREATE TABLE life_big AS SELECT (i % 2) AS label, ARRAY[(i % 2) * 2 - 1 + random(), random(), random(), random()]::float8[] AS features
                    FROM generate_series(1, 200000) i ORDER BY i % 2""")
    result = {}

    def run():
        with psycopg.connect(dsn, autocommit=True) as c:
            result["pid"] = c.info.backend_pid
            try:
                train(c, "life_big", "svm", {"epochs": 1000, "name": "watched"})
            except psycopg.errors.QueryCanceled:
                result["cancelled"] = True

    t = threading.Thread(target=run)
    t.start()
    seen = []
    deadline = time.time() + 60
    while time.time() < deadline and len(seen) < 2:
        rows = conn.execute("""SELECT pid, relation, model, phase, epoch, epochs, epoch_percent, tuples_this_epoch,
                                      last_epoch_loss, elapsed_seconds, remaining_seconds, query
                               FROM corgipile.progress""").fetchall()
        if rows and rows[0][4] >= 2:
            seen.append(rows[0])
        time.sleep(0.3)
    pid = result["pid"]
    conn.execute("SELECT pg_cancel_backend(%s)", (pid,))
    t.join()
    assert result.get("cancelled")
    assert len(seen) == 2, "the training showed up in corgipile.progress"
    first, later = seen
    assert first[0] == pid and first[1] == "life_big" and first[2] == "svm" and first[3] == "training"
    assert first[5] == 1000 and 0 <= first[6] <= 100 and 0 <= first[7] <= 200000
    assert first[8] is not None and first[10] is not None and first[10] > 0
    assert later[9] >= first[9]
    assert first[11].startswith("SELECT corgipile_train(")
    # Gone once the training ended; the activity line is no longer the progress line.
    assert conn.execute("SELECT count(*) FROM corgipile.progress WHERE pid = %s", (pid,)).fetchone()[0] == 0


def test_activity_shows_the_statement_again_after_training(pts, dsn, conn):
    with psycopg.connect(dsn, autocommit=True) as c:
        train(c, pts, "svm", {"epochs": 2})
        query = scalar(conn, "SELECT query FROM pg_stat_activity WHERE pid = %s", (c.info.backend_pid,))
    assert query.startswith("SELECT corgipile_train(")
