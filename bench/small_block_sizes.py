#!/usr/bin/env python3
"""Shuffle quality of larger blocks on small tables: test accuracy by block size.

A cold epoch of a small table is cheaper with large blocks (bench-cold, a 31 MB table: 1 MB
or 10 MB blocks 1.2x a cold no_shuffle epoch, the automatic one-page blocks 1.5x). This
measures what large blocks cost in accuracy on the small real tables stored clustered by label
(a9a 36 MB, ijcnn1 12 MB; the harness's tables, loaded from $CORGIPILE_DATASETS, default
/work/shared/datasets, when missing): svm and logistic, 5 epochs, seeds 1-3, default params
except `block_size`; against no_shuffle on the copy stored in random order (a shuffle once).

Usage: bench/small_block_sizes.py [--out FILE]
Needs PGHOST/PGPORT/PGUSER for a cluster with corgipile installed; uses the database
corgipile_bench (the harness's, `make bench`), creating the tables it lacks."""

import argparse
import json
import os
import statistics
import sys

import psycopg

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import datasets  # noqa: E402
import provenance  # noqa: E402
import records  # noqa: E402

DBNAME = "corgipile_bench"
BLOCKS = ["auto", "64kB", "256kB", "1MB", "10MB"]
SEEDS = (1, 2, 3)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results/small_block_sizes.md")
    args = ap.parse_args()
    with psycopg.connect(dbname="postgres", autocommit=True) as c:
        if not c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DBNAME,)).fetchone():
            c.execute(f"CREATE DATABASE {DBNAME}")
    lines = ["# Block size on small tables stored clustered by label: test accuracy", "",
             "svm and logistic, 5 epochs, default params but `block_size`; median (min–max) test accuracy "
             f"of seeds {', '.join(map(str, SEEDS))}. Last row: no_shuffle on the copy stored in random order.", ""]
    figures = {}  # dataset -> block size (or the random-order copy) -> model -> test accuracy over seeds
    with psycopg.connect(dbname=DBNAME, autocommit=True) as c:
        c.execute("CREATE EXTENSION IF NOT EXISTS corgipile")
        c.execute("SET client_min_messages = warning")
        for name in ("a9a", "ijcnn1"):
            tables = {d.order: d for d in datasets.real(c, name)}
            clustered, shuffled = tables["clustered"], tables["shuffled"]
            pages = c.execute("SELECT relpages FROM pg_class WHERE oid = %s::regclass", (clustered.train,)).fetchone()[0]
            lines += [f"## {name} ({clustered.size}, {pages:,} pages; a 10% buffer holds {pages // 10:,} pages)", "",
                      "| block_size | svm | logistic |", "|---|---|---|"]
            cases = [(b, clustered.train, {} if b == "auto" else {"block_size": b}) for b in BLOCKS]
            cases.append(("no_shuffle, random order", shuffled.train, {"shuffle": "no_shuffle"}))
            for label, table, extra in cases:
                cells = []
                for model in ("svm", "logistic"):
                    accs = []
                    for seed in SEEDS:
                        params = {"epochs": 5, "seed": seed, "verbose": False, **extra}
                        m = c.execute("SELECT corgipile_train(%s, %s, %s)", (table, model, json.dumps(params))).fetchone()[0]
                        accs.append(c.execute("SELECT corgipile_evaluate(%s, %s)", (m, clustered.test)).fetchone()[0]["accuracy"])
                        c.execute("SELECT corgipile_drop_model(%s)", (m,))
                    cells.append(f"{statistics.median(accs):.4f} ({min(accs):.4f}–{max(accs):.4f})")
                    figures.setdefault(name, {}).setdefault(label, {})[model] = records.median_range(accs)
                lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
                print(lines[-1], flush=True)
            lines.append("")
        installed = records.server(c)
    text = "\n".join(lines)
    print(text)
    provenance.write(args.out, text, "bench-small-blocks", DBNAME)
    records.append_record("small_block_sizes", figures, make_target="bench-small-blocks", results_file=args.out,
                          config={"blocks": BLOCKS, "seeds": list(SEEDS)}, **installed)


if __name__ == "__main__":
    main()
