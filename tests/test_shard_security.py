"""Security of sharded training: what a coordinator sends to a shard server, as whom, and what it
accepts back.

Harness: the test cluster (PGHOST/PGPORT, trust authentication) is the coordinator. One shard
server of this suite's own is started with scripts/cluster.sh on port PGPORT+130 (so that the
PostgreSQL 15 and 18 runs never collide, nor collide with test_shards.py or the hardening suites)
and destroyed at the end. Its pg_hba.conf trusts one role (shsec_trusted) and asks every other role
for a SCRAM password (the shard superuser postgres included); it logs every connection and
statement, with the application name, so that the tests can see whether the coordinator connected
and what it ran. Three databases on it: shsec_shard (an honest shard), shsec_evil (an ordinary
role, mallory, owns a schema of look-alike functions and operators) and shsec_hostile (the shard's
superuser replaced corgipile_shard_round by a wrapper that forges its replies).

Checked here:
1. Connection rules, table-driven against postgres_fdw itself (CONNECTION_VARIANTS): for each user
   mapping (password missing, '', ' ', a password with a trailing blank, right and wrong SCRAM
   passwords, a shard that trusts the role, the coordinator itself, a `passfile` server option
   holding the shard superuser's password with an empty / blank / missing mapping password or with
   a right password, password_required 'false'), an ordinary role with USAGE on the server reads
   the foreign table through postgres_fdw AND trains on a sharded table with it as a partition:
   corgipile refuses whenever postgres_fdw refuses (2F003 when postgres_fdw refuses before
   connecting, in which case no connection reaches the shard), never connects with a password the
   mapping did not give (the shard's log says as whom it connected), and is stricter than
   postgres_fdw in one place: any `passfile` option is refused for non-superusers. Superuser
   mappings keep working (trust, SCRAM, a passfile).
2. A foreign server whose `options` put a schema of the shard's ordinary role mallory first on the
   remote search_path (also before pg_catalog): mallory's corgipile_shard_round and her `=`
   operator on name never run as the mapping's (superuser) role; the training succeeds.
3. Hostile shard replies (the shard's superuser wraps corgipile_shard_round): a statistics reply
   claiming 10^11 features, statistics arrays of 10^7 entries (beyond the role's
   corgipile.max_model_memory), weights one short and one long, weights of 1e300, "NaN" and null
   weights, a reply of 300 MB, a reply that is not JSON, negative and huge tuples/rows, a softmax's
   class list forged (none, one short of its counts, a class twice, a 5000-byte text, 70,000
   classes, a text among numbers; classes for a label of values), the statistics of a list of
   feature columns forged (missing, a column short, of another kind, 200,000 categories, counts
   beyond the rows, a category twice, a quantile sketch of 100,000 centroids or of forged
   weights, an array of 10^6 elements; in a training round's reply), a round's learners forged
   (none, one more than sent, one set aside with a model; a search's second learner's weights,
   bias or validation score; a fold's score forged or sent for the model of every row), a gated
   training's evaluations of the rows the shards held out forged (metrics one longer, none,
   2^64-1 rows, not JSON: the version stored before the gate rolls back), per-group models'
   groups forged (100,001 groups, a 1001-byte key, rows negative, beyond 2^64, beyond the
   shard's, none, a key twice; groups in a training round's reply or for a training without
   "group_by"; a learner's answer for another group), a table mark forged
   (in a training round's reply, a zero oid, 2^40 pages, none in a "since" training), a Newton
   pass's part of the information matrix forged ("inference": values short or long, NaN, 1e400,
   a negative diagonal or loss, counts beyond its rows, other rows than the reply's, none, 10^7
   values; a part in a training round's reply), a reply of
   another shard protocol or corgipile version (0A000 naming both). Each is a
   clean ERROR (08P01, 54000 for sizes beyond corgipile.max_model_memory; the diverged 22003 for
   1e300) naming the server, as an ordinary role; no model is stored; the coordinator never
   restarts (an idle sentinel connection, the checkpointer's pid, the server log). Forged
   evaluation replies too (metrics arrays one longer, no metrics, 2^64-1 rows scored, not JSON,
   300 MB) for corgipile_evaluate over the sharded table.
4. (tests/test_fuzz.py, test_shard_round_requests_never_crash: the request fuzzer.)
5. A shard's DBA revokes EXECUTE on corgipile_shard_round from PUBLIC: training through a mapping
   whose remote role lacks it is 42501 relayed with the server's name; after GRANT it trains.
6. Local partitions of a sharded table are read with the parent's privileges and RLS semantics,
   as SELECT through the parent is: a role with SELECT on the parent but not on the local
   partition trains, and a policy on the local partition itself does not filter the training
   (rows trained = what SELECT count(*) through the parent sees).

Why apart from test_security.py: everything here needs a shard server of this suite's own
(own_cluster) with password authentication, statement logging and three databases, set up once
per module by the shard_server / coordinator fixtures; its subject is what crosses the wire
between a coordinator and a shard. test_security.py checks one server's privileges, RLS and
catalog on the test cluster alone, and runs in `make pytest-quick`."""

import os
import re
import time

import psycopg
import psycopg.errors as E
import pytest
from psycopg import sql

from helpers import (CRASH_RE, DBNAME, PGHOST, PGPORT, PG_BIN, as_pg, cluster_sh, models_count,
                     require_extension, rows_trained, scalar, train, wait_ready)

COORDINATOR_LOG = os.environ.get("CORGIPILE_CLUSTER_DIR", "/tmp/corgipile-cluster") + "/log"
SHARD_PORT = PGPORT + 130
SHARD_DIR = f"/tmp/corgipile-shsec-{SHARD_PORT}"
SHARD_LOG = f"{SHARD_DIR}/log"
PASSFILE = f"{SHARD_DIR}/pgpass"

SHARD_DB = "shsec_shard"
EVIL_DB = "shsec_evil"
HOSTILE_DB = "shsec_hostile"
PG_PASSWORD = "pg-secret"  # the shard superuser's (and only in the passfile besides the tests)
REMOTE_PASSWORD = "remote-secret"
MALLORY_PASSWORD = "mallory-secret"

# Roles on the coordinator (cluster-wide there: unique prefix, dropped at the end).
USER = "shsec_user"  # an ordinary role
SMALL = "shsec_small"  # an ordinary role whose corgipile.max_model_memory is 64MB
COORDINATOR_ROLES = (USER, SMALL)
SMALL_MODEL_MEMORY = "64MB"
STATS_ENTRIES = 10_000_000  # 80 MB per statistics array once parsed: beyond 64MB
HUGE_REPLY_BYTES = 300_000_000

pytestmark = pytest.mark.own_cluster  # a shard server of its own (see above)
QUIET = {"verbose": False}


# ----------------------------------------------------------------------------------------------
# the shard server


def shard(dbname=SHARD_DB, user="postgres", password=PG_PASSWORD):
    """A connection to the shard server (the superuser's by default)."""
    return psycopg.connect(host=SHARD_DIR, port=SHARD_PORT, dbname=dbname, user=user, password=password,
                           autocommit=True, connect_timeout=10)


def on_shard(dbname, *statements):
    with shard(dbname) as c:
        for s in statements:
            c.execute(s)


class LogTail:
    """The lines a server log gained since the last call (None: the log is not readable)."""

    def __init__(self, path):
        self.path = path
        self.offset = self._size()

    def _size(self):
        try:
            return os.path.getsize(self.path)
        except OSError:
            return 0

    def new_lines(self):
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return None
        self.offset += len(data)
        return data.decode(errors="replace").splitlines()


def corgipile_log(lines):
    """What the coordinator's connections did on the shard: 'connection received' lines, the users
    of 'connection authorized' lines of application corgipile, and the statements they ran."""
    received = [ln for ln in lines if "connection received:" in ln]
    authorized = [m.group(1) for ln in lines
                  if (m := re.search(r"connection authorized: user=(\S+) .*application_name=corgipile", ln))]
    statements = [ln for ln in lines if "app=corgipile " in ln and re.search(r"(statement|execute [^:]*):", ln)]
    return received, authorized, statements


TABLE_ROWS = 2000


def colored(select):
    """The rows of `select` (with an id) and a text column `color` (red, green, blue)."""
    return f"SELECT r.*, (ARRAY['red', 'green', 'blue'])[1 + r.id % 3] AS color FROM ({select}) r"


# Of shsec_hostile's rows (ids 1-1000 on one shard, the others on the other; label i % 2): one
# class on each shard.
ONE_CLASS_EACH = "(id <= 1000) = (label = 0)"


def rows_sql(n, start=1, width=4):
    """SELECT of n rows (id, label 0/1, features float8[width]) a linear model separates."""
    return f"""SELECT i AS id, i % 2 AS label,
                      ARRAY(SELECT (CASE WHEN i % 2 = 1 THEN 0.7 ELSE -0.7 END) + random()
                            FROM generate_series(1, {width}) k WHERE i > 0)::float8[] AS features
               FROM generate_series({start}, {start + n - 1}) i"""


@pytest.fixture(scope="module")
def shard_server(dsn):
    """The shard server: SCRAM for everyone but shsec_trusted; roles shsec_remote, shsec_blank
    (password ' '), shsec_trail (password 'trail '), shsec_trusted, shsec_mallory; databases with
    corgipile; a passfile (owned by postgres, 0600) holding the superuser's password."""
    with psycopg.connect(dsn, autocommit=True) as c:
        require_extension(c, "postgres_fdw")
    cluster_sh("destroy", SHARD_DIR, SHARD_PORT)  # a fresh cluster even after an interrupted run
    try:
        cluster_sh("start", SHARD_DIR, SHARD_PORT)
        as_pg(["tee", "-a", f"{SHARD_DIR}/data/postgresql.conf"], check=True, input="""
# ---- tests/test_shard_security.py ----
password_encryption = 'scram-sha-256'
log_connections = on
log_statement = 'all'
log_parameter_max_length = 0
log_line_prefix = '%m [%p] app=%a user=%u db=%d '
""")
        with psycopg.connect(host=SHARD_DIR, port=SHARD_PORT, dbname="postgres", user="postgres",
                             autocommit=True) as c:
            c.execute("SELECT pg_reload_conf()")
            c.execute("SET password_encryption = 'scram-sha-256'")
            c.execute(f"ALTER ROLE postgres PASSWORD '{PG_PASSWORD}'")
            c.execute(f"CREATE ROLE shsec_remote LOGIN PASSWORD '{REMOTE_PASSWORD}'")
            c.execute("CREATE ROLE shsec_blank LOGIN PASSWORD ' '")
            c.execute("CREATE ROLE shsec_trail LOGIN PASSWORD 'trail '")
            c.execute("CREATE ROLE shsec_trusted LOGIN")
            c.execute(f"CREATE ROLE shsec_mallory LOGIN PASSWORD '{MALLORY_PASSWORD}'")
            for db in (SHARD_DB, EVIL_DB, HOSTILE_DB):
                c.execute(f"CREATE DATABASE {db}")
        as_pg(["tee", f"{SHARD_DIR}/data/pg_hba.conf"], check=True, input=(
            "# tests/test_shard_security.py: one trusted role, SCRAM for every other one\n"
            "local all shsec_trusted trust\n"
            "local all all scram-sha-256\n"))
        as_pg(["tee", PASSFILE], check=True, input=f"*:*:*:postgres:{PG_PASSWORD}\n")
        as_pg(["chmod", "600", PASSFILE], check=True)
        as_pg([f"{PG_BIN}/pg_ctl", "reload",
               "-D", f"{SHARD_DIR}/data"], check=True)
        time.sleep(0.5)
        with pytest.raises(psycopg.OperationalError):  # SCRAM is in force
            shard("postgres", password=None).close()
        grant_all = "GRANT SELECT ON ALL TABLES IN SCHEMA public TO PUBLIC"
        on_shard(SHARD_DB, "CREATE EXTENSION corgipile", "SELECT setseed(0.5)",
                 f"CREATE TABLE conn_part AS {rows_sql(TABLE_ROWS)}",
                 f"CREATE TABLE mix_part AS {rows_sql(1500, start=5001)}", grant_all)
        yield
    finally:
        cluster_sh("destroy", SHARD_DIR, SHARD_PORT)


@pytest.fixture(scope="module")
def coordinator(dsn, shard_server):
    """postgres_fdw and the ordinary roles on the coordinator; everything dropped at the end."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE EXTENSION IF NOT EXISTS postgres_fdw")
        drop_coordinator_objects(c)
        for role in COORDINATOR_ROLES:
            c.execute(f"CREATE ROLE {role} LOGIN")
        c.execute(f"ALTER ROLE {SMALL} SET corgipile.max_model_memory = '{SMALL_MODEL_MEMORY}'")
    try:
        yield
    finally:
        with psycopg.connect(dsn, autocommit=True) as c:
            drop_coordinator_objects(c)


def drop_coordinator_objects(c):
    for (stmt,) in c.execute("""SELECT format('DROP TABLE IF EXISTS %s CASCADE', oid::regclass) FROM pg_class
                                WHERE relname LIKE 'shsec\\_%' AND relkind IN ('p', 'r', 'f')
                                  AND NOT relispartition""").fetchall():
        c.execute(stmt)
    for (srv,) in c.execute("SELECT srvname FROM pg_foreign_server WHERE srvname LIKE 'shsec\\_%'").fetchall():
        c.execute(sql.SQL("DROP SERVER {} CASCADE").format(sql.Identifier(srv)))
    for role in COORDINATOR_ROLES:
        if scalar(c, "SELECT count(*) FROM pg_roles WHERE rolname = %s", (role,)):
            c.execute("DELETE FROM corgipile.models WHERE trained_by = %s", (role,))
            c.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            c.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def quote_literal(value):
    return "'" + value.replace("'", "''") + "'"


def options_sql(options):
    return ", ".join(f"{k} {quote_literal(v)}" for k, v in options.items())


def foreign_server(c, name, dbname=SHARD_DB, **extra):
    """A postgres_fdw server on the shard server (`self=True`: on this coordinator)."""
    c.execute(sql.SQL("DROP SERVER IF EXISTS {} CASCADE").format(sql.Identifier(name)))
    if extra.pop("self", False):
        opts = {"host": PGHOST, "port": str(PGPORT), "dbname": DBNAME}
    else:
        opts = {"host": SHARD_DIR, "port": str(SHARD_PORT), "dbname": dbname}
    opts.update(extra)
    c.execute(f"CREATE SERVER {name} FOREIGN DATA WRAPPER postgres_fdw OPTIONS ({options_sql(opts)})")


def user_mapping(c, role, server, options):
    target = "CURRENT_USER" if role is None else role
    c.execute(f"DROP USER MAPPING IF EXISTS FOR {target} SERVER {server}")
    opts = f" OPTIONS ({options_sql(options)})" if options else ""
    c.execute(f"CREATE USER MAPPING FOR {target} SERVER {server}{opts}")


def sharded_table(c, name, partitions, cols="id int, label int, features float8[]", by="RANGE (id)"):
    """CREATE TABLE name PARTITION BY by; partitions: (suffix, bounds, server or None, remote table)."""
    c.execute(f"DROP TABLE IF EXISTS {name} CASCADE")
    c.execute(f"CREATE TABLE {name} ({cols}) PARTITION BY {by}")
    for suffix, bounds, server, remote in partitions:
        if server is None:
            c.execute(f"CREATE TABLE {name}_{suffix} PARTITION OF {name} {bounds}")
        else:
            c.execute(f"CREATE FOREIGN TABLE {name}_{suffix} PARTITION OF {name} {bounds} "
                      f"SERVER {server} OPTIONS (schema_name 'public', table_name '{remote}')")


def message(e):
    return e.diag.message_primary or str(e)


# ----------------------------------------------------------------------------------------------
# 1. connection rules, against postgres_fdw


# Every user mapping variant: what postgres_fdw does with it (a read of the foreign table) and
# what corgipile must do (a sharded training): "ok", or the SQLSTATE of the refusal.
# server: "scram" (the shard server), "passfile" (the same with passfile = the superuser's
# password), "self" (the coordinator itself, trust). connects: whether postgres_fdw gets as far
# as opening a connection (False: both refuse before connecting, and no connection of corgipile's
# may reach the shard). as: the shard role the connection must be authorized as when it works.
CONNECTION_VARIANTS = [
    dict(id="no_password", server="scram", mapping={"user": "shsec_remote"},
         fdw="2F003", corgipile="2F003", connects=False),
    dict(id="empty_password", server="scram", mapping={"user": "shsec_remote", "password": ""},
         fdw="2F003", corgipile="2F003", connects=False),
    dict(id="blank_password_the_shard_refuses", server="scram", mapping={"user": "shsec_remote", "password": " "},
         fdw="08001", corgipile="08001"),
    dict(id="blank_password_the_shard_accepts", server="scram", mapping={"user": "shsec_blank", "password": " "},
         fdw="ok", corgipile="ok", role="shsec_blank"),
    dict(id="password_with_a_trailing_blank", server="scram", mapping={"user": "shsec_trail", "password": "trail "},
         fdw="ok", corgipile="ok", role="shsec_trail"),
    dict(id="right_scram_password", server="scram", mapping={"user": "shsec_remote", "password": REMOTE_PASSWORD},
         fdw="ok", corgipile="ok", role="shsec_remote"),
    dict(id="wrong_scram_password", server="scram", mapping={"user": "shsec_remote", "password": "wrong"},
         fdw="08001", corgipile="08001"),
    dict(id="shard_trusts_the_role", server="scram", mapping={"user": "shsec_trusted", "password": "unused"},
         fdw="2F003", corgipile="2F003", says="did not ask for the user mapping's password"),
    dict(id="back_to_the_coordinator_itself", server="self", mapping={"user": "postgres", "password": "anything"},
         fdw="2F003", corgipile="2F003", says="did not ask for the user mapping's password"),
    dict(id="passfile_empty_password", server="passfile", mapping={"user": "postgres", "password": ""},
         fdw="2F003", corgipile="2F003", connects=False),
    dict(id="passfile_blank_password", server="passfile", mapping={"user": "postgres", "password": " "},
         fdw="08001", corgipile="2F003"),  # stricter: no passfile for non-superusers
    dict(id="passfile_no_password", server="passfile", mapping={"user": "postgres"},
         fdw="2F003", corgipile="2F003", connects=False),
    dict(id="passfile_right_password", server="passfile", mapping={"user": "shsec_remote", "password": REMOTE_PASSWORD},
         fdw="ok", corgipile="2F003"),  # stricter: no passfile for non-superusers
    dict(id="password_required_false_trusted", server="scram",
         mapping={"user": "shsec_trusted", "password_required": "false"},
         fdw="ok", corgipile="ok", role="shsec_trusted"),
    dict(id="password_required_false_no_password_scram", server="scram",
         mapping={"user": "shsec_remote", "password_required": "false"},
         fdw="08001", corgipile="08001"),
    # Superusers' mappings: postgres_fdw asks nothing of them, nor does corgipile.
    dict(id="superuser_trusted_no_password", server="scram", mapping={"user": "shsec_trusted"},
         fdw="ok", corgipile="ok", superuser=True, role="shsec_trusted"),
    dict(id="superuser_scram_password", server="scram", mapping={"user": "postgres", "password": PG_PASSWORD},
         fdw="ok", corgipile="ok", superuser=True, role="postgres"),
    dict(id="superuser_passfile", server="passfile", mapping={"user": "postgres"},
         fdw="ok", corgipile="ok", superuser=True, role="postgres"),
]


@pytest.fixture(scope="module")
def variant_tables(dsn, coordinator):
    """Per variant: foreign server shsec_v<k>, a mapping for shsec_user (or the superuser), a
    partitioned table shsec_v<k> whose only partition shsec_v<k>_f is the shard's conn_part (the
    coordinator's own shsec_self_part for "self")."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS shsec_self_part")
        c.execute(f"CREATE TABLE shsec_self_part AS {rows_sql(TABLE_ROWS)}")
        for k, v in enumerate(CONNECTION_VARIANTS):
            name = f"shsec_v{k}"
            extra = {"passfile": PASSFILE} if v["server"] == "passfile" else {}
            foreign_server(c, name, self=v["server"] == "self", **extra)
            role = None if v.get("superuser") else USER
            user_mapping(c, role, name, v["mapping"])
            remote = "shsec_self_part" if v["server"] == "self" else "conn_part"
            sharded_table(c, name, [("f", "FOR VALUES FROM (1) TO (100000)", name, remote)])
            if role:
                c.execute(f"GRANT USAGE ON FOREIGN SERVER {name} TO {role}")
                c.execute(f"GRANT SELECT ON {name}, {name}_f TO {role}")
    yield


def outcome(fn):
    """("ok", value) or (sqlstate, error)."""
    try:
        return "ok", fn()
    except psycopg.Error as e:
        return e.sqlstate, e


@pytest.mark.parametrize("k", range(len(CONNECTION_VARIANTS)), ids=[v["id"] for v in CONNECTION_VARIANTS])
def test_connection_rules_are_postgres_fdw_rules(dsn, variant_tables, k):
    v = CONNECTION_VARIANTS[k]
    name = f"shsec_v{k}"
    user = "postgres" if v.get("superuser") else USER
    table_line = (f"{v['id']}: mapping {v['mapping']} on {v['server']} as {user}: "
                  f"expected postgres_fdw {v['fdw']}, corgipile {v['corgipile']}")
    # postgres_fdw (a fresh session: its connection cache is per session).
    with psycopg.connect(dsn, user=user, autocommit=True) as u:
        fdw, fdw_value = outcome(lambda: scalar(u, f"SELECT count(*) FROM {name}_f"))
    assert fdw == v["fdw"], f"{table_line}: postgres_fdw gave {fdw}: {fdw_value}"
    if fdw == "ok":
        assert fdw_value == TABLE_ROWS
    # corgipile
    with psycopg.connect(dsn, autocommit=True) as admin:
        before = models_count(admin)
    shard_log = LogTail(SHARD_LOG)
    with psycopg.connect(dsn, user=user, autocommit=True) as u:
        got, value = outcome(lambda: train(u, name, "svm", {"epochs": 1, "seed": 1}))
    time.sleep(0.2)  # the shard's log lines of a connection that just closed
    lines = shard_log.new_lines()
    received, authorized, statements = corgipile_log(lines or [])
    detail = f"{table_line}: corgipile gave {got}: {value if got != 'ok' else 'a model'}; shard log: " \
             f"{len(received)} connections received, authorized as {authorized}, statements {statements[:3]}"
    assert got == v["corgipile"], detail
    with psycopg.connect(dsn, autocommit=True) as admin:
        if got == "ok":
            assert rows_trained(admin, value) == TABLE_ROWS, detail
        else:
            assert models_count(admin) == before, detail
            assert f'"{name}"' in message(value), detail
            if v.get("says"):
                assert v["says"] in message(value), detail
    if v["server"] == "self" or lines is None:
        return  # the coordinator's own log is shared; an unreadable log proves nothing
    if got == "ok":
        # Every connection of corgipile's was authorized as the mapping's role, never as another
        # (a password that did not come from the mapping).
        assert authorized and set(authorized) == {v["role"]}, detail
    else:
        assert statements == [], f"a refused connection ran statements on the shard: {detail}"
        assert all(a != "postgres" for a in authorized), f"connected as the shard's superuser: {detail}"
        if not v.get("connects", True):
            assert received == [], f"corgipile connected where postgres_fdw refuses before connecting: {detail}"


def test_the_variant_table_covers_what_postgres_fdw_refuses_and_accepts():
    """The table above has both outcomes of postgres_fdw and the cases where corgipile is stricter."""
    fdw = {v["fdw"] for v in CONNECTION_VARIANTS}
    assert {"ok", "2F003", "08001"} <= fdw
    stricter = [v["id"] for v in CONNECTION_VARIANTS if v["fdw"] == "ok" and v["corgipile"] != "ok"]
    assert stricter == ["passfile_right_password"], stricter
    laxer = [v["id"] for v in CONNECTION_VARIANTS if v["fdw"] != "ok" and v["corgipile"] == "ok"]
    assert laxer == [], laxer


# ----------------------------------------------------------------------------------------------
# 2. the remote search_path


EVIL_SETUP = [
    "CREATE EXTENSION corgipile",
    f"CREATE TABLE evil_part AS {rows_sql(TABLE_ROWS)}",
    "GRANT SELECT ON evil_part TO PUBLIC",
    "CREATE SCHEMA mallory AUTHORIZATION shsec_mallory",
    "SET ROLE shsec_mallory",
    "CREATE TABLE mallory.ran (who name, what text)",
    "GRANT INSERT, SELECT ON mallory.ran TO PUBLIC",
    """CREATE FUNCTION mallory.escalate(what text) RETURNS void LANGUAGE plpgsql AS $$
       BEGIN
         INSERT INTO mallory.ran VALUES (current_user, what);
         IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) current_user) THEN
           EXECUTE 'ALTER ROLE shsec_mallory SUPERUSER';
         END IF;
       END $$""",
    """CREATE FUNCTION mallory.corgipile_shard_round(r regclass, m text, p jsonb, q text) RETURNS text
       LANGUAGE plpgsql AS $$
       BEGIN
         PERFORM mallory.escalate('corgipile_shard_round');
         RETURN public.corgipile_shard_round(r, m, p, q);
       END $$""",
    """CREATE FUNCTION mallory.name_eq(a name, b name) RETURNS boolean LANGUAGE plpgsql AS $$
       BEGIN
         PERFORM mallory.escalate('=');
         RETURN a OPERATOR(pg_catalog.=) b;
       END $$""",
    "CREATE OPERATOR mallory.= (LEFTARG = name, RIGHTARG = name, FUNCTION = mallory.name_eq)",
    "RESET ROLE",
]


@pytest.fixture(scope="module")
def evil(dsn, coordinator):
    on_shard(EVIL_DB, *EVIL_SETUP)
    with psycopg.connect(dsn, autocommit=True) as c:
        for k, path in enumerate(("mallory,public", "mallory,pg_catalog,public")):
            name = f"shsec_evil{k}"
            foreign_server(c, name, dbname=EVIL_DB, options=f"-c search_path={path}")
            user_mapping(c, None, name, {"user": "postgres", "password": PG_PASSWORD})
            sharded_table(c, name, [("f", "FOR VALUES FROM (1) TO (100000)", name, "evil_part")])
    yield


@pytest.mark.parametrize("k, path", [(0, "mallory,public"), (1, "mallory,pg_catalog,public")])
def test_a_remote_search_path_never_runs_look_alike_functions(dsn, evil, k, path):
    """The victim: the coordinator's superuser, whose mapping connects as the shard's superuser."""
    name = f"shsec_evil{k}"
    with psycopg.connect(dsn, autocommit=True) as c:
        got, value = outcome(lambda: train(c, name, "svm", {"epochs": 2, "seed": 1}))
    print(f"\nsearch_path {path}: training {got}: {value if got == 'ok' else message(value)}")
    with shard(EVIL_DB) as s:
        ran = s.execute("SELECT who, what FROM mallory.ran").fetchall()
        escalated = scalar(s, "SELECT rolsuper FROM pg_roles WHERE rolname = 'shsec_mallory'")
        if ran or escalated:  # undo, for the next case
            s.execute("ALTER ROLE shsec_mallory NOSUPERUSER")
            s.execute("TRUNCATE mallory.ran")
    assert ran == [] and not escalated, \
        f"search_path {path}: mallory's objects ran on the shard {len(ran)} times, as (role, object) " \
        f"{sorted(set(ran))}; shsec_mallory became superuser: {escalated}"
    if got == "ok":
        with psycopg.connect(dsn, autocommit=True) as c:
            assert rows_trained(c, value) == TABLE_ROWS
    else:  # a clean refusal naming the server is acceptable too
        assert not got.startswith("XX") and f'"{name}"' in message(value), (got, message(value))


# ----------------------------------------------------------------------------------------------
# 5. EXECUTE on corgipile_shard_round


SHARD_ROUND = "public.corgipile_shard_round(regclass, text, jsonb, text)"


@pytest.fixture(scope="module")
def honest(dsn, coordinator):
    """shsec_honest: the shard's conn_part through a SCRAM mapping (shsec_user as shsec_remote)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        foreign_server(c, "shsec_honest")
        user_mapping(c, USER, "shsec_honest", {"user": "shsec_remote", "password": REMOTE_PASSWORD})
        c.execute(f"GRANT USAGE ON FOREIGN SERVER shsec_honest TO {USER}")
        sharded_table(c, "shsec_honest", [("f", "FOR VALUES FROM (1) TO (100000)", "shsec_honest", "conn_part")])
        c.execute(f"GRANT SELECT ON shsec_honest TO {USER}")
    yield


def test_revoked_execute_on_the_shard_is_42501_naming_the_server(dsn, honest):
    on_shard(SHARD_DB, f"REVOKE EXECUTE ON FUNCTION {SHARD_ROUND} FROM PUBLIC")
    try:
        with psycopg.connect(dsn, user=USER, autocommit=True) as u, psycopg.connect(dsn, autocommit=True) as admin:
            before = models_count(admin)
            with pytest.raises(psycopg.Error) as err:
                train(u, "shsec_honest", "svm", {"epochs": 1})
            assert err.value.sqlstate == "42501", (err.value.sqlstate, message(err.value))
            assert message(err.value).startswith('shard server "shsec_honest": '), message(err.value)
            assert "corgipile_shard_round" in message(err.value), message(err.value)
            assert models_count(admin) == before
            # The superuser's mapping (the shard's superuser) is not affected.
            user_mapping(admin, None, "shsec_honest", {"user": "postgres", "password": PG_PASSWORD})
            assert rows_trained(admin, train(admin, "shsec_honest", "svm", {"epochs": 1})) == TABLE_ROWS
            # The DBA grants it to the role the mapping connects as: it trains again.
            on_shard(SHARD_DB, f"GRANT EXECUTE ON FUNCTION {SHARD_ROUND} TO shsec_remote")
            assert rows_trained(admin, train(u, "shsec_honest", "svm", {"epochs": 1})) == TABLE_ROWS
            # Another remote role still lacks it.
            user_mapping(admin, USER, "shsec_honest", {"user": "shsec_mallory", "password": MALLORY_PASSWORD})
            with pytest.raises(psycopg.Error) as err:
                train(u, "shsec_honest", "svm", {"epochs": 1})
            assert err.value.sqlstate == "42501", (err.value.sqlstate, message(err.value))
            assert message(err.value).startswith('shard server "shsec_honest": '), message(err.value)
    finally:
        on_shard(SHARD_DB, f"GRANT EXECUTE ON FUNCTION {SHARD_ROUND} TO PUBLIC",
                 f"REVOKE EXECUTE ON FUNCTION {SHARD_ROUND} FROM shsec_remote")
        with psycopg.connect(dsn, autocommit=True) as admin:
            user_mapping(admin, USER, "shsec_honest", {"user": "shsec_remote", "password": REMOTE_PASSWORD})


def test_corgipile_shard_round_is_executable_by_public_on_a_fresh_install(shard_server):
    """The decision: EXECUTE stays granted to PUBLIC (it reads only what the caller may SELECT)."""
    with shard(SHARD_DB) as s:
        assert scalar(s, f"SELECT has_function_privilege('shsec_remote', '{SHARD_ROUND}', 'EXECUTE')")
        assert scalar(s, """SELECT bool_or(a.grantee = 0 AND a.privilege_type = 'EXECUTE')
                            FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
                            WHERE p.proname = 'corgipile_shard_round'""")


# ----------------------------------------------------------------------------------------------
# 6. local partitions: the parent's privileges and RLS semantics


MIX_LOCAL, MIX_REMOTE = 5000, 1500


@pytest.fixture
def mixed(dsn, honest):
    """shsec_mix: a local partition shsec_mix_local (ids 1..5000) and a foreign one (5001..6500, the
    shard's mix_part through shsec_user's SCRAM mapping); SELECT on the parent only."""
    with psycopg.connect(dsn, autocommit=True) as c:
        sharded_table(c, "shsec_mix", [("local", "FOR VALUES FROM (1) TO (5001)", None, None),
                                       ("remote", "FOR VALUES FROM (5001) TO (6501)", "shsec_honest", "mix_part")])
        c.execute("SELECT setseed(0.25)")
        c.execute(f"INSERT INTO shsec_mix_local {rows_sql(MIX_LOCAL)}")
        c.execute("ANALYZE shsec_mix_local")
        c.execute(f"GRANT SELECT ON shsec_mix TO {USER}")
    yield "shsec_mix"
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS shsec_mix CASCADE")


def train_counted(dsn, rel):
    """(rows trained, rows SELECT count(*) sees) for shsec_user."""
    with psycopg.connect(dsn, user=USER, autocommit=True) as u, psycopg.connect(dsn, autocommit=True) as admin:
        seen = scalar(u, f"SELECT count(*) FROM {rel}")
        return rows_trained(admin, train(u, rel, "svm", {"epochs": 1, "seed": 1})), seen


def test_a_local_partition_is_read_with_the_parents_privileges(dsn, mixed):
    with psycopg.connect(dsn, user=USER, autocommit=True) as u:
        with pytest.raises(E.InsufficientPrivilege):
            u.execute("SELECT count(*) FROM shsec_mix_local")  # no SELECT on the partition itself
    trained, seen = train_counted(dsn, mixed)
    assert seen == MIX_LOCAL + MIX_REMOTE
    assert trained == seen, f"rows trained {trained}, SELECT count(*) through the parent {seen}"


@pytest.mark.parametrize("grant_partition", [True, False], ids=["with_select_on_the_partition", "without"])
def test_a_policy_on_the_local_partition_does_not_filter_the_training(dsn, mixed, grant_partition):
    """SELECT through the parent does not apply the partition's own policies; nor may the training."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("ALTER TABLE shsec_mix_local ENABLE ROW LEVEL SECURITY")
        c.execute("CREATE POLICY hide_some ON shsec_mix_local FOR SELECT USING (id % 4 <> 0)")
        if grant_partition:
            c.execute(f"GRANT SELECT ON shsec_mix_local TO {USER}")
    if grant_partition:
        with psycopg.connect(dsn, user=USER, autocommit=True) as u:
            assert scalar(u, "SELECT count(*) FROM shsec_mix_local") == MIX_LOCAL * 3 // 4  # the policy is in force
    trained, seen = train_counted(dsn, mixed)
    assert seen == MIX_LOCAL + MIX_REMOTE == 6500
    assert trained == seen, f"rows trained {trained}, SELECT count(*) through the parent {seen}"


# ----------------------------------------------------------------------------------------------
# 3. hostile shard replies


# The shard's superuser made the extension's corgipile_shard_round a wrapper of the real one
# (renamed corgipile_shard_round_real) that forges the reply of one phase as hostile_mode says.
HOSTILE_WRAPPER = f"""
CREATE FUNCTION public.corgipile_shard_round(rel regclass, model text, params jsonb, request text)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  mode text;
  on_phase text;
  reply text := public.corgipile_shard_round_real(rel, model, params, request);
  r jsonb;
  s jsonb;
  n bigint := {STATS_ENTRIES};
BEGIN
  SELECT m, phase INTO mode, on_phase FROM public.hostile_mode;
  IF mode = 'honest' OR on_phase <> request::jsonb ->> 'phase' THEN
    RETURN reply;
  END IF;
  r := reply::jsonb;
  -- An importance mode forges the sampling round's scores, not the count of rows before it.
  IF mode LIKE 'imp\\_%' AND jsonb_typeof(r -> 'importance') IS DISTINCT FROM 'object' THEN
    RETURN reply;
  END IF;
  -- A family's mode forges its per-group metrics, not another evaluation's.
  IF mode LIKE 'grp\\_%' AND jsonb_typeof(r -> 'group_evaluations') IS DISTINCT FROM 'array' THEN
    RETURN reply;
  END IF;
  CASE mode
    WHEN 'width_1e11' THEN RETURN jsonb_set(r, '{{width}}', '100000000000')::text;
    WHEN 'stats_huge' THEN
      s := r -> 'stats';
      RETURN '{{"rows":' || (r ->> 'rows') || ',"rows_skipped":0,"width":' || n
        || ',"stats":{{"rows":' || (s ->> 'rows')
        || ',"seen":[' || repeat((s ->> 'rows') || ',', (n - 1)::int) || (s ->> 'rows') || ']'
        || ',"mean":[' || repeat('0.5,', (n - 1)::int) || '0.5]'
        || ',"m2":[' || repeat('1,', (n - 1)::int) || '1]'
        || ',"max_abs":[' || repeat('1,', (n - 1)::int) || '1]'
        || ',"label_n":' || (s ->> 'label_n') || ',"label_mean":' || (s ->> 'label_mean')
        || ',"label_m2":' || (s ->> 'label_m2') || ',"classes":' || (s -> 'classes')::text
        || '}},"weights":[],"bias":[],"tuples":0,"loss":0.0,"accuracy":null,"r2":null,"evaluation":null}}';
    WHEN 'weights_short' THEN RETURN jsonb_set(r, '{{learners,0,weights}}', (r #> '{{learners,0,weights}}') - (-1))::text;
    WHEN 'weights_long' THEN RETURN jsonb_set(r, '{{learners,0,weights}}', (r #> '{{learners,0,weights}}') || '0.5'::jsonb)::text;
    WHEN 'weights_1e300' THEN
      RETURN jsonb_set(r, '{{learners,0,weights}}',
                       (SELECT jsonb_agg(1e300::numeric) FROM jsonb_array_elements(r #> '{{learners,0,weights}}')))::text;
    WHEN 'weights_nan' THEN RETURN jsonb_set(r, '{{learners,0,weights,0}}', '"NaN"')::text;
    WHEN 'weights_null' THEN RETURN jsonb_set(r, '{{learners,0,weights,0}}', 'null')::text;
    WHEN 'learners_none' THEN RETURN jsonb_set(r, '{{learners}}', '[]')::text;
    WHEN 'learners_extra' THEN RETURN jsonb_set(r, '{{learners}}', (r -> 'learners') || jsonb_build_array(r #> '{{learners,0}}'))::text;
    WHEN 'control_short' THEN RETURN jsonb_set(r, '{{learners,0,control}}', (r #> '{{learners,0,control}}') - (-1))::text;
    WHEN 'control_long' THEN RETURN jsonb_set(r, '{{learners,0,control}}', (r #> '{{learners,0,control}}') || '0.5'::jsonb)::text;
    WHEN 'control_nan' THEN RETURN jsonb_set(r, '{{learners,0,control,0}}', '"NaN"')::text;
    WHEN 'control_1e308' THEN  -- one shard's +1.7e308 for every parameter, the other's -1.7e308
      RETURN jsonb_set(r, '{{learners,0,control}}',
                       (SELECT jsonb_agg(CASE WHEN rel::text LIKE '%hostile_a' THEN 1.7e308 ELSE -1.7e308 END::numeric)
                        FROM jsonb_array_elements(r #> '{{learners,0,control}}')))::text;
    WHEN 'control_none' THEN RETURN jsonb_set(r, '{{learners,0,control}}', 'null')::text;
    WHEN 'control_unasked' THEN RETURN jsonb_set(r, '{{learners,0,control}}', r #> '{{learners,0,weights}}')::text;
    WHEN 'set_aside_model' THEN RETURN jsonb_set(r, '{{learners,0,set_aside}}', 'true')::text;
    WHEN 'second_nan' THEN RETURN jsonb_set(r, '{{learners,1,weights,0}}', '"NaN"')::text;
    WHEN 'second_short' THEN RETURN jsonb_set(r, '{{learners,1,bias}}', '[]')::text;
    WHEN 'second_long' THEN RETURN jsonb_set(r, '{{learners,1,weights}}', (r #> '{{learners,1,weights}}') || '0.5'::jsonb)::text;
    WHEN 'learners_swapped' THEN
      RETURN jsonb_set(jsonb_set(r, '{{learners,0}}', r #> '{{learners,1}}'), '{{learners,1}}', r #> '{{learners,0}}')::text;
    WHEN 'holdout_loss' THEN RETURN jsonb_set(r, '{{learners,0,holdout,loss}}', '-1')::text;
    WHEN 'holdout_unasked' THEN RETURN jsonb_set(r, '{{learners,3,holdout}}', r #> '{{learners,0,holdout}}')::text;
    WHEN 'second_val_loss' THEN RETURN jsonb_set(r, '{{learners,1,validation,loss}}', '-1')::text;
    WHEN 'huge' THEN RETURN left(reply, -1) || ',"padding":"' || repeat('x', {HUGE_REPLY_BYTES}) || '"}}';
    WHEN 'not_json' THEN RETURN 'corgipile shard says: <html>not json</html>';
    WHEN 'tuples_negative' THEN RETURN jsonb_set(r, '{{learners,0,tuples}}', '-5')::text;
    WHEN 'tuples_huge' THEN RETURN jsonb_set(r, '{{learners,0,tuples}}', '18446744073709551615')::text;
    WHEN 'rows_negative' THEN RETURN jsonb_set(r, '{{rows}}', '-1')::text;
    WHEN 'rows_huge' THEN RETURN jsonb_set(r, '{{rows}}', '9223372036854775808')::text;
    WHEN 'protocol_old' THEN RETURN jsonb_set(r, '{{protocol}}', '1')::text;
    WHEN 'version_other' THEN RETURN jsonb_set(r, '{{version}}', '"0.4.9"')::text;
    WHEN 'classes_drop' THEN RETURN jsonb_set(r, '{{classes}}', '[]')::text;
    WHEN 'classes_short' THEN RETURN jsonb_set(r, '{{classes}}', (r -> 'classes') - (-1))::text;
    WHEN 'classes_twice' THEN
      RETURN jsonb_set(r, '{{classes}}', (r -> 'classes') || jsonb_build_array(r -> 'classes' -> 0))::text;
    WHEN 'classes_long' THEN RETURN jsonb_set(r, '{{classes}}', jsonb_build_array(repeat('x', 5000), 'y'))::text;
    WHEN 'classes_many' THEN
      RETURN jsonb_set(r, '{{classes}}', (SELECT jsonb_agg(g) FROM generate_series(1, 70000) g))::text;
    WHEN 'classes_nan' THEN RETURN jsonb_set(r, '{{classes,0}}', '"NaN"')::text;
    WHEN 'classes_added' THEN RETURN jsonb_set(r, '{{classes}}', '[0, 1]')::text;
    WHEN 'cols_none' THEN RETURN (r - 'columns')::text;
    WHEN 'cols_count' THEN
      RETURN jsonb_set(r, '{{columns,columns}}', (r #> '{{columns,columns}}') - (-1))::text;
    WHEN 'cols_kind' THEN RETURN jsonb_set(r, '{{columns,columns,0}}', '{{"kind": "hashed"}}')::text;
    WHEN 'cats_many' THEN
      RETURN jsonb_set(r, '{{columns,columns,1,counts}}',
                       (SELECT jsonb_agg(jsonb_build_array('c' || g, 1) ORDER BY ('c' || g) COLLATE "C")
                        FROM generate_series(1, 200000) g))::text;
    WHEN 'cats_counts' THEN RETURN jsonb_set(r, '{{columns,columns,1,counts,0,1}}', '1000000000000000')::text;
    WHEN 'cats_twice' THEN
      RETURN jsonb_set(r, '{{columns,columns,1,counts}}',
                       jsonb_build_array(r #> '{{columns,columns,1,counts,0}}') || (r #> '{{columns,columns,1,counts}}'))::text;
    WHEN 'sketch_big' THEN
      RETURN jsonb_set(r, '{{columns,columns,0,sketch,centroids}}',
                       (SELECT jsonb_agg(jsonb_build_array(1, 1)) FROM generate_series(1, 100000)))::text;
    WHEN 'sketch_weights' THEN RETURN jsonb_set(r, '{{columns,columns,0,sketch,centroids,0,1}}', '1e6')::text;
    WHEN 'array_wide' THEN
      RETURN jsonb_set(r, '{{columns,columns,2,moments}}',
                       ('[' || repeat('{{"n": 1, "mean": 0, "m2": 0}},', 999999) || '{{"n": 1, "mean": 0, "m2": 0}}]')::jsonb)::text;
    WHEN 'cols_train' THEN RETURN jsonb_set(r, '{{columns}}', '{{"rows": 0, "columns": []}}')::text;
    WHEN 'val_none' THEN RETURN jsonb_set(r, '{{learners,0,validation}}', 'null')::text;
    WHEN 'val_correct' THEN
      RETURN jsonb_set(r, '{{learners,0,validation,correct}}',
                       to_jsonb((r #>> '{{learners,0,validation,rows}}')::bigint + 1))::text;
    WHEN 'val_loss' THEN RETURN jsonb_set(r, '{{learners,0,validation,loss}}', '-1')::text;
    WHEN 'val_matrix' THEN RETURN jsonb_set(r, '{{learners,0,validation,binary}}', 'null')::text;
    WHEN 'mark_train' THEN
      RETURN jsonb_set(r, '{{mark}}', '{{"system": 1, "database": 5, "relid": 16384, "filenode": 16384, "pages": 1}}')::text;
    WHEN 'mark_zero' THEN RETURN jsonb_set(r, '{{mark,relid}}', '0')::text;
    WHEN 'mark_huge' THEN RETURN jsonb_set(r, '{{mark,pages}}', '1099511627776')::text;
    WHEN 'mark_none' THEN RETURN (r - 'mark')::text;
    WHEN 'groups_many' THEN
      RETURN jsonb_set(r, '{{groups}}', (SELECT jsonb_agg(jsonb_build_array('g' || g, 1)) FROM generate_series(1, 100001) g))::text;
    WHEN 'group_key_long' THEN RETURN jsonb_set(r, '{{groups,0,0}}', to_jsonb(repeat('x', 1001)))::text;
    WHEN 'group_rows_negative' THEN RETURN jsonb_set(r, '{{groups,0,1}}', '-1')::text;
    WHEN 'group_rows_overflow' THEN RETURN jsonb_set(r, '{{groups,0,1}}', '18446744073709551616')::text;
    WHEN 'group_rows_over' THEN RETURN jsonb_set(r, '{{groups,0,1}}', to_jsonb((r ->> 'rows')::bigint + 1))::text;
    WHEN 'group_zero' THEN RETURN jsonb_set(r, '{{groups,0,1}}', '0')::text;
    WHEN 'group_twice' THEN  -- the first group's rows split over two entries of its key
      RETURN jsonb_set(r, '{{groups}}',
                       jsonb_build_array(jsonb_build_array(r #> '{{groups,0,0}}', 1),
                                         jsonb_build_array(r #> '{{groups,0,0}}', (r #>> '{{groups,0,1}}')::bigint - 1))
                       || ((r -> 'groups') - 0))::text;
    WHEN 'group_unknown' THEN RETURN jsonb_set(r, '{{learners,1,group}}', '7')::text;
    WHEN 'groups_unasked' THEN RETURN jsonb_set(r, '{{groups}}', '[["red", 1]]')::text;
    WHEN 'eval_grow' THEN RETURN regexp_replace(reply, '\\[(?=[^\\]])', '[0,', 'g');
    WHEN 'eval_none' THEN RETURN jsonb_set(r, '{{evaluation}}', 'null')::text;
    WHEN 'eval_counts' THEN RETURN jsonb_set(r, '{{evaluation,scored}}', '18446744073709551615')::text;
    WHEN 'imp_short' THEN RETURN jsonb_set(r, '{{importance,permuted}}', (r #> '{{importance,permuted}}') - (-1))::text;
    WHEN 'imp_many' THEN
      RETURN jsonb_set(r, '{{importance,permuted}}',
                       (SELECT jsonb_agg(r #> '{{importance,baseline}}') FROM generate_series(1, 200000)))::text;
    WHEN 'imp_correct' THEN
      RETURN jsonb_set(r, '{{importance,baseline,correct}}',
                       to_jsonb((r #>> '{{importance,baseline,rows}}')::bigint + 1))::text;
    WHEN 'imp_rows' THEN RETURN jsonb_set(r, '{{rows}}', to_jsonb((r ->> 'rows')::bigint + 1000000))::text;
    WHEN 'imp_none' THEN RETURN jsonb_set(r, '{{importance}}', 'null')::text;
    WHEN 'imp_nan' THEN RETURN jsonb_set(r, '{{importance,moments,0,mean}}', '"NaN"')::text;
    WHEN 'grp_short' THEN RETURN jsonb_set(r, '{{group_evaluations}}', (r -> 'group_evaluations') - (-1))::text;
    WHEN 'grp_none' THEN RETURN jsonb_set(r, '{{group_evaluations}}', 'null')::text;
    WHEN 'grp_rows' THEN
      RETURN jsonb_set(r, '{{group_evaluations,0,scored}}',
                       to_jsonb((r #>> '{{group_evaluations,0,scored}}')::bigint + 7))::text;
    WHEN 'inf_short' THEN RETURN jsonb_set(r, '{{information,h}}', (r #> '{{information,h}}') - (-1))::text;
    WHEN 'inf_long' THEN RETURN jsonb_set(r, '{{information,g}}', (r #> '{{information,g}}') || '0.5'::jsonb)::text;
    WHEN 'inf_nan' THEN RETURN jsonb_set(r, '{{information,h,0}}', '"NaN"')::text;
    WHEN 'inf_1e400' THEN RETURN regexp_replace(jsonb_set(r, '{{information,g,0}}', '7')::text, '"g": \\[7', '"g": [1e400');
    WHEN 'inf_diag' THEN RETURN jsonb_set(r, '{{information,h,0}}', '-1')::text;
    WHEN 'inf_loss' THEN RETURN jsonb_set(r, '{{information,loss}}', '-1')::text;
    WHEN 'inf_counts' THEN
      RETURN jsonb_set(r, '{{information,counts,0}}', to_jsonb((r #>> '{{information,rows}}')::bigint + 1))::text;
    WHEN 'inf_rows' THEN
      RETURN jsonb_set(r, '{{information,rows}}', to_jsonb((r #>> '{{information,rows}}')::bigint + 5))::text;
    WHEN 'inf_none' THEN RETURN jsonb_set(r, '{{information}}', 'null')::text;
    WHEN 'inf_huge' THEN
      RETURN jsonb_set(r, '{{information,h}}', ('[' || repeat('0.5,', (n - 1)::int) || '0.5]')::jsonb)::text;
    WHEN 'inf_train' THEN
      RETURN jsonb_set(r, '{{information}}', '{{"h": [], "g": [], "rows": 0, "loss": 0, "counts": []}}')::text;
    ELSE RAISE EXCEPTION 'unknown hostile mode %', mode;
  END CASE;
END $$
"""

# A search of two configurations (two learners in every round).
SEARCH = {"search": {"learning_rate": [0.01, 0.1]}, "validation": {"fraction": 0.2}, "name": "shsec_search"}

# A search of two networks of two shapes (hidden [2] and [4] over the 4 features and 2 classes):
# each learner's parameters of its own length.
NETSEARCH = {"search": {"hidden": [[2], [4]]}, "name": "shsec_netsearch"}

# A list of feature columns of the hostile tables.
COLUMNS = {"features": ["id", "color", "features"], "preprocess": {"id": {"encode": "ple"}}}
# Per-group models of the hostile tables' colors (three groups).
GROUPS = {"features": ["features"], "group_by": "color", "min_group_rows": 10, "name": "shsec_groups"}
# A gated training: its gate evaluates the rows every shard held out.
GATED = {"validation": {"fraction": 0.2}, "deploy": "if_better", "name": "shsec_gated"}

# (mode, phase forged, model, params, SQLSTATEs accepted). 08P01: a malformed or forged reply;
# 54000: a size beyond corgipile.max_model_memory; 22003: the model diverged (1e300 overflows).
HOSTILE_CASES = [
    ("weights_short", "Train", "svm", {}, ("08P01",)),
    ("weights_long", "Train", "svm", {}, ("08P01",)),
    ("weights_1e300", "Train", "logistic", {"sync": 2}, ("08P01", "22003")),
    ("weights_nan", "Train", "svm", {}, ("08P01",)),
    ("weights_null", "Train", "svm", {}, ("08P01",)),
    ("huge", "Statistics", "svm", {}, ("54000", "08P01")),
    ("not_json", "Statistics", "svm", {}, ("08P01",)),
    ("not_json", "Train", "svm", {}, ("08P01",)),
    ("tuples_negative", "Train", "svm", {}, ("08P01",)),
    ("tuples_huge", "Train", "svm", {}, ("08P01",)),
    ("rows_negative", "Train", "svm", {}, ("08P01",)),
    ("rows_huge", "Train", "svm", {}, ("08P01",)),
    ("stats_huge", "Statistics", "svm", {}, ("54000", "08P01")),
    # Versions: a reply of another shard protocol or corgipile version is 0A000 naming both.
    ("protocol_old", "Statistics", "svm", {}, ("0A000",)),
    ("version_other", "Train", "svm", {}, ("0A000",)),
    # A softmax's statistics come with the shard's classes (numbers here): none with rows
    # counted by class, one short of its counts, one twice, a text of 5000 bytes, 70,000 of
    # them, a text among numbers; classes for a label of values (svm).
    ("classes_drop", "Statistics", "softmax", {}, ("08P01",)),
    ("classes_short", "Statistics", "softmax", {}, ("08P01",)),
    ("classes_twice", "Statistics", "softmax", {}, ("08P01",)),
    ("classes_long", "Statistics", "softmax", {}, ("08P01",)),
    ("classes_many", "Statistics", "softmax", {}, ("08P01", "54000")),
    ("classes_nan", "Statistics", "softmax", {}, ("08P01",)),
    ("classes_added", "Statistics", "svm", {}, ("08P01",)),
    # A validation round's score of the shard's held-out rows: none, more rows correct than
    # scored, a negative loss, a binary kind's score without its confusion matrix.
    ("val_none", "Validate", "svm", {"validation": {"fraction": 0.2}}, ("08P01",)),
    ("val_correct", "Validate", "logistic", {"validation": {"fraction": 0.2}}, ("08P01",)),
    ("val_loss", "Validate", "svm", {"validation": {"fraction": 0.2}}, ("08P01",)),
    ("val_matrix", "Validate", "logistic", {"validation": {"fraction": 0.2}}, ("08P01",)),
    # Every learner of a round answers (shard protocol 5): none, one more than sent, a learner
    # set aside that still sends a model, a validation round's scores missing; a search's second
    # learner with a NaN weight, without its bias, with a negative validation loss.
    # A network's control (shard protocol 8: its round's mean gradient, one per parameter):
    # one short or long, not a number, missing, near f64's limit; a control a linear model's
    # round did not ask for.
    # One round per epoch: every round trains tuples on every shard (a round without any
    # answers no control).
    # (Controls are asked of shards whose class shares differ: one class on each, by "where".)
    ("control_short", "Train", "mlp", {"hidden": [4], "sync": 1, "where": ONE_CLASS_EACH}, ("08P01",)),
    ("control_long", "Train", "mlp", {"hidden": [4], "sync": 1, "where": ONE_CLASS_EACH}, ("08P01",)),
    ("control_nan", "Train", "mlp", {"hidden": [4], "sync": 1, "where": ONE_CLASS_EACH}, ("08P01",)),
    ("control_none", "Train", "mlp", {"hidden": [4], "sync": 1, "where": ONE_CLASS_EACH}, ("08P01",)),
    ("control_unasked", "Train", "svm", {}, ("08P01",)),
    ("learners_none", "Train", "svm", {}, ("08P01",)),
    ("learners_extra", "Train", "svm", {}, ("08P01",)),
    ("set_aside_model", "Train", "svm", {}, ("08P01",)),
    ("learners_none", "Validate", "svm", {"validation": {"fraction": 0.2}}, ("08P01",)),
    ("second_nan", "Train", "svm", SEARCH, ("08P01",)),
    ("second_short", "Train", "logistic", SEARCH, ("08P01",)),
    ("second_val_loss", "Validate", "svm", SEARCH, ("08P01",)),
    # A search of networks of two shapes (shard protocol 9): each learner's reply is checked
    # against its own length — the two learners' replies swapped, the second's one longer.
    ("learners_swapped", "Train", "mlp", NETSEARCH, ("08P01",)),
    ("second_long", "Train", "mlp", NETSEARCH, ("08P01",)),
    # "folds": 3 (learners: the three folds', then the model of every row): a fold's score of
    # its rows with a negative loss; a score from the model of every row, which has no fold.
    ("holdout_loss", "Train", "svm", {"folds": 3}, ("08P01",)),
    ("holdout_unasked", "Train", "logistic", {"folds": 3}, ("08P01",)),
    # A gated training's evaluations of the held-out rows every shard kept (the gate scores
    # after the model is stored: nothing stays stored): metrics arrays one longer, none, 2^64-1
    # rows scored, not JSON.
    ("eval_grow", "Evaluate", "logistic", GATED, ("08P01",)),
    ("eval_none", "Evaluate", "logistic", GATED, ("08P01",)),
    ("eval_counts", "Evaluate", "logistic", GATED, ("08P01",)),
    ("not_json", "Evaluate", "svm", GATED, ("08P01",)),
    # A list of feature columns (id encoded "ple", color one-hot, the features array): the
    # statistics of its columns missing, of one column fewer, of another kind; a color forged
    # into 200,000 categories (more than the rows), a count beyond the rows, a category twice;
    # a quantile sketch of 100,000 centroids, centroids weighing more than the values; an array
    # of 10^6 elements (beyond corgipile.max_model_memory to read); statistics in a training
    # round's reply.
    ("cols_none", "Statistics", "logistic", COLUMNS, ("08P01",)),
    ("cols_count", "Statistics", "logistic", COLUMNS, ("08P01",)),
    ("cols_kind", "Statistics", "logistic", COLUMNS, ("08P01",)),
    ("cats_many", "Statistics", "logistic", COLUMNS, ("08P01", "54000")),
    ("cats_counts", "Statistics", "logistic", COLUMNS, ("08P01",)),
    ("cats_twice", "Statistics", "logistic", COLUMNS, ("08P01",)),
    ("sketch_big", "Statistics", "logistic", COLUMNS, ("08P01",)),
    ("sketch_weights", "Statistics", "logistic", COLUMNS, ("08P01",)),
    ("array_wide", "Statistics", "logistic", COLUMNS, ("54000", "08P01")),
    ("cols_train", "Train", "logistic", COLUMNS, ("08P01",)),
    # A table mark (what the shard's table was when the training began, for "since"): in a
    # training round's reply, with a zero oid, of 2^40 pages; none in a "since" training.
    ("mark_train", "Train", "svm", {}, ("08P01",)),
    ("mark_zero", "Statistics", "svm", {}, ("08P01",)),
    ("mark_huge", "Statistics", "svm", {}, ("08P01",)),
    ("mark_none", "Statistics", "svm", {"since": "shsec_inc"}, ("08P01",)),
    # Per-group models (shard protocol 8): the statistics round's groups forged — 100,001 of
    # them, a key of 1001 bytes, rows negative, beyond 2^64, beyond the shard's rows, none, a
    # group twice; groups in a training round's reply, or for a training without "group_by";
    # a learner's answer for a group the round does not number.
    ("groups_many", "Statistics", "logistic", GROUPS, ("08P01", "54000")),
    ("group_key_long", "Statistics", "logistic", GROUPS, ("08P01",)),
    ("group_rows_negative", "Statistics", "logistic", GROUPS, ("08P01",)),
    ("group_rows_overflow", "Statistics", "logistic", GROUPS, ("08P01",)),
    ("group_rows_over", "Statistics", "logistic", GROUPS, ("08P01",)),
    ("group_zero", "Statistics", "logistic", GROUPS, ("08P01",)),
    ("group_twice", "Statistics", "logistic", GROUPS, ("08P01",)),
    ("groups_unasked", "Train", "logistic", GROUPS, ("08P01",)),
    ("groups_unasked", "Statistics", "svm", {}, ("08P01",)),
    ("group_unknown", "Train", "logistic", GROUPS, ("08P01",)),
    # "inference" (a linear model: one Newton pass): a shard's part of the information matrix
    # one value short in H, one long in the gradient, with a NaN, 1e400 (beyond a float), a
    # negative diagonal or loss, a feature counted in more rows than the part has, a part of
    # other rows than the reply's, none, of 10^7 values (beyond corgipile.max_model_memory to
    # read); a part in a training round's reply.
    ("inf_short", "Inference", "linear", {"inference": True}, ("08P01",)),
    ("inf_long", "Inference", "linear", {"inference": True}, ("08P01",)),
    ("inf_nan", "Inference", "linear", {"inference": True}, ("08P01",)),
    ("inf_1e400", "Inference", "linear", {"inference": True}, ("08P01",)),
    ("inf_diag", "Inference", "linear", {"inference": True}, ("08P01",)),
    ("inf_loss", "Inference", "linear", {"inference": True}, ("08P01",)),
    ("inf_counts", "Inference", "linear", {"inference": True}, ("08P01",)),
    ("inf_rows", "Inference", "linear", {"inference": True}, ("08P01",)),
    ("inf_none", "Inference", "linear", {"inference": True}, ("08P01",)),
    ("inf_huge", "Inference", "linear", {"inference": True}, ("54000", "08P01")),
    ("not_json", "Inference", "linear", {"inference": True}, ("08P01",)),
    ("inf_train", "Train", "linear", {"inference": True}, ("08P01",)),
    # Last: on a build without the check the coordinator crashes here (and, with
    # synchronous_commit off, loses its last commits in the restart).
    ("width_1e11", "Statistics", "svm", {}, ("54000", "08P01")),
]


class CoordinatorWatch:
    """Detects a restart of the coordinator: an idle sentinel connection, the checkpointer's pid
    (on PostgreSQL 15 pg_postmaster_start_time() does not change at a crash restart), its log."""

    def __init__(self, dsn):
        self.dsn = dsn
        self.sentinel = psycopg.connect(dsn, autocommit=True)
        self.checkpointer = self._checkpointer(self.sentinel)
        self.log = LogTail(COORDINATOR_LOG)

    @staticmethod
    def _checkpointer(c):
        return scalar(c, "SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'")

    def problems(self):
        found = []
        try:
            assert scalar(self.sentinel, "SELECT 1") == 1
        except Exception as e:  # noqa: BLE001 - any failure of the sentinel is the finding
            found.append(f"sentinel connection lost: {e!r}")
        try:
            wait_ready(90)
            with psycopg.connect(self.dsn, autocommit=True) as c:
                now = self._checkpointer(c)
            if now != self.checkpointer:
                found.append(f"checkpointer pid changed: {self.checkpointer} -> {now}")
        except Exception as e:  # noqa: BLE001
            found.append(f"cannot connect: {e!r}")
        crash = [ln for ln in (self.log.new_lines() or []) if CRASH_RE.search(ln)]
        if crash:
            found.append("server log: " + " | ".join(crash[:4]))
        return found

    def close(self):
        try:
            self.sentinel.close()
        except Exception:  # noqa: BLE001
            pass


@pytest.fixture(scope="module")
def hostile(dsn, coordinator):
    """shsec_hostile: two foreign partitions (hostile_a, hostile_b) on the forging shard database,
    read by shsec_small (max_model_memory 64MB) as shsec_remote with its password."""
    on_shard(HOSTILE_DB, "CREATE EXTENSION corgipile", "SELECT setseed(0.75)",
             f"CREATE TABLE hostile_a AS {colored(rows_sql(1000))}",
             f"CREATE TABLE hostile_b AS {colored(rows_sql(1000, start=1001))}",
             "CREATE TABLE hostile_mode (m text, phase text)", "INSERT INTO hostile_mode VALUES ('honest', '')",
             "GRANT SELECT ON hostile_a, hostile_b, hostile_mode TO PUBLIC",
             f"ALTER EXTENSION corgipile DROP FUNCTION {SHARD_ROUND}",
             f"ALTER FUNCTION {SHARD_ROUND} RENAME TO corgipile_shard_round_real",
             HOSTILE_WRAPPER,
             f"ALTER EXTENSION corgipile ADD FUNCTION {SHARD_ROUND}")
    with psycopg.connect(dsn, autocommit=True) as c:
        foreign_server(c, "shsec_hostile", dbname=HOSTILE_DB)
        user_mapping(c, SMALL, "shsec_hostile", {"user": "shsec_remote", "password": REMOTE_PASSWORD})
        c.execute(f"GRANT USAGE ON FOREIGN SERVER shsec_hostile TO {SMALL}")
        sharded_table(c, "shsec_hostile", cols="id int, label int, features float8[], color text",
                      partitions=[("a", "FOR VALUES FROM (1) TO (1001)", "shsec_hostile", "hostile_a"),
                                           ("b", "FOR VALUES FROM (1001) TO (2001)", "shsec_hostile", "hostile_b")])
        c.execute(f"GRANT SELECT ON shsec_hostile TO {SMALL}")
    with psycopg.connect(dsn, user=SMALL, autocommit=True) as u:
        # Honest, it trains; the role's limit is in force once the library is loaded.
        assert train(u, "shsec_hostile", "svm", {"epochs": 1, "seed": 1})
        # The model the "since" cases continue.
        assert train(u, "shsec_hostile", "svm", {"epochs": 1, "seed": 1, "name": "shsec_inc"})
        assert scalar(u, "SHOW corgipile.max_model_memory") == SMALL_MODEL_MEMORY
    yield


def test_the_hostile_shard_trains_when_honest(dsn, hostile):
    """The wrapper itself is transparent: the failures above come from the forged replies."""
    on_shard(HOSTILE_DB, "UPDATE hostile_mode SET m = 'honest', phase = ''")
    with psycopg.connect(dsn, user=SMALL, autocommit=True) as u, psycopg.connect(dsn, autocommit=True) as admin:
        assert rows_trained(admin, train(u, "shsec_hostile", "svm", {"epochs": 2, "seed": 1})) == 2000
        assert rows_trained(admin, train(u, "shsec_hostile", "logistic", {"epochs": 2, "seed": 1, **COLUMNS})) == 2000
        family = train(u, "shsec_hostile", "logistic", {"epochs": 2, "seed": 1, **GROUPS})
        assert scalar(admin, "SELECT count(*) FROM corgipile.group_models WHERE family_id = %s", (family,)) == 3
        linear = train(u, "shsec_hostile", "linear", {"epochs": 2, "seed": 1, "inference": True})
        assert scalar(admin, "SELECT metrics->'inference'->'rows' FROM corgipile.models WHERE id = %s", (linear,)) == 2000


def hostile_call(dsn, mode, phase, call):
    """Runs call(connection of shsec_small) with the shard forging `mode` in `phase`; returns
    (SQLSTATE or "ok" or "lost", message, seconds, models stored meanwhile, restart problems)."""
    on_shard(HOSTILE_DB, f"UPDATE hostile_mode SET m = '{mode}', phase = '{phase}'")
    watch = CoordinatorWatch(dsn)
    try:
        with psycopg.connect(dsn, autocommit=True) as admin:
            before = models_count(admin)
        started = time.monotonic()
        try:
            with psycopg.connect(dsn, user=SMALL, autocommit=True) as u:
                u.execute("SET statement_timeout = '60s'")
                got, value = outcome(lambda: call(u))
                if u.broken:
                    got = "lost"
        except psycopg.OperationalError as e:  # the session itself is gone
            got, value = "lost", e
        took = time.monotonic() - started
        problems = watch.problems()
        with psycopg.connect(dsn, autocommit=True) as admin:
            stored = models_count(admin) - before
    finally:
        watch.close()
        on_shard(HOSTILE_DB, "UPDATE hostile_mode SET m = 'honest', phase = ''")
    text = message(value) if got != "ok" else f"{value!r} returned"
    print(f"\n{mode} ({phase}): {got} after {took:.1f} s: {text[:300]}")
    return got, text, stored, problems


@pytest.mark.parametrize("mode, phase, model, params, states", HOSTILE_CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in HOSTILE_CASES])
def test_a_hostile_reply_is_a_clean_error(dsn, hostile, mode, phase, model, params, states):
    got, text, stored, problems = hostile_call(
        dsn, mode, phase, lambda u: train(u, "shsec_hostile", model, {"epochs": 2, "seed": 1, **params}))
    assert not problems, f"{mode}: THE COORDINATOR RESTARTED: {problems}; the call gave {got}: {text[:300]}"
    assert got != "lost", f"{mode}: connection lost: {text[:300]}"
    assert got in states, f"{mode} ({phase}): expected one of {states}, got {got}: {text[:300]}"
    assert 'shard server "shsec_hostile"' in text, text[:300]
    assert stored == 0, "a model was stored"


def test_controls_whose_corrections_overflow_are_a_divergence(dsn, hostile):
    """Finite controls (±1.7e308 for every parameter on the two shards, which train 500 and 250
    rows, one class each) whose tuple-weighted corrections are not finite: the coordinator's
    22003, before it sends them; nothing stored, no restart."""
    params = {"epochs": 2, "seed": 1, "hidden": [4], "sync": 1, "where": f"({ONE_CLASS_EACH}) AND id <= 1500"}
    got, text, stored, problems = hostile_call(
        dsn, "control_1e308", "Train", lambda u: train(u, "shsec_hostile", "mlp", params))
    assert not problems, f"THE COORDINATOR RESTARTED: {problems}; the call gave {got}: {text[:300]}"
    assert got == "22003", f"{got}: {text[:300]}"
    assert stored == 0


# Forged evaluation replies (corgipile_evaluate over the sharded table).
HOSTILE_EVALUATION_CASES = [
    ("eval_grow", ("08P01",)),  # every non-empty array of the metrics one element longer
    ("eval_none", ("08P01",)),
    ("eval_counts", ("08P01",)),  # 2^64-1 rows scored, on each of two shards
    ("not_json", ("08P01",)),
    ("huge", ("54000", "08P01")),
]


@pytest.mark.parametrize("mode, states", HOSTILE_EVALUATION_CASES, ids=[c[0] for c in HOSTILE_EVALUATION_CASES])
def test_a_hostile_evaluation_reply_is_a_clean_error(dsn, hostile, mode, states):
    on_shard(HOSTILE_DB, "UPDATE hostile_mode SET m = 'honest', phase = ''")
    with psycopg.connect(dsn, user=SMALL, autocommit=True) as u:
        model_id = train(u, "shsec_hostile", "logistic", {"epochs": 1, "seed": 1})
        honest = scalar(u, "SELECT corgipile_evaluate(%s::bigint, 'shsec_hostile')", (model_id,))
    assert honest["rows_scored"] == 2000
    got, text, _, problems = hostile_call(
        dsn, mode, "Evaluate", lambda u: scalar(u, "SELECT corgipile_evaluate(%s::bigint, 'shsec_hostile')",
                                                (model_id,)))
    assert not problems, f"{mode}: THE COORDINATOR RESTARTED: {problems}; the call gave {got}: {text[:300]}"
    assert got != "lost", f"{mode}: connection lost: {text[:300]}"
    assert got in states, f"{mode} (Evaluate): expected one of {states}, got {got}: {text[:300]}"
    assert 'shard server "shsec_hostile"' in text, text[:300]


# Forged importance replies (corgipile_feature_importance over the sharded table): the sampling
# round's scores one permutation short, 200,000 of them, more rows correct than scored, more
# rows than asked for, none, a column's moments not finite; a count beyond any table, not JSON.
HOSTILE_IMPORTANCE_CASES = [
    ("imp_short", ("08P01",)),
    ("imp_many", ("08P01", "54000")),
    ("imp_correct", ("08P01",)),
    ("imp_rows", ("08P01",)),
    ("imp_none", ("08P01",)),
    ("imp_nan", ("08P01",)),
    ("rows_huge", ("08P01",)),
    ("not_json", ("08P01",)),
]


@pytest.mark.parametrize("mode, states", HOSTILE_IMPORTANCE_CASES, ids=[c[0] for c in HOSTILE_IMPORTANCE_CASES])
def test_a_hostile_importance_reply_is_a_clean_error(dsn, hostile, mode, states):
    on_shard(HOSTILE_DB, "UPDATE hostile_mode SET m = 'honest', phase = ''")
    query = "SELECT * FROM corgipile_feature_importance(%s::bigint, 'shsec_hostile', '{\"rows\": 500}')"
    with psycopg.connect(dsn, user=SMALL, autocommit=True) as u:
        model_id = train(u, "shsec_hostile", "logistic", {"epochs": 1, "seed": 1})
        honest = u.execute(query, (model_id,)).fetchall()
    assert len(honest) == 4 and {r[6] for r in honest} == {500}, honest
    got, text, _, problems = hostile_call(dsn, mode, "Importance", lambda u: u.execute(query, (model_id,)).fetchall())
    assert not problems, f"{mode}: THE COORDINATOR RESTARTED: {problems}; the call gave {got}: {text[:300]}"
    assert got != "lost", f"{mode}: connection lost: {text[:300]}"
    assert got in states, f"{mode} (Importance): expected one of {states}, got {got}: {text[:300]}"
    assert 'shard server "shsec_hostile"' in text, text[:300]


# Forged per-group metrics of a family (corgipile_evaluate of per-group models over the sharded
# table): one group's missing, none, a group's count that does not add up.
HOSTILE_FAMILY_CASES = [("grp_short", ("08P01",)), ("grp_none", ("08P01",)), ("grp_rows", ("08P01",))]


@pytest.mark.parametrize("mode, states", HOSTILE_FAMILY_CASES, ids=[c[0] for c in HOSTILE_FAMILY_CASES])
def test_a_hostile_family_evaluation_reply_is_a_clean_error(dsn, hostile, mode, states):
    on_shard(HOSTILE_DB, "UPDATE hostile_mode SET m = 'honest', phase = ''")
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("DROP TABLE IF EXISTS shsec_family_rows")
        admin.execute(f"CREATE TABLE shsec_family_rows AS {colored(rows_sql(2000))}")
        admin.execute(f"GRANT SELECT ON shsec_family_rows TO {SMALL}")
    query = "SELECT corgipile_evaluate(%s::bigint, 'shsec_hostile')"
    with psycopg.connect(dsn, user=SMALL, autocommit=True) as u:
        model_id = train(u, "shsec_family_rows", "logistic", {"epochs": 1, "seed": 1, "features": ["features"], "group_by": "color",
                                                               "min_group_rows": 10, "name": "shsec_family"})
        honest = scalar(u, query, (model_id,))
    assert honest["rows_scored"] == 2000 and set(honest["groups"]) == {"red", "green", "blue"}, honest
    got, text, _, problems = hostile_call(dsn, mode, "Evaluate", lambda u: scalar(u, query, (model_id,)))
    assert not problems, f"{mode}: THE COORDINATOR RESTARTED: {problems}; the call gave {got}: {text[:300]}"
    assert got != "lost", f"{mode}: connection lost: {text[:300]}"
    assert got in states, f"{mode} (Evaluate): expected one of {states}, got {got}: {text[:300]}"
    assert 'shard server "shsec_hostile"' in text, text[:300]
