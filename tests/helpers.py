"""Plain helper functions shared by the test suites (tests/test_*.py). Pytest fixtures are all in
tests/conftest.py; a suite imports what it needs from here: `from helpers import scalar, train`.
The builders of the training tables several suites use are in tests/tables.py.

Sections: where things are (paths, the cluster under test), inputs outside the repository
(datasets, contrib extensions), connections and queries, training, a training in a thread and its
cancellation, parallel workers (proof that they ran), the server's health (crash restarts,
/proc), roles, and throw-away clusters of a suite's own (scripts/cluster.sh, or a Cluster
started under `ulimit -v`)."""

import os
import pathlib
import re
import subprocess
import threading
import time

import psycopg
import pytest
from psycopg.types.json import Jsonb

# ---------------------------------------------------------------------------------------------
# Where things are

REPO = pathlib.Path(__file__).resolve().parent.parent
# The shard protocol's version (src/pipeline/protocol.rs): a forged request must say it to be read.
SHARD_PROTOCOL = int(re.search(r"pub const PROTOCOL: u32 = (\d+);",
                               (REPO / "src/pipeline/protocol.rs").read_text()).group(1))
DATASETS = pathlib.Path(os.environ.get("CORGIPILE_DATASETS", REPO.parent / "shared" / "datasets"))
# The database of the `dsn` / `conn` fixtures; the `db` fixture's are DBNAME_<suite>.
DBNAME = os.environ.get("CORGIPILE_TEST_DB", "corgipile_pytest")
PG_BIN = os.environ.get("CORGIPILE_PG_BIN", "/usr/lib/postgresql/15/bin")  # the major under test (make sets it)
PG_OS_USER = "postgres"
SERVER_LOG = os.environ.get("CORGIPILE_CLUSTER_DIR", "/tmp/corgipile-cluster") + "/log"
PGHOST = os.environ.get("PGHOST", "/tmp/corgipile-cluster")
PGPORT = int(os.environ.get("PGPORT", "5432"))

# ---------------------------------------------------------------------------------------------
# Inputs outside the repository

# In CI (CI=true, as CI services set it) or with CORGIPILE_REQUIRE_INPUTS=1, an input a test
# needs (a dataset, a contrib extension) that is missing is a failure naming it, never a skip
# that would let CI pass without the check. Elsewhere (a fresh clone without the datasets) it is
# a skip, and conftest.py's pytest_terminal_summary lists every such skip at the end of the run.
# Where the datasets come from: docs/development.md, "Datasets".
def _flag(name):
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


REQUIRE_INPUTS = _flag("CI") or _flag("CORGIPILE_REQUIRE_INPUTS")
MISSING_INPUT = "input missing: "  # how a missing input's skip reason begins (conftest.py counts them)


def missing_input(what):
    """A test cannot run because `what` (an input outside the repository) is absent: a failure
    in CI (CI=true) or under CORGIPILE_REQUIRE_INPUTS=1, a skip otherwise."""
    if REQUIRE_INPUTS:
        why = " and ".join(f"{v}={os.environ[v]}" for v in ("CI", "CORGIPILE_REQUIRE_INPUTS") if _flag(v))
        pytest.fail(f"required input missing: {what} (a failure, not a skip, under {why})", pytrace=False)
    pytest.skip(MISSING_INPUT + what)


def dataset(*names):
    """Paths of files in DATASETS; a missing one is missing_input (a failure in CI)."""
    paths = [DATASETS / n for n in names]
    absent = [p.name for p in paths if not p.exists()]
    if absent:
        missing_input(f"dataset file(s) {', '.join(absent)} not in {DATASETS} (set CORGIPILE_DATASETS; "
                      "docs/development.md, Datasets)")
    return paths if len(paths) > 1 else paths[0]


def require_extension(conn, name):
    """The contrib extension `name` is installable on the server under test, else missing_input."""
    if not conn.execute("SELECT count(*) FROM pg_available_extensions WHERE name = %s", (name,)).fetchone()[0]:
        missing_input(f"{name} is not available in this server's installation")


# ---------------------------------------------------------------------------------------------
# Connections and queries

def connect(dsn, user=None, **kw):
    """psycopg.connect(dsn), autocommit unless told otherwise; `user`: as that role."""
    kw.setdefault("autocommit", True)
    if user is not None:
        kw["user"] = user
    return psycopg.connect(dsn, **kw)


def suite_db(dsn):
    """The database name of a "dbname=..." dsn (the db fixture's)."""
    return dsn.split("=", 1)[1]


def scalar(conn, sql, params=None):
    """The first column of the first row of `sql`."""
    return conn.execute(sql, params).fetchone()[0]


def error_of(conn, query, params=None):
    """The psycopg.Error a statement raises (None if it succeeds)."""
    try:
        conn.execute(query, params)
    except psycopg.Error as e:
        return e
    return None


def describe(e):
    """An error (from error_of) for an assertion message: SQLSTATE, class, message, detail, hint."""
    if e is None:
        return "no error"
    detail = f" (detail {e.diag.message_detail!r})" if e.diag.message_detail else ""
    return f"{e.sqlstate} {type(e).__name__}: {e.diag.message_primary!r}{detail} (hint {e.diag.message_hint!r})"


def models_count(conn):
    """Rows of corgipile.models the connection's role sees (all of them for a superuser)."""
    return scalar(conn, "SELECT count(*) FROM corgipile.models")


def parallel_guc(conn):
    """The setting that forces a parallel plan: PostgreSQL 16 renamed force_parallel_mode."""
    return "force_parallel_mode" if int(scalar(conn, "SHOW server_version_num")) < 160000 else "debug_parallel_query"


# ---------------------------------------------------------------------------------------------
# Training

QUIET = {"verbose": False}


def train(conn, rel, model="svm", params=None, *, defaults=QUIET, **extra):
    """corgipile_train(rel, model, params) and the new model's id. The params sent are `defaults`
    ({"verbose": False} unless the caller gives others; {} sends only what it names), overridden
    by `params` (a dict), overridden by keyword `extra`s."""
    p = {**defaults, **(params or {}), **extra}
    return scalar(conn, "SELECT corgipile_train(%s::regclass, %s, %s)", (rel, model, Jsonb(p)))


def evaluate(conn, model, rel, params=None):
    """corgipile_evaluate of a model (its id, or a name: its deployed version) on `rel`."""
    by = "bigint" if isinstance(model, int) else "text"
    return scalar(conn, f"SELECT corgipile_evaluate(%s::{by}, %s::regclass, %s)", (model, rel, Jsonb(params or {})))


def explain(conn, rel, model, params, analyze=False, *, defaults=QUIET):
    """corgipile_explain's lines for a training of `model` on `rel` (params over `defaults`)."""
    return [r[0] for r in conn.execute("SELECT * FROM corgipile_explain(%s::regclass, %s, %s, %s)",
                                       (rel, model, Jsonb({**defaults, **params}), analyze))]


def rows_trained(conn, model_id):
    return scalar(conn, "SELECT rows_trained FROM corgipile.models WHERE id = %s", (model_id,))


def train_error(conn, rel, model="svm", params=None, **kw):
    """The psycopg.Error train() raises (None if it succeeds)."""
    try:
        train(conn, rel, model, params, **kw)
    except psycopg.Error as e:
        return e
    return None


def timed(fn, *args, **kw):
    """(fn(*args, **kw), the seconds it took)."""
    started = time.monotonic()
    result = fn(*args, **kw)
    return result, time.monotonic() - started


def catalog_counts(conn):
    """(models, epochs) as the superuser sees them."""
    return conn.execute(
        "SELECT (SELECT count(*) FROM corgipile.models), (SELECT count(*) FROM corgipile.epochs)"
    ).fetchone()


def assert_catalog_consistent(conn):
    orphans_m = scalar(conn, """SELECT count(*) FROM corgipile.models m
                                WHERE NOT EXISTS (SELECT 1 FROM corgipile.epochs e WHERE e.model_id = m.id)""")
    orphans_e = scalar(conn, """SELECT count(*) FROM corgipile.epochs e
                                WHERE NOT EXISTS (SELECT 1 FROM corgipile.models m WHERE m.id = e.model_id)""")
    assert (orphans_m, orphans_e) == (0, 0), f"models without epochs: {orphans_m}, epochs without model: {orphans_e}"


# ---------------------------------------------------------------------------------------------
# A training in a thread, and stopping it

def run_in_thread(conn, sql, params=None):
    """Runs `sql` on `conn` in a thread; returns (thread, result dict with "started", "ended"
    and "value" (the first row's first column) or "error")."""
    result = {}

    def run():
        result["started"] = time.monotonic()
        try:
            result["value"] = conn.execute(sql, params).fetchone()[0]
        except BaseException as e:  # noqa: BLE001 - reported to the test
            result["error"] = e
        result["ended"] = time.monotonic()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, result


def start_training(conn, rel, model, params, *, defaults=QUIET):
    """Runs corgipile_train (params as train() builds them: without NOTICEs unless `defaults` says
    otherwise) in a thread (see run_in_thread)."""
    return run_in_thread(conn, "SELECT corgipile_train(%s::regclass, %s, %s)",
                         (rel, model, Jsonb({**defaults, **params})))


def stop_if_running(killer, t, pid):
    """Never leave a training running on the shared cluster."""
    if t.is_alive():
        killer.execute("SELECT pg_terminate_backend(%s)", (pid,))
        t.join(timeout=30)


def cancel_and_join(killer, t, result, pid, timeout=60):
    """Cancels the training running in thread `t` (from start_training) on backend `pid` and
    waits for it to stop; returns the seconds from the cancel to the end of its statement."""
    cancelled_at = time.monotonic()
    assert scalar(killer, "SELECT pg_cancel_backend(%s)", (pid,))
    t.join(timeout=timeout)
    assert not t.is_alive(), f"training not stopped {timeout} s after pg_cancel_backend"
    return result["ended"] - cancelled_at


def wait_active(observer, pid, timeout=10.0, function="corgipile_train"):
    """Until backend `pid` runs a query calling `function` (a cancel sent while idle would be
    ignored)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if scalar(observer, "SELECT state = 'active' AND strpos(query, %s) > 0 FROM pg_stat_activity "
                            "WHERE pid = %s", (function, pid)):
            return
        time.sleep(0.01)
    raise AssertionError("training did not start")


# ---------------------------------------------------------------------------------------------
# Parallel workers

def parallel_workers_of(observer, leader_pid):
    """Pids of the parallel workers of backend `leader_pid` running now (pg_stat_activity)."""
    return [r[0] for r in observer.execute("""SELECT pid FROM pg_stat_activity
                                              WHERE backend_type = 'parallel worker' AND leader_pid = %s""",
                                           (leader_pid,))]


def explain_workers_launched(conn, rel, model, params):
    """"Workers Launched" of corgipile_explain(rel, model, params, analyze): a training that stores
    nothing; 0 when the plan has no such line."""
    lines = [r[0] for r in conn.execute("SELECT * FROM corgipile_explain(%s::regclass, %s, %s, true)",
                                        (rel, model, Jsonb(params)))]
    launched = [int(m.group(1)) for ln in lines for m in [re.search(r"Workers Launched: (\d+)", ln)] if m]
    return max(launched, default=0)


def train_with_workers(conn, rel, model="svm", params=None, *, defaults=QUIET, **extra):
    """train() (same arguments; params with "workers" >= 1), and proof that the training ran with
    at least one parallel worker; returns the model id. Without the proof a test comparing a
    training "with workers" against one process passes trivially when no worker slot is free:
    the backend then trains alone.

    The proof: while the training runs, another session polls pg_stat_activity without pause
    for parallel workers led by conn's backend (a worker is listed from its start to the end of
    the training: the leader waits for every launched worker to attach and to finish). A
    training of a few ms on a loaded machine can end between two polls (measured on 2 cores, a
    training of 2,000 rows, 1 epoch, ~15 ms: its workers seen 200 times out of 200; beside two
    CPU hogs, missed 1 time in 10); then the same call is run again by corgipile_explain(...,
    analyze), which stores nothing, and its "Workers Launched" must be at least 1."""
    p = {**defaults, **(params or {}), **extra}
    assert isinstance(p.get("workers"), int) and p["workers"] >= 1, p
    leader = conn.info.backend_pid
    seen = set()
    stop = threading.Event()
    with psycopg.connect(conn.info.dsn, autocommit=True) as observer:
        def poll():
            while not stop.is_set():
                seen.update(parallel_workers_of(observer, leader))

        watcher = threading.Thread(target=poll, daemon=True)
        watcher.start()
        try:
            model_id = train(conn, rel, model, p, defaults={})
        finally:
            stop.set()
            watcher.join(timeout=30)
    if not seen:
        launched = explain_workers_launched(conn, rel, model, p)
        print(f"\n{model} on {rel}: no parallel worker seen while it trained; EXPLAIN ANALYZE of the same call: "
              f"Workers Launched: {launched}")
        assert launched >= 1, (f"no parallel worker ran for {model} on {rel} with {p} (none seen while it trained, "
                               f"Workers Launched: {launched} in EXPLAIN ANALYZE of the same call): "
                               "the comparison with one process would be vacuous")
    return model_id


# ---------------------------------------------------------------------------------------------
# The server's health

def wait_ready(timeout=60.0):
    """Wait until the server under test accepts connections and runs a query (after a crash
    restart)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        r = subprocess.run([f"{PG_BIN}/pg_isready", "-q"], capture_output=True)
        if r.returncode == 0:
            try:
                with psycopg.connect(dbname="postgres", autocommit=True, connect_timeout=5) as c:
                    if c.execute("SELECT 1").fetchone()[0] == 1:
                        return time.monotonic()
            except psycopg.Error as e:  # still in recovery
                last = e
        time.sleep(0.25)
    raise AssertionError(f"server not ready after {timeout} s: {last}")


def server_crashes():
    """Number of crash restarts in the server log: the postmaster reinitialises after any
    backend dies abnormally (a signal, an abort, an unexpected exit code)."""
    try:
        with open(SERVER_LOG, errors="replace") as f:
            return sum(1 for line in f
                       if "terminated by signal" in line or "all server processes terminated; reinitializing" in line)
    except OSError:
        return 0


# Lines of a server log that mean a backend died and the postmaster restarted (or will).
CRASH_RE = re.compile(
    r"terminated by signal|server process .* was terminated|server process .* exited with exit code"
    r"|terminating any other active server processes|all server processes terminated; reinitializing"
    r"|PANIC:"
)


def proc_status(pid):
    """/proc/<pid>/status as a dict."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k] = v.strip()
    return out


def status_kb(pid, key):
    return int(proc_status(pid)[key].split()[0])


def threads(pid):
    """Threads of process `pid` (a backend: 1 unless a training's reader thread runs)."""
    return int(proc_status(pid)["Threads"])


# ---------------------------------------------------------------------------------------------
# Roles

# The ordinary roles of the roles_env fixture (conftest.py).
ROLES_ENV_ALICE, ROLES_ENV_BOB = "hard_alice", "hard_bob"
ROLES_ENV_SMALL_ROWS = 3000  # rows of its table hard_small

def drop_role(admin, role):
    """Drops `role` and what it owns, if it exists."""
    if scalar(admin, "SELECT count(*) FROM pg_roles WHERE rolname = %s", (role,)):
        admin.execute(f"DROP OWNED BY {role}")
        admin.execute(f"DROP ROLE {role}")


# ---------------------------------------------------------------------------------------------
# Throw-away clusters of a suite's own

def as_pg(args, **kw):
    """Run a command as the postgres OS user (the servers run as it), from a directory it can read."""
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    kw.setdefault("cwd", "/")
    if os.geteuid() == 0:
        args = ["runuser", "-u", PG_OS_USER, "--"] + list(args)
    elif os.environ.get("USER", "") != PG_OS_USER:
        args = ["sudo", "-u", PG_OS_USER, "--"] + list(args)
    return subprocess.run(args, **kw)


def cluster_sh(action, cluster_dir, port, pg_bin=None):
    """scripts/cluster.sh `action` for the cluster in `cluster_dir` listening on `port` (the
    programs of `pg_bin`, default the major under test)."""
    env = {**os.environ, "CORGIPILE_CLUSTER_DIR": cluster_dir, "CORGIPILE_PORT": str(port)}
    if pg_bin is not None:
        env["CORGIPILE_PG_BIN"] = str(pg_bin)
    subprocess.run([str(REPO / "scripts" / "cluster.sh"), action], env=env, check=True,
                   capture_output=True, text=True, timeout=300)


VMEM_KB = 4_000_000  # ulimit -v of a Cluster's server: about 4 GB of address space per process


class Cluster:
    """A throw-away cluster in a new /tmp/corgipile-hardening-* directory (test_fuzz.py,
    test_tabular_attacks.py), started as scripts/cluster.sh does, plus `ulimit -v VMEM_KB`."""

    def __init__(self, port, dbname="hardening"):
        r = as_pg(["mktemp", "-d", "/tmp/corgipile-hardening-XXXXXX"], check=True)
        self.dir = r.stdout.strip()
        assert self.dir.startswith("/tmp/corgipile-hardening-"), self.dir
        as_pg(["chmod", "755", self.dir], check=True)
        self.data = f"{self.dir}/data"
        self.log = f"{self.dir}/log"
        self.port = port
        self.dbname = dbname
        self.log_offset = 0

    def init(self):
        r = as_pg([f"{PG_BIN}/initdb", "-D", self.data, "--auth=trust", "-U", "postgres", "-E", "UTF8",
                   "--locale=C.UTF-8"])
        assert r.returncode == 0, f"initdb failed: {r.stdout}\n{r.stderr}"
        conf = f"""
# ---- corgipile throw-away cluster under ulimit -v (tests/helpers.py, Cluster) ----
listen_addresses = ''
unix_socket_directories = '{self.dir}'
port = {self.port}
shared_buffers = 128MB
max_wal_size = 2GB
fsync = off
synchronous_commit = off
full_page_writes = off
huge_pages = off
"""
        r = as_pg(["tee", "-a", f"{self.data}/postgresql.conf"], input=conf)
        assert r.returncode == 0, r.stderr

    def start(self):
        # The limit is set in the shell that execs pg_ctl: the postmaster and every backend inherit it.
        cmd = (f"ulimit -v {VMEM_KB} && exec env -u RUST_BACKTRACE -u RUST_LIB_BACKTRACE "
               f"{PG_BIN}/pg_ctl start -D {self.data} -l {self.log} -w -t 120 -o '-p {self.port} -k {self.dir}'")
        r = as_pg(["bash", "-c", cmd])
        assert r.returncode == 0, f"server failed to start: {r.stdout}\n{r.stderr}\n{self.tail()}"

    def stop(self):
        as_pg([f"{PG_BIN}/pg_ctl", "stop", "-D", self.data, "-m", "fast", "-w"])

    def destroy(self):
        if self.dir.startswith("/tmp/corgipile-hardening-"):
            as_pg(["rm", "-rf", "--", self.dir])

    def read_log(self):
        try:
            with open(self.log, errors="replace") as f:
                return f.read()
        except PermissionError:
            return as_pg(["cat", self.log]).stdout
        except OSError:
            return ""

    def tail(self, n=40):
        return "\n".join(self.read_log().splitlines()[-n:])

    def new_log_lines(self):
        text = self.read_log()
        new, self.log_offset = text[self.log_offset:], len(text)
        return new.splitlines()

    def postmaster_pid(self):
        r = as_pg(["head", "-n", "1", f"{self.data}/postmaster.pid"])
        return int(r.stdout.strip())

    def connect(self, user="postgres", dbname=None, **kw):
        kw.setdefault("autocommit", True)
        kw.setdefault("connect_timeout", 10)
        return psycopg.connect(host=self.dir, port=self.port, user=user, dbname=dbname or self.dbname, **kw)

    def wait_ready(self, timeout=90.0):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                with self.connect(dbname="postgres") as c:
                    if c.execute("SELECT 1").fetchone()[0] == 1:
                        return
            except psycopg.Error as e:  # still restarting / in recovery
                last = e
            time.sleep(0.25)
        raise AssertionError(f"fuzz cluster not ready after {timeout} s: {last}\n{self.tail()}")
