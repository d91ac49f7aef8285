"""docs/reference.md against the extension it documents, so that the reference cannot fall behind
the code: every function the extension owns is documented, every function the page names
exists, every `corgipile.*` setting is in the Settings table with its real default and context,
and every table and view of schema `corgipile` is in the Catalog section with all its columns.
(The param table of the page is checked against the code by ml/tests/reference_params.rs.)

Formats the page keeps, and these tests read:
- Functions (`## Functions`): a function is documented when a `###` heading of that section, or a
  line of it that starts with `name(` (the signatures in its ```text blocks), names it. Overloads
  are grouped by name.
- Settings (`## Settings`): one row per setting in the table whose header starts with
  `| setting | default |`: `` | `name` | `default` | who may set it | bounds | ``, the default
  written as PostgreSQL's SHOW writes it (`512MB`), the who-may-set-it cell naming pg_settings'
  context (`` context `superuser` ``); and a `### `name`` heading for each setting.
- Catalog (`## Catalog`): a `### `corgipile.x`` heading per table and view, and every column
  of it in backticks in that subsection.
"""

import re

from helpers import REPO

REFERENCE = REPO / "docs" / "reference.md"


def page():
    return REFERENCE.read_text()


def section(text, title):
    """The body of the `## title` section (up to the next `## ` heading), outside nothing."""
    start = re.search(rf"^## {re.escape(title)}\s*$", text, re.MULTILINE)
    assert start, f"docs/reference.md has no '## {title}' section"
    rest = text[start.end():]
    end = re.search(r"^## ", rest, re.MULTILINE)
    return rest[:end.start()] if end else rest


def subsections(body):
    """{heading text: body} of the `### ` headings of a section."""
    parts = re.split(r"^### (.*)$", body, flags=re.MULTILINE)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def names(word):
    """A regex matching `word` as a whole name (not a prefix of a longer one)."""
    return re.compile(rf"(?<![\w.]){re.escape(word)}(?![\w])")


def extension_functions(conn):
    """Every function the corgipile extension owns, by name (overloads grouped)."""
    rows = conn.execute("""
        SELECT DISTINCT p.proname
        FROM pg_catalog.pg_proc p
        JOIN pg_catalog.pg_depend d ON d.classid = 'pg_catalog.pg_proc'::regclass AND d.objid = p.oid
                                    AND d.deptype = 'e'
        JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid AND e.extname = 'corgipile'
        ORDER BY 1""").fetchall()
    return [r[0] for r in rows]


def test_every_function_of_the_extension_is_documented(conn):
    functions = extension_functions(conn)
    assert len(functions) > 20, functions
    body = section(page(), "Functions")
    headings = [h for h in subsections(body)]
    signature_lines = [line.strip() for line in body.split("\n")]
    missing = []
    for name in functions:
        pattern = names(name)
        in_heading = any(pattern.search(h) for h in headings)
        in_signature = any(line.startswith(f"{name}(") for line in signature_lines)
        if not (in_heading or in_signature):
            missing.append(name)
    assert not missing, f"functions of the extension not documented in docs/reference.md: {missing}"


def test_every_function_the_reference_names_exists(conn):
    functions = set(extension_functions(conn))
    # corgipile_model_42 is the default name of an exported function (corgipile_export_sql).
    named = set(re.findall(r"(?<![\w.])corgipile_\w+", page())) - {"corgipile_model_42"}
    unknown = sorted(named - functions)
    assert not unknown, f"docs/reference.md names functions the extension does not have: {unknown}"


def shown_as_show_does(value, unit):
    """A setting's value in pg_settings' base unit, as SHOW prints it (524288 kB -> 512MB)."""
    if unit in ("B", "kB", "MB", "8kB"):
        factor = {"B": 1, "kB": 1024, "MB": 1024 ** 2, "8kB": 8192}[unit]
        size = int(value) * factor
        for suffix, bytes_ in (("TB", 1024 ** 4), ("GB", 1024 ** 3), ("MB", 1024 ** 2), ("kB", 1024)):
            if size % bytes_ == 0:
                return f"{size // bytes_}{suffix}"
        return f"{size}B"
    return value if unit is None else f"{value}{unit}"


def settings_table(body):
    """The rows of the Settings table: {name: [cells after the name]}."""
    lines = body.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("| setting | default |"))
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[cells[0].strip("`")] = cells[1:]
    return rows


def test_every_setting_is_documented_with_its_default(conn):
    # The settings exist once the library is loaded in the session (a corgipile call loads it).
    conn.execute("LOAD 'corgipile'")
    settings = conn.execute("""SELECT name, boot_val, unit, context FROM pg_catalog.pg_settings
                               WHERE name LIKE 'corgipile.%' ORDER BY name""").fetchall()
    assert settings, "no corgipile.* setting in pg_settings after LOAD 'corgipile'"
    body = section(page(), "Settings")
    table = settings_table(body)
    headings = subsections(body)
    for name, boot_val, unit, context in settings:
        assert name in table, f"{name} has no row in the Settings table of docs/reference.md"
        default, who = table[name][0], table[name][1]
        expected = shown_as_show_does(boot_val, unit)
        assert default == f"`{expected}`", f"{name}: the reference says {default}, the default is {expected}"
        assert f"context `{context}`" in who, f"{name}: the reference does not give its context {context}: {who}"
        assert f"`{name}`" in headings, f"{name} has no ### heading in the Settings section"
    stale = sorted(set(table) - {s[0] for s in settings})
    assert not stale, f"the Settings table lists settings that do not exist: {stale}"


def test_every_catalog_table_and_view_is_documented_with_its_columns(conn):
    relations = conn.execute("""
        SELECT c.relname, c.relkind, array_agg(a.attname::text ORDER BY a.attnum)
        FROM pg_catalog.pg_class c
        JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
        WHERE c.relnamespace = 'corgipile'::regnamespace AND c.relkind IN ('r', 'v', 'm', 'p')
        GROUP BY c.relname, c.relkind ORDER BY 1""").fetchall()
    assert {r[0] for r in relations} >= {"models", "epochs", "model_grants", "model_summary", "progress"}
    body = section(page(), "Catalog")
    parts = subsections(body)
    for relname, _kind, columns in relations:
        heading = f"`corgipile.{relname}`"
        assert heading in parts, f"corgipile.{relname} has no ### heading in the Catalog section"
        missing = [c for c in columns if f"`{c}`" not in parts[heading]]
        assert not missing, f"corgipile.{relname}: columns not documented in docs/reference.md: {missing}"
    sequences = [r[0] for r in conn.execute("""SELECT relname FROM pg_catalog.pg_class
        WHERE relnamespace = 'corgipile'::regnamespace AND relkind = 'S'""").fetchall()]
    for seq in sequences:
        assert f"corgipile.{seq}" in body, f"sequence corgipile.{seq} is not named in the Catalog section"
