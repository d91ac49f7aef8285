#!/usr/bin/env python3
"""Ranges over the kept benchmark runs: what the docs may quote (issue #53).

Every benchmark run appends one record (a JSON line) to bench/results/runs/<benchmark>.jsonl
(bench/records.py; the format: bench/results/runs/README.md). This script reads them.

  scripts/bench_ranges.py [--benchmark NAME] [--figure TEXT] [--version V] [--major N]
                          [--commit ID] [--since DATE] [--clean] [--no-imported] [--quote]
      Per benchmark, PostgreSQL major and config (the options that change what is measured):
      how many runs, which builds (version @ commit, "+" for uncommitted code), which CPUs, and
      per figure min–max and median over the runs, e.g.
          corgipile_double_div_floor: 1.04–1.09 (median 1.06), 7 runs
      A figure that is a list in each run (e.g. per-round ratios) is pooled over the runs; a
      PASS/FAIL figure is counted. --quote prints one line per figure with the builds and CPUs,
      as the docs should cite it: "1.04–1.09, 7 runs, 0.5.0 @ f350eef+, c0ef7d9; 2 × AMD EPYC".
      --clean leaves out runs of uncommitted code (and imported records that cannot say).

  scripts/bench_ranges.py --check
      Every line of every bench/results/runs/*.jsonl parses and is a valid record
      (bench/records.py problems()), every file ends with a newline, nothing else is in the folder
      but README.md, and every file is the committed one (HEAD) plus appended lines: a kept record
      is never rewritten or removed. Passes when there are no records. Run by `make lint`.

  scripts/bench_ranges.py --import-existing
      One-off: appends records of the runs whose results git already holds and that name their
      build (a provenance line with version, commit, command and CPUs): every committed version
      of the harness's bench/results/*.md.json (make bench, bench-quick) and of
      bench/results/epoch_times*.md (make bench-epochs), and the JSON results of bench-defaults,
      bench-mlp, bench-groups, bench-search and bench-predict with the provenance line of the .md
      committed with them. Figures are recomputed from the JSON by the script's own figures()
      function or read from the markdown tables. Each such record says "imported_from":
      "<file>@<commit>", keeps the provenance line, and is "incomplete": true (memory, kernel, the
      exact second and the dirty files were never recorded: they are null). A run already
      imported (same provenance line) is not imported again."""

import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))
import records  # noqa: E402

RUNS = records.RUNS_DIR


# ---------------------------------------------------------------- reading

def read_runs(runs_dir=RUNS):
    """([(file name, line number, record)], [problem]) of every .jsonl in runs_dir."""
    out, problems = [], []
    if not os.path.isdir(runs_dir):
        return out, problems
    for name in sorted(os.listdir(runs_dir)):
        path = os.path.join(runs_dir, name)
        if name == "README.md":
            continue
        if not name.endswith(".jsonl") or not os.path.isfile(path):
            problems.append(f"{name}: only <benchmark>.jsonl files and README.md belong in {rel(runs_dir)}")
            continue
        with open(path, "rb") as f:
            data = f.read()
        if data and not data.endswith(b"\n"):
            problems.append(f"{name}: does not end with a newline (a record cut short?)")
        text = data.decode("utf-8", "replace")
        lines = text[:-1].split("\n") if text.endswith("\n") else text.split("\n") if text else []
        for n, line in enumerate(lines, start=1):
            if not line.strip():
                problems.append(f"{name}:{n}: empty line")
                continue
            try:
                record = json.loads(line, parse_constant=no_constant)
            except ValueError as e:
                problems.append(f"{name}:{n}: not JSON ({e})")
                continue
            wrong = records.problems(record, name[:-len(".jsonl")])
            problems += [f"{name}:{n}: {w}" for w in wrong]
            if not wrong:
                out.append((name, n, record))
    return out, problems


def no_constant(name):
    raise ValueError(f"{name} is not a number a record may hold")


def rel(path):
    return os.path.relpath(path, REPO)


def git(*args, binary=False):
    try:
        r = subprocess.run(["git", "-C", REPO, *args], capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode != 0:
        return None
    return r.stdout if binary else r.stdout.decode("utf-8", "replace")


def appended_only(runs_dir=RUNS):
    """Problems where a committed runs/*.jsonl is not a prefix of the file in the tree."""
    problems = []
    if git("rev-parse", "--verify", "--quiet", "HEAD") is None:
        return problems  # not a git checkout: nothing to compare with
    listed = git("ls-tree", "--name-only", "HEAD", rel(runs_dir) + "/") or ""
    for path in listed.splitlines():
        if not path.endswith(".jsonl"):
            continue
        committed = git("show", f"HEAD:{path}", binary=True) or b""
        full = os.path.join(REPO, path)
        if not os.path.exists(full):
            problems.append(f"{os.path.basename(path)}: committed, but gone from the tree (records are never removed)")
            continue
        with open(full, "rb") as f:
            now = f.read()
        if not now.startswith(committed):
            problems.append(f"{os.path.basename(path)}: its committed lines were changed (records are only appended)")
    return problems


def check(runs_dir=RUNS):
    runs, problems = read_runs(runs_dir)
    problems += appended_only(runs_dir)
    for p in problems:
        print(f"bench_ranges: {p}", file=sys.stderr)
    if problems:
        print(f"bench_ranges: {len(problems)} problem(s) in {rel(runs_dir)} (bench/results/runs/README.md: the format)",
              file=sys.stderr)
        return 1
    files = len({name for name, _, _ in runs})
    print(f"bench_ranges: {len(runs)} run records in {files} files of {rel(runs_dir)}, all valid"
          + (" (none yet)" if not runs else ""))
    return 0


# ---------------------------------------------------------------- ranges

def leaves(value, path=()):
    """(path, value) of every figure: dicts are walked; a list of numbers is one leaf."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from leaves(v, path + (k,))
    else:
        yield path, value


def is_number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def fmt(x, digits=3):
    """`digits` significant digits, trailing zeros kept (1.20, 0.970); large numbers whole."""
    if abs(x) >= 10 ** digits:
        return f"{x:,.0f}"
    text = f"{x:#.{digits}g}"
    return text[:-1] if text.endswith(".") else text


def short(commit):
    return (commit or "?")[:7]


def build_names(runs):
    """'0.5.0 @ f350eef+, c0ef7d9' over runs (order of first appearance; + = uncommitted code)."""
    seen = {}
    for r in runs:
        key = (r.get("version") or "?", short(r.get("commit")) + ("+" if r.get("dirty") is not False else ""))
        seen.setdefault(key, 0)
        seen[key] += 1
    by_version = {}
    for (version, commit), _ in seen.items():
        by_version.setdefault(version, []).append(commit)
    parts = []
    for version, commits in by_version.items():
        shown = commits if len(commits) <= 4 else commits[:2] + [f"… {len(commits) - 3} more …", commits[-1]]
        parts.append(f"{version} @ {', '.join(shown)}")
    return "; ".join(parts)


def cpu_names(runs):
    counts = {}
    for r in runs:
        m = r.get("machine") or {}
        key = f"{m.get('cpus') or '?'} × {m.get('cpu_model') or '?'}"
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(k if len(counts) == 1 else f"{k} ({n})" for k, n in counts.items())


def group_key(r):
    return (r["benchmark"], (r.get("postgres") or {}).get("major"), json.dumps(r.get("config"), sort_keys=True))


def summarize_figure(values):
    """(kind, text) of one figure over runs: numbers, pooled lists, or counted strings."""
    nums = [v for v in values if is_number(v)]
    lists = [v for v in values if isinstance(v, list) and v and all(is_number(x) for x in v)]
    texts = [v for v in values if isinstance(v, (str, bool))]
    missing = sum(v is None for v in values)
    note = f"; not measured in {missing}" if missing else ""
    if nums and len(nums) + missing == len(values):
        lo, med, hi = min(nums), statistics.median(nums), max(nums)
        return "number", (lo, med, hi, len(nums), note)
    if lists and len(lists) + missing == len(values):
        pooled = [x for v in lists for x in v]
        return "pooled", (min(pooled), statistics.median(pooled), max(pooled), len(lists), f", {len(pooled)} values pooled{note}")
    if missing == len(values):
        return "none", (missing,)
    if texts and len(texts) + missing == len(values):
        counts = {}
        for t in texts:
            counts[str(t)] = counts.get(str(t), 0) + 1
        return "counted", (", ".join(f"{k} {n}" for k, n in sorted(counts.items())), len(texts), note)
    return "mixed", (len(values),)


def ranges(runs, args):
    groups = {}
    for r in runs:
        groups.setdefault(group_key(r), []).append(r)
    if not groups:
        print("bench_ranges: no run records match" + ("" if glob.glob(os.path.join(RUNS, "*.jsonl")) else
                                                     f" (none in {rel(RUNS)} yet)"))
        return 0
    for (benchmark, major, config), group in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0, kv[0][2])):
        group.sort(key=lambda r: r["date"])
        imported = sum("imported_from" in r for r in group)
        dirty = sum(r.get("dirty") is not False for r in group)
        builds, cpus = build_names(group), cpu_names(group)
        if not args.quote:
            print(f"## {benchmark}, PostgreSQL {major or '?'}" + ("" if config == "null" else f", config {config}"))
            print(f"{len(group)} runs ({imported} imported from results files, {dirty} of uncommitted or unknown code), "
                  f"{group[0]['date'][:10]} – {group[-1]['date'][:10]}")
            print(f"builds: {builds}")
            print(f"CPUs: {cpus}")
            print()
        paths = []
        for r in group:
            for path, _ in leaves(r["figures"]):
                if path not in paths:
                    paths.append(path)
        for path in paths:
            name = " / ".join(path)
            if args.figure and args.figure.lower() not in name.lower():
                continue
            values = []
            for r in group:
                v = r["figures"]
                for k in path:
                    v = v.get(k) if isinstance(v, dict) else None
                values.append(v)
            kind, s = summarize_figure(values)
            if kind in ("number", "pooled"):
                lo, med, hi, n, note = s
                span = fmt(lo, args.digits) if lo == hi else f"{fmt(lo, args.digits)}–{fmt(hi, args.digits)}"
                if args.quote:
                    print(f"{benchmark} PG{major or '?'}: {name}: {span}, {n} runs, {builds}; {cpus}")
                else:
                    print(f"- {name}: {span} (median {fmt(med, args.digits)}), {n} runs{note}")
            elif kind == "counted" and not args.quote:
                text, n, note = s
                print(f"- {name}: {text} ({n} runs{note})")
            elif kind == "none" and not args.quote:
                print(f"- {name}: not measured in any of the {s[0]} runs")
            elif kind == "mixed" and not args.quote:
                print(f"- {name}: values of different kinds in {s[0]} runs")
        if not args.quote:
            print()
    return 0


def select(runs, args):
    out = []
    for _name, _n, r in runs:
        if args.benchmark and r["benchmark"] not in args.benchmark:
            continue
        if args.version and r.get("version") not in args.version:
            continue
        if args.major and (r.get("postgres") or {}).get("major") not in args.major:
            continue
        if args.clean and r.get("dirty") is not False:
            continue
        if args.no_imported and "imported_from" in r:
            continue
        if args.commit and not any((r.get("commit") or "").startswith(c) for c in args.commit):
            continue
        if args.since and r["date"][:10] < args.since:
            continue
        out.append(r)
    return out


# ---------------------------------------------------------------- one-off import

PROVENANCE = re.compile(
    r"Provenance: corgipile (?P<version>\S+?), commit (?P<commit>[0-9a-f]{7,40})(?P<changes>\+changes)?\b.*?"
    r", command (?:`make (?P<target>[\w-]+)` → )?`(?P<command>[^`]+)`, PostgreSQL (?P<pg>.+?), "
    r"(?P<date>\d{4}-\d\d-\d\d \d\d:\d\d) UTC, (?P<cpus>\d+) CPUs \((?P<cpu>[^)]*(?:\([^)]*\)[^)]*)*)\)\.")


def parse_provenance(line):
    """The fields of a provenance line (bench/provenance.py's format), or None."""
    m = PROVENANCE.search(line or "")
    return m.groupdict() if m else None


def full_commit(short_id):
    full = (git("rev-parse", "--verify", "--quiet", f"{short_id}^{{commit}}") or "").strip()
    return full or short_id


def cargo_version_at(commit):
    text = git("show", f"{commit}:Cargo.toml")
    if not text:
        return None
    found = re.search(r'^version\s*=\s*"([^"]+)"', text.split("[package]", 1)[-1], re.M)
    return found.group(1) if found else None


def option(command, name, default=None, kind=str):
    m = re.search(rf"(?:^|\s){re.escape(name)}(?:\s+|=)(\S+)", command)
    return kind(m.group(1)) if m else default


def imported_record(benchmark, figures, line, source, results_file, config=None, duration=None):
    """The record of a run a results file describes: only what its provenance line states."""
    p = parse_provenance(line)
    commit = full_commit(p["commit"])
    pg = records.postgres(p["pg"])
    record = {
        "schema": records.SCHEMA,
        "benchmark": benchmark,
        "version": cargo_version_at(commit) or p["version"],
        "extension_version": p["version"],
        "commit": commit,
        # "+changes": some tracked file of the tree had uncommitted changes (maybe code, maybe not).
        "dirty": bool(p["changes"]),
        "dirty_files": None,
        "command": p["command"],
        "make_target": p["target"],
        "machine": {"cpu_model": p["cpu"], "cpus": int(p["cpus"]), "cpus_usable": None, "memory_bytes": None,
                    "kernel": None, "arch": None},
        "postgres": pg,
        "date": p["date"].replace(" ", "T") + ":00Z",
        "date_precision": "minute",
        "started": None,
        "duration_s": None if duration is None else round(duration, 1),
        "results_file": results_file,
        "config": config,
        "figures": records.clean(figures),
        "imported_from": source,
        "provenance": line.strip(),
        "incomplete": True,
    }
    if p["changes"]:
        record["dirty_note"] = "the provenance line said +changes: some tracked file had uncommitted changes"
    return record


def versions_in_git(path):
    """[(commit, text)] of every committed version of `path`, oldest first."""
    log = git("log", "--format=%H", "--", path) or ""
    out = []
    for commit in reversed(log.split()):
        text = git("show", f"{commit}:{path}")
        if text is not None:
            out.append((commit, text))
    return out


def table_rows(text):
    """[(header cells, [row cells])] of every markdown table of `text`."""
    tables, current = [], None
    for line in text.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if current is None:
                current = (cells, [])
                tables.append(current)
            elif not set("".join(cells)) <= set("-: "):
                current[1].append(cells)
        else:
            current = None
    return tables


def number(cell):
    m = re.match(r"^\**(-?[0-9][0-9,]*\.?[0-9]*)", cell.strip())
    return None if not m else float(m.group(1).replace(",", ""))


def span(cell):
    m = re.match(r"^\(?(-?[0-9.]+)\s*[–-]\s*(-?[0-9.]+)", cell.strip().strip("()"))
    return (float(m.group(1)), float(m.group(2))) if m else (None, None)


def with_range(median_cell, range_cell):
    lo, hi = span(range_cell)
    return {"median": number(median_cell), "min": lo, "max": hi}


def epoch_times_figures(text):
    """The figures bench/epoch_times.py records, read back from the markdown it wrote."""
    figures = {"epochs": {}, "predict": {}, "targets": {}}
    for header, rows in table_rows(text):
        if header[-1] != "÷ parallel scan floor":
            # The prediction rows have the main table's columns (one version wrote them below
            # the next table).
            for cells in rows:
                what = cells[0]
                key = ("evaluate" if "corgipile_evaluate" in what else
                       "predict_by_name" if "'epoch_times_svm'" in what else
                       "predict_by_id" if "corgipile_predict(" in what else None)
                if key and len(cells) == 6:
                    figures["predict"][key] = {**with_range(cells[1], cells[2]), "div_floor": number(cells[4])}
            rows = [cells for cells in rows if not (len(cells) == 6 and "corgipile_" in cells[0] and "`" in cells[0])]
        if header[:2] == ["what", "median s"] and "÷ scan touching arrays" in header:
            for cells in rows:
                what = cells[0]
                if what == "`SELECT count(*)`":
                    figures["count_s"] = with_range(cells[1], cells[2])
                elif "(scan floor)" in what:
                    figures["floor_s"] = with_range(cells[1], cells[2])
                elif what.startswith("epoch: "):
                    figures["epochs"][what[len("epoch: "):]] = {
                        **with_range(cells[1], cells[2]), "div_no_shuffle": number(cells[3]),
                        "div_floor": number(cells[4]), "train_accuracy": number(cells[5])}
        elif header[-1] == "÷ parallel scan floor":
            for cells in rows:
                if "corgipile_predict" in cells[0]:
                    figures.setdefault("parallel_2_workers", {})["predict_by_id_s"] = with_range(cells[1], cells[2])
                    figures["parallel_2_workers"]["predict_div_floor"] = number(cells[3])
                else:
                    figures.setdefault("parallel_2_workers", {})["floor_s"] = with_range(cells[1], cells[2])
        elif header[:2] == ["training", "statistics pass s (range)"]:
            for cells in rows:
                st_med, st_range = cells[1].split(" ", 1)
                pe_med, pe_range = cells[3].split(" ", 1)
                figures.setdefault("whole_training", {})[cells[0]] = {
                    "statistics_pass_s": with_range(st_med, st_range), "per_epoch_s": with_range(pe_med, pe_range),
                    "per_epoch_div_floor": number(cells[4])}
        elif header[0].startswith("target") and header[1:3] == ["result", "measured"]:
            for cells in rows:
                target, result, measured = cells[0], cells[1], cells[2]
                figures["targets"][target] = result
                if "in every round" in target:
                    lo, hi = span(measured)
                    figures["corgipile_double_div_floor_rounds_min"] = lo
                    figures["corgipile_double_div_floor_rounds_max"] = hi
                elif target.startswith("default training end to end"):
                    figures["default_training_per_epoch_div_floor"] = number(measured)
                elif target.startswith("statistics pass"):
                    figures["statistics_pass_div_epoch"] = number(measured)
    epochs = figures["epochs"]
    if "corgipile, double buffer" in epochs:
        figures["corgipile_double_div_floor"] = epochs["corgipile, double buffer"]["div_floor"]
        figures["corgipile_div_no_shuffle_double"] = epochs["corgipile, double buffer"]["div_no_shuffle"]
    if "corgipile, single buffer" in epochs:
        figures["corgipile_div_no_shuffle_single"] = epochs["corgipile, single buffer"]["div_no_shuffle"]
    return {k: v for k, v in figures.items() if v != {}}


def epoch_times_config(text):
    m = re.search(r"([0-9][0-9,]*) rows x (\d+) float8 features.*?svm, (\d+) epochs x (\d+) interleaved rounds", text)
    if not m:
        return None
    return {"rows": int(m.group(1).replace(",", "")), "features": int(m.group(2)), "epochs": int(m.group(3)),
            "rounds": int(m.group(4))}


def first_provenance(text):
    return next((line for line in text.splitlines()[:12] if line.startswith("Provenance: ")), None)


def pair_config(benchmark, res, command):
    """The config the script would record, from its raw numbers and (options it was not given
    take their defaults) its command; None where neither states it."""
    if benchmark == "predict_row":
        return {"rows": res["rows"], "rounds": len(next(iter(res["times"].values())))}
    if benchmark == "groups_one_pass":
        return {"rows": res["rows"], "groups": res["groups"], "epochs": res["epochs"], "rounds": res["rounds"],
                "sample": option(command, "--sample", 5, int)}
    if benchmark == "search_one_pass":
        return {k: res[k] for k in ("rows", "epochs", "mlp_epochs", "rounds")}
    if benchmark == "defaults_vs_sklearn":
        return {"seeds": res["seeds"], "models": res["models"], "datasets": [d["dataset"] for d in res["datasets"]],
                "shuffled": all("shuffled_summary" in m for d in res["datasets"] for m in d["models"].values()),
                "svm_loss": option(command, "--svm-loss", "hinge"), "params": json.loads(option(command, "--params", "{}"))}
    if benchmark == "mlp_vs_sklearn" and "--predict-only" not in command:
        return {"epochs": res["epochs"], "seeds": res["seeds"], "datasets": [d["dataset"] for d in res["datasets"]],
                "rows": option(command, "--rows", 4_500_000, int), "rounds": res["rounds"],
                "speed_epochs": res["speed_epochs"], "skip_speed": "speed" not in res,
                "predict_copies": option(command, "--predict-copies", 20, int)}
    return None


def import_sources():
    """[(record or None, source, why not)] of every run git holds that a record can be made of."""
    out = []
    # make bench / bench-quick: the harness's raw numbers, provenance line included.
    import harness
    for path in sorted(glob.glob(os.path.join(REPO, "bench", "results", "*.md.json"))):
        name = rel(path)
        if os.path.basename(path) == "predict_row.md.json":
            continue
        for commit, text in versions_in_git(name):
            source = f"{name}@{commit[:7]}"
            try:
                results = json.loads(text)
            except ValueError:
                out.append((None, source, "not JSON"))
                continue
            if not parse_provenance(results.get("provenance")):
                out.append((None, source, "no provenance line (no commit, command or CPU)"))
                continue
            try:
                figures = harness.figures(results)
            except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
                out.append((None, source, f"an older layout the harness cannot read ({type(e).__name__}: {e})"))
                continue
            cmd = parse_provenance(results["provenance"])["command"]
            config = {"only": option(cmd, "--only"), "seed": option(cmd, "--seed", 1, int)}
            out.append((imported_record(harness.benchmark(results), figures, results["provenance"], source,
                                        name[:-len(".json")], config, results.get("total_seconds")), source, None))
    # make bench-epochs: every committed version of its markdown.
    for path in sorted(glob.glob(os.path.join(REPO, "bench", "results", "epoch_times*.md"))):
        name = rel(path)
        for commit, text in versions_in_git(name):
            source = f"{name}@{commit[:7]}"
            line = first_provenance(text)
            p = parse_provenance(line)
            if not p:
                out.append((None, source, "no provenance line naming commit, command and CPUs"))
                continue
            if not p["command"].startswith("bench/epoch_times.py"):
                out.append((None, source, f"not made by bench/epoch_times.py ({p['command']})"))
                continue
            figures = epoch_times_figures(text)
            if "corgipile_double_div_floor" not in figures:
                out.append((None, source, "its tables are not bench/epoch_times.py's"))
                continue
            out.append((imported_record("epoch_times", figures, line, source, name, epoch_times_config(text)), source, None))
    # Scripts that write raw JSON next to their markdown: the pair committed together.
    pairs = [("defaults_vs_sklearn", "defaults_vs_sklearn.json", "defaults_vs_sklearn.md"),
             ("mlp_vs_sklearn", "mlp_vs_sklearn.json", "mlp_vs_sklearn.md"),
             ("groups_one_pass", "groups_one_pass.json", "groups_one_pass.md"),
             ("search_one_pass", "search_one_pass.json", "search_one_pass.md"),
             ("predict_row", "predict_row.md.json", "predict_row.md")]
    for benchmark, json_name, md_name in pairs:
        jpath, mpath = f"bench/results/{json_name}", f"bench/results/{md_name}"
        if not os.path.exists(os.path.join(REPO, jpath)):
            continue
        last_j = (git("log", "-1", "--format=%H", "--", jpath) or "").strip()
        last_m = (git("log", "-1", "--format=%H", "--", mpath) or "").strip()
        source = f"{jpath}@{last_j[:7]}"
        if not last_j or last_j != last_m:
            out.append((None, source, f"not committed together with {md_name}"))
            continue
        res = json.loads(git("show", f"{last_j}:{jpath}"))
        line = first_provenance(git("show", f"{last_m}:{mpath}") or "")
        p = parse_provenance(line)
        if not p:
            out.append((None, source, f"{md_name} has no provenance line naming commit, command and CPUs"))
            continue
        if res.get("git_head") and not (p["commit"].startswith(res["git_head"]) or res["git_head"].startswith(p["commit"])):
            out.append((None, source, f"its git_head {res['git_head']} is not the commit of {md_name} ({p['commit']})"))
            continue
        module = __import__(benchmark)
        figures = module.figures(res["times"] if benchmark == "predict_row" else res)
        config = pair_config(benchmark, res, p["command"])
        out.append((imported_record(benchmark, figures, line, source, mpath, config, res.get("total_seconds")), source, None))
    return out


def import_existing():
    existing, problems = read_runs()
    if problems:
        print("bench_ranges: fix the records first (--check)", file=sys.stderr)
        return 1
    have = {r.get("provenance") for _, _, r in existing if "imported_from" in r}
    found = import_sources()
    made = sorted((r for r, _, _ in found if r), key=lambda r: r["date"])
    appended, duplicates = {}, 0
    for r in made:
        if r["provenance"] in have:
            duplicates += 1
            continue
        have.add(r["provenance"])
        records.append_line(os.path.join(RUNS, f"{r['benchmark']}.jsonl"), r)
        appended[r["benchmark"]] = appended.get(r["benchmark"], 0) + 1
    for _, source, why in found:
        if why:
            print(f"bench_ranges: not imported: {source}: {why}")
    print(f"bench_ranges: imported {sum(appended.values())} runs ("
          + ", ".join(f"{b} {n}" for b, n in sorted(appended.items())) + f"); {duplicates} already kept or seen twice; "
          f"{sum(1 for r, _, _ in found if not r)} versions without what a record needs")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="validate the records (make lint)")
    ap.add_argument("--import-existing", action="store_true", help="one-off: records of the runs git already holds")
    ap.add_argument("--benchmark", action="append", help="only this benchmark (repeatable)")
    ap.add_argument("--figure", help="only figures whose name contains this text")
    ap.add_argument("--version", action="append", help="only runs of this corgipile version (repeatable)")
    ap.add_argument("--major", action="append", type=int, help="only runs on this PostgreSQL major (repeatable)")
    ap.add_argument("--commit", action="append", help="only runs of a commit starting with this (repeatable)")
    ap.add_argument("--since", help="only runs on or after this date (YYYY-MM-DD)")
    ap.add_argument("--clean", action="store_true", help="leave out runs of uncommitted (or unknown) code")
    ap.add_argument("--no-imported", action="store_true", help="leave out records imported from results files")
    ap.add_argument("--quote", action="store_true", help="one line per figure, with builds and CPUs")
    ap.add_argument("--digits", type=int, default=3, help="significant digits shown (default 3)")
    args = ap.parse_args()
    if args.check:
        return check()
    if args.import_existing:
        return import_existing()
    runs, problems = read_runs()
    for p in problems:
        print(f"bench_ranges: skipped: {p}", file=sys.stderr)
    return ranges(select(runs, args), args)


if __name__ == "__main__":
    sys.exit(main())
