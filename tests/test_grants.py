"""Models shared between roles: corgipile_grant / corgipile_revoke.

gr_alice owns the models. gr_bob is the grantee under test, gr_carol a member of the group role
gr_app, gr_dave a NOINHERIT member of gr_app, gr_eve never gets anything. Every test grants what
it needs and revokes it again (the module's roles and models are shared)."""

import subprocess

import psycopg
import psycopg.errors as E
import pytest
from psycopg import sql

from helpers import scalar, train
from tables import STEPS, points

ROLES = ("gr_alice", "gr_bob", "gr_carol", "gr_dave", "gr_eve", "gr_app")
PTS = "public.pts"  # every model of this suite is trained on it with TRAIN
TRAIN = {"features": "features", "label": "label", "epochs": 1, "seed": 1, "verbose": False}
X = "ARRAY[0.5, -1.0]::float8[]"


def drop_roles(admin, roles):
    for role in roles:
        if scalar(admin, "SELECT count(*) FROM pg_roles WHERE rolname = %s", (role,)):
            admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@pytest.fixture(scope="module")
def world(dsn):
    with psycopg.connect(dsn, autocommit=True) as admin:
        drop_roles(admin, ROLES)
        for role in ("gr_alice", "gr_bob", "gr_carol", "gr_eve"):
            admin.execute(f"CREATE ROLE {role} LOGIN")
        admin.execute("CREATE ROLE gr_dave LOGIN NOINHERIT")
        admin.execute("CREATE ROLE gr_app NOLOGIN")
        admin.execute("GRANT gr_app TO gr_carol, gr_dave")
        points(admin, "public.pts", 2000, features=STEPS, replace=True)
        admin.execute("GRANT SELECT ON public.pts TO PUBLIC")
    with psycopg.connect(dsn, user="gr_alice", autocommit=True) as alice:
        ids = {"v1": train(alice, PTS, "logistic", defaults=TRAIN, name="churn"),
               "v2": train(alice, PTS, "logistic", defaults=TRAIN, name="churn"),
               "unnamed": train(alice, PTS, "logistic", defaults=TRAIN)}
    yield ids
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("DELETE FROM corgipile.models WHERE trained_by::text LIKE 'gr\\_%'")
        admin.execute("DELETE FROM corgipile.model_grants WHERE owner::text LIKE 'gr\\_%'")
        drop_roles(admin, ROLES)


def session(dsn, role):
    return psycopg.connect(dsn, user=role, autocommit=True)


def as_alice(dsn, sql, params=None):
    with session(dsn, "gr_alice") as c:
        c.execute(sql, params)


def predict(c, model):
    return scalar(c, f"SELECT corgipile_predict_proba(%s, {X})", (model,))


def visible_ids(c):
    return {r[0] for r in c.execute("SELECT id FROM corgipile.model_summary")}


def assert_cannot_reach(c, world, name="gr_alice.churn"):
    """Nothing of gr_alice's reaches this session: not in any view, and every function says
    'does not exist', word for word as for an id or name that never existed."""
    assert visible_ids(c).isdisjoint(world.values())
    assert scalar(c, "SELECT count(*) FROM corgipile.models") == 0
    assert scalar(c, "SELECT count(*) FROM corgipile.epochs") == 0
    assert scalar(c, "SELECT count(*) FROM corgipile.model_grants WHERE owner = 'gr_alice'") == 0
    for stmt in (f"SELECT corgipile_predict(%s::bigint, {X})",
                 "SELECT corgipile_evaluate(%s::bigint, 'public.pts')",
                 "SELECT count(*) FROM corgipile_model_coefficients(%s::bigint)",
                 "SELECT corgipile_drop_model(%s::bigint)",
                 "SELECT corgipile_grant(%s::bigint, 'gr_eve', 'use')"):
        messages = []
        for model in (world["v1"], 987654321):
            with pytest.raises(E.UndefinedObject) as err:
                c.execute(stmt, (model,))
            messages.append(str(err.value).replace(str(model), "N"))
        assert messages[0] == messages[1], stmt
    for stmt in (f"SELECT corgipile_predict(%s::text, {X})",
                 "SELECT corgipile_deploy(%s)",
                 "SELECT corgipile_drop_model(%s::text)",
                 "SELECT corgipile_grant(%s::text, 'gr_eve', 'use')"):
        messages = []
        for model in (name, "gr_alice.no_such_name"):
            with pytest.raises(E.UndefinedObject) as err:
                c.execute(stmt, (model,))
            messages.append(str(err.value).replace(model, "NAME"))
        assert messages[0] == messages[1], stmt
    # Retraining another role's name: the same refusal whether or not the name exists.
    messages = []
    for model in (name, "gr_alice.no_such_name"):
        with pytest.raises(E.InsufficientPrivilege) as err:
            train(c, PTS, "logistic", defaults=TRAIN, name=model)
        messages.append(str(err.value).replace(model, "NAME"))
    assert messages[0] == messages[1]


def test_without_a_grant_another_roles_models_do_not_exist(dsn, world):
    with session(dsn, "gr_bob") as bob:
        assert_cannot_reach(bob, world)


def test_owner_sees_and_uses_everything(dsn, world):
    with session(dsn, "gr_alice") as alice:
        assert visible_ids(alice) >= set(world.values())
        assert predict(alice, "churn") == predict(alice, world["v2"])


def test_use_on_a_name_covers_every_version_present_and_future(dsn, world):
    as_alice(dsn, "SELECT corgipile_grant('churn', 'gr_bob', 'use')")
    try:
        with session(dsn, "gr_bob") as bob, session(dsn, "gr_alice") as alice:
            assert visible_ids(bob) == {world["v1"], world["v2"]}
            assert bob.execute("SELECT version, deployed, trained_by FROM corgipile.model_summary ORDER BY version").fetchall() == \
                [(1, False, "gr_alice"), (2, True, "gr_alice")]
            assert predict(bob, "gr_alice.churn") == predict(alice, "churn")
            assert predict(bob, str(world["v1"])) == predict(alice, world["v1"])
            assert scalar(bob, "SELECT corgipile_evaluate('gr_alice.churn', 'public.pts') ->> 'rows_scored'") == "2000"
            assert scalar(bob, "SELECT count(*) FROM corgipile_model_coefficients('gr_alice.churn')") == 3
            assert scalar(bob, "SELECT count(*) FROM corgipile.epochs WHERE model_id = %s", (world["v1"],)) == 1
            # Not the unnamed model, and not the grants made to others.
            assert world["unnamed"] not in visible_ids(bob)
            # "churn" alone is bob's own name (he has none).
            with pytest.raises(E.UndefinedObject):
                predict(bob, "churn")
            # use is not manage.
            with pytest.raises(E.InsufficientPrivilege):
                bob.execute("SELECT corgipile_deploy('gr_alice.churn', %s)", (world["v1"],))
            with pytest.raises(E.InsufficientPrivilege):
                bob.execute("SELECT corgipile_drop_model(%s::bigint)", (world["v1"],))
            with pytest.raises(E.InsufficientPrivilege):
                bob.execute("SELECT corgipile_drop_model('gr_alice.churn')")
            with pytest.raises(E.InsufficientPrivilege):
                train(bob, PTS, "logistic", defaults=TRAIN, name="gr_alice.churn")
            with pytest.raises(E.InsufficientPrivilege):
                bob.execute("SELECT corgipile_grant('gr_alice.churn', 'gr_eve', 'use')")
            # A version trained later is covered too, and becomes the deployed one.
            v3 = train(alice, PTS, "logistic", defaults=TRAIN, name="churn")
            try:
                assert v3 in visible_ids(bob)
                assert predict(bob, "gr_alice.churn") == predict(alice, v3)
            finally:
                alice.execute("SELECT corgipile_drop_model(%s::bigint)", (v3,))
        with session(dsn, "gr_eve") as eve:
            assert_cannot_reach(eve, world)
    finally:
        as_alice(dsn, "SELECT corgipile_revoke('churn', 'gr_bob', 'use')")
    with session(dsn, "gr_bob") as bob:
        assert_cannot_reach(bob, world)


def test_use_on_an_id_covers_that_model_only(dsn, world):
    as_alice(dsn, "SELECT corgipile_grant(%s::bigint, 'gr_bob', 'use')", (world["v1"],))
    try:
        with session(dsn, "gr_bob") as bob:
            assert visible_ids(bob) == {world["v1"]}
            assert predict(bob, world["v1"]) is not None
            # Addressing the name needs a grant on the name.
            with pytest.raises(E.UndefinedObject):
                predict(bob, "gr_alice.churn")
            with pytest.raises(E.InsufficientPrivilege):
                bob.execute("SELECT corgipile_drop_model(%s::bigint)", (world["v1"],))
    finally:
        as_alice(dsn, "SELECT corgipile_revoke(%s::bigint, 'gr_bob', 'use')", (world["v1"],))
    with session(dsn, "gr_bob") as bob:
        assert visible_ids(bob) == set()


def test_manage_deploys_retrains_grants_and_drops(dsn, world):
    as_alice(dsn, "SELECT corgipile_grant('churn', 'gr_bob', 'manage')")
    try:
        with session(dsn, "gr_bob") as bob, session(dsn, "gr_alice") as alice:
            # manage includes use.
            assert visible_ids(bob) == {world["v1"], world["v2"]}
            assert scalar(bob, "SELECT corgipile_deploy('gr_alice.churn', %s)", (world["v1"],)) == world["v1"]
            assert predict(alice, "churn") == predict(alice, world["v1"])
            assert scalar(bob, "SELECT corgipile_deploy('gr_alice.churn')") == world["v2"]
            # A new version of alice's name, owned by alice.
            v3 = train(bob, PTS, "logistic", defaults=TRAIN, name="gr_alice.churn")
            assert alice.execute("SELECT version, trained_by FROM corgipile.models WHERE id = %s", (v3,)).fetchone() == (3, "gr_alice")
            # bob has no "churn" of his own.
            assert scalar(bob, "SELECT count(*) FROM corgipile.models WHERE trained_by = 'gr_bob'") == 0
            # bob may pass "use" on.
            bob.execute("SELECT corgipile_grant('gr_alice.churn', 'gr_eve', 'use')")
            with session(dsn, "gr_eve") as eve:
                assert v3 in visible_ids(eve)
            bob.execute("SELECT corgipile_revoke('gr_alice.churn', 'gr_eve', 'use')")
            with session(dsn, "gr_eve") as eve:
                assert_cannot_reach(eve, world)
            assert scalar(bob, "SELECT corgipile_drop_model(%s::bigint)", (v3,)) == 1
            assert scalar(alice, "SELECT count(*) FROM corgipile.models WHERE id = %s", (v3,)) == 0
            # Still nothing outside the granted name.
            with pytest.raises(E.UndefinedObject):
                bob.execute("SELECT corgipile_drop_model(%s::bigint)", (world["unnamed"],))
    finally:
        as_alice(dsn, "SELECT corgipile_revoke('churn', 'gr_bob', 'manage')")


def test_manage_on_an_id(dsn, world):
    with session(dsn, "gr_alice") as alice:
        victim = train(alice, PTS, "logistic", defaults=TRAIN, name="churn")
        alice.execute("SELECT corgipile_grant(%s::bigint, 'gr_bob', 'manage')", (victim,))
    with session(dsn, "gr_bob") as bob:
        assert visible_ids(bob) == {victim}
        with pytest.raises(E.UndefinedObject):
            bob.execute("SELECT corgipile_deploy('gr_alice.churn', %s)", (victim,))
        assert scalar(bob, "SELECT corgipile_drop_model(%s::bigint)", (victim,)) == 1
    with session(dsn, "gr_alice") as alice:
        # The id's grants went with the model.
        assert scalar(alice, "SELECT count(*) FROM corgipile.model_grants WHERE model_id = %s", (victim,)) == 0


def test_membership_counts_as_in_postgresql(dsn, world):
    as_alice(dsn, "SELECT corgipile_grant('churn', 'gr_app', 'use')")
    try:
        with session(dsn, "gr_carol") as carol:
            assert visible_ids(carol) == {world["v1"], world["v2"]}
            assert predict(carol, "gr_alice.churn") is not None
        # NOINHERIT: a member that does not inherit the group's privileges gets nothing ...
        with session(dsn, "gr_dave") as dave:
            assert_cannot_reach(dave, world)
            # ... until it takes on the role, as with any privilege.
            dave.execute("SET ROLE gr_app")
            assert visible_ids(dave) == {world["v1"], world["v2"]}
        with session(dsn, "gr_bob") as bob:
            assert_cannot_reach(bob, world)
    finally:
        as_alice(dsn, "SELECT corgipile_revoke('churn', 'gr_app', 'use')")


def test_public(dsn, world):
    as_alice(dsn, "SELECT corgipile_grant('churn', 'PUBLIC', 'use')")
    try:
        for role in ("gr_bob", "gr_eve", "gr_dave"):
            with session(dsn, role) as c:
                assert visible_ids(c) == {world["v1"], world["v2"]}
                assert predict(c, "gr_alice.churn") is not None
                with pytest.raises(E.InsufficientPrivilege):
                    c.execute("SELECT corgipile_deploy('gr_alice.churn')")
    finally:
        as_alice(dsn, "SELECT corgipile_revoke('churn', 'public', 'use')")
    with session(dsn, "gr_eve") as eve:
        assert_cannot_reach(eve, world)


def test_bad_grants(dsn, world):
    with session(dsn, "gr_alice") as alice:
        with pytest.raises(E.InvalidParameterValue, match="unknown model privilege"):
            alice.execute("SELECT corgipile_grant('churn', 'gr_bob', 'select')")
        with pytest.raises(E.UndefinedObject, match='role "gr_nobody" does not exist'):
            alice.execute("SELECT corgipile_grant('churn', 'gr_nobody', 'use')")
        with pytest.raises(E.UndefinedObject, match='no corgipile model named "no_such"'):
            alice.execute("SELECT corgipile_grant('no_such', 'gr_bob', 'use')")
        # Granting twice is one grant; revoking what was never granted says so.
        alice.execute("SELECT corgipile_grant('churn', 'gr_bob', 'use')")
        alice.execute("SELECT corgipile_grant('churn', 'gr_bob', 'use')")
        assert scalar(alice, "SELECT count(*) FROM corgipile.model_grants WHERE grantee = 'gr_bob'::regrole") == 1
        alice.execute("SELECT corgipile_revoke('churn', 'gr_bob', 'use')")
        notices = []
        alice.add_notice_handler(lambda d: notices.append(d.message_primary))
        alice.execute("SELECT corgipile_revoke('churn', 'gr_bob', 'use')")
        assert any("held no" in n for n in notices), notices
    # Nobody writes the grants table directly.
    with session(dsn, "gr_bob") as bob:
        with pytest.raises(E.InsufficientPrivilege):
            bob.execute("""INSERT INTO corgipile.model_grants (owner, model_name, grantee, privilege, granted_by)
                           VALUES ('gr_alice', 'churn', 'gr_bob', 'manage', 'gr_alice')""")


def test_a_dropped_roles_grants_disappear(dsn, world):
    with psycopg.connect(dsn, autocommit=True) as admin:
        drop_roles(admin, ["gr_temp"])
        admin.execute("CREATE ROLE gr_temp LOGIN")
        temp_oid = scalar(admin, "SELECT oid FROM pg_roles WHERE rolname = 'gr_temp'")
    as_alice(dsn, "SELECT corgipile_grant('churn', 'gr_temp', 'use')")
    with session(dsn, "gr_temp") as temp:
        assert visible_ids(temp) == {world["v1"], world["v2"]}
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("DROP ROLE gr_temp")
    with session(dsn, "gr_alice") as alice:
        # Dead at once: not shown to the owner (shown rows name live roles only) ...
        assert alice.execute("SELECT grantee::text FROM corgipile.model_grants").fetchall() == []
        # ... and deleted by the next grant or revoke of anyone.
        alice.execute("SELECT corgipile_grant('churn', 'gr_bob', 'use')")
        alice.execute("SELECT corgipile_revoke('churn', 'gr_bob', 'use')")
    with psycopg.connect(dsn, autocommit=True) as admin:
        assert scalar(admin, "SELECT count(*) FROM corgipile.model_grants WHERE grantee::oid = %s", (temp_oid,)) == 0


def test_grants_survive_dump_and_restore(dsn, world, tmp_path):
    source, target = "corgipile_grants_src", "corgipile_grants_dst"
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        for db in (source, target):
            admin.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {source}")
        drop_roles(admin, ["gr_gone"])
        admin.execute("CREATE ROLE gr_gone")
    with psycopg.connect(dbname=source, autocommit=True) as c:
        c.execute("CREATE EXTENSION corgipile")
        c.execute("""CREATE TABLE public.pts AS SELECT i AS id, ARRAY[(i % 2) * 2 - 1 + (i % 7) / 7.0, 0.5]::float8[] AS features,
                     (i % 2) AS label FROM generate_series(1, 500) i""")
        c.execute("GRANT SELECT ON public.pts TO PUBLIC")
    with psycopg.connect(dbname=source, user="gr_alice", autocommit=True) as alice:
        v1 = train(alice, PTS, "logistic", defaults=TRAIN, name="churn")
        other = train(alice, PTS, "logistic", defaults=TRAIN)
        alice.execute("SELECT corgipile_grant('churn', 'gr_bob', 'use')")
        alice.execute("SELECT corgipile_grant(%s::bigint, 'gr_app', 'manage')", (other,))
        alice.execute("SELECT corgipile_grant('churn', 'gr_gone', 'use')")
        before = predict(alice, "churn")
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        admin.execute("DROP ROLE gr_gone")
    dump = tmp_path / "grants.dump"
    subprocess.run(["pg_dump", "-Fc", "-f", str(dump), source], check=True)
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {target}")
    subprocess.run(["pg_restore", "-d", target, str(dump)], check=True)
    try:
        with psycopg.connect(dbname=target, autocommit=True) as c:
            rows = c.execute("""SELECT owner::text, model_name, model_id, grantee::text, privilege
                                FROM corgipile.model_grants ORDER BY privilege, grantee::text""").fetchall()
            assert rows == [("gr_alice", None, other, "gr_app", "manage"), ("gr_alice", "churn", None, "gr_bob", "use")]
        with psycopg.connect(dbname=target, user="gr_bob", autocommit=True) as bob:
            assert predict(bob, "gr_alice.churn") == before
            assert {r[0] for r in bob.execute("SELECT id FROM corgipile.model_summary")} == {v1}
        with psycopg.connect(dbname=target, user="gr_carol", autocommit=True) as carol:
            assert scalar(carol, "SELECT corgipile_drop_model(%s::bigint)", (other,)) == 1
    finally:
        with psycopg.connect(dbname="postgres", autocommit=True) as admin:
            for db in (source, target):
                admin.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


def test_owner_names_with_dots_and_quotes(dsn, world):
    with psycopg.connect(dsn, autocommit=True) as admin:
        drop_roles(admin, ['gr.dotted'])
        admin.execute('CREATE ROLE "gr.dotted" LOGIN')
    try:
        with session(dsn, "gr.dotted") as dotted:
            train(dotted, PTS, "logistic", defaults=TRAIN, name="m")
            dotted.execute("SELECT corgipile_grant('m', 'gr_bob', 'use')")
            # A name of one's own may contain a dot where the part before it is no role.
            own = train(dotted, PTS, "logistic", defaults=TRAIN, name="v1.2")
            assert scalar(dotted, f"SELECT corgipile_predict_proba('v1.2', {X})") == predict(dotted, own)
        with session(dsn, "gr_bob") as bob:
            assert predict(bob, '"gr.dotted".m') is not None
            with pytest.raises(E.UndefinedObject):
                predict(bob, "gr.dotted.m")
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute("DELETE FROM corgipile.models WHERE trained_by = 'gr.dotted'")
            admin.execute("DELETE FROM corgipile.model_grants WHERE owner = 'gr.dotted'")
            drop_roles(admin, ['gr.dotted'])


def test_a_call_site_never_serves_one_roles_model_to_another(dsn, world):
    """A PL/pgSQL expression's call site outlives a role switch (SECURITY DEFINER): the model it
    caches is the one of the role that loaded it, and is reloaded for another role."""
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("DROP SCHEMA IF EXISTS gr_s CASCADE")
        admin.execute("CREATE SCHEMA gr_s AUTHORIZATION gr_alice")
        admin.execute("GRANT USAGE ON SCHEMA gr_s TO PUBLIC")
    with session(dsn, "gr_alice") as alice:
        alice.execute("""CREATE FUNCTION gr_s.score(x float8[]) RETURNS float8 LANGUAGE plpgsql
                          AS $$BEGIN RETURN corgipile_decision_function('churn', x); END$$""")
        alice.execute("""CREATE FUNCTION gr_s.report() RETURNS float8 LANGUAGE plpgsql SECURITY DEFINER
                         SET search_path = pg_catalog, public
                         AS $$BEGIN RETURN gr_s.score(ARRAY[0.5, -1.0]); END$$""")
        alices = scalar(alice, "SELECT gr_s.report()")
    try:
        with session(dsn, "gr_eve") as eve:
            eve.execute("SET search_path = pg_catalog, public")
            eve.execute("BEGIN")
            # The definer's call loads alice's churn; eve's own call of the same site must not
            # reuse it: she has no model named churn.
            with pytest.raises(E.UndefinedObject):
                eve.execute("SELECT gr_s.report(), gr_s.score(ARRAY[0.5, -1.0]::float8[])")
            eve.execute("ROLLBACK")
            # Eve's own churn, trained on flipped labels, never reaches alice's function either.
            own = train(eve, PTS, "logistic", defaults=TRAIN, name="churn")
            try:
                eve.execute("BEGIN")
                mine, report = eve.execute("SELECT gr_s.score(ARRAY[0.5, -1.0]::float8[]), gr_s.report()").fetchone()
                eve.execute("ROLLBACK")
                assert report == alices
                assert mine == scalar(eve, f"SELECT corgipile_decision_function({own}, {X})")
            finally:
                eve.execute("SELECT corgipile_drop_model('churn')")
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute("DROP SCHEMA gr_s CASCADE")


def test_a_role_named_like_public_is_that_role(dsn, world):
    with psycopg.connect(dsn, autocommit=True) as admin:
        drop_roles(admin, ["Public"])
        admin.execute('CREATE ROLE "Public"')
    try:
        as_alice(dsn, "SELECT corgipile_grant('churn', 'Public', 'use')")
        with session(dsn, "gr_eve") as eve:
            assert_cannot_reach(eve, world)
        with session(dsn, "gr_alice") as alice:
            assert alice.execute("SELECT grantee::text FROM corgipile.model_grants WHERE model_name = 'churn'").fetchall() == [('"Public"',)]
            alice.execute("SELECT corgipile_revoke('churn', 'Public', 'use')")
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            drop_roles(admin, ["Public"])


def test_no_role_can_block_another_roles_grants(dsn, world):
    with psycopg.connect(dsn, autocommit=True) as admin:
        drop_roles(admin, ["gr_temp2"])
        admin.execute("CREATE ROLE gr_temp2")
    with session(dsn, "gr_bob") as bob:
        own = train(bob, PTS, "logistic", defaults=TRAIN)
        bob.execute("SELECT corgipile_grant(%s::bigint, 'gr_temp2', 'use')", (own,))
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute("DROP ROLE gr_temp2")  # a dead grant of bob's waits to be purged
        bob.execute("BEGIN")
        bob.execute("SELECT corgipile_grant(%s::bigint, 'gr_carol', 'use')", (own,))
        try:
            with session(dsn, "gr_alice") as alice:
                alice.execute("SET lock_timeout = '2s'")
                alice.execute("SELECT corgipile_grant('churn', 'gr_eve', 'use')")
                alice.execute("SELECT corgipile_revoke('churn', 'gr_eve', 'use')")
        finally:
            bob.execute("ROLLBACK")
        bob.execute("SELECT corgipile_drop_model(%s::bigint)", (own,))


def test_deployed_is_unknown_to_a_grantee_of_one_id(dsn, world):
    as_alice(dsn, "SELECT corgipile_grant(%s::bigint, 'gr_bob', 'use')", (world["v1"],))
    try:
        with session(dsn, "gr_bob") as bob:
            assert bob.execute("SELECT id, deployed FROM corgipile.model_summary").fetchall() == [(world["v1"], None)]
    finally:
        as_alice(dsn, "SELECT corgipile_revoke(%s::bigint, 'gr_bob', 'use')", (world["v1"],))


def test_owner_may_qualify_her_own_names(dsn, world):
    with session(dsn, "gr_alice") as alice:
        assert predict(alice, "gr_alice.churn") == predict(alice, "churn")
        v3 = train(alice, PTS, "logistic", defaults=TRAIN, name="gr_alice.churn")
        try:
            assert alice.execute("SELECT name, version FROM corgipile.models WHERE id = %s", (v3,)).fetchone() == ("churn", 3)
        finally:
            alice.execute("SELECT corgipile_drop_model(%s::bigint)", (v3,))


def test_a_manager_sees_the_grants_it_made(dsn, world):
    as_alice(dsn, "SELECT corgipile_grant('churn', 'gr_bob', 'manage')")
    try:
        with session(dsn, "gr_bob") as bob:
            bob.execute("SELECT corgipile_grant('gr_alice.churn', 'gr_eve', 'use')")
            rows = bob.execute("""SELECT grantee::text, privilege, granted_by::text FROM corgipile.model_grants
                                  WHERE owner = 'gr_alice' ORDER BY 1""").fetchall()
            assert rows == [("gr_bob", "manage", "gr_alice"), ("gr_eve", "use", "gr_bob")]
            bob.execute("SELECT corgipile_revoke('gr_alice.churn', 'gr_eve', 'use')")
    finally:
        as_alice(dsn, "SELECT corgipile_revoke('churn', 'gr_bob', 'manage')")


# --- Revoking: what a revoked role keeps (nothing), and the grants it made (RESTRICT / CASCADE).

def grants_of(admin, owner="gr_alice"):
    """Every grant on owner's models, as the superuser sees them: (grantee, privilege, target,
    granted_by)."""
    return set(admin.execute("""SELECT grantee::text, privilege, coalesce(model_name, model_id::text), granted_by::text
                                FROM corgipile.model_grants WHERE owner = %s""", (owner,)).fetchall())


def cleanup_grants(dsn):
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("DELETE FROM corgipile.model_grants WHERE owner = 'gr_alice'")


def test_a_revoked_manager_keeps_nothing(dsn, world):
    """bob managed churn and granted it on; once his manage is revoked (with the grants he made),
    he sees and uses nothing of alice's: not the versions he saw, not those trained later."""
    as_alice(dsn, "SELECT corgipile_grant('churn', 'gr_bob', 'manage')")
    try:
        with session(dsn, "gr_bob") as bob:
            assert visible_ids(bob) == {world["v1"], world["v2"]}
            bob.execute("SELECT corgipile_grant('gr_alice.churn', 'gr_eve', 'use')")
        as_alice(dsn, "SELECT corgipile_revoke('churn', 'gr_bob', 'manage', cascade => true)")
        with session(dsn, "gr_alice") as alice:
            v3 = train(alice, PTS, "logistic", defaults=TRAIN, name="churn")
        try:
            for role in ("gr_bob", "gr_eve"):
                with session(dsn, role) as c:
                    assert_cannot_reach(c, world)
                    assert v3 not in visible_ids(c)
                    assert scalar(c, "SELECT count(*) FROM corgipile.models WHERE id = %s", (v3,)) == 0
                    assert scalar(c, "SELECT count(*) FROM corgipile.epochs WHERE model_id = %s", (v3,)) == 0
        finally:
            as_alice(dsn, "SELECT corgipile_drop_model(%s::bigint)", (v3,))
    finally:
        cleanup_grants(dsn)


def test_visibility_comes_from_privileges_held_not_grants_made(dsn, world):
    """carol managed churn through gr_app and granted it to eve; taken out of gr_app (a plain
    REVOKE of the membership, which corgipile does not see), her grant to eve stays, and she
    can still see that grant row, but it gives her nothing: she no longer sees, predicts,
    evaluates, deploys or sees the deployed flag."""
    as_alice(dsn, "SELECT corgipile_grant('churn', 'gr_app', 'manage')")
    try:
        with session(dsn, "gr_carol") as carol:
            carol.execute("SELECT corgipile_grant('gr_alice.churn', 'gr_eve', 'use')")
            assert visible_ids(carol) == {world["v1"], world["v2"]}
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute("REVOKE gr_app FROM gr_carol")
        try:
            with session(dsn, "gr_carol") as carol:
                # The grant she made is still listed for her ...
                assert scalar(carol, "SELECT count(*) FROM corgipile.model_grants WHERE granted_by = 'gr_carol'") == 1
                # ... and reaches nothing of alice's.
                assert visible_ids(carol) == set()
                assert scalar(carol, "SELECT count(*) FROM corgipile.models") == 0
                assert scalar(carol, "SELECT count(*) FROM corgipile.epochs") == 0
                with pytest.raises(E.UndefinedObject):
                    predict(carol, world["v1"])
                with pytest.raises(E.UndefinedObject):
                    predict(carol, "gr_alice.churn")
                with pytest.raises(E.UndefinedObject):
                    carol.execute("SELECT corgipile_evaluate(%s::bigint, 'public.pts')", (world["v2"],))
                with pytest.raises(E.UndefinedObject):
                    carol.execute("SELECT corgipile_deploy('gr_alice.churn')")
            with session(dsn, "gr_eve") as eve:
                assert visible_ids(eve) == {world["v1"], world["v2"]}
        finally:
            with psycopg.connect(dsn, autocommit=True) as admin:
                admin.execute("GRANT gr_app TO gr_carol")
    finally:
        cleanup_grants(dsn)


def test_revoke_refuses_while_grants_depend_on_it(dsn, world):
    as_alice(dsn, "SELECT corgipile_grant('churn', 'gr_bob', 'manage')")
    try:
        with session(dsn, "gr_bob") as bob:
            bob.execute("SELECT corgipile_grant('gr_alice.churn', 'gr_eve', 'use')")
        with psycopg.connect(dsn, autocommit=True) as admin:
            before = grants_of(admin)
        for stmt in ("SELECT corgipile_revoke('churn', 'gr_bob', 'manage')",
                     "SELECT corgipile_revoke('churn', 'gr_bob', 'manage', false)",
                     "SELECT corgipile_revoke('churn', 'gr_bob', 'manage', cascade => false)"):
            with session(dsn, "gr_alice") as alice:
                with pytest.raises(E.DependentPrivilegeDescriptorsStillExist) as err:
                    alice.execute(stmt)
            diag = err.value.diag
            assert diag.message_primary == "dependent privileges exist"
            assert diag.message_detail == "Granted through the \"manage\" being revoked: gr_bob granted use on 'churn' to gr_eve."
            assert diag.message_hint == "Revoke them too with corgipile_revoke('churn', 'gr_bob', 'manage', cascade => true)."
        # Another manager is told how many grants depend, not who made them to whom.
        as_alice(dsn, "SELECT corgipile_grant('churn', 'gr_dave', 'manage')")
        with session(dsn, "gr_dave") as dave:
            with pytest.raises(E.DependentPrivilegeDescriptorsStillExist) as err:
                dave.execute("SELECT corgipile_revoke('gr_alice.churn', 'gr_bob', 'manage')")
            assert err.value.diag.message_detail == "1 grant made through the \"manage\" being revoked."
            assert err.value.diag.message_hint == \
                "Revoke them too with corgipile_revoke('gr_alice.churn', 'gr_bob', 'manage', cascade => true)."
        as_alice(dsn, "SELECT corgipile_revoke('churn', 'gr_dave', 'manage')")
        with psycopg.connect(dsn, autocommit=True) as admin:
            assert grants_of(admin) == before  # nothing changed
        with session(dsn, "gr_bob") as bob:
            assert scalar(bob, "SELECT corgipile_deploy('gr_alice.churn')") == world["v2"]
        with session(dsn, "gr_eve") as eve:
            assert visible_ids(eve) == {world["v1"], world["v2"]}
        # Revoking a "use" never has dependents.
        as_alice(dsn, "SELECT corgipile_grant('churn', 'gr_carol', 'use')")
        as_alice(dsn, "SELECT corgipile_revoke('churn', 'gr_carol', 'use')")
    finally:
        cleanup_grants(dsn)


def test_revoke_cascade_is_recursive(dsn, world):
    """alice → carol (manage) → eve (manage) → gr_app (manage, which carol is a member of: a
    cycle back to her) and eve → bob (use on v1); dave's grant comes from alice's manage. Revoking
    carol's manage: while the cycle alone keeps carol and eve "holding" manage, it supports
    nothing, so RESTRICT refuses, and CASCADE takes carol's and eve's grants, and only those."""
    as_alice(dsn, "SELECT corgipile_grant('churn', 'gr_carol', 'manage')")
    as_alice(dsn, "SELECT corgipile_grant('churn', 'gr_dave', 'manage')")
    try:
        with session(dsn, "gr_carol") as carol:
            carol.execute("SELECT corgipile_grant('gr_alice.churn', 'gr_eve', 'manage')")
        with session(dsn, "gr_eve") as eve:
            eve.execute("SELECT corgipile_grant('gr_alice.churn', 'gr_app', 'manage')")
            eve.execute("SELECT corgipile_grant(%s::bigint, 'gr_bob', 'use')", (world["v1"],))
        with session(dsn, "gr_dave") as dave:
            dave.execute("SELECT corgipile_grant('gr_alice.churn', 'gr_app', 'use')")
        with pytest.raises(E.DependentPrivilegeDescriptorsStillExist) as err:
            as_alice(dsn, "SELECT corgipile_revoke('churn', 'gr_carol', 'manage')")
        detail = err.value.diag.message_detail
        for made in ("gr_carol granted manage on 'churn' to gr_eve", "gr_eve granted manage on 'churn' to gr_app",
                     f"gr_eve granted use on model {world['v1']} to gr_bob"):
            assert made in detail
        with session(dsn, "gr_alice") as alice:
            notices = []
            alice.add_notice_handler(lambda d: notices.append(d.message_primary))
            alice.execute("SELECT corgipile_revoke('churn', 'gr_carol', 'manage', cascade => true)")
            assert "revoked 3 dependent grants too" in notices, notices
        with psycopg.connect(dsn, autocommit=True) as admin:
            assert grants_of(admin) == {("gr_dave", "manage", "churn", "gr_alice"),
                                        ("gr_app", "use", "churn", "gr_dave")}
        for role in ("gr_bob", "gr_eve"):
            with session(dsn, role) as c:
                assert_cannot_reach(c, world)
        with session(dsn, "gr_carol") as carol:  # uses churn through gr_app (dave's grant), manages nothing
            assert visible_ids(carol) == {world["v1"], world["v2"]}
            with pytest.raises(E.InsufficientPrivilege):
                carol.execute("SELECT corgipile_deploy('gr_alice.churn')")
    finally:
        cleanup_grants(dsn)


def test_manage_held_another_way_keeps_the_grants_made(dsn, world):
    # carol holds manage directly and through gr_app: losing the direct grant keeps hers.
    as_alice(dsn, "SELECT corgipile_grant('churn', 'gr_carol', 'manage')")
    as_alice(dsn, "SELECT corgipile_grant('churn', 'gr_app', 'manage')")
    # bob holds manage on the name and on the id v1, and granted v1 by id to eve.
    as_alice(dsn, "SELECT corgipile_grant('churn', 'gr_bob', 'manage')")
    as_alice(dsn, "SELECT corgipile_grant(%s::bigint, 'gr_bob', 'manage')", (world["v1"],))
    try:
        with session(dsn, "gr_carol") as carol:
            carol.execute("SELECT corgipile_grant('gr_alice.churn', 'gr_eve', 'use')")
        with session(dsn, "gr_bob") as bob:
            bob.execute("SELECT corgipile_grant(%s::bigint, 'gr_eve', 'manage')", (world["v1"],))
        as_alice(dsn, "SELECT corgipile_revoke('churn', 'gr_carol', 'manage')")
        # The name grant covers the id: no dependents on the id grant either.
        as_alice(dsn, "SELECT corgipile_revoke(%s::bigint, 'gr_bob', 'manage')", (world["v1"],))
        with psycopg.connect(dsn, autocommit=True) as admin:
            assert grants_of(admin) == {("gr_app", "manage", "churn", "gr_alice"),
                                        ("gr_bob", "manage", "churn", "gr_alice"),
                                        ("gr_eve", "use", "churn", "gr_carol"),
                                        ("gr_eve", "manage", str(world["v1"]), "gr_bob")}
        # Now bob's name grant is all that supports his grant on v1: RESTRICT refuses ...
        with pytest.raises(E.DependentPrivilegeDescriptorsStillExist) as err:
            as_alice(dsn, "SELECT corgipile_revoke('churn', 'gr_bob', 'manage')")
        assert f"gr_bob granted manage on model {world['v1']} to gr_eve" in err.value.diag.message_detail
        # ... PUBLIC manage would keep it (every role holds it) ...
        as_alice(dsn, "SELECT corgipile_grant('churn', 'public', 'manage')")
        as_alice(dsn, "SELECT corgipile_revoke('churn', 'gr_bob', 'manage')")
        # ... and revoking PUBLIC's, by id overload, with cascade, takes bob's (he holds nothing else).
        with session(dsn, "gr_alice") as alice:
            alice.execute("SELECT corgipile_revoke('churn', 'PUBLIC', 'manage', cascade => true)")
        with psycopg.connect(dsn, autocommit=True) as admin:
            assert grants_of(admin) == {("gr_app", "manage", "churn", "gr_alice"),
                                        ("gr_eve", "use", "churn", "gr_carol")}
        # The owner never loses the right to grant; nor does a superuser.
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute("SELECT corgipile_grant('gr_alice.churn', 'gr_dave', 'use')")
        as_alice(dsn, "SELECT corgipile_revoke('churn', 'gr_app', 'manage', cascade => true)")
        with psycopg.connect(dsn, autocommit=True) as admin:
            assert grants_of(admin) == {("gr_dave", "use", "churn", "postgres")}
    finally:
        cleanup_grants(dsn)


def test_revoke_by_id_with_cascade(dsn, world):
    as_alice(dsn, "SELECT corgipile_grant(%s::bigint, 'gr_bob', 'manage')", (world["v2"],))
    try:
        with session(dsn, "gr_bob") as bob:
            bob.execute("SELECT corgipile_grant(%s::bigint, 'gr_eve', 'use')", (world["v2"],))
        with pytest.raises(E.DependentPrivilegeDescriptorsStillExist) as err:
            as_alice(dsn, "SELECT corgipile_revoke(%s::bigint, 'gr_bob', 'manage')", (world["v2"],))
        assert f"corgipile_revoke({world['v2']}, 'gr_bob', 'manage', cascade => true)" in err.value.diag.message_hint
        as_alice(dsn, "SELECT corgipile_revoke(%s::bigint, 'gr_bob', 'manage', cascade => true)", (world["v2"],))
        with psycopg.connect(dsn, autocommit=True) as admin:
            assert grants_of(admin) == set()
        with session(dsn, "gr_eve") as eve:
            assert visible_ids(eve) == set()
    finally:
        cleanup_grants(dsn)


# --- Bad input to the management functions: a clean ERROR, never an internal one.

@pytest.mark.parametrize("stmt", [
    "SELECT corgipile_deploy(NULL, 1)",
    "SELECT corgipile_deploy(NULL)",
    "SELECT corgipile_grant(NULL::text, 'gr_bob', 'use')",
    "SELECT corgipile_grant(NULL::bigint, 'gr_bob', 'use')",
    "SELECT corgipile_grant('churn', NULL, 'use')",
    "SELECT corgipile_grant('churn', 'gr_bob', NULL)",
    "SELECT corgipile_revoke(NULL::text, 'gr_bob', 'use')",
    "SELECT corgipile_revoke(NULL::bigint, 'gr_bob', 'use')",
    "SELECT corgipile_revoke('churn', NULL, 'use')",
    "SELECT corgipile_revoke('churn', 'gr_bob', NULL)",
    "SELECT corgipile_revoke('churn', 'gr_bob', 'use', NULL)",
])
def test_null_arguments_are_a_clean_error(dsn, world, stmt):
    with session(dsn, "gr_alice") as alice:
        with pytest.raises(E.NullValueNotAllowed) as err:
            alice.execute(stmt)
    assert "must not be NULL" in err.value.diag.message_primary
    assert err.value.diag.message_hint.startswith("Call it as corgipile_")


def test_null_model_to_drop_is_null(dsn, world):
    """corgipile_drop_model is STRICT: NULL in, NULL out, nothing dropped."""
    with session(dsn, "gr_alice") as alice:
        assert scalar(alice, "SELECT corgipile_drop_model(NULL::bigint)") is None
        assert scalar(alice, "SELECT corgipile_drop_model(NULL::text)") is None
        assert visible_ids(alice) >= set(world.values())


@pytest.mark.parametrize("name", ["o'brien", "o'brien'); DROP TABLE pts; --", "back\\slash'"])
def test_deploy_hint_quotes_the_name(dsn, world, name):
    with session(dsn, "gr_alice") as alice:
        own = train(alice, PTS, "logistic", defaults=TRAIN, name=name)
        try:
            with pytest.raises(E.InvalidParameterValue) as err:
                alice.execute("SELECT corgipile_deploy(%s, %s)", (name, world["v1"]))
            hint = err.value.diag.message_hint
            literal = "'" + name.replace("'", "''").replace("\\", "\\\\") + "'"
            if "\\" in name:
                literal = "E" + literal
            assert hint == f"SELECT version, id FROM corgipile.model_summary WHERE name = {literal} lists its versions."
            # The hint's query runs as written and finds the name's versions.
            query = hint.removesuffix(" lists its versions.")
            assert alice.execute(query).fetchall() == [(1, own)]
        finally:
            alice.execute("SELECT corgipile_drop_model(%s::bigint)", (own,))


def in_thread(c, stmt, params=None):
    """Runs stmt on connection c in a thread; returns (thread, outcome dict)."""
    import threading

    outcome = {}

    def run():
        try:
            c.execute(stmt, params)
            outcome["ok"] = True
        except psycopg.Error as e:
            outcome["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, outcome


def test_grants_and_revokes_on_one_owners_models_are_serialised(dsn, world):
    """A revoke never misses a grant made at the same time through the manage it revokes."""
    import time

    as_alice(dsn, "SELECT corgipile_grant('churn', 'gr_bob', 'manage')")
    try:
        # bob's grant first (uncommitted): alice's revoke waits for it, then sees it.
        with session(dsn, "gr_bob") as bob, session(dsn, "gr_alice") as alice:
            bob.execute("BEGIN")
            bob.execute("SELECT corgipile_grant('gr_alice.churn', 'gr_eve', 'use')")
            t, outcome = in_thread(alice, "SELECT corgipile_revoke('churn', 'gr_bob', 'manage')")
            time.sleep(0.5)
            assert t.is_alive(), "the revoke did not wait for the grant in progress"
            bob.execute("COMMIT")
            t.join(30)
            assert isinstance(outcome.get("error"), E.DependentPrivilegeDescriptorsStillExist), outcome
        # Only grants on one name (and its versions) wait for each other: bob's open transaction
        # on churn does not hold up alice's grants on her other models.
        with session(dsn, "gr_bob") as bob, session(dsn, "gr_alice") as alice:
            other = train(alice, PTS, "logistic", defaults=TRAIN, name="other")
            bob.execute("BEGIN")
            bob.execute("SELECT corgipile_grant('gr_alice.churn', 'gr_eve', 'use')")
            try:
                alice.execute("SET lock_timeout = '2s'")
                for model in (other, world["unnamed"]):
                    alice.execute("SELECT corgipile_grant(%s::bigint, 'gr_carol', 'use')", (model,))
                    alice.execute("SELECT corgipile_revoke(%s::bigint, 'gr_carol', 'use')", (model,))
                with pytest.raises(E.LockNotAvailable):
                    alice.execute("SELECT corgipile_grant(%s::bigint, 'gr_carol', 'use')", (world["v1"],))
            finally:
                bob.execute("ROLLBACK")
                alice.execute("SELECT corgipile_drop_model('other')")
        # alice's revoke first (uncommitted): bob's grant waits, then finds no manage left.
        with session(dsn, "gr_bob") as bob, session(dsn, "gr_alice") as alice:
            alice.execute("BEGIN")
            alice.execute("SELECT corgipile_revoke('churn', 'gr_bob', 'manage', cascade => true)")
            t, outcome = in_thread(bob, "SELECT corgipile_grant('gr_alice.churn', 'gr_carol', 'use')")
            time.sleep(0.5)
            assert t.is_alive(), "the grant did not wait for the revoke in progress"
            alice.execute("COMMIT")
            t.join(30)
            assert isinstance(outcome.get("error"), E.UndefinedObject), outcome
        with psycopg.connect(dsn, autocommit=True) as admin:
            assert grants_of(admin) == set()
    finally:
        cleanup_grants(dsn)
