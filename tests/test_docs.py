"""The docs run: every SQL example in README.md and docs/*.md, and every output they show.

Each page runs in a fresh database of its own: docs/examples/tables.sql first (the example tables
the docs point newcomers to), then every ```sql block of the page in order, in one psql session
(so a SET or a model of one block is there for the next), fed on stdin as pg_regress feeds its
suites (`psql -X -q`: no command tags; notices and errors in the same stream).

What a page must hold to pass:
- A ```sql block that runs without an ERROR — unless the output shown for it shows that ERROR.
- The output shown for a block: a ```text fence right after the ```sql fence (only blank lines
  between) is what psql prints for the whole block, compared line by line (trailing blanks
  ignored). A line `...` stands for any number of lines, and `…` inside a line for any text. A
  NOTICE the page does not show is not compared (trainings report their epochs and timings).
- `<!-- doc-test: skip: <why> -->` on the line before a ```sql fence leaves that block out (the
  reason is required; the test prints them); ```sh and other fences never run.
- Every relative link points at a file that exists, and every `#anchor` at a heading of it.

By hand, against the running test cluster (PGHOST/PGPORT/PGUSER as `make pytest` sets them):
    .venv/bin/python tests/test_docs.py docs/guide.md     # one page, its failures and skips
"""

import os
import pathlib
import re
import subprocess
import sys

import psycopg
import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
TABLES = REPO / "docs" / "examples" / "tables.sql"
MARKER = "@@doc-test block {}@@"
SKIP = re.compile(r"<!--\s*doc-test:\s*skip:\s*(\S.*?)\s*-->")
ROLE = re.compile(r"\bCREATE\s+(?:ROLE|USER)\s+(\w+)", re.IGNORECASE)


def doc_pages():
    pages = [REPO / "README.md"] + sorted((REPO / "docs").glob("**/*.md"))
    return [p for p in pages if p.exists()]


class Block:
    def __init__(self, line, sql, skip):
        self.line, self.sql, self.skip, self.expected = line, sql, skip, None


def parse(text):
    """The ```sql blocks of a page (with the ```text output shown after each, if any)."""
    lines = text.split("\n")
    blocks, i, last = [], 0, None  # last: the sql block an output fence may belong to
    while i < len(lines):
        fence = re.match(r"^(\s*)```\s*([\w-]*)", lines[i])
        if not fence:
            if lines[i].strip():
                last = None
            i += 1
            continue
        info, start = fence.group(2).lower(), i
        body = []
        i += 1
        while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        if info == "sql":
            prev = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
            skip = SKIP.search(prev)
            blocks.append(Block(start + 1, "\n".join(body), skip.group(1) if skip else None))
            last = blocks[-1]
        elif info in ("text", "") and last is not None and last.expected is None:
            last.expected = body
            last = None
        else:
            last = None
    return blocks


def normalize(out):
    lines = [re.sub(r"^psql:[^:]*:\d+: ", "", line).rstrip() for line in out.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    while lines and not lines[0]:
        lines.pop(0)
    return lines


def drop_notices(lines):
    """Lines other than NOTICEs (and their DETAIL/HINT/CONTEXT continuation lines)."""
    kept, in_notice = [], False
    for line in lines:
        if line.startswith("NOTICE:"):
            in_notice = True
            continue
        if in_notice and re.match(r"^(DETAIL|HINT|CONTEXT):", line):
            continue
        in_notice = False
        kept.append(line)
    return kept


def line_matches(pattern, line):
    if "…" not in pattern:
        return pattern.rstrip() == line
    parts = [re.escape(p) for p in pattern.rstrip().split("…")]
    return re.fullmatch(".*".join(parts), line, re.DOTALL) is not None


def matches(expected, actual):
    """expected (with `...` lines and `…` spans) against actual, line by line."""
    if not expected:
        return not actual
    if expected[0].strip() == "...":
        rest = expected[1:]
        return any(matches(rest, actual[k:]) for k in range(len(actual) + 1))
    return bool(actual) and line_matches(expected[0], actual[0]) and matches(expected[1:], actual[1:])


def run_page(page):
    """Runs a page's blocks; returns (failures, skips) as lists of strings."""
    blocks = parse(page.read_text())
    dbname = "corgipile_docs_" + re.sub(r"\W", "_", page.stem.lower())
    roles = sorted(set(ROLE.findall(page.read_text())))
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)")
        drop_roles(admin, roles)
        admin.execute(f"CREATE DATABASE {dbname}")
    script = [f"\\i {TABLES}", "\\pset pager off", "\\set ON_ERROR_STOP 0"]
    run = [b for b in blocks if b.skip is None]
    for n, b in enumerate(run):
        script += [f"\\echo '{MARKER.format(n)}'", b.sql]
    script.append(f"\\echo '{MARKER.format(len(run))}'")
    psql = os.path.join(os.environ["CORGIPILE_PG_BIN"], "psql") if os.environ.get("CORGIPILE_PG_BIN") else "psql"
    try:
        proc = subprocess.run([psql, "-X", "-q", "-d", dbname], input="\n".join(script) + "\n",
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600,
                              cwd=REPO)
        out = proc.stdout
    finally:
        with psycopg.connect(dbname="postgres", autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)")
            drop_roles(admin, roles)
    failures = [f"{page.relative_to(REPO)}:{b.line}: the block does not end its last statement with ;"
                for b in run if not ends_statement(b.sql)]
    pieces = out.split(MARKER.format(0) + "\n", 1)
    if len(pieces) != 2:
        return [f"{page.name}: docs/examples/tables.sql did not run:\n{out[-2000:]}"], []
    if any(line.startswith("ERROR:") for line in normalize(pieces[0])):
        failures.append(f"{page.name}: docs/examples/tables.sql failed:\n{pieces[0][-2000:]}")
    rest = pieces[1]
    for n, b in enumerate(run):
        head, _, rest = rest.partition(MARKER.format(n + 1) + "\n")
        actual = normalize(head)
        where = f"{page.relative_to(REPO)}:{b.line}"
        errors = [line for line in actual if line.startswith("ERROR:")]
        if b.expected is None:
            if errors:
                failures.append(f"{where}: the example fails:\n{b.sql}\n--- psql printed:\n" + "\n".join(actual))
            continue
        expected = [line.rstrip() for line in b.expected]
        while expected and not expected[-1]:
            expected.pop()
        compared = actual if any(line.startswith("NOTICE:") for line in expected) else drop_notices(actual)
        if not matches(expected, compared):
            failures.append(f"{where}: the output shown is not what psql prints:\n{b.sql}\n--- shown:\n"
                            + "\n".join(expected) + "\n--- psql printed:\n" + "\n".join(compared))
    skips = [f"{page.relative_to(REPO)}:{b.line}: {b.skip}" for b in blocks if b.skip is not None]
    return failures, skips


def ends_statement(sql):
    """The last line that is not blank or a comment ends with ; or is a psql meta-command."""
    code = [line.strip() for line in sql.split("\n") if line.strip() and not line.strip().startswith("--")]
    return not code or code[-1].endswith(";") or code[-1].startswith("\\") or "\\g" in code[-1]


def drop_roles(admin, roles):
    for role in roles:
        if admin.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
            for (db,) in admin.execute("SELECT datname FROM pg_database WHERE datallowconn").fetchall():
                try:
                    with psycopg.connect(dbname=db, autocommit=True) as c:
                        c.execute(f'DROP OWNED BY "{role}" CASCADE')
                except psycopg.Error:
                    pass
            admin.execute(f'DROP ROLE IF EXISTS "{role}"')


def slug(heading):
    """GitHub's anchor of a heading."""
    text = re.sub(r"[`*]|<[^>]+>", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page):
    seen, out = {}, set()
    in_fence = False
    for line in page.read_text().split("\n"):
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
        if in_fence or not line.startswith("#"):
            continue
        s = slug(line.lstrip("#"))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def broken_links(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    problems = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            problems.append(f"{page.relative_to(REPO)}: link to {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{page.relative_to(REPO)}: link to {target}: no such heading")
    return problems


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_example_runs_as_shown(page):
    failures, skips = run_page(page)
    for s in skips:
        print("skipped:", s)
    assert not failures, "\n\n".join(failures)


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_links_resolve(page):
    assert not broken_links(page)


def test_the_runner_catches_a_wrong_example():
    """The runner itself: a failing example, a wrong output and a skip are all seen."""
    page = parse("```sql\nSELECT 1/0;\n```\n\n```sql\nSELECT 2 AS x;\n```\n\n```text\n x\n---\n 3\n```\n"
                 "<!-- doc-test: skip: needs two servers -->\n```sql\nSELECT 3;\n```\n")
    assert [b.skip for b in page] == [None, None, "needs two servers"]
    assert page[1].expected == [" x", "---", " 3"]
    assert matches(["a", "...", "d"], ["a", "b", "c", "d"]) and not matches(["a", "...", "d"], ["a", "b"])
    assert line_matches("took … s", "took 0.3 s") and not line_matches("took … s", "took 0.3 ms")


if __name__ == "__main__":
    bad = 0
    for arg in sys.argv[1:] or [str(p) for p in doc_pages()]:
        page = pathlib.Path(arg).resolve()
        failures, skips = run_page(page)
        failures += broken_links(page)
        for s in skips:
            print("skipped:", s)
        for f in failures:
            print(f"\nFAIL {f}")
        print(f"{page.relative_to(REPO)}: {len(parse(page.read_text()))} sql blocks, {len(failures)} failures")
        bad += len(failures)
    sys.exit(1 if bad else 0)
