"""The "minor" items of the fourth hostile review (issue 51, of version 0.5.0), as a user depends
on them. hard_alice owns the models she shares; hard_bob is the other, ordinary role (roles_env).

* A warm start or `since` by id from another role's model continues that owner's name: it needs
  `manage` on it (the new version is then the owner's), else ERROR 42501 whose hint says to give
  "name"; it never becomes a version of the caller's own, unrelated name of the same text,
  which the caller's predictions by that name would then use.
* `corgipile_train_query` refuses FOR UPDATE / FOR SHARE anywhere in the query (a subquery, a
  nested WITH query, a sublink, a view it reads, a branch of a UNION): 0A000 before anything
  runs, nothing stored.
* Revoking `manage` with dependent grants is the SQLSTATE the documentation says (2B000, as
  PostgreSQL's REVOKE).
* A valid date after 294276 AD trains (read as days since 1970-01-01 × 86,400, no cast to
  timestamp), is read as exactly those days, and a row's prediction agrees with evaluate;
  `infinity` is still 22000 naming the column and the row.
* A regression whose loss stays finite but runs away (500 random features, default learning
  rate) is ERROR 22003 with a hint and nothing stored; a search sets it aside.
* A family grantee's 42501 for a group's model it may not use never names that model's id.
"""

import re

import pytest
from psycopg.types.json import Jsonb

from helpers import (REPO, ROLES_ENV_ALICE, ROLES_ENV_BOB, connect, describe, error_of, scalar,
                     train)

QUIET = {"verbose": False}
SMALL = {"features": "features", "label": "label", "epochs": 1, "seed": 1}


@pytest.fixture(scope="module")
def alice(roles_env):
    with connect(roles_env, ROLES_ENV_ALICE) as c:
        yield c


@pytest.fixture(scope="module")
def bob(roles_env):
    with connect(roles_env, ROLES_ENV_BOB) as c:
        yield c


@pytest.fixture(scope="module", autouse=True)
def grants_cleaned(roles_env):
    yield
    with connect(roles_env) as admin:
        admin.execute("DELETE FROM corgipile.model_grants WHERE owner IN (%s, %s)",
                      (ROLES_ENV_ALICE, ROLES_ENV_BOB))


def versions(conn, owner, name):
    """(id, version) of `owner`'s versions of `name` (as the superuser sees them)."""
    return conn.execute("SELECT id, version FROM corgipile.models WHERE trained_by = %s AND name = %s "
                        "ORDER BY version", (owner, name)).fetchall()


def train_json(conn, rel, model, params):
    return scalar(conn, "SELECT corgipile_train(%s::regclass, %s, %s)", (rel, model, Jsonb({**QUIET, **params})))


def train_error_json(conn, rel, model, params):
    return error_of(conn, "SELECT corgipile_train(%s::regclass, %s, %s)",
                    (rel, model, Jsonb({**QUIET, **params})))


# ---------------------------------------------------------------------------------------------
# 1. A warm start or "since" from another owner's model


def test_continuing_anothers_model_never_joins_the_callers_family(roles_admin, alice, bob):
    theirs = train(alice, "hard_small", "logistic", SMALL, name="h4_inc")
    alice.execute("SELECT corgipile_grant('h4_inc', %s, 'use')", (ROLES_ENV_BOB,))
    # bob's own, unrelated family of the same name (another kind).
    mine = train(bob, "hard_small", "svm", SMALL, name="h4_inc")
    predicted = scalar(bob, "SELECT array_agg(corgipile_predict(%s::bigint, features) ORDER BY id) FROM hard_small",
                       (mine,))

    # With "use" only: no version of alice's name, and none of bob's.
    for param in ("warm_start", "since"):
        e = train_error_json(bob, "hard_small", "logistic", {param: theirs, "epochs": 1, "seed": 1})
        assert e is not None and e.sqlstate == "42501", (param, describe(e))
        assert f"{ROLES_ENV_ALICE}.h4_inc" in e.diag.message_primary and f'"{param}"' in e.diag.message_primary, \
            describe(e)
        assert '"name"' in e.diag.message_hint and "manage" in e.diag.message_hint, describe(e)
    assert versions(roles_admin, ROLES_ENV_BOB, "h4_inc") == [(mine, 1)]
    assert versions(roles_admin, ROLES_ENV_ALICE, "h4_inc") == [(theirs, 1)]
    # bob's name still deploys his own model.
    assert scalar(bob, "SELECT array_agg(corgipile_predict('h4_inc', features) ORDER BY id) FROM hard_small") == predicted

    # A name of bob's own, given: his, and it records where it started.
    named = train_json(bob, "hard_small", "logistic", {"warm_start": theirs, "name": "h4_mine", "epochs": 1, "seed": 1})
    assert roles_admin.execute("SELECT trained_by::text, name, version, (params->>'warm_start')::bigint "
                               "FROM corgipile.models WHERE id = %s", (named,)).fetchone() == \
        (ROLES_ENV_BOB, "h4_mine", 1, theirs)

    # With "manage" on alice's name: the next version of alice's name, hers.
    alice.execute("SELECT corgipile_grant('h4_inc', %s, 'manage')", (ROLES_ENV_BOB,))
    continued = train_json(bob, "hard_small", "logistic", {"warm_start": theirs, "epochs": 1, "seed": 1})
    assert versions(roles_admin, ROLES_ENV_ALICE, "h4_inc") == [(theirs, 1), (continued, 2)]
    assert versions(roles_admin, ROLES_ENV_BOB, "h4_inc") == [(mine, 1)]
    assert scalar(bob, "SELECT array_agg(corgipile_predict('h4_inc', features) ORDER BY id) FROM hard_small") == predicted
    since = train_json(bob, "hard_small", "logistic", {"since": continued, "epochs": 1, "seed": 1})
    assert versions(roles_admin, ROLES_ENV_ALICE, "h4_inc")[-1] == (since, 3)
    assert versions(roles_admin, ROLES_ENV_BOB, "h4_inc") == [(mine, 1)]


# ---------------------------------------------------------------------------------------------
# 2. corgipile_train_query: no row lock anywhere


LOCKING = [
    "SELECT * FROM (SELECT * FROM h4_q FOR UPDATE) s",
    "SELECT * FROM (WITH l AS (SELECT * FROM h4_q FOR SHARE) SELECT * FROM l) s",
    "SELECT * FROM h4_q WHERE id IN (SELECT id FROM h4_q FOR UPDATE)",
    "SELECT q.*, (SELECT r.x FROM h4_q r WHERE r.id = q.id FOR NO KEY UPDATE) AS x2 FROM h4_q q",
    "SELECT * FROM h4_q UNION ALL SELECT * FROM (SELECT * FROM h4_q FOR KEY SHARE) s",
    "SELECT * FROM h4_q_locking",
]


def test_a_training_query_locks_no_row_anywhere(bob):
    bob.execute("DROP VIEW IF EXISTS h4_q_locking")
    bob.execute("DROP TABLE IF EXISTS h4_q")
    bob.execute("CREATE TABLE h4_q AS SELECT i AS id, (i % 7) / 7.0 AS x, i % 2 AS y FROM generate_series(1, 500) i")
    bob.execute("CREATE VIEW h4_q_locking AS SELECT * FROM h4_q FOR UPDATE")
    params = Jsonb({"features": ["x"], "label": "y", "epochs": 1, "seed": 1, **QUIET})
    before = scalar(bob, "SELECT count(*) FROM corgipile.models")
    for query in LOCKING:
        e = error_of(bob, "SELECT corgipile_train_query(%s, 'logistic', %s)", (query, params))
        assert e is not None and e.sqlstate == "0A000", (query, describe(e))
        assert "FOR UPDATE / FOR SHARE locks rows" in e.diag.message_primary, (query, describe(e))
    assert scalar(bob, "SELECT count(*) FROM corgipile.models") == before
    assert scalar(bob, "SELECT count(*) FROM pg_class WHERE relname LIKE 'corgipile_spill%'") == 0
    # The same queries without the locking clause train.
    for query in ("SELECT * FROM (SELECT * FROM h4_q) s",
                  "SELECT * FROM h4_q WHERE id IN (SELECT id FROM h4_q WHERE id % 2 = 0 OR id % 3 = 0)"):
        assert scalar(bob, "SELECT corgipile_train_query(%s, 'logistic', %s)", (query, params)) is not None


# ---------------------------------------------------------------------------------------------
# 3. Revoking "manage" with dependent grants: the documented SQLSTATE


def documented_revoke_codes():
    reference = (REPO / "docs" / "reference.md").read_text()
    models = (REPO / "docs" / "models.md").read_text()
    changelog = (REPO / "CHANGELOG.md").read_text()
    found = [
        re.search(r"Revoking `manage` from a role that granted\s+privileges with it is ERROR (\w{5})", reference),
        re.search(r"the caller cannot see, 42704; (\w{5}) as above", reference),
        re.search(r"is refused \(SQLSTATE\s+(\w{5}), the dependent grants listed\)", models),
        re.search(r"granted privileges with it stops with (\w{5}) \"dependent privileges exist\"", changelog),
    ]
    return [m.group(1) if m else None for m in found]


def test_revoking_manage_with_dependent_grants_is_the_documented_sqlstate(alice, bob):
    train(alice, "hard_small", "logistic", SMALL, name="h4_rev")
    alice.execute("SELECT corgipile_grant('h4_rev', %s, 'manage')", (ROLES_ENV_BOB,))
    bob.execute(f"SELECT corgipile_grant('{ROLES_ENV_ALICE}.h4_rev', 'public', 'use')")
    e = error_of(alice, "SELECT corgipile_revoke('h4_rev', %s, 'manage')", (ROLES_ENV_BOB,))
    assert e is not None and e.diag.message_primary == "dependent privileges exist", describe(e)
    assert e.sqlstate == "2B000", describe(e)  # PostgreSQL's REVOKE answers the same
    assert documented_revoke_codes() == [e.sqlstate] * 4
    alice.execute("SELECT corgipile_revoke('h4_rev', %s, 'manage', cascade => true)", (ROLES_ENV_BOB,))
    for path in ("docs/reference.md", "docs/models.md"):  # (the CHANGELOG's fix names the old code)
        assert "2BP01" not in (REPO / path).read_text(), path


# ---------------------------------------------------------------------------------------------
# 4. Dates after 294276 AD


@pytest.fixture(scope="module")
def dates(bob):
    bob.execute("DROP TABLE IF EXISTS h4_dates, h4_dates_inf")
    # Half the rows in 2020, half after 300000 AD (a valid date, beyond timestamp's range).
    bob.execute("""CREATE TABLE h4_dates AS SELECT i AS id,
                     CASE WHEN i % 2 = 0 THEN DATE '2020-01-01' + i ELSE make_date(300000, 1, 1) + i END AS d,
                     (i % 7) / 7.0 AS x, (i % 2) + (i % 7) / 7.0 AS y
                   FROM generate_series(1, 400) i""")
    return "h4_dates"


def test_a_date_after_294276_ad_trains_and_predicts_as_read(bob, dates):
    model = train(bob, dates, "linear", {"features": ["d", "x"], "label": "y", "epochs": 5, "seed": 1})
    # Each date is read as its days since 1970-01-01 (the value part, unscaled): exactly.
    traced = bob.execute("SELECT label::int, first_feature FROM corgipile_trace('h4_dates', %s)",
                         (Jsonb({"features": ["d"], "label": "id", "normalize": False,
                                 "preprocess": {"d": {"parts": ["value"]}}}),)).fetchall()
    days = dict(bob.execute("SELECT id, (d - DATE '1970-01-01')::float8 FROM h4_dates").fetchall())
    assert len(traced) == 400 and all(first == days[i] for i, first in traced), \
        [(i, first, days[i]) for i, first in traced if first != days[i]][:3]
    assert days[1] > 1e8  # the far dates are in
    # A prediction from a row reads a date as the training query did: evaluate agrees.
    report = scalar(bob, "SELECT corgipile_evaluate(%s, 'h4_dates')", (model,))
    assert report["rows_scored"] == 400, report
    mae = scalar(bob, "SELECT avg(abs(corgipile_predict(%s, t) - y))::float8 FROM h4_dates t", (model,))
    assert mae == pytest.approx(report["mae"], rel=1e-9)
    # An infinite date is still an ERROR naming the column and the row.
    bob.execute("CREATE TABLE h4_dates_inf AS SELECT * FROM h4_dates")
    for value in ("infinity", "-infinity"):
        bob.execute("UPDATE h4_dates_inf SET d = %s WHERE id = 7", (value,))
        e = train_error_json(bob, "h4_dates_inf", "linear", {"features": ["d", "x"], "label": "y", "epochs": 1})
        assert e is not None and e.sqlstate == "22000", describe(e)
        assert 'column "d"' in e.diag.message_primary and "ctid" in e.diag.message_primary, describe(e)


# ---------------------------------------------------------------------------------------------
# 5. A regression that runs away while its loss stays finite


@pytest.fixture(scope="module")
def wide(bob):
    bob.execute("DROP TABLE IF EXISTS h4_wide")
    # 500 uniform pseudo-random features and a random label: at the default learning rate a
    # step overshoots by more each time, and the loss ends near 1e160 without overflowing.
    bob.execute("""CREATE TABLE h4_wide AS SELECT i AS id,
                     ARRAY(SELECT (hashint4(i * 1000 + j)::float8 + 2147483648) / 4294967296
                           FROM generate_series(1, 500) j) AS features,
                     (hashint4(-i)::float8 + 2147483648) / 4294967296 AS y
                   FROM generate_series(1, 2000) i""")
    return "h4_wide"


def test_a_regression_that_diverged_while_finite_is_not_stored(bob, wide):
    before = scalar(bob, "SELECT count(*) FROM corgipile.models")
    e = train_error_json(bob, wide, "linear", {"features": "features", "label": "y", "seed": 1})
    assert e is not None and e.sqlstate == "22003", describe(e)
    assert e.diag.message_primary.startswith("training diverged in epoch "), describe(e)
    assert "1000 times" in e.diag.message_primary, describe(e)  # finite: not the NaN check
    assert "learning_rate" in e.diag.message_hint, describe(e)
    assert scalar(bob, "SELECT count(*) FROM corgipile.models") == before
    # A search sets such a configuration aside and stores the others.
    best = train_json(bob, wide, "linear", {"features": "features", "label": "y", "seed": 1, "epochs": 3,
                                           "name": "h4_div", "search": {"learning_rate": [0.01, 1e-6]}})
    stored = bob.execute("SELECT id, params->>'learning_rate' FROM corgipile.models WHERE name = 'h4_div'").fetchall()
    assert [(i, float(lr)) for i, lr in stored] == [(best, 1e-6)], stored
    aside = scalar(bob, "SELECT metrics->'search'->'set_aside' FROM corgipile.models WHERE id = %s", (best,))
    assert len(aside) == 1 and aside[0]["params"] == {"learning_rate": 0.01} and "diverged" in aside[0]["error"], aside


# ---------------------------------------------------------------------------------------------
# 6. A hidden group model's id


def test_a_family_grantee_never_learns_a_hidden_group_models_id(roles_admin, alice, bob):
    alice.execute("DROP TABLE IF EXISTS h4_groups")
    alice.execute("""CREATE TABLE h4_groups AS SELECT i AS id, i % 3 AS g,
                       (hashint4(i) % 1000) / 250.0 AS x1, (hashint4(i * 7 + 3) % 1000) / 250.0 AS x2,
                       (hashint4(i) % 1000) + (hashint4(i * 7 + 3) % 1000) > 0 AS y
                     FROM generate_series(1, 3000) i""")
    alice.execute(f"GRANT SELECT ON h4_groups TO {ROLES_ENV_BOB}")
    family = train(alice, "h4_groups", "logistic", {"features": ["x1", "x2"], "label": "y", "epochs": 2, "seed": 7,
                                                    "name": "h4_g", "group_by": "g"})
    hidden = [r[0] for r in roles_admin.execute(
        "SELECT model_id FROM corgipile.group_models WHERE family_id = %s", (family,))]
    assert len(hidden) == 3
    # A grant on the family's id covers the family only.
    alice.execute("SELECT corgipile_grant(%s::bigint, %s, 'use')", (family, ROLES_ENV_BOB))
    for call in ("SELECT corgipile_predict(%s, s) FROM h4_groups s WHERE id = 4",
                 "SELECT p.model_id FROM h4_groups s, corgipile_predict_group(%s::text, s) p WHERE s.id = 4",
                 "SELECT corgipile_evaluate(%s, 'h4_groups')"):
        e = error_of(bob, call, (family,))
        assert e is not None and e.sqlstate == "42501", (call, describe(e))
        assert str(family) in e.diag.message_primary and "which you may not use" in e.diag.message_primary, \
            (call, describe(e))
        said = " ".join(filter(None, (e.diag.message_primary, e.diag.message_detail, e.diag.message_hint)))
        assert not any(re.search(rf"\b{i}\b", said) for i in hidden), (call, hidden, said)
