"""Real LIBSVM data (../shared/datasets), loaded with scripts/load_libsvm.py and stored
clustered by label: CorgiPile's default shuffle reaches the accuracy of a shuffled scan,
storage order does not."""

import subprocess
import sys

import psycopg
import pytest

from helpers import REPO, dataset, scalar

A9A_FEATURES = 123


def load(dbname, path, table, n_features):
    subprocess.run(
        [sys.executable, str(REPO / "scripts" / "load_libsvm.py"), str(path), table,
         "--n-features", str(n_features), "-d", dbname],
        check=True, capture_output=True,
    )


@pytest.fixture(scope="module")
def a9a(dsn):
    train, test = dataset("a9a.train.bz2", "a9a.test.bz2")
    dbname = dsn.split("=")[1]
    load(dbname, train, "a9a_train", A9A_FEATURES)
    load(dbname, test, "a9a_test", A9A_FEATURES)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE a9a_clustered AS SELECT * FROM a9a_train ORDER BY label, id")
        assert scalar(c, "SELECT count(*) FROM a9a_clustered") == 32561
    return dsn


def test_a9a_clustered(a9a, conn):
    results = {}
    for model in ("svm", "logistic"):
        for shuffle in ("corgipile", "no_shuffle"):
            params = psycopg.types.json.Jsonb({"epochs": 10, "shuffle": shuffle, "seed": 5, "verbose": False})
            model_id = scalar(conn, "SELECT corgipile_train('a9a_clustered', %s, %s)", (model, params))
            results[model, shuffle] = float(scalar(
                conn, "SELECT avg((corgipile_predict(%s, features) = label)::int) FROM a9a_test", (model_id,)))
    print("a9a test accuracy:", {f"{m}/{s}": round(a, 4) for (m, s), a in results.items()})
    for model in ("svm", "logistic"):
        assert results[model, "corgipile"] >= 0.84
        assert results[model, "corgipile"] > results[model, "no_shuffle"]
