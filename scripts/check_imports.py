#!/usr/bin/env python3
"""No import circles: fails if the source files of a crate refer to each other in a circle, or
if two top-level folders (or files) import each other: no such pair is allowed, so the
top-level folders stay layered (what two of them share lives in a lower one).

A file's module path comes from its place in the tree (src/exec/sgd/train.rs is
crate::exec::sgd::train, a mod.rs is its folder). Every `crate::a::b::...` path a file names
(in `use` or inline), and every `super::...` path (resolved from the file's module), is an
edge to the deepest file that exists on that path. A child that names its own ancestors is
not counted: a folder's mod.rs declares its children and holds what they share. Test files
(`tests.rs`, `test_*.rs`, `*/tests/*`) are left out. Run by `make lint`; prints each circle
and each pair found.

    scripts/check_imports.py [crate root dir ...]   (default: src ml/src)"""
import pathlib
import re
import sys

PATH = re.compile(r"\bcrate::((?:[a-z_][a-z0-9_]*::)*[a-z_][a-z0-9_]*)")
USE_GROUP = re.compile(r"\buse\s+crate::\{([^;]*)\};", re.S)


def module_of(root, f):
    parts = list(f.relative_to(root).with_suffix("").parts)
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    return tuple(parts)


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(line.split("//")[0] for line in text.splitlines())


def graph(root):
    files = {module_of(root, f): f for f in root.rglob("*.rs")
             if f.name != "tests.rs" and not f.name.startswith("test_")
             and "tests" not in f.relative_to(root).parts[:-1]}
    edges = {m: set() for m in files}
    for m, f in files.items():
        text = strip_comments(f.read_text())
        paths = [p.split("::") for p in PATH.findall(text)]
        # super:: paths, relative to the file's module (a non-mod.rs file's parent is its
        # folder's module).
        for sup in re.findall(r"\b((?:super::)+)((?:[a-z_][a-z0-9_]*::)*[a-z_][a-z0-9_]*)", text):
            ups = sup[0].count("super::")
            base = list(m[:len(m) - ups]) if len(m) >= ups else []
            paths.append(base + sup[1].split("::"))
        for sup in re.findall(r"\buse\s+((?:super::)+)\{([^;]*)\};", text, flags=re.S):
            ups = sup[0].count("super::")
            base = list(m[:len(m) - ups])
            paths += [base + [head] for head in re.findall(r"(?:^|[{,])\s*([a-z_][a-z0-9_]*)", sup[1])]
        for group in USE_GROUP.findall(text):  # use crate::{a::X, b::{Y, Z}}
            paths += [[head] for head in re.findall(r"(?:^|[{,])\s*([a-z_][a-z0-9_]*)::", group)]
        for p in paths:
            target = None
            for n in range(len(p), 0, -1):
                if tuple(p[:n]) in files:
                    target = tuple(p[:n])
                    break
            if target is None or target == m or target == m[:len(target)]:
                continue  # unknown, itself, or one of its ancestors
            edges[m].add(target)
    return edges


def circles(edges):
    """Strongly connected components with more than one file (Tarjan)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def folder_pairs(edges):
    """Top-level folders (and files) that import each other."""
    top = {}
    for m, ts in edges.items():
        for t in ts:
            if m and t and m[0] != t[0]:
                top.setdefault(m[0], set()).add(t[0])
    return sorted({tuple(sorted((a, b))) for a, bs in top.items() for b in bs if a in top.get(b, ())})


def main():
    roots = [pathlib.Path(r) for r in (sys.argv[1:] or ["src", "ml/src"])]
    failed = False
    for root in roots:
        edges = graph(root)
        for comp in circles(edges):
            failed = True
            names = ["::".join(m) or "lib" for m in comp]
            print(f"{root}: import circle: {', '.join(names)}")
            for m in comp:
                inside = sorted("::".join(t) for t in edges[m] if t in comp)
                print(f"    {'::'.join(m) or 'lib'} -> {', '.join(inside)}")
        for a, b in folder_pairs(edges):
            failed = True
            print(f"{root}: {a} and {b} import each other (move what they share down)")
    if failed:
        sys.exit(1)
    print(f"check_imports: no import circle and no pair of folders importing each other in {', '.join(map(str, roots))}")


if __name__ == "__main__":
    main()
