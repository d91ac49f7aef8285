#!/usr/bin/env python3
"""Every figure the docs quote with a figure marker is what the kept run records say.

A marker is an HTML comment (invisible on the rendered page) right before the figure:

    <!-- figure epoch_times major=15 commit=3365391 runs=3
         path="epochs / corgipile, double buffer / div_floor" -->1.07–1.10×

The records (bench/results/runs/<benchmark>.jsonl, clean runs only: committed code) of that
benchmark, PostgreSQL major and commits (comma-separated prefixes; or `version=0.5.0`) are
selected, and the figure at `path` over them must be exactly the text after the marker: its
range `lo–hi` (or one value when they agree) in `digits` significant digits (default 3, as
scripts/bench_ranges.py prints), and the number of runs must be `runs`. `busy_neighbour=true`
selects the runs made beside a busy neighbour (bench/epoch_times.py --busy-neighbour), which
are otherwise left out. The page's own words
about the runs ("3 kept runs") are the author's; the marker's `runs` keeps them honest.

Usage: scripts/check_figures.py [page.md ...]   (default: README.md and docs/**/*.md)
Run by `make lint`."""

import pathlib
import re
import shlex
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_ranges import fmt, read_runs, summarize_figure  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parent.parent
MARKER = re.compile(r"<!--\s*figure\s+(?P<args>.*?)-->(?P<after>[^\s<]*)", re.S)


def parse(args):
    """The marker's benchmark and key=value settings."""
    words = shlex.split(args)
    if not words or "=" in words[0]:
        raise ValueError("a marker starts with the benchmark's name")
    settings = dict(w.split("=", 1) for w in words[1:] if "=" in w)
    unknown = set(settings) - {"major", "commit", "version", "path", "runs", "digits", "busy_neighbour"}
    if unknown or len(settings) != len(words) - 1:
        raise ValueError(f"unknown settings {sorted(unknown)}" if unknown else "a setting without a value")
    if "path" in settings:  # a path may wrap to the next line of the page
        settings["path"] = " ".join(settings["path"].split())
    for needed in ("major", "path", "runs"):
        if needed not in settings:
            raise ValueError(f"a marker needs {needed}=")
    if "commit" not in settings and "version" not in settings:
        raise ValueError("a marker names the build: commit= or version=")
    return words[0], settings


def figure(runs, benchmark, s):
    """(quoted text, number of runs) of the figure the marker selects."""
    chosen = [r for r in runs
              if r["benchmark"] == benchmark
              and r.get("dirty") is False
              and (r.get("postgres") or {}).get("major") == int(s["major"])
              and ("commit" not in s or any((r.get("commit") or "").startswith(c) for c in s["commit"].split(",")))
              and ("version" not in s or r.get("version") == s["version"])
              # A run beside a busy neighbour is its own figure (bench/epoch_times.py --busy-neighbour).
              and bool((r.get("config") or {}).get("busy_neighbour")) == (s.get("busy_neighbour") == "true")]
    values = []
    for r in chosen:
        v = r["figures"]
        for k in s["path"].split(" / "):
            v = v.get(k) if isinstance(v, dict) else None
        values.append(v)
    if not values or all(v is None for v in values):
        return None, 0
    kind, summary = summarize_figure(values)
    if kind != "number":
        return None, len(values)
    lo, _, hi, n, _ = summary
    digits = int(s.get("digits", 3))
    text = fmt(lo, digits) if fmt(lo, digits) == fmt(hi, digits) else f"{fmt(lo, digits)}–{fmt(hi, digits)}"
    return text, n


def without_code_blocks(text):
    """The page with its fenced code blocks blanked (their lines kept): a marker shown as an
    example is not a figure."""
    return re.sub(r"^```.*?^```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S | re.M)


def check_page(page, runs):
    problems, count = [], 0
    text = without_code_blocks(page.read_text())
    for m in MARKER.finditer(text):
        count += 1
        line = text.count("\n", 0, m.start()) + 1
        where = f"{page.relative_to(REPO) if page.is_relative_to(REPO) else page}:{line}"
        try:
            benchmark, s = parse(m.group("args"))
        except ValueError as e:
            problems.append(f"{where}: {e}")
            continue
        quoted, n = figure(runs, benchmark, s)
        if quoted is None:
            problems.append(f"{where}: no clean run record of {benchmark} gives a number at \"{s['path']}\"")
            continue
        if not m.group("after").startswith(quoted):
            problems.append(f"{where}: the page says {m.group('after')!r}, the {n} records say {quoted}")
        if n != int(s["runs"]):
            problems.append(f"{where}: the marker says runs={s['runs']}, {n} records match")
    return problems, count


def main():
    pages = [pathlib.Path(a) for a in sys.argv[1:]] or [REPO / "README.md"] + sorted((REPO / "docs").glob("**/*.md"))
    runs = [r for _name, _n, r in read_runs()[0]]
    problems, count = [], 0
    for page in pages:
        p, n = check_page(page, runs)
        problems += p
        count += n
    for p in problems:
        print(f"check_figures: {p}", file=sys.stderr)
    if problems:
        return 1
    print(f"check_figures: {count} marked figures, each what its run records say")
    return 0


if __name__ == "__main__":
    sys.exit(main())
