"""Concurrency on one model name: deploys and drops of a name from several sessions are
serialised (every call succeeds in some order, the last one wins; never 23505 on the
one-pinned-per-name index nor a deadlock), and the training name lock is per exact name (two
names whose old 16-bit keys clashed train side by side), still fails fast for one name, and
cannot be taken by another role."""

import random
import threading
import time

import psycopg
import psycopg.errors as E
import pytest

from helpers import connect, scalar, suite_db, train
from tables import STEPS, points

ROLES = ["nl_alice", "nl_bob", "nl_eve"]
MASK = (1 << 64) - 1


@pytest.fixture(scope="module")
def env(db):
    with connect(db) as c:
        for r in ROLES:
            c.execute(f"DROP ROLE IF EXISTS {r}")
            c.execute(f"CREATE ROLE {r} LOGIN")
        points(c, "pts", 2000, features=STEPS)
        c.execute("GRANT SELECT ON pts TO PUBLIC")
    yield db
    with connect("dbname=postgres") as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {suite_db(db)} WITH (FORCE)")
        for r in ROLES:
            admin.execute(f"DROP ROLE IF EXISTS {r}")


def as_role(env, role, **kw):
    return connect(env, user=role, **kw)


def versions(c, name, n):
    return [train(c, "pts", "logistic", {"name": name, "epochs": 1, "seed": k}) for k in range(n)]


def run_threads(bodies, timeout=120):
    """Runs each body(barrier) in its own thread, all released together; returns the exceptions."""
    errors = []
    barrier = threading.Barrier(len(bodies))

    def wrap(body):
        try:
            body(barrier)
        except Exception as e:  # noqa: BLE001 - reported to the test
            errors.append(e)

    threads = [threading.Thread(target=wrap, args=(b,), daemon=True) for b in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a session is still running"
    return errors


def test_concurrent_deploys_of_one_name_all_succeed_last_one_wins(env):
    with as_role(env, "nl_alice") as alice:
        ids = versions(alice, "dep", 4)
    calls = []  # (clock_timestamp at the end of the call, asked, returned)

    def deployer(seed):
        def body(barrier):
            rng = random.Random(seed)
            with as_role(env, "nl_alice") as c:
                barrier.wait()
                for _ in range(25):
                    asked = rng.choice(ids + [None])
                    if asked is None:
                        got, at = c.execute("SELECT corgipile_deploy('dep'), clock_timestamp()").fetchone()
                    else:
                        got, at = c.execute("SELECT corgipile_deploy('dep', %s), clock_timestamp()", (asked,)).fetchone()
                    calls.append((at, asked, got))
        return body

    errors = run_threads([deployer(s) for s in range(6)])
    # Before serialisation, about 40% of such calls failed with 23505 or 40P01.
    assert not errors, [f"{type(e).__name__}: {e}" for e in errors[:5]]
    assert len(calls) == 150
    # Each call deployed what it asked for (unpinning deploys the newest version).
    assert all(got == (asked if asked is not None else ids[-1]) for _, asked, got in calls)
    # The calls ran one after another: the last one (by the time it finished, in the server)
    # is what stays deployed.
    _, last_asked, last_got = max(calls)
    with as_role(env, "nl_alice") as alice:
        pinned = [r[0] for r in alice.execute("SELECT id FROM corgipile.models WHERE name = 'dep' AND pinned")]
        assert pinned == ([] if last_asked is None else [last_asked])
        assert scalar(alice, "SELECT id FROM corgipile.model_summary WHERE name = 'dep' AND deployed") == last_got
        alice.execute("SELECT corgipile_drop_model('dep')")


def test_deploys_and_drops_of_one_name_never_clash(env):
    for round_ in range(3):
        with as_role(env, "nl_alice") as alice:
            ids = versions(alice, "dd", 3)
        dropped = []

        def deployer(seed):
            def body(barrier):
                rng = random.Random(seed)
                with as_role(env, "nl_alice") as c:
                    barrier.wait()
                    for _ in range(30):
                        try:
                            c.execute("SELECT corgipile_deploy('dd', %s)", (rng.choice(ids),))
                        except E.UndefinedObject as e:
                            # After the drop of ids[0] or of the name, in this call's turn:
                            # "does not exist", as for any model or name that is gone.
                            if 'no corgipile model named "dd"' in str(e):
                                return  # nothing left to deploy
                            assert f"corgipile model {ids[0]} does not exist" in str(e)

            return body

        def dropper(barrier):
            with as_role(env, "nl_alice") as c:
                barrier.wait()
                time.sleep(0.05 * round_)
                # One version by id, then the whole name.
                c.execute("SELECT corgipile_drop_model(%s::bigint)", (ids[0],))
                dropped.append(scalar(c, "SELECT corgipile_drop_model('dd')"))

        errors = run_threads([deployer(s) for s in range(4)] + [dropper])
        assert not errors, [f"{type(e).__name__}: {e}" for e in errors[:5]]
        assert dropped == [2]
        with connect(env) as admin:
            assert scalar(admin, "SELECT count(*) FROM corgipile.models WHERE name = 'dd'") == 0


def old_key(name):
    """The training lock's key before 0.4.0: FNV-1a of the name folded to 16 bits."""
    h = 0xCBF29CE484222325
    for b in name.encode():
        h = ((h ^ b) * 0x100000001B3) & MASK
    return (h ^ (h >> 16) ^ (h >> 32) ^ (h >> 48)) & 0xFFFF


def new_key(name, purpose=1):
    """src/locks.rs: (pg_locks.objid, objsubid) of a name's lock; purpose 1 = training."""
    h = 0xCBF29CE484222325
    for b in bytes([purpose, 0xFF]) + name.encode():
        h = ((h ^ b) * 0x100000001B3) & MASK
    h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & MASK
    h ^= h >> 31
    return h & 0xFFFFFFFF, 0x8000 | ((h >> 32) & 0x7FFF)


def test_names_whose_old_keys_clashed_train_side_by_side(env):
    assert old_key("model_123") == old_key("model_188")  # the premise
    with as_role(env, "nl_alice") as a, as_role(env, "nl_alice") as b:
        a.execute("BEGIN")
        first = train(a, "pts", "svm", {"name": "model_123", "epochs": 1})
        try:
            second = train(b, "pts", "svm", {"name": "model_188", "epochs": 1})
            assert scalar(b, "SELECT version FROM corgipile.models WHERE id = %s", (second,)) == 1
        finally:
            a.execute("COMMIT")
        assert scalar(a, "SELECT name FROM corgipile.models WHERE id = %s", (first,)) == "model_123"
        a.execute("SELECT corgipile_drop_model('model_123')")
        a.execute("SELECT corgipile_drop_model('model_188')")


def test_the_same_name_still_fails_fast(env):
    with as_role(env, "nl_alice") as a, as_role(env, "nl_alice") as b, connect(env) as admin:
        a.execute("BEGIN")
        train(a, "pts", "svm", {"name": "held", "epochs": 1})
        try:
            # The locks as pg_locks shows them: the owner's OID, the name's keys, and field4 >=
            # 32768 (objsubid, an int2: negative), never the 1 or 2 of pg_advisory_*: the
            # training's, and the deploy lock it took to store its version (and record what that
            # did to the name's deployment) until the transaction ends.
            owner = scalar(admin, "SELECT oid FROM pg_roles WHERE rolname = 'nl_alice'")
            apid = scalar(a, "SELECT pg_backend_pid()")
            held = admin.execute("""SELECT classid::oid::int8, objid::int8, objsubid::int4 & 65535 FROM pg_locks
                                    WHERE locktype = 'advisory' AND pid = %s AND granted""", (apid,)).fetchall()
            assert sorted(held) == sorted([(owner, *new_key("held")), (owner, *new_key("held", purpose=2))])
            started = time.monotonic()
            with pytest.raises(E.LockNotAvailable, match='model name "held" is being trained by another session'):
                train(b, "pts", "svm", {"name": "held", "epochs": 1})
            assert time.monotonic() - started < 1.0
        finally:
            a.execute("COMMIT")
        assert scalar(b, "SELECT version FROM corgipile.models WHERE id = %s",
                      (train(b, "pts", "svm", {"name": "held", "epochs": 1}),)) == 2
        a.execute("SELECT corgipile_drop_model('held')")


def test_a_training_stores_its_version_after_a_deploy_of_the_name(env):
    """A training's version (and the history row of what it did to the name's deployment) waits
    for a deploy of the name in progress, as deploys wait for each other."""
    with as_role(env, "nl_alice") as a, as_role(env, "nl_alice") as b:
        ids = versions(a, "busy", 2)
        a.execute("BEGIN")
        a.execute("SELECT corgipile_deploy('busy', %s)", (ids[0],))
        try:
            b.execute("SET lock_timeout = '300ms'")
            with pytest.raises(E.LockNotAvailable):
                train(b, "pts", "svm", {"name": "busy", "epochs": 1})
        finally:
            a.execute("COMMIT")
        v3 = train(b, "pts", "svm", {"name": "busy", "epochs": 1})
        assert scalar(b, "SELECT id FROM corgipile.models WHERE name = 'busy' AND pinned") == ids[0]
        assert scalar(b, "SELECT version FROM corgipile.models WHERE id = %s", (v3,)) == 3
        a.execute("SELECT corgipile_drop_model('busy')")


def test_another_role_cannot_block_a_training_or_deploy(env):
    with connect(env) as admin:
        owner = scalar(admin, "SELECT oid FROM pg_roles WHERE rolname = 'nl_alice'")
    with as_role(env, "nl_alice") as alice:
        ids = versions(alice, "mine", 2)
    lo, hi = new_key("mine")
    lo_deploy, _ = new_key("mine", purpose=2)
    as_int4 = lambda v: v - (1 << 32) if v >= 1 << 31 else v  # noqa: E731
    with as_role(env, "nl_eve") as eve, as_role(env, "nl_alice") as alice:
        eve.execute("BEGIN")
        # Every advisory lock SQL can build on the keys of alice's locks ...
        for key in (lo, lo_deploy):
            eve.execute("SELECT pg_advisory_xact_lock(%s, %s)", (owner, as_int4(key)))
            eve.execute("SELECT pg_advisory_xact_lock(%s)", ((owner << 32) | key,))
            eve.execute("SELECT pg_advisory_xact_lock(%s)", (as_int4(key),))
        # ... and the functions themselves, on her name, in savepoints kept open.
        for stmt, params in (("SELECT corgipile_train('pts', 'svm', %s)", ('{"name": "nl_alice.mine", "epochs": 1}',)),
                             ("SELECT corgipile_deploy('nl_alice.mine', %s)", (ids[0],)),
                             ("SELECT corgipile_drop_model('nl_alice.mine')", ()),
                             ("SELECT corgipile_drop_model(%s::bigint)", (ids[0],))):
            eve.execute("SAVEPOINT s")
            with pytest.raises((E.InsufficientPrivilege, E.UndefinedObject)):
                eve.execute(stmt, params)
            eve.execute("ROLLBACK TO SAVEPOINT s")
        try:
            alice.execute("SET lock_timeout = '2s'")
            v3 = train(alice, "pts", "svm", {"name": "mine", "epochs": 1})
            assert scalar(alice, "SELECT corgipile_deploy('mine', %s)", (ids[0],)) == ids[0]
            assert scalar(alice, "SELECT corgipile_drop_model(%s::bigint)", (v3,)) == 1
            assert scalar(alice, "SELECT corgipile_drop_model('mine')") == 2
        finally:
            eve.execute("ROLLBACK")


def test_a_manager_waits_for_the_owners_deploy(env):
    """Deploys of one name by different roles (the owner and a manager) are serialised too."""
    with as_role(env, "nl_alice") as alice:
        ids = versions(alice, "shared", 2)
        alice.execute("SELECT corgipile_grant('shared', 'nl_bob', 'manage')")
    with as_role(env, "nl_alice") as alice, as_role(env, "nl_bob") as bob:
        alice.execute("BEGIN")
        alice.execute("SELECT corgipile_deploy('shared', %s)", (ids[0],))
        done = {}

        def bobs_deploy():
            try:
                done["id"] = scalar(bob, "SELECT corgipile_deploy('nl_alice.shared', %s)", (ids[1],))
            except psycopg.Error as e:
                done["error"] = e

        t = threading.Thread(target=bobs_deploy, daemon=True)
        t.start()
        time.sleep(0.5)
        assert t.is_alive(), "bob's deploy did not wait for alice's transaction"
        alice.execute("COMMIT")
        t.join(30)
        assert done == {"id": ids[1]}
        assert scalar(alice, "SELECT id FROM corgipile.models WHERE name = 'shared' AND pinned") == ids[1]
        alice.execute("SELECT corgipile_drop_model('shared')")
