"""The deploy gate ("deploy": "if_better", "margin") and the history of deployments
(corgipile.deployments, corgipile_deploy(name, 'previous')): a new version that clearly wins is
deployed and one that clearly loses is not (the old one stays, pinned); both are scored on
exactly the rows the training held out (its stored validation score is the gate's score of it,
and the old version's score is what SQL computes on those rows); every deploy path writes one
row, exactly; 'previous' walks the history back; and as ordinary roles: another role cannot read
a name's history without a grant, nor deploy through the gate a name it may not manage.

The table gt_pts: x is informative (label = x > 0, y = 3x + a little noise), noise is not; a
logistic model of x scores about 1.0, one of noise about 0.5 — a clear winner and a clear
loser."""

import psycopg.errors as E
import pytest
from psycopg.types.json import Jsonb

from helpers import connect, error_of, scalar, suite_db, train

ROLES = ("gt_alice", "gt_bob")
ROWS = 4000
BASE = {"label": "label", "epochs": 3, "seed": 7, "verbose": False}
FRACTION = {"validation": {"fraction": 0.25}}
GATE = {**BASE, **FRACTION, "deploy": "if_better"}
GOOD, BAD = {"features": ["x"]}, {"features": ["noise"]}
PREDICATE = "id % 4 = 0"


def table(c, name, rows, start=1, columns="id, x, noise, label, label2, y"):
    """rows of gt_pts' generator: x and noise pseudo-random in [-1, 1) and [0, 1) (fixed formulas)."""
    c.execute(f"""
        CREATE TABLE IF NOT EXISTS {name} AS SELECT {columns} FROM (
            SELECT i AS id, x, noise, x > 0 AS label, x > 0.5 AS label2,
                   3 * x + 0.1 * (noise - 0.5) AS y
            FROM (SELECT i, ((i::bigint * 2654435761) % 100003) / 50001.5 - 1 AS x,
                         ((i::bigint * 40503) % 9973) / 9973.0 AS noise
                  FROM generate_series({start}, {start + rows - 1}) i) g) t WITH NO DATA""")
    c.execute(f"""
        INSERT INTO {name} SELECT {columns} FROM (
            SELECT i AS id, x, noise, x > 0 AS label, x > 0.5 AS label2,
                   3 * x + 0.1 * (noise - 0.5) AS y
            FROM (SELECT i, ((i::bigint * 2654435761) % 100003) / 50001.5 - 1 AS x,
                         ((i::bigint * 40503) % 9973) / 9973.0 AS noise
                  FROM generate_series({start}, {start + rows - 1}) i) g) t""")
    c.execute(f"GRANT SELECT ON {name} TO PUBLIC")


@pytest.fixture(scope="module")
def env(db):
    with connect(db) as c:
        for r in ROLES:
            c.execute(f"DROP ROLE IF EXISTS {r}")
            c.execute(f"CREATE ROLE {r} LOGIN")
        table(c, "gt_pts", ROWS)
        table(c, "gt_test", 1000, start=ROWS + 1)
        table(c, "gt_other", 500, columns="id, noise, label")
    yield db
    with connect("dbname=postgres") as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {suite_db(db)} WITH (FORCE)")
        for r in ROLES:
            admin.execute(f"DROP ROLE IF EXISTS {r}")


def history(c, name, owner=None):
    """The name's rows of corgipile.deployments the connection sees, oldest first."""
    return c.execute("""SELECT how, from_model, to_model, candidate, metric, new_score, old_score, margin,
                               held_out_rows, deployed_by::text, reason
                        FROM corgipile.deployments WHERE name = %s AND owner = coalesce(%s, current_user)
                        ORDER BY id""", (name, owner)).fetchall()


def deployed(c, name):
    """The id of the version the name means (the caller's own name)."""
    return scalar(c, "SELECT id FROM corgipile.model_summary WHERE name = %s AND deployed AND trained_by = current_user",
                  (name,))


def pinned(c, name):
    return [r[0] for r in c.execute("SELECT id FROM corgipile.models WHERE name = %s AND pinned", (name,))]


def validation(c, model_id, key="accuracy"):
    return c.execute("""SELECT (metrics->'validation'->>%s)::float8, (metrics->'validation'->>'rows')::bigint
                        FROM corgipile.models WHERE id = %s""", (key, model_id)).fetchone()


def counts(c):
    return (scalar(c, "SELECT count(*) FROM corgipile.models"), scalar(c, "SELECT count(*) FROM corgipile.deployments"))


def sql_accuracy(c, model_id, rel, where="true"):
    """A classifier's accuracy on rows of rel, computed in SQL from its predictions."""
    where = where.replace("%", "%%")
    return scalar(c, f"""SELECT avg((corgipile_predict_class(%s::bigint, t) = t.label::text)::int)::float8
                         FROM {rel} t WHERE {where}""", (model_id,))


def sql_r2(c, model_id, rel):
    return scalar(c, f"""SELECT 1 - sum((y - p) ^ 2) / sum((y - m) ^ 2)
                         FROM (SELECT y, corgipile_predict(%s::bigint, t) AS p, avg(y) OVER () AS m FROM {rel} t) s""",
                  (model_id,))


def test_the_gate_both_ways_and_its_history(env):
    with connect(env) as c:
        v1 = train(c, "gt_pts", "logistic", {**GATE, **BAD, "name": "both"})
        # The first version of a name is deployed, and scored for the record.
        assert deployed(c, "both") == v1 and pinned(c, "both") == []
        s1, n1 = validation(c, v1)
        assert 0.3 < s1 < 0.7 and n1 > 900
        # A clear winner: deployed (the newest, nothing pinned).
        v2 = train(c, "gt_pts", "logistic", {**GATE, **GOOD, "name": "both"})
        assert deployed(c, "both") == v2 and pinned(c, "both") == []
        s2, n2 = validation(c, v2)
        assert s2 > 0.95 and n2 == n1
        # A clear loser: stored, not deployed; the winner stays, pinned.
        v3 = train(c, "gt_pts", "logistic", {**GATE, **BAD, "name": "both", "seed": 8})
        assert deployed(c, "both") == v2 and pinned(c, "both") == [v2]
        s3, _ = validation(c, v3)
        # The gate's score of each new version is its stored validation score: the same rows.
        rows = history(c, "both")
        assert [r[:5] for r in rows] == [
            ("gated", None, v1, v1, "accuracy"),
            ("gated", v1, v2, v2, "accuracy"),
            ("gated", v2, v2, v3, "accuracy"),
        ]
        for r, (new, old) in zip(rows, [(s1, None), (s2, s1), (s3, s2)]):
            assert r[5] == pytest.approx(new, rel=1e-12), r
            assert (r[6] is None) if old is None else r[6] == pytest.approx(old, rel=1e-12), r
            assert r[7] == 0 and r[8] == n1 and r[9] == "postgres"
        assert rows[0][10].startswith(f"version 1 (model {v1}) is the first version of the name: deployed")
        assert "higher by more than the margin 0; version 2 is deployed" in rows[1][10]
        assert rows[2][10].endswith("not higher by more than the margin 0; version 2 stays deployed (pinned)")
        # The stored params say it.
        assert scalar(c, "SELECT params->>'deploy' || ' ' || (params->>'margin') FROM corgipile.models WHERE id = %s",
                      (v3,)) == "if_better 0.0"


def test_the_old_version_is_scored_on_exactly_the_held_out_rows(env):
    with connect(env) as c:
        # A predicate: the held-out rows are those SQL selects with it.
        p = {**BASE, "validation": {"predicate": PREDICATE}, "deploy": "if_better", "name": "pred"}
        old = train(c, "gt_pts", "logistic", {**p, **BAD})
        new = train(c, "gt_pts", "logistic", {**p, **GOOD})
        (how, _, to, _, _, new_score, old_score, _, rows, _, _), = history(c, "pred")[1:]
        assert (how, to) == ("gated", new)
        assert rows == scalar(c, f"SELECT count(*) FROM gt_pts WHERE {PREDICATE}")
        assert new_score == pytest.approx(sql_accuracy(c, new, "gt_pts", PREDICATE), rel=1e-12)
        assert old_score == pytest.approx(sql_accuracy(c, old, "gt_pts", PREDICATE), rel=1e-12)
        # A validation relation: every row of it.
        p = {**BASE, "validation": {"relation": "gt_test"}, "deploy": "if_better", "name": "rel"}
        old = train(c, "gt_pts", "logistic", {**p, **BAD})
        new = train(c, "gt_pts", "logistic", {**p, **GOOD})
        r = history(c, "rel")[1]
        assert (r[0], r[2], r[8]) == ("gated", new, 1000)
        assert r[5] == pytest.approx(sql_accuracy(c, new, "gt_test"), rel=1e-12)
        assert r[6] == pytest.approx(sql_accuracy(c, old, "gt_test"), rel=1e-12)


def test_a_regression_is_gated_by_r2(env):
    with connect(env) as c:
        p = {**BASE, "label": "y", "validation": {"relation": "gt_test"}, "deploy": "if_better", "name": "reg"}
        good = train(c, "gt_pts", "linear", {**p, **GOOD})
        bad = train(c, "gt_pts", "linear", {**p, **BAD})
        assert deployed(c, "reg") == good
        r = history(c, "reg")[1]
        assert r[:5] == ("gated", good, good, bad, "r2")
        assert r[5] == pytest.approx(sql_r2(c, bad, "gt_test"), rel=1e-9, abs=1e-12)
        assert r[6] == pytest.approx(sql_r2(c, good, "gt_test"), rel=1e-9)
        assert r[6] > 0.95 and r[5] < 0.2
        # A classifier is not compared with a regression, nor another label: before any work.
        e = error_of(c, "SELECT corgipile_train('gt_pts', 'logistic', %s)",
                     (Jsonb({**p, **GOOD, "label": "label"}),))
        assert isinstance(e, E.DatatypeMismatch), e
        assert "cannot compare this logistic training (a classifier, scored by accuracy)" in e.diag.message_primary
        q = {**BASE, **FRACTION, "deploy": "if_better", "name": "lbl"}
        train(c, "gt_pts", "logistic", {**q, **GOOD})
        before = counts(c)
        e = error_of(c, "SELECT corgipile_train('gt_pts', 'logistic', %s)", (Jsonb({**q, **GOOD, "label": "label2"}),))
        assert isinstance(e, E.InvalidParameterValue), e
        assert 'predicts "label", this training "label2"' in e.diag.message_primary
        # A deployed version whose columns the training's table lacks: before any work.
        e = error_of(c, "SELECT corgipile_train('gt_other', 'logistic', %s)", (Jsonb({**q, **BAD}),))
        assert e is not None and "x" in e.diag.message_primary, e
        assert counts(c) == before


def test_margin(env):
    with connect(env) as c:
        g = {**GATE, "name": "margin"}
        v1 = train(c, "gt_pts", "logistic", {**g, **BAD})
        # The same training again scores the same: a tie keeps the deployed version.
        v2 = train(c, "gt_pts", "logistic", {**g, **BAD})
        assert deployed(c, "margin") == v1 and pinned(c, "margin") == [v1]
        # About 0.5 better, but the margin asks for 0.9 more.
        v3 = train(c, "gt_pts", "logistic", {**g, **GOOD, "margin": 0.9})
        assert deployed(c, "margin") == v1
        # About 0.5 better, the margin 0.3: deployed.
        v4 = train(c, "gt_pts", "logistic", {**g, **GOOD, "margin": 0.3})
        assert deployed(c, "margin") == v4 and pinned(c, "margin") == [v4]
        rows = history(c, "margin")
        assert [(r[1], r[2], r[3], r[7]) for r in rows] == [
            (None, v1, v1, 0), (v1, v1, v2, 0), (v1, v1, v3, 0.9), (v1, v4, v4, 0.3)]
        assert rows[1][5] == rows[1][6]
        assert "not higher by more than the margin 0.9" in rows[2][10]


def test_every_deploy_path_writes_one_row_and_previous_walks_back(env):
    with connect(env) as c:
        p = {**BASE, **GOOD, **FRACTION, "name": "paths"}
        v1 = train(c, "gt_pts", "logistic", p)
        v2 = train(c, "gt_pts", "logistic", {**p, "seed": 2})
        assert scalar(c, "SELECT corgipile_deploy('paths', %s::bigint)", (v1,)) == v1
        v3 = train(c, "gt_pts", "logistic", {**p, "seed": 3})  # pinned: nothing changes, no row
        assert scalar(c, "SELECT corgipile_deploy('paths')") == v3
        rows = history(c, "paths")
        assert [r[:4] for r in rows] == [
            ("train", None, v1, None), ("train", v1, v2, None), ("manual", v2, v1, None), ("latest", v1, v3, None)]
        assert rows[0][10] == f"a training stored version 1 (model {v1}), the first version of the name"
        assert rows[1][10] == f"a training stored version 2 (model {v2}), the newest version, and no version is pinned"
        assert rows[2][10] == f"corgipile_deploy pinned version 1 (model {v1})"
        assert rows[3][10] == f"corgipile_deploy unpinned the name: its newest version is deployed, version 3 (model {v3})"
        assert all(r[4:9] == (None,) * 5 and r[9] == "postgres" for r in rows)
        # 'previous': the version deployed before the current one came in, one decision a call.
        assert scalar(c, "SELECT corgipile_deploy('paths', 'previous')") == v1  # latest v1 -> v3
        assert scalar(c, "SELECT corgipile_deploy('paths', 'previous')") == v2  # manual v2 -> v1
        assert scalar(c, "SELECT corgipile_deploy('paths', 'previous')") == v1  # train v1 -> v2
        e = error_of(c, "SELECT corgipile_deploy('paths', 'previous')")  # v1 was the first
        assert isinstance(e, E.NoDataFound), e
        assert e.diag.message_primary == 'version 1 of "paths" was the first version deployed: there is no previous one'
        assert "corgipile.deployments" in e.diag.message_hint
        assert [r[:3] for r in history(c, "paths")[4:]] == [
            ("previous", v3, v1), ("previous", v1, v2), ("previous", v2, v1)]
        # 'best': the scores it chose by.
        best = scalar(c, "SELECT corgipile_deploy('paths', 'best')")
        row = history(c, "paths")[-1]
        assert row[:3] == ("best", v1, best)
        assert row[4:7] == ("accuracy", validation(c, best)[0], validation(c, v1)[0])
        # Dropping the deployed version is a row; a rollback to a dropped version is P0002.
        assert scalar(c, "SELECT corgipile_deploy('paths', %s::bigint)", (v2,)) == v2
        assert history(c, "paths")[-1][:3] == ("manual", best, v2)
        assert scalar(c, "SELECT corgipile_drop_model(%s::bigint)", (v1,)) == 1
        assert scalar(c, "SELECT corgipile_drop_model(%s::bigint)", (v2,)) == 1
        assert history(c, "paths")[-1][:3] == ("drop", v2, v3)
        e = error_of(c, "SELECT corgipile_deploy('paths', 'previous')")
        assert isinstance(e, E.NoDataFound) and "was dropped" in e.diag.message_primary, e
        assert scalar(c, "SELECT corgipile_drop_model('paths')") == 1
        assert history(c, "paths")[-1][:3] == ("drop", v3, None)


def test_since_is_gated_on_its_held_out_rows_replay_sample_included(env):
    with connect(env) as c:
        table(c, "gt_grow", 3000)
        p = {**BASE, **GOOD, "validation": {"fraction": 0.2}, "deploy": "if_better", "name": "nightly"}
        v1 = train(c, "gt_grow", "logistic", p)
        table(c, "gt_grow", 3000, start=3001)
        v2 = train(c, "gt_grow", "logistic", {**p, "since": "nightly", "replay": 0.5})
        score, rows = validation(c, v2)
        r = history(c, "nightly")[1]
        assert (r[1], r[3], r[8]) == (v1, v2, rows)
        assert r[5] == pytest.approx(score, rel=1e-12)


def test_partitions_and_a_query_are_gated_on_their_held_out_rows(env):
    """The held-out rows are found again by leaf and tuple id: in partitions (whose tuple ids
    repeat), and in the temporary table a query's rows are spilled into."""
    with connect(env) as c:
        c.execute("CREATE TABLE gt_parts (id int, x float8, noise float8, label boolean) PARTITION BY RANGE (id)")
        c.execute("CREATE TABLE gt_parts_1 PARTITION OF gt_parts FOR VALUES FROM (1) TO (2001)")
        c.execute("CREATE TABLE gt_parts_2 PARTITION OF gt_parts FOR VALUES FROM (2001) TO (10000)")
        c.execute("INSERT INTO gt_parts SELECT id, x, noise, label FROM gt_pts")
        p = {**GATE, "name": "parts"}
        train(c, "gt_parts", "logistic", {**p, **BAD})
        new = train(c, "gt_parts", "logistic", {**p, **GOOD})
        score, rows = validation(c, new)
        r = history(c, "parts")[1]
        assert (r[2], r[3], r[8]) == (new, new, rows) and r[5] == pytest.approx(score, rel=1e-12)
        q = {**GATE, "name": "query"}
        scalar(c, "SELECT corgipile_train_query('SELECT * FROM gt_pts WHERE id <= 3000', 'logistic', %s)",
               (Jsonb({**q, **BAD}),))
        new = scalar(c, "SELECT corgipile_train_query('SELECT * FROM gt_pts WHERE id <= 3000', 'logistic', %s)",
                     (Jsonb({**q, **GOOD}),))
        score, rows = validation(c, new)
        r = history(c, "query")[1]
        assert (r[2], r[3], r[8]) == (new, new, rows) and r[5] == pytest.approx(score, rel=1e-12)


def test_networks_and_searches_hold_out_rows_by_default(env):
    with connect(env) as c:
        m = train(c, "gt_pts", "mlp", {"label": "label", "seed": 1, "verbose": False, "hidden": [8],
                                       "features": ["x", "noise"], "deploy": "if_better", "name": "net"})
        score, rows = validation(c, m)
        assert history(c, "net")[0][3:6] == (m, "accuracy", pytest.approx(score, rel=1e-12))
        s = train(c, "gt_pts", "logistic", {**BASE, **GOOD, "name": "net", "deploy": "if_better",
                                            "search": {"learning_rate": [0.001, 0.1]}})
        r = history(c, "net")[1]
        assert r[1] == m and r[3] == s and r[5] == pytest.approx(validation(c, s)[0], rel=1e-12)


def test_bad_gates_stop_before_any_work(env):
    with connect(env) as c:
        before = counts(c)
        for params, state, text in [
            ({**BASE, **GOOD, "name": "nope", "deploy": "if_better"}, E.InvalidParameterValue,
             '"deploy": "if_better" needs held-out rows: "validation"'),
            ({**BASE, **GOOD, **FRACTION, "deploy": "if_better"}, E.InvalidParameterValue,
             '"deploy": "if_better" needs "name"'),
            ({**GATE, **GOOD, "name": "nope", "workers": 1}, E.FeatureNotSupported,
             '"deploy": "if_better" cannot be used with "workers" yet'),
            ({**GATE, **GOOD, "name": "nope", "deploy": "always"}, E.InvalidParameterValue, '"deploy"'),
            ({**BASE, **GOOD, "margin": 0.1}, E.InvalidParameterValue, '"margin" needs "deploy": "if_better"'),
            ({**GATE, **GOOD, "name": "nope", "margin": 2}, E.InvalidParameterValue, '"margin"'),
        ]:
            e = error_of(c, "SELECT corgipile_train('gt_pts', 'logistic', %s)", (Jsonb(params),))
            assert isinstance(e, state) and text in e.diag.message_primary, (params, e)
            assert e.diag.message_hint, e
        assert counts(c) == before


def test_read_only_and_rolled_back(env):
    with connect(env) as c:
        train(c, "gt_pts", "logistic", {**GATE, **GOOD, "name": "ro"})
        before = counts(c)
        for stmt, args in [("SELECT corgipile_train('gt_pts', 'logistic', %s)", (Jsonb({**GATE, **BAD, "name": "ro"}),)),
                           ("SELECT corgipile_deploy('ro', 'previous')", None)]:
            c.execute("BEGIN READ ONLY")
            e = error_of(c, stmt, args)
            c.execute("ROLLBACK")
            assert isinstance(e, E.ReadOnlySqlTransaction), e
        # A gated training rolled back leaves no version, no pin, no row.
        c.execute("BEGIN")
        train(c, "gt_pts", "logistic", {**GATE, **BAD, "name": "ro"})
        assert pinned(c, "ro") != []
        c.execute("ROLLBACK")
        assert counts(c) == before and pinned(c, "ro") == []


def test_other_roles_see_no_history_and_cannot_gate_what_they_may_not_manage(env):
    with connect(env, user="gt_alice") as alice, connect(env, user="gt_bob") as bob, connect(env) as admin:
        a1 = train(alice, "gt_pts", "logistic", {**GATE, **BAD, "name": "shared"})
        a2 = train(alice, "gt_pts", "logistic", {**GATE, **GOOD, "name": "shared"})
        train(alice, "gt_pts", "logistic", {**GATE, **GOOD, "name": "solo"})
        train(bob, "gt_pts", "logistic", {**GATE, **GOOD, "name": "bobs"})
        # No grant: neither sees the other's history, nor anything of it.
        assert scalar(bob, "SELECT count(*) FROM corgipile.deployments WHERE owner = 'gt_alice'") == 0
        assert scalar(alice, "SELECT count(*) FROM corgipile.deployments WHERE owner = 'gt_bob'") == 0
        gated = {**GATE, **BAD, "name": "gt_alice.shared"}
        models = scalar(admin, "SELECT count(*) FROM corgipile.models WHERE trained_by = 'gt_alice'")
        for grant, denied in ((None, E.UndefinedObject), ("use", E.InsufficientPrivilege)):
            if grant:
                alice.execute("SELECT corgipile_grant('shared', 'gt_bob', %s)", (grant,))
            # Neither without a grant (the name does not exist for bob) nor with `use` (42501):
            # before any work, nothing stored, nothing deployed.
            e = error_of(bob, "SELECT corgipile_train('gt_pts', 'logistic', %s)", (Jsonb(gated),))
            assert isinstance(e, E.InsufficientPrivilege), e
            e = error_of(bob, "SELECT corgipile_deploy('gt_alice.shared', 'previous')")
            assert isinstance(e, denied), e
        assert scalar(admin, "SELECT count(*) FROM corgipile.models WHERE trained_by = 'gt_alice'") == models
        assert deployed(alice, "shared") == a2
        # With `use` on the name: its history, and no other name's.
        assert len(history(bob, "shared", "gt_alice")) == 2
        assert scalar(bob, "SELECT count(*) FROM corgipile.deployments WHERE owner = 'gt_alice'") == 2
        # A grant on one id shows that model, not the history (it names the name's other versions).
        alice.execute("SELECT corgipile_grant(%s::bigint, 'gt_bob', 'use')",
                      (scalar(alice, "SELECT id FROM corgipile.models WHERE name = 'solo'"),))
        assert scalar(bob, "SELECT count(*) FROM corgipile.models WHERE name = 'solo'") == 1
        assert history(bob, "solo", "gt_alice") == []
        # Nobody writes the history but corgipile's functions.
        for stmt in ["INSERT INTO corgipile.deployments (owner, name, how, reason, deployed_by) "
                     "VALUES ('gt_alice', 'shared', 'manual', 'forged', 'gt_alice')",
                     "UPDATE corgipile.deployments SET reason = 'forged'",
                     "DELETE FROM corgipile.deployments"]:
            for who in (alice, bob):
                assert isinstance(error_of(who, stmt), E.InsufficientPrivilege), stmt
        # With `manage`: bob gates a new version of alice's name; it is alice's, bob decided.
        alice.execute("SELECT corgipile_grant('shared', 'gt_bob', 'manage')")
        b3 = train(bob, "gt_pts", "logistic", gated)
        assert scalar(admin, "SELECT trained_by::text FROM corgipile.models WHERE id = %s", (b3,)) == "gt_alice"
        row = history(alice, "shared")[-1]
        assert row[:4] == ("gated", a2, a2, b3) and row[9] == "gt_bob"
        assert deployed(alice, "shared") == a2
        assert scalar(bob, "SELECT corgipile_deploy('gt_alice.shared', 'previous')") == a1
        # Revoked: 42501 again.
        alice.execute("SELECT corgipile_revoke('shared', 'gt_bob', 'manage')")
        e = error_of(bob, "SELECT corgipile_train('gt_pts', 'logistic', %s)", (Jsonb(gated),))
        assert isinstance(e, E.InsufficientPrivilege), e
        assert history(admin, "shared", "gt_alice")[-1][0] == "previous"
