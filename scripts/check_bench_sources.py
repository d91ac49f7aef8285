#!/usr/bin/env python3
"""Every results file the README quotes names the corgipile version and the command that made it.

For each `bench/results/<name>.md` the README mentions (a link or a path): the file exists, and
one of its first lines is a provenance line (bench/provenance.py writes it) of the form
`Provenance: corgipile <version>, ..., command ... \u0060...\u0060, ...` whose version is this checkout's
(Cargo.toml), or, while that version is unreleased (CHANGELOG.md's newest heading says
"Unreleased"), the last released one (the newest install script in sql/released/): a release
re-measures what it quotes, and until then the README says which version measured a figure. A
figure measured on any other version, or by hand, fails `make lint`.

Usage: scripts/check_bench_sources.py [README.md]"""

import pathlib
import re
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
HEAD_LINES = 12  # the provenance line is among the first lines of a results file


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


def main():
    readme = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "README.md"
    want = version()
    accepted = {want, last_released()} - {None}
    quoted = sorted(set(re.findall(r"bench/results/[\w.\-]+\.md", readme.read_text())))
    problems = []
    for rel in quoted:
        path = REPO / rel
        if not path.exists():
            problems.append(f"{rel}: quoted by the README, but there is no such file")
            continue
        head = path.read_text().splitlines()[:HEAD_LINES]
        line = next((h for h in head if h.startswith("Provenance: ")), None)
        if line is None:
            problems.append(f"{rel}: no 'Provenance: ' line in its first {HEAD_LINES} lines")
            continue
        found = re.match(r"Provenance: corgipile (\S+?),", line)
        if not found or found.group(1) not in accepted:
            problems.append(f"{rel}: made by corgipile {found.group(1) if found else '?'}, this is {want}")
        if not re.search(r"command .*`[^`]+`", line):
            problems.append(f"{rel}: its provenance line names no command")
    for p in problems:
        print(f"check_bench_sources: {p}", file=sys.stderr)
    if problems:
        print("check_bench_sources: rerun the benchmark (make bench-...) on this version, or stop quoting it",
              file=sys.stderr)
        return 1
    print(f"check_bench_sources: {len(quoted)} results files quoted by the README, each made by corgipile "
          f"{' or '.join(sorted(accepted))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
