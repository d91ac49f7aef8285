#!/usr/bin/env python3
"""Every results file the docs quote names the corgipile version and the command that made it.

For each `bench/results/<name>.md` that README.md or a page of docs/ (docs/**/*.md) mentions (a
link or a path): the file exists, and
one of its first lines is a provenance line (bench/provenance.py writes it) of the form
`Provenance: corgipile <version>, ..., command ... \u0060...\u0060, ...` whose version is this checkout's
(Cargo.toml), or, while that version is unreleased (CHANGELOG.md's newest heading says
"Unreleased"), the last released one (the newest install script in sql/released/): a release
re-measures what it quotes, and until then the docs say which version measured a figure. A
figure measured on any other version, or by hand, fails `make lint`.

bench/results/HISTORY.md is not a results file but the measurement history (earlier versions'
figures): the docs may link it, and what it quotes is not checked.

Usage: scripts/check_bench_sources.py [page.md ...]   (default: README.md and docs/**/*.md)"""

import pathlib
import re
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
HEAD_LINES = 12  # the provenance line is among the first lines of a results file
NOT_RESULTS = {"bench/results/HISTORY.md"}  # the measurement history, not a results file


def version():
    text = (REPO / "Cargo.toml").read_text()
    return re.search(r'^version\s*=\s*"([^"]+)"', text, re.M).group(1)


def last_released():
    """The newest version in sql/released/ if the current version is still unreleased, else None."""
    changelog = (REPO / "CHANGELOG.md").read_text()
    newest = re.search(r"^## (.*)$", changelog, re.M)
    if not newest or not newest.group(1).startswith("Unreleased"):
        return None
    released = [p.name[len("corgipile--"):-len(".sql")] for p in (REPO / "sql" / "released").glob("corgipile--*.sql")]
    return max(released, key=lambda v: tuple(int(x) for x in v.split(".")), default=None)


def pages():
    """The pages whose quotes are checked: the arguments, or README.md and every page of docs/."""
    if len(sys.argv) > 1:
        return [pathlib.Path(a) for a in sys.argv[1:]]
    return [REPO / "README.md"] + sorted((REPO / "docs").glob("**/*.md"))


def main():
    want = version()
    accepted = {want, last_released()} - {None}
    quoted_by = {}  # results file -> the pages quoting it
    for page in pages():
        for rel in set(re.findall(r"bench/results/[\w.\-]+\.md", page.read_text())):
            if rel not in NOT_RESULTS:
                quoted_by.setdefault(rel, []).append(page.relative_to(REPO).as_posix()
                                                      if page.is_relative_to(REPO) else str(page))
    quoted = sorted(quoted_by)
    problems = []
    for rel in quoted:
        path = REPO / rel
        if not path.exists():
            problems.append(f"{rel}: quoted by {', '.join(quoted_by[rel])}, but there is no such file")
            continue
        head = path.read_text().splitlines()[:HEAD_LINES]
        line = next((h for h in head if h.startswith("Provenance: ")), None)
        if line is None:
            problems.append(f"{rel} (quoted by {', '.join(quoted_by[rel])}): no 'Provenance: ' line in its first {HEAD_LINES} lines")
            continue
        found = re.match(r"Provenance: corgipile (\S+?),", line)
        if not found or found.group(1) not in accepted:
            problems.append(f"{rel} (quoted by {', '.join(quoted_by[rel])}): made by corgipile "
                            f"{found.group(1) if found else '?'}, this is {want}")
        if not re.search(r"command .*`[^`]+`", line):
            problems.append(f"{rel} (quoted by {', '.join(quoted_by[rel])}): its provenance line names no command")
    for p in problems:
        print(f"check_bench_sources: {p}", file=sys.stderr)
    if problems:
        print("check_bench_sources: rerun the benchmark (make bench-...) on this version, or stop quoting it",
              file=sys.stderr)
        return 1
    print(f"check_bench_sources: {len(quoted)} results files quoted by README.md and docs/, each made by "
          f"corgipile {' or '.join(sorted(accepted))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
