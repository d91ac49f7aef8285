#!/usr/bin/env python3
"""The source map of docs/development.md (the code block under "## Source files") stays true:
every Rust source file of src/ and ml/src/ is in it (named by its path, or by its file name on
the line of its folder, e.g. `src/exec/sgd/` ... `train.rs`), and every file it names exists.
Test files (tests.rs, */tests/*) are not listed. Run by `make lint`."""
import pathlib
import re
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
MAP_PAGE = "docs/development.md"
MAP_HEADING = "## Source files"


def map_entries():
    """(folder, [file names]) for each entry of the map: a path at the start of a line and the
    file names on its lines (continuation lines are indented)."""
    text = (REPO / MAP_PAGE).read_text()
    if MAP_HEADING not in text:
        sys.exit(f"check_source_map: {MAP_PAGE} has no '{MAP_HEADING}' heading")
    block = text.split(MAP_HEADING, 1)[1].split("```", 2)[1]
    entries = []
    for line in block.splitlines():
        head = re.match(r"^(\S+)", line)
        if head:
            entries.append([head.group(1), []])
        if entries:
            entries[-1][1] += re.findall(r"\b([a-z_0-9]+\.rs)\b", line)
    return entries


def main():
    entries = map_entries()
    listed = set()
    problems = []
    for path, names in entries:
        if path.endswith(".rs"):
            listed.add(path)
        if path.endswith("/") and (path.startswith("src/") or path.startswith("ml/src/")):
            for name in names:
                if not (REPO / path / name).is_file():
                    problems.append(f"the map names {path}{name}, which does not exist")
                listed.add(path + name)
        elif path.endswith(".rs") and not (REPO / path).is_file():
            problems.append(f"the map names {path}, which does not exist")
    for root in ("src", "ml/src"):
        for f in sorted((REPO / root).rglob("*.rs")):
            rel = f.relative_to(REPO).as_posix()
            if f.name == "tests.rs" or "/tests/" in rel:
                continue
            if rel not in listed:
                problems.append(f"{rel} is not in the source map of {MAP_PAGE}")
    for p in problems:
        print(f"check_source_map: {p}")
    if problems:
        sys.exit(1)
    print(f"check_source_map: the map of {MAP_PAGE} names all {len(listed)} source files")


if __name__ == "__main__":
    main()
