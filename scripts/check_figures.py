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
selects the runs made beside a busy neighbour (bench/epoch_times.py --busy-neighbour),
`busy_neighbour=group_nice_19` those beside one in an autogroup at nice 19
(--neighbour-group-nice); they are otherwise left out. The page's own words
about the runs ("3 kept runs") are the author's; the marker's `runs` keeps them honest.

A figure without a marker must be in a results file its section cites (issue #53, item 2).
In the sections that report measurements -- all of docs/results.md, the sections of SCOPE
below, and any section that carries a figure marker or cites a bench/results/*.md file -- every
*figure* outside code (fenced blocks and `code spans`), HTML comments, link targets, headings
and tables' header rows and first column is found:

  - a number with a unit of measurement or a ratio: `1.07×`, `0.42 s`, `120 ms`, `20 ns`,
    `3.5 MB`, `+0.14 points`, `71%` (units: × % s ms µs ns min minutes MB GB MiB GiB kB KB point(s));
  - any number with a decimal part (`0.9708`, `2.36`, `1.5 to 2.5`): an accuracy or a ratio;
  - a range with a dash (`289–293`) and a number right before or after `→` (`403 → 425`):
    a spread or a before-and-after of a measurement;
  - in a table's cells (not its first column, which names the row): every number.

Not figures: other whole numbers in prose without a unit (counts of rows, epochs, seeds, runs, tests),
a number run into letters (`4.5M`, `8da9482`), a dotted version (`0.5.0`, `§7.3.4`), the
number after "PostgreSQL" (its version). A range `lo–hi` (or `lo to hi`) is one figure.

Each figure must be (a) covered by a figure marker (the text right after it), or (b) in a
results file bench/results/*.md (not HISTORY.md) that the same section (the text under the
same `#`, `##` or `###` heading) cites by path, a file scripts/check_bench_sources.py ties to a
build, or (c) allowed: an HTML comment right before it,

    <!-- not-a-measurement: the reason -->10%

for a number in such a section that is a setting, a target, a default or a property of the
data rather than a measurement (the comment covers that one number; a comment that is not
right before a figure is an error). "In the file" is verbatim, up to these equivalences: the
unit is not compared (`1.07×` is `1.07`, `0.42 s` is `0.42`), thousands separators are
ignored (`4,500,000` is `4500000`), `−` is `-`, a leading `+` or `±` is dropped, and a range's
dash may be `–`, `-` or ` to ` (`1.07–1.10` is `1.07 to 1.10`); digits are never rounded or
padded (`1.10` is not `1.1`).

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


def walk(value, parts):
    """The figure at a path of keys joined by " / "; a key may itself hold " / " (the harness's
    "susy (4,500,000 x 18, clustered) / svm"): the longest key that leads to a figure wins."""
    if not parts:
        return value
    if not isinstance(value, dict):
        return None
    for n in range(len(parts), 0, -1):
        key = " / ".join(parts[:n])
        if key in value:
            found = walk(value[key], parts[n:])
            if found is not None:
                return found
    return None


def neighbour(run):
    """The run's busy neighbour as a marker names it: "false" (none), "true" (a process at nice 19
    in the benchmark's own session), or the kind the record names (e.g. "group_nice_19": in a
    session of its own whose autogroup is at nice 19)."""
    v = (run.get("config") or {}).get("busy_neighbour")
    return "false" if not v else "true" if v is True else str(v)


def figure(runs, benchmark, s):
    """(quoted text, number of runs) of the figure the marker selects."""
    chosen = [r for r in runs
              if r["benchmark"] == benchmark
              and r.get("dirty") is False
              and (r.get("postgres") or {}).get("major") == int(s["major"])
              and ("commit" not in s or any((r.get("commit") or "").startswith(c) for c in s["commit"].split(",")))
              and ("version" not in s or r.get("version") == s["version"])
              # A run beside a busy neighbour is its own figure (bench/epoch_times.py --busy-neighbour).
              and neighbour(r) == s.get("busy_neighbour", "false")]
    values = [walk(r["figures"], s["path"].split(" / ")) for r in chosen]
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


# ---------------------------------------------------------------- figures without a record

# The sections that report measurements besides those found by themselves (a figure marker or
# a cited bench/results/*.md file): page -> None (every section) or the headings' titles (the
# first section of a page is its `#` title's).
SCOPE = {
    "docs/results.md": None,
    "README.md": ["corgipile", "Limits"],
    "docs/training.md": ["Training enough by default"],
}
UNITS = r"(?:×|\s?%|\s?(?:ms|µs|ns|s|min|minutes|MB|GB|MiB|GiB|kB|KB|points?)(?![\w]))"
NUMBER = r"[+±−-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
# A number (or range) not inside a word, an identifier or a dotted version, then its unit if any.
FIGURE = re.compile(rf"(?<![\w.,/#§])(?P<num>{NUMBER}(?:\s?–\s?{NUMBER}| to {NUMBER})?)(?P<unit>{UNITS})?"
                    r"(?![\w]|\.\d)")
NOT_A_MEASUREMENT = re.compile(r"<!--\s*not-a-measurement:(?P<reason>.*?)-->", re.S)
CITED = re.compile(r"bench/results/[\w.\-]+\.md")
NOT_RESULTS = {"bench/results/HISTORY.md"}  # the measurement history (check_bench_sources.py)


def blank(text, start, end):
    """text with [start, end) replaced by spaces, its newlines kept (offsets stay valid)."""
    return text[:start] + re.sub(r"[^\n]", " ", text[start:end]) + text[end:]


def code_blanked(text):
    """The page with its fenced code blocks blanked, every offset kept."""
    for m in reversed(list(re.finditer(r"^```.*?^```", text, re.S | re.M))):
        text = blank(text, m.start(), m.end())
    return text


def sections(text):
    """[(title, start, end)] of the page: each `#`, `##` or `###` heading (outside code blocks)
    starts one, the first from the page's start; deeper headings stay in theirs."""
    starts = [(m.group(2).strip(), m.start()) for m in re.finditer(r"^(#{1,3}) +(.*)$", code_blanked(text), re.M)]
    if not starts:
        return [(None, 0, len(text))]
    starts[0] = (starts[0][0], 0)
    return [(title, start, starts[i + 1][1] if i + 1 < len(starts) else len(text))
            for i, (title, start) in enumerate(starts)]


def visible(text):
    """(the text a reader sees as prose or table cells, [end of each not-a-measurement comment])
    with everything else blanked: code blocks and spans, HTML comments (a figure marker with the
    figure it covers), link targets, headings, table header rows and first cells."""
    text = code_blanked(text)
    for m in reversed(list(re.finditer(r"`[^`]*`", text))):
        if "\n\n" not in m.group(0):
            text = blank(text, m.start(), m.end())
    allowed = [m.end() for m in NOT_A_MEASUREMENT.finditer(text)]
    for m in reversed(list(re.finditer(r"<!--.*?-->", text, re.S))):
        end = m.end()
        if MARKER.match(text, m.start()):
            end = MARKER.match(text, m.start()).end()
        text = blank(text, m.start(), end)
    for m in reversed(list(re.finditer(r"\]\([^)\s]*\)", text))):
        text = blank(text, m.start() + 1, m.end())
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if line.startswith("#"):
            lines[i] = " " * len(line)
        elif re.match(r"^\|?\s*:?-{3,}", line) and line.strip().startswith("|"):
            lines[i] = " " * len(line)
            if i and lines[i - 1].lstrip().startswith("|"):
                lines[i - 1] = " " * len(lines[i - 1])
        elif line.lstrip().startswith("|"):
            first = line.index("|", line.index("|") + 1) if line.count("|") > 1 else len(line)
            lines[i] = " " * first + line[first:]
    return "\n".join(lines), allowed


def normalized(text):
    """Text with the equivalences of figures applied: − as -, no thousands separators, no
    leading + or ±, ranges' dashes and "to" as –."""
    text = text.replace("−", "-")
    text = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", text)
    text = re.sub(r"[+±](?=\d)", "", text)
    return text


def numbers_of(figure):
    """The number or (lo, hi) of a figure's text, normalized."""
    parts = re.split(r"\s?–\s?| to ", normalized(figure))
    return [p.strip() for p in parts]


def in_file(figure, text):
    """Whether the figure (a number or a range) is in the normalized text of a results file."""
    nums = [re.escape(n) for n in numbers_of(figure)]
    edge_l, edge_r = r"(?<![\d.\w-])", r"(?!\d|\.\d)"
    if len(nums) == 1:
        pattern = edge_l + nums[0] + edge_r
    else:
        pattern = edge_l + nums[0] + r"\s?(?:–|-| to )\s?" + nums[1] + edge_r
    return re.search(pattern, text) is not None


def in_scope(rel, title, raw):
    """Whether a section reports measurements (and so is checked)."""
    if rel in SCOPE and (SCOPE[rel] is None or title in SCOPE[rel]):
        return True
    shown = code_blanked(raw)
    return bool(MARKER.search(shown)) or any(c not in NOT_RESULTS for c in CITED.findall(shown))


def page_figures(page, root=REPO):
    """(problems, {"marked": n, "cited": n, "allowed": n}) of the figures of a page's
    measurement sections."""
    page = pathlib.Path(page)
    rel = page.relative_to(root).as_posix() if page.is_relative_to(root) else str(page)
    text = page.read_text()
    problems, counts = [], {"marked": 0, "cited": 0, "allowed": 0}
    shown, allowed = visible(text)

    def where(offset):
        return f"{rel}:{text.count(chr(10), 0, offset) + 1}"

    for title, start, end in sections(text):
        raw = text[start:end]
        pending = [a for a in allowed if start <= a < end]
        if not in_scope(rel, title, raw):
            problems += [f"{where(a)}: a not-a-measurement comment outside the sections checked" for a in pending]
            continue
        counts["marked"] += len(MARKER.findall(code_blanked(raw)))
        files = sorted({c for c in CITED.findall(code_blanked(raw)) if c not in NOT_RESULTS})
        contents = [normalized((root / f).read_text()) for f in files if (root / f).exists()]
        for m in FIGURE.finditer(shown, start, end):
            num, unit = m.group("num"), m.group("unit")
            line_start = shown.rfind("\n", 0, m.start()) + 1
            in_table = text[line_start:].lstrip().startswith("|")
            compared = re.search(r"→\s*$", shown[line_start:m.start()]) or re.match(r"\s*→", shown[m.end():])
            if not (unit or "." in num or "–" in num or compared or in_table):
                continue
            if re.search(r"PostgreSQL\s*$", text[max(0, m.start() - 12):m.start()]):
                continue  # its version
            allowing = [a for a in pending if a <= m.start() and not shown[a:m.start()].strip()]
            if allowing:
                pending.remove(allowing[0])
                counts["allowed"] += 1
            elif any(in_file(num, body) for body in contents):
                counts["cited"] += 1
            else:
                problems.append(f"{where(m.start())}: {m.group(0).strip()!r} (section {title!r}): no figure marker, "
                                "and not in " + (f"the results files the section cites ({', '.join(files)})"
                                                 if files else "a results file: the section cites none"))
        problems += [f"{where(a)}: a not-a-measurement comment not right before a figure" for a in pending]
    return problems, counts


def main():
    pages = [pathlib.Path(a).resolve() for a in sys.argv[1:]] or [REPO / "README.md"] + sorted((REPO / "docs").glob("**/*.md"))
    runs = [r for _name, _n, r in read_runs()[0]]
    problems, count = [], 0
    totals = {"marked": 0, "cited": 0, "allowed": 0}
    for page in pages:
        p, n = check_page(page, runs)
        problems += p
        count += n
        p, counts = page_figures(page)
        problems += p
        for k in totals:
            totals[k] += counts[k]
    for p in problems:
        print(f"check_figures: {p}", file=sys.stderr)
    if problems:
        print(f"check_figures: {len(problems)} problems: quote a figure with a marker (scripts/bench_ranges.py "
              f"--quote), cite the results file that holds it, or say why it is not a measurement",
              file=sys.stderr)
        return 1
    print(f"check_figures: {count} marked figures, each what its run records say; in the sections that report "
          f"measurements, {totals['cited']} more figures are in the results files they cite and "
          f"{totals['allowed']} numbers are marked not-a-measurement")
    return 0


if __name__ == "__main__":
    sys.exit(main())
