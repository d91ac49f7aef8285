"""Run records: every benchmark run appends one JSON line to bench/results/runs/<benchmark>.jsonl
(issue #53: a results file is rewritten by the next run, a record is never rewritten).

A benchmark script calls `append_record(benchmark, figures, make_target=..., conn=...)` right
after it writes its results file. The line holds the figures that file states (medians, ranges,
ratios, PASS/FAIL) and what made them: the version (Cargo.toml) and the commit checked out when
the process started, whether the extension's code (src/, ml/, sql/, Cargo.*, build.rs) or the
benchmark scripts (bench/*.py) had uncommitted changes then ("dirty"), the command, the machine
(CPU model, logical CPU count, memory, kernel), the PostgreSQL server, the date (UTC) and how long
the process had run. The file is opened for appending only (never truncated, never rewritten)
and the line is written with one write() call; figures must be finite numbers, strings,
booleans or None, in lists and dicts (no NaN, no infinity). scripts/bench_ranges.py reads the
records: ranges over runs for the docs, and `--check` (run by `make lint`) validates them.
bench/results/runs/README.md describes the format."""

import datetime
import json
import math
import os
import platform
import re
import shlex
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS_DIR = os.path.join(REPO, "bench", "results", "runs")
SCHEMA = 1
# Every record has these keys (a value may be null only where the record says "incomplete": true,
# i.e. for records imported from results files that did not state it).
REQUIRED = ("schema", "benchmark", "version", "commit", "dirty", "command", "machine", "postgres", "date", "figures")
MACHINE_KEYS = ("cpu_model", "cpus")
# What a build's "dirty" looks at: the extension's code and the benchmark scripts, not the
# results files (which the run itself writes).
CODE_PATHS = ("src", "ml", "sql", "Cargo.toml", "Cargo.lock", "build.rs", "bench/*.py")
NAME = re.compile(r"^[a-z0-9][a-z0-9_.\-]*$")
SIGNIFICANT = 6  # digits kept of a float figure


def _git(*args):
    try:
        r = subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout if r.returncode == 0 else None


def build():
    """{"commit": full hash or None, "dirty": bool or None, "dirty_files": [...]} of the checkout now."""
    head = (_git("rev-parse", "HEAD") or "").strip() or None
    status = _git("status", "--porcelain", "--", *CODE_PATHS)
    files = None if status is None else sorted({line[3:] for line in status.splitlines() if line.strip()})
    return {"commit": head, "dirty": None if files is None else bool(files),
            "dirty_files": None if files is None else files[:50]}


# The build as the process found it at its start (the benchmark scripts import this module
# first thing): the tree may move while a benchmark runs, the library measured does not.
STARTED = time.time()
START_BUILD = build()


def cargo_version():
    try:
        with open(os.path.join(REPO, "Cargo.toml")) as f:
            text = f.read()
    except OSError:
        return None
    package = text.split("[package]", 1)[-1]
    found = re.search(r'^version\s*=\s*"([^"]+)"', package, re.M)
    return found.group(1) if found else None


def machine():
    """CPU model, logical CPU count (and those this process may use), memory, kernel."""
    model = None
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        pass
    memory = None
    try:
        with open("/proc/meminfo") as f:
            kb = next((int(line.split()[1]) for line in f if line.startswith("MemTotal:")), None)
            memory = None if kb is None else kb * 1024
    except (OSError, ValueError):
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = None
    return {"cpu_model": model, "cpus": os.cpu_count(), "cpus_usable": usable, "memory_bytes": memory,
            "kernel": platform.release() or None, "arch": platform.machine() or None}


def postgres(server_version):
    """{"version": "15.20 (Debian ...)", "major": 15} from `SHOW server_version`, or nulls."""
    if not server_version:
        return {"version": None, "major": None}
    found = re.match(r"(\d+)", server_version)
    return {"version": server_version, "major": int(found.group(1)) if found else None}


def server(conn):
    """{"server_version", "extension_version"} of the server of an open connection, for
    append_record(**server(conn)) after the connection is closed."""
    row = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'corgipile'").fetchone()
    return {"server_version": conn.execute("SHOW server_version").fetchone()[0],
            "extension_version": row[0] if row else None}


def command_line():
    return " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0], REPO)] + sys.argv[1:])


def utc(ts):
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def clean(value, where="figures"):
    """`value` with floats rounded to SIGNIFICANT digits (tuples as lists); ValueError for
    anything but finite numbers, strings, booleans, None, lists and dicts with string keys."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where}: {value!r} is not a finite number")
        return float(f"{value:.{SIGNIFICANT}g}")
    if hasattr(value, "item") and not isinstance(value, (list, tuple, dict)):  # numpy scalars
        return clean(value.item(), where)
    if isinstance(value, (list, tuple)):
        return [clean(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str) or not k:
                raise ValueError(f"{where}: key {k!r} is not a non-empty string")
            out[k] = clean(v, f"{where} / {k}")
        return out
    raise ValueError(f"{where}: {value!r} ({type(value).__name__}) is not a number, string, list or dict")


def validate_figures(figures):
    """Raises ValueError unless `figures` is a non-empty dict of allowed values (see clean)."""
    if not isinstance(figures, dict) or not figures:
        raise ValueError("figures: must be a non-empty dict of named figures")
    clean(figures)


def problems(record, benchmark=None):
    """What is wrong with one record (a dict read back from a .jsonl line): [] if nothing."""
    out = []
    if not isinstance(record, dict):
        return ["not a JSON object"]
    missing = [k for k in REQUIRED if k not in record]
    if missing:
        out.append(f"missing keys: {', '.join(missing)}")
    incomplete = record.get("incomplete") is True
    if record.get("schema") != SCHEMA:
        out.append(f"schema {record.get('schema')!r}, expected {SCHEMA}")
    if benchmark is not None and record.get("benchmark") != benchmark:
        out.append(f"benchmark {record.get('benchmark')!r} in {benchmark}.jsonl")
    if not isinstance(record.get("benchmark"), str) or not NAME.match(record.get("benchmark") or ""):
        out.append(f"benchmark {record.get('benchmark')!r} is not a name")
    if not isinstance(record.get("version"), str):
        out.append("version is not a string")
    commit = record.get("commit")
    if not (isinstance(commit, str) and re.fullmatch(r"[0-9a-f]{7,40}", commit)) and not (commit is None and incomplete):
        out.append(f"commit {commit!r} is not a hex commit id")
    if not isinstance(record.get("dirty"), bool) and not (record.get("dirty") is None and incomplete):
        out.append("dirty is not true/false")
    if not isinstance(record.get("command"), str) and not (record.get("command") is None and incomplete):
        out.append("command is not a string")
    m = record.get("machine")
    if not isinstance(m, dict):
        out.append("machine is not an object")
    else:
        for k in MACHINE_KEYS:
            if k not in m:
                out.append(f"machine has no {k}")
            elif m[k] is None and not incomplete:
                out.append(f"machine.{k} is null in a record not marked incomplete")
    if not isinstance(record.get("postgres"), dict):
        out.append("postgres is not an object")
    date = record.get("date")
    try:
        datetime.datetime.strptime(date, "%Y-%m-%dT%H:%M:%SZ")
    except (TypeError, ValueError):
        out.append(f"date {date!r} is not YYYY-MM-DDTHH:MM:SSZ")
    try:
        validate_figures(record.get("figures"))
    except ValueError as e:
        out.append(str(e))
    if record.get("config") is not None and not isinstance(record["config"], dict):
        out.append("config is neither null nor an object")
    if "imported_from" in record and not isinstance(record["imported_from"], str):
        out.append("imported_from is not a string")
    return out


def append_line(path, record):
    """Appends `record` as one JSON line to `path`: O_APPEND (never truncates or rewrites), one
    write() of the whole line with its newline. Refuses a record with problems()."""
    wrong = problems(record, os.path.basename(path)[:-len(".jsonl")] if path.endswith(".jsonl") else None)
    if wrong:
        raise ValueError(f"not appending to {path}: {'; '.join(wrong)}")
    data = (json.dumps(record, ensure_ascii=False, allow_nan=False, separators=(",", ":")) + "\n").encode()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        # A line cut short by a crash before: start on a line of our own.
        size = os.fstat(fd).st_size
        if size:
            with open(path, "rb") as f:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    data = b"\n" + data
        written = os.write(fd, data)
    finally:
        os.close(fd)
    if written != len(data):
        raise OSError(f"{path}: wrote {written} of {len(data)} bytes of a record")
    return path


def make_record(benchmark, figures, *, command=None, make_target=None, server_version=None,
                extension_version=None, results_file=None, config=None, conn=None, when=None):
    """The record of a run of this process (see the module's docstring); `conn`, if given and
    open, supplies the server version and the installed extension's version. `config`: the
    options that change what is measured (rows, epochs, rounds, ...): runs are compared only
    with runs of the same config."""
    if not NAME.match(benchmark):
        raise ValueError(f"benchmark name {benchmark!r}: lower case letters, digits, _ . -")
    validate_figures(figures)
    if conn is not None and not getattr(conn, "closed", False):
        server_version = server_version or conn.execute("SHOW server_version").fetchone()[0]
        if extension_version is None:
            row = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'corgipile'").fetchone()
            extension_version = row[0] if row else None
    now = time.time() if when is None else when
    end = build()
    record = {
        "schema": SCHEMA,
        "benchmark": benchmark,
        "version": cargo_version(),
        "extension_version": extension_version,
        "commit": START_BUILD["commit"],
        "dirty": START_BUILD["dirty"],
        "dirty_files": START_BUILD["dirty_files"],
        "command": command or command_line(),
        # The make target that runs this script, when make ran it (make sets MAKELEVEL).
        "make_target": make_target if os.environ.get("MAKELEVEL") else None,
        "machine": machine(),
        "postgres": postgres(server_version),
        "date": utc(now),
        "started": utc(STARTED),
        "duration_s": round(now - STARTED, 1),
        "results_file": None if results_file is None else os.path.relpath(os.path.abspath(results_file), REPO),
        "config": None if config is None else clean(config, "config"),
        "figures": clean(figures),
    }
    if end["commit"] != START_BUILD["commit"]:
        record["commit_at_end"] = end["commit"]
    if record["commit"] is None or record["dirty"] is None:
        record["incomplete"] = True  # not run from a git checkout
    return record


def append_record(benchmark, figures, command=None, **kw):
    """Appends one record of this run to bench/results/runs/<benchmark>.jsonl; returns its path.
    Keywords as make_record (make_target, conn, server_version, extension_version, results_file,
    config)."""
    record = make_record(benchmark, figures, command=command, **kw)
    path = append_line(os.path.join(RUNS_DIR, f"{benchmark}.jsonl"), record)
    print(f"records: appended a run of {benchmark} to {os.path.relpath(path, REPO)}", file=sys.stderr)
    return path


def pass_fail(lines):
    """{target: "PASS" or "FAIL"} of the markdown table rows `| target | PASS | ... |` among
    `lines` (the targets tables the scripts write; rows whose result is neither are left out)."""
    out = {}
    for line in lines:
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if line.lstrip().startswith("|") and len(cells) >= 2 and cells[1].strip("*") in ("PASS", "FAIL"):
            out[cells[0]] = cells[1].strip("*")
    return out


def median_range(values):
    """{"median", "min", "max", "n"} of a list of numbers (a figure's spread within one run)."""
    import statistics
    xs = list(values)
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}
