"""Per-group models in one pass: 1,000 logistic models (`"group_by"`) against one logistic training
over the same table, and each group's model against a model trained on that group's rows alone.

The table: --rows rows (default 10M) of four float8 features (float8, not numeric: a numeric
column is converted in the query, off the page reader) and an int group column `grp`
(1,000 groups, drawn by a hash of the row: each group's rows are spread over the whole table);
the label is a linear rule whose weights depend on the group (so one model of every row cannot
fit them all). Stored clustered by label.

Arms, interleaved round by round (medians with min-max over rounds): `SELECT sum(x1)` (the scan
floor), one logistic training, the training with "group_by": "grp". Then, for a sample of groups,
each group's rows copied into a table of their own and trained alone (same params and seed):
its accuracy on those rows against the group's model's.

Usage: bench/groups_one_pass.py [--rows N] [--groups G] [--epochs E] [--rounds R] [--sample S]
Writes bench/results/groups_one_pass.md and .json."""

import argparse
import json
import os
import statistics
import sys
import time

import psycopg
from psycopg.types.json import Jsonb

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import provenance  # noqa: E402
import records  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "groups_one_pass")
FEATURES = ["x1", "x2", "x3", "x4"]


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def make_table(conn, table, rows, groups):
    exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()[0]
    if exists and conn.execute(f"SELECT count(*) = %s FROM {table}", (rows,)).fetchone()[0]:
        return
    conn.execute(f"DROP TABLE IF EXISTS {table}")
    # Group g's rule: sign((1 + g % 7) x1 - (g % 5 - 2) x2 + (g % 3 - 1) x3 + 0.5 x4 - (g % 11) / 10).
    conn.execute(f"""CREATE TABLE {table} AS
        SELECT i AS id, grp, x1, x2, x3, x4,
               (1 + grp % 7) * x1 - (grp % 5 - 2) * x2 + (grp % 3 - 1) * x3 + 0.5 * x4 - (grp % 11) / 10.0
                 + (hashint4(i * 13) % 1000) / 2000.0 > 0 AS y
        FROM (SELECT i, abs(hashint4(i * 7 + 1)) % {groups} AS grp,
                     (hashint4(i) % 1000) / 500.0::float8 AS x1, (hashint4(i * 3 + 1) % 1000) / 500.0::float8 AS x2,
                     (hashint4(i * 5 + 2) % 1000) / 500.0::float8 AS x3,
                     (hashint4(i * 11 + 3) % 1000) / 500.0::float8 AS x4
              FROM generate_series(1, {rows}) i) s
        ORDER BY y, id""")
    conn.execute(f"VACUUM ANALYZE {table}")


def train(conn, table, params):
    started = time.perf_counter()
    model_id = conn.execute("SELECT corgipile_train(%s::regclass, 'logistic', %s)",
                            (table, Jsonb({"verbose": False, **params}))).fetchone()[0]
    return model_id, time.perf_counter() - started


def accuracy(conn, table, model, where):
    return conn.execute(f"SELECT avg((corgipile_predict(%s, t) = y::int)::int)::float8 FROM {table} t WHERE {where}",
                        (model,)).fetchone()[0]


def med(xs):
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}–{max(xs):.2f})"


def figures(res):
    """The figures of the results file, from its raw numbers (`res`), for the run's record."""
    t = res["times"]
    return {"floor_s": records.median_range(t["floor"]), "one_s": records.median_range(t["one"]),
            "groups_s": records.median_range(t["groups"]),
            "groups_div_one": statistics.median(t["groups"]) / statistics.median(t["one"]),
            "group_models_stored": res["stored"][0],
            "sample_group_minus_alone_points": {str(s["group"]): 100 * (s["group_model"] - s["alone"]) for s in res["sample"]},
            "accuracy_per_group": res["overall"]["per_group"], "accuracy_one_model": res["overall"]["one_model"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--groups", type=int, default=1000)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sample", type=int, default=5)
    args = ap.parse_args()
    table = f"bench_groups_{args.rows}x{args.groups}"
    conn = psycopg.connect(autocommit=True)
    conn.execute("CREATE EXTENSION IF NOT EXISTS corgipile")
    log(f"table {table}")
    make_table(conn, table, args.rows, args.groups)
    table_mb = conn.execute("SELECT pg_table_size(%s::regclass) / 1048576", (table,)).fetchone()[0]
    conn.execute("DELETE FROM corgipile.models WHERE name LIKE 'bench_groups%'")
    base = {"features": FEATURES, "label": "y", "epochs": args.epochs, "seed": 11}
    times = {"floor": [], "one": [], "groups": []}
    one_ids, family = [], None
    for r in range(args.rounds):
        log(f"round {r + 1}/{args.rounds}")
        started = time.perf_counter()
        conn.execute(f"SELECT sum(x1) FROM {table}")
        times["floor"].append(time.perf_counter() - started)
        one, t = train(conn, table, base)
        times["one"].append(t)
        one_ids.append(one)
        family, t = train(conn, table, {**base, "name": f"bench_groups{r}", "group_by": "grp"})
        times["groups"].append(t)
        log(f"  floor {times['floor'][-1]:.2f} s, one training {times['one'][-1]:.2f} s, "
            f"{args.groups} group models {times['groups'][-1]:.2f} s")
    name = f"bench_groups{args.rounds - 1}"
    stored = conn.execute("SELECT count(*), min(group_rows), max(group_rows) FROM corgipile.group_models "
                          "WHERE name = %s", (name,)).fetchone()

    # A sample of groups: the group's model against a model of its rows alone.
    sample = []
    for g in range(0, args.groups, max(1, args.groups // args.sample))[:args.sample]:
        own = conn.execute("SELECT model_id FROM corgipile.group_models WHERE name = %s AND group_key = %s",
                           (name, str(g))).fetchone()[0]
        alone_table = f"{table}_g{g}"
        conn.execute(f"DROP TABLE IF EXISTS {alone_table}")
        conn.execute(f"CREATE TABLE {alone_table} AS SELECT * FROM {table} WHERE grp = {g}")
        alone, _ = train(conn, alone_table, base)
        row = {"group": g, "rows": conn.execute(f"SELECT count(*) FROM {alone_table}").fetchone()[0],
               "group_model": accuracy(conn, alone_table, own, "true"),
               "alone": accuracy(conn, alone_table, alone, "true"),
               "one_model": accuracy(conn, alone_table, one_ids[-1], "true")}
        sample.append(row)
        conn.execute(f"DROP TABLE {alone_table}")
        log(f"  group {g}: group model {row['group_model']:.4f}, alone {row['alone']:.4f}, "
            f"one model of every row {row['one_model']:.4f}")
    overall = {"per_group": accuracy(conn, table, name, "true"), "one_model": accuracy(conn, table, one_ids[-1], "true")}

    m = {k: statistics.median(v) for k, v in times.items()}
    res = {"rows": args.rows, "groups": args.groups, "epochs": args.epochs, "rounds": args.rounds,
           "table_mb": table_mb, "times": times, "stored": stored, "sample": sample, "overall": overall}
    with open(OUT + ".json", "w") as f:
        json.dump(res, f, indent=1, default=str)
    lines = [
        f"One run of `bench/groups_one_pass.py` on the {args.rows:,}-row table `{table}` ({table_mb} MB: four "
        f"float8 features, an int group column of {args.groups:,} groups spread over the whole table, stored "
        f"clustered by label), one backend, double-buffered, {os.cpu_count()} cores. Every training: logistic, "
        f"features {FEATURES}, seed 11, default params otherwise (a statistics pass, then {args.epochs} epochs). "
        f"Medians (min–max) over {args.rounds} interleaved rounds.",
        "",
        "| what | seconds | × one training |",
        "|---|---|---|",
        f"| `SELECT sum(x1)` (scan floor, one pass) | {med(times['floor'])} | |",
        f"| one logistic training | {med(times['one'])} | 1.00 |",
        f"| `\"group_by\": \"grp\"`: {stored[0]} group models beside the model of every row, one pass | "
        f"{med(times['groups'])} | {m['groups'] / m['one']:.2f} |",
        "",
        f"Group models stored: {stored[0]} (rows per group {stored[1]:,}–{stored[2]:,}).",
        "",
        "## Each group's model against a model of its rows alone",
        "",
        "Accuracy on the group's rows (training accuracy: the group's rows copied into a table of their own "
        "and trained with the same params and seed).",
        "",
        "| group | rows | its model (group_by) | trained alone | difference (points) | the one model of every row |",
        "|---|---|---|---|---|---|",
    ]
    for s in sample:
        lines.append(f"| {s['group']} | {s['rows']:,} | {s['group_model']:.4f} | {s['alone']:.4f} | "
                     f"{100 * (s['group_model'] - s['alone']):+.2f} | {s['one_model']:.4f} |")
    lines += ["", f"Over the whole table: predicting each row with its group's model (`corgipile_predict(name, row)`) "
                  f"{overall['per_group']:.4f}; the one model of every row {overall['one_model']:.4f}.",
              "", "Raw numbers: bench/results/groups_one_pass.json."]
    provenance.write(OUT + ".md", "\n".join(lines) + "\n", "bench-groups")
    records.append_record("groups_one_pass", figures(res), make_target="bench-groups", results_file=OUT + ".md",
                          config={"rows": args.rows, "groups": args.groups, "epochs": args.epochs,
                                  "rounds": args.rounds, "sample": args.sample}, conn=conn)
    log(f"wrote {OUT}.md")


if __name__ == "__main__":
    main()
