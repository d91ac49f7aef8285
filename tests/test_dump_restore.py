"""pg_dump / pg_restore of a database carries its corgipile models: predictions after a restore
into a new database are identical."""

import subprocess

import psycopg

from helpers import scalar
from tables import NOISY, points

SOURCE, TARGET = "corgipile_dump_src", "corgipile_dump_dst"


def test_models_survive_dump_and_restore(tmp_path):
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        for db in (SOURCE, TARGET):
            admin.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {SOURCE}")
    with psycopg.connect(dbname=SOURCE, autocommit=True) as c:
        c.execute("CREATE EXTENSION corgipile")
        points(c, "pts", 2000, features=NOISY)
        ids = [scalar(c, "SELECT corgipile_train('pts', %s, '{\"epochs\": 2, \"seed\": 1, \"verbose\": false, \"name\": \"pts\"}')", (m,))
               for m in ("svm", "logistic")]
        # Version 1 of "pts" pinned: the deployment survives too.
        c.execute("SELECT corgipile_deploy('pts', %s)", (ids[0],))
        by_name = "SELECT corgipile_decision_function('pts', features) FROM pts ORDER BY id"
        by_name_before = c.execute(by_name).fetchall()
        before = c.execute("""SELECT m, id, corgipile_decision_function(m, features) FROM pts, unnest(%s::bigint[]) m
                              ORDER BY m, id""", (ids,)).fetchall()
        epochs_before = scalar(c, "SELECT count(*) FROM corgipile.epochs")
    dump = tmp_path / "db.dump"
    subprocess.run(["pg_dump", "-Fc", "-f", str(dump), SOURCE], check=True)
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {TARGET}")
    subprocess.run(["pg_restore", "-d", TARGET, str(dump)], check=True)
    with psycopg.connect(dbname=TARGET, autocommit=True) as c:
        after = c.execute("""SELECT m, id, corgipile_decision_function(m, features) FROM pts, unnest(%s::bigint[]) m
                             ORDER BY m, id""", (ids,)).fetchall()
        assert after == before
        assert c.execute(by_name).fetchall() == by_name_before
        assert c.execute("SELECT version, deployed FROM corgipile.model_summary WHERE name = 'pts' ORDER BY version").fetchall() == \
            [(1, True), (2, False)]
        assert scalar(c, "SELECT count(*) FROM corgipile.epochs") == epochs_before
        # New models do not collide with restored ids.
        new_id = scalar(c, "SELECT corgipile_train('pts', 'svm', '{\"epochs\": 1, \"verbose\": false, \"name\": \"pts\"}')")
        assert new_id > max(ids)
        assert scalar(c, "SELECT version FROM corgipile.models WHERE id = %s", (new_id,)) == 3
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        for db in (SOURCE, TARGET):
            admin.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


def test_per_group_models_survive_dump_and_restore(tmp_path):
    src, dst = SOURCE + "_g", TARGET + "_g"
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        for db in (src, dst):
            admin.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {src}")
    with psycopg.connect(dbname=src, autocommit=True) as c:
        c.execute("CREATE EXTENSION corgipile")
        c.execute("""CREATE TABLE shop AS SELECT i AS id, i % 4 AS store, (i % 7) - 3.0 AS x,
                     CASE WHEN i % 4 < 2 THEN (i % 7) > 3 ELSE (i % 7) < 3 END AS y FROM generate_series(1, 4000) i""")
        c.execute("""SELECT corgipile_train('shop', 'logistic', '{"features": ["x"], "label": "y", "group_by": "store",
                     "name": "shop", "epochs": 2, "seed": 1, "verbose": false}')""")
        query = "SELECT p.* FROM shop s, corgipile_predict_group('shop', s) p ORDER BY s.id"
        before = c.execute(query).fetchall()
        report = scalar(c, "SELECT corgipile_evaluate('shop', 'shop')")
    dump = tmp_path / "groups.dump"
    subprocess.run(["pg_dump", "-Fc", "-f", str(dump), src], check=True)
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {dst}")
    subprocess.run(["pg_restore", "-d", dst, str(dump)], check=True)
    with psycopg.connect(dbname=dst, autocommit=True) as c:
        assert c.execute(query).fetchall() == before
        assert {r[2] for r in before} == {"0", "1", "2", "3"} and all(r[3] for r in before)
        assert scalar(c, "SELECT corgipile_evaluate('shop', 'shop')") == report
        assert scalar(c, "SELECT count(*) FROM corgipile.group_models WHERE name = 'shop'") == 4
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        for db in (src, dst):
            admin.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
