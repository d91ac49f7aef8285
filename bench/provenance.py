"""The provenance line every results file in bench/results/ starts with: which corgipile version
and build made it, with which command, where. scripts/check_bench_sources.py checks that every
results file the README quotes has one naming the current version."""

import datetime
import os
import shlex
import subprocess
import sys

from records import CODE_PATHS


def git_head():
    """The commit, "+changes" when the code measured differs from it (results files, which the
    runs themselves write, do not count: see records.CODE_PATHS)."""
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", *CODE_PATHS],
                           capture_output=True, text=True)
    return (r.stdout.strip() or "unknown") + ("+changes" if dirty.stdout.strip() else "")


def machine():
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{os.cpu_count()} CPUs ({model})"


def line(conn=None, make_target=None, dbname=None):
    """'Provenance: corgipile <version>, ...' for a results file written now, by this process,
    against the server of `conn` (the version installed in its database; without `conn`, a new
    connection to `dbname` on the server PGHOST/PGPORT name)."""
    if conn is None:
        import psycopg
        with psycopg.connect(**({"dbname": dbname} if dbname else {}), autocommit=True) as c:
            return line(c, make_target)
    version = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'corgipile'").fetchone()
    server = conn.execute("SHOW server_version").fetchone()[0]
    command = " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0])] + sys.argv[1:])
    via = f"`make {make_target}` → " if make_target else ""
    return (f"Provenance: corgipile {version[0] if version else '(not installed)'}, commit {git_head()}, "
            f"command {via}`{command}`, PostgreSQL {server}, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
            f"{machine()}.")


def write(path, text, make_target, dbname=None):
    """Writes a markdown results file that starts with its provenance line."""
    # The line first: opening the file for writing changes it, and the tree would read as dirty.
    first = line(None, make_target, dbname)
    with open(path, "w") as f:
        f.write(first + "\n\n" + text)


def write_report(lines, path):
    """Prints the report's lines and writes them to `path`."""
    text = "\n".join(lines) + "\n"
    print(text)
    with open(path, "w") as out:
        out.write(text)
