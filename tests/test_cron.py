"""The production loop on a real scheduler (docs/production.md): pg_cron runs a job that retrains
a model from the rows added since its deployed version (`"since"`) behind the deploy gate
(`"deploy": "if_better"`), as a nightly job would; here the jobs run at the next minute and the
test waits for them. Checked: pg_cron's own record of the runs (cron.job_run_details), the
version deployed as the gate decided, the history rows (corgipile.deployments), and what the
`cr_keep` job's drift check wrote into a table (the input columns did not move).

The rows change their meaning (concept drift): the first versions learn from rows labelled
`x <= 0`, the rows that arrive before the job are labelled `x > 0`. Two names, retrained in the
same minute by two jobs: `cr_win`, whose job's version learns the new rows and beats the first
version on the rows it held out (mostly new ones), so it is deployed; and `cr_keep`, whose job has
`"margin": 1` (no accuracy can beat another by a whole point of 1), so its version is stored and
the first one stays deployed.

PostgreSQL 15 only: pg_cron here is Debian's postgresql-15-cron (make setup installs it); there
is no pg_cron for the PyPI PostgreSQL 18, where this suite is skipped. Own cluster (pg_cron must
be in shared_preload_libraries): helpers.Cluster on PGPORT + 150."""

import json
import pathlib
import subprocess
import time

import psycopg
import pytest

from helpers import PG_BIN, PGPORT, Cluster, as_pg, missing_input

pytestmark = [pytest.mark.slow, pytest.mark.own_cluster]

PORT = PGPORT + 150
DB = "corgipile_cron"
ROWS = 20_000  # the first versions' rows; as many again arrive before the job runs
WAIT = 150  # seconds: the next minute's start, plus both trainings


def pg_major():
    out = subprocess.run([str(pathlib.Path(PG_BIN) / "pg_config"), "--version"], check=True,
                         capture_output=True, text=True).stdout
    return int(out.split()[1].split(".")[0])


@pytest.fixture(scope="module")
def cron():
    if pg_major() != 15:
        pytest.skip("pg_cron is Debian's postgresql-15-cron here; the PyPI PostgreSQL 18 has none")
    libdir = subprocess.run([str(pathlib.Path(PG_BIN) / "pg_config"), "--pkglibdir"], check=True,
                            capture_output=True, text=True).stdout.strip()
    if not (pathlib.Path(libdir) / "pg_cron.so").exists():
        missing_input(f"pg_cron in {libdir} (Debian's postgresql-15-cron: make setup installs it)")
    cluster = Cluster(PORT, DB)
    try:
        cluster.init()
        # Jobs run in background workers of this server (no connection, no password needed).
        conf = f"""
shared_preload_libraries = 'pg_cron'
cron.database_name = '{DB}'
cron.use_background_workers = on
max_worker_processes = 16
"""
        r = as_pg(["tee", "-a", f"{cluster.data}/postgresql.conf"], input=conf)
        assert r.returncode == 0, r.stderr
        cluster.start()
        dsn = f"host={cluster.dir} port={PORT} user=postgres"
        with psycopg.connect(dsn + " dbname=postgres", autocommit=True) as c:
            c.execute(f"CREATE DATABASE {DB}")
        yield dsn + f" dbname={DB}"
    finally:
        cluster.stop()
        cluster.destroy()


def rows_sql(name, start, n, flipped=False):
    """x decides the label (x > 0; `flipped`: x <= 0), noise does not; fixed formulas."""
    return f"""INSERT INTO {name} SELECT i, x, noise, (x > 0) <> {flipped} FROM (
                 SELECT i, ((i::bigint * 2654435761) % 100003) / 50001.5 - 1 AS x,
                        ((i::bigint * 40503) % 9973) / 9973.0 AS noise
                 FROM generate_series({start}, {start + n - 1}) i) g"""


def train(c, params):
    return c.execute("SELECT corgipile_train('cr_rows', 'logistic', %s)", (json.dumps(params),)).fetchone()[0]


def deployed(c, name):
    return c.execute("SELECT id FROM corgipile.model_summary WHERE name = %s AND deployed", (name,)).fetchone()


def test_a_scheduled_job_retrains_behind_the_gate(cron):
    base = {"features": ["x", "noise"], "label": "label", "seed": 1, "verbose": False,
            "validation": {"fraction": 0.2}}
    with psycopg.connect(cron, autocommit=True) as c:
        c.execute("CREATE EXTENSION pg_cron")
        c.execute("CREATE EXTENSION corgipile")
        c.execute("CREATE TABLE cr_rows (id int, x float8, noise float8, label boolean)")
        c.execute(rows_sql("cr_rows", 1, ROWS, flipped=True))
        first_win = train(c, {**base, "name": "cr_win", "epochs": 3, "deploy": "if_better"})
        first_keep = train(c, {**base, "name": "cr_keep", "epochs": 3, "deploy": "if_better"})
        # Today's rows arrive; the jobs continue each name's deployed version on them.
        c.execute(rows_sql("cr_rows", ROWS + 1, ROWS))
        job = {**base, "epochs": 3, "learning_rate": 0.1, "deploy": "if_better"}
        c.execute("CREATE TABLE cr_drift AS SELECT now() AS checked_at, d.* "
                  "FROM corgipile_drift('cr_keep', 'cr_rows') d WITH NO DATA")
        drift = "INSERT INTO cr_drift SELECT now(), d.* FROM corgipile_drift('cr_keep', 'cr_rows') d"
        for name, extra, then in (("cr_win", {}, ""), ("cr_keep", {"margin": 1}, drift)):
            params = json.dumps({**job, **extra, "name": name, "since": name})
            command = f"SELECT corgipile_train('cr_rows', 'logistic', '{params}'); {then}"
            c.execute("SELECT cron.schedule(%s, '* * * * *', %s)", (f"retrain {name}", command))
        runs = []
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            runs = c.execute("""SELECT j.jobname, d.status, d.return_message FROM cron.job_run_details d
                                JOIN cron.job j USING (jobid)
                                WHERE d.status IN ('succeeded', 'failed') ORDER BY d.runid""").fetchall()
            if len({r[0] for r in runs}) == 2:
                break
            time.sleep(2)
        c.execute("SELECT cron.unschedule(jobname) FROM cron.job")
        assert len({r[0] for r in runs}) == 2, f"both jobs ran within {WAIT} s: {runs}"
        assert all(r[1] == "succeeded" for r in runs), runs

        # cr_win: the job's version won the gate and is deployed; cr_keep's first stays.
        history = {name: c.execute("""SELECT how, from_model, to_model, candidate, new_score, old_score
                                      FROM corgipile.deployments WHERE name = %s ORDER BY id""",
                                   (name,)).fetchall() for name in ("cr_win", "cr_keep")}
        win, keep = history["cr_win"], history["cr_keep"]
        # A name's first version is deployed by its gate (nothing to beat), then the job's verdict.
        assert [h[0] for h in win] == ["gated", "gated"] and [h[0] for h in keep] == ["gated", "gated"], history
        assert win[0][1:3] == (None, first_win) and keep[0][1:3] == (None, first_keep), history
        how, old, new, candidate, new_score, old_score = win[1]
        assert (old, new) == (first_win, candidate) and candidate != first_win, win
        assert new_score > old_score + 0.2, win  # the old concept scores badly on the new rows
        assert deployed(c, "cr_win") == (candidate,)
        how, old, new, candidate, new_score, old_score = keep[1]
        assert (old, new) == (first_keep, first_keep) and candidate not in (None, first_keep), keep
        assert deployed(c, "cr_keep") == (first_keep,)
        # The drift check after cr_keep's retraining compared a sample of the table (half of its
        # rows new) with the rows the deployed version was trained on: x and noise kept their
        # distributions (the new ids continue the same formulas).
        rows = {r[0]: r[1:] for r in c.execute(
            "SELECT column_name, measure, distance, passes FROM cr_drift WHERE role <> 'prediction'")}
        assert {"x", "noise"} <= set(rows), rows
        for col in ("x", "noise"):
            measure, distance, passes = rows[col]
            assert measure == "psi" and distance is not None and distance < 0.1 and passes, (col, rows[col])
        # The candidate of each is a stored version that read only the new pages (plus replay).
        for name, (_, _, _, candidate, _, _) in (("cr_win", win[1]), ("cr_keep", keep[1])):
            params = c.execute("SELECT params FROM corgipile.models WHERE id = %s", (candidate,)).fetchone()[0]
            assert params.get("since") is not None and params.get("deploy") == "if_better", (name, params)
