"""Search in one pass: a search's configurations side by side against one training and against
the same configurations trained one after another, on the 4.5M x 18 benchmark table
(bench/epoch_times.py's, stored clustered by label).

Arms, interleaved round by round (medians with min-max over rounds; the separate trainings are
timed once, in full, since they are the slow arm):
  - one logistic training (default params, validation 20%, as a search scores on);
  - a search of 12 logistic configurations (learning_rate x 4, l2 x 3) in one pass;
  - the same 12 configurations trained one after another (12 corgipile_train calls);
  - 5-fold cross-validation of the one logistic configuration ("folds": 5, no validation),
    divided by one logistic training without validation (every row trained on, as each fold's
    model trains on 4/5 of them and the sixth model on all): like for like;
  - one mlp training (hidden [64]) and a search of 4 mlp configurations (hidden [32], [64] x
    learning_rate 0.001, 0.01), fewer epochs (a network's epoch costs more).
Then the best configuration of each search trained alone with its stored params: the same
model, bit for bit (its validation accuracy is the search's).

Usage: bench/search_one_pass.py [--rows N] [--epochs E] [--mlp-epochs E] [--rounds R]
Writes bench/results/search_one_pass.md and .json."""

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
from epoch_times import make_table  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "search_one_pass")
LINEAR_GRID = {"learning_rate": [0.001, 0.003, 0.01, 0.03], "l2": [0, 0.00001, 0.0001]}
MLP_GRID = {"hidden": [[32], [64]], "learning_rate": [0.001, 0.01]}


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def train(conn, table, model, params):
    started = time.perf_counter()
    model_id = conn.execute("SELECT corgipile_train(%s::regclass, %s, %s)",
                            (table, model, Jsonb({"verbose": False, **params}))).fetchone()[0]
    return model_id, time.perf_counter() - started


def grid_configs(grid):
    configs = [{}]
    for key, values in grid.items():
        configs = [{**c, key: v} for c in configs for v in values]
    return configs


def med(xs):
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}–{max(xs):.2f})"


def figures(res):
    """The figures of the results file, from its raw numbers (`res`), for the run's record."""
    t = res["times"]
    m = {k: statistics.median(v) for k, v in t.items()}
    return {"floor_s": records.median_range(res["floor"]), **{f"{k}_s": records.median_range(v) for k, v in t.items()},
            "separate12_s": res["separate12"], "search12_div_one": m["search12"] / m["one"],
            "separate12_div_one": res["separate12"] / m["one"], "cv5_div_one_all": m["cv5"] / m["one_all"],
            "mlp_search4_div_mlp_one": m["mlp_search4"] / m["mlp_one"],
            "best_alone": {name: {"score": tw["score"], "alone_score": tw["alone_score"], "identical": tw["identical"]}
                           for name, tw in res["twins"].items()}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4_500_000)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--mlp-epochs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    table = f"bench_clustered_{args.rows}x18"
    conn = psycopg.connect(autocommit=True)
    conn.execute("CREATE EXTENSION IF NOT EXISTS corgipile")
    log(f"table {table}")
    make_table(conn, table, args.rows, 18)
    conn.execute("DELETE FROM corgipile.models WHERE name LIKE 'bench_search%'")
    base = {"epochs": args.epochs, "seed": 11, "validation": {"fraction": 0.2}}
    mlp_base = {"epochs": args.mlp_epochs, "seed": 11, "validation": {"fraction": 0.2}}
    times = {"one": [], "search12": [], "one_all": [], "cv5": [], "mlp_one": [], "mlp_search4": []}
    floor = []
    for r in range(args.rounds):
        log(f"round {r + 1}/{args.rounds}")
        started = time.perf_counter()
        conn.execute(f"SELECT sum(features[1]) FROM {table}")
        floor.append(time.perf_counter() - started)
        times["one"].append(train(conn, table, "logistic", base)[1])
        times["search12"].append(train(conn, table, "logistic",
                                       {**base, "name": f"bench_search_lin{r}", "search": LINEAR_GRID})[1])
        cv_params = {k: v for k, v in base.items() if k != "validation"}
        times["one_all"].append(train(conn, table, "logistic", cv_params)[1])
        times["cv5"].append(train(conn, table, "logistic", {**cv_params, "folds": 5})[1])
        times["mlp_one"].append(train(conn, table, "mlp", mlp_base)[1])
        times["mlp_search4"].append(train(conn, table, "mlp",
                                          {**mlp_base, "name": f"bench_search_mlp{r}", "search": MLP_GRID})[1])
        log(f"  one {times['one'][-1]:.2f} s, search of 12 {times['search12'][-1]:.2f} s, "
            f"one without validation {times['one_all'][-1]:.2f} s, 5-fold cv {times['cv5'][-1]:.2f} s, "
            f"mlp {times['mlp_one'][-1]:.2f} s, mlp search of 4 {times['mlp_search4'][-1]:.2f} s")
    log("the 12 configurations one after another")
    separate = 0.0
    for c in grid_configs(LINEAR_GRID):
        separate += train(conn, table, "logistic", {**base, **c})[1]
    log(f"  {separate:.2f} s")

    # The best of each search, trained alone with its stored params.
    twins = {}
    for name, model in (("bench_search_lin0", "logistic"), ("bench_search_mlp0", "mlp")):
        best, params, score = conn.execute(
            "SELECT model_id, (SELECT params FROM corgipile.models WHERE id = model_id), score "
            "FROM corgipile.search_trials WHERE name = %s AND selected", (name,)).fetchone()
        twin, _ = train(conn, table, model, {**params, "name": None})
        same = conn.execute("SELECT a.weights = b.weights AND a.bias = b.bias FROM corgipile.models a, "
                            "corgipile.models b WHERE a.id = %s AND b.id = %s", (best, twin)).fetchone()[0]
        twin_score = conn.execute("SELECT (metrics->'validation'->>'accuracy')::float8 FROM corgipile.models "
                                  "WHERE id = %s", (twin,)).fetchone()[0]
        trials = conn.execute("SELECT params, score FROM corgipile.search_trials WHERE name = %s ORDER BY trial",
                              (name,)).fetchall()
        twins[name] = {"best": best, "params": {k: params[k] for k in (LINEAR_GRID if model == "logistic" else MLP_GRID)},
                       "score": score, "alone_score": twin_score, "identical": same, "trials": trials}

    m = {k: statistics.median(v) for k, v in times.items()}
    res = {"rows": args.rows, "epochs": args.epochs, "mlp_epochs": args.mlp_epochs, "rounds": args.rounds,
           "times": times, "floor": floor, "separate12": separate, "twins": twins}
    with open(OUT + ".json", "w") as f:
        json.dump(res, f, indent=1, default=str)
    lines = [
        f"One run of `bench/search_one_pass.py` on the {args.rows:,} x 18 table `{table}` (925 MB at 4.5M rows, "
        f"stored clustered by label), one backend, double-buffered (the SGD thread trains while the backend reads). "
        f"Every training: seed 11, validation 20% (the search's default), default params otherwise (logistic: "
        f"normalize, so a statistics pass, then {args.epochs} epochs; mlp: {args.mlp_epochs} epochs). "
        f"Medians (min–max) over {args.rounds} interleaved rounds; the 12 separate trainings once. "
        f"Several models (a search, folds) train on up to 1 + max_parallel_workers_per_gather threads "
        f"(2 here: {os.cpu_count()} cores, and the backend reads meanwhile).",
        "",
        "| what | seconds | × one training |",
        "|---|---|---|",
        f"| `SELECT sum(features[1])` (scan floor, one pass) | {med(floor)} | |",
        f"| one logistic training | {med(times['one'])} | 1.00 |",
        f"| search: 12 logistic configurations in one pass | {med(times['search12'])} | "
        f"{m['search12'] / m['one']:.2f} |",
        f"| the same 12 configurations, 12 trainings one after another | {separate:.2f} | "
        f"{separate / m['one']:.2f} |",
        f"| one logistic training without validation (every row trained on) | {med(times['one_all'])} | "
        f"{m['one_all'] / m['one']:.2f} |",
        f"| 5-fold cross-validation of one logistic configuration (`\"folds\": 5`: 6 models) | "
        f"{med(times['cv5'])} | {m['cv5'] / m['one']:.2f} (÷ one without validation: "
        f"{m['cv5'] / m['one_all']:.2f}) |",
        f"| one mlp training (hidden [64]) | {med(times['mlp_one'])} | 1.00 |",
        f"| search: 4 mlp configurations in one pass | {med(times['mlp_search4'])} | "
        f"{m['mlp_search4'] / m['mlp_one']:.2f} |",
        "",
        f"Search grids: logistic {json.dumps(LINEAR_GRID)}; mlp {json.dumps(MLP_GRID)}.",
        "",
        "## The best configuration, trained alone",
        "",
        "| search | best configuration | its validation accuracy in the search | trained alone (same seed and params) | same weights, bit for bit |",
        "|---|---|---|---|---|",
    ]
    for name, t in twins.items():
        lines.append(f"| {name} | `{json.dumps(t['params'])}` | {t['score']:.4f} | {t['alone_score']:.4f} | {t['identical']} |")
    lines += ["", "## Every configuration's validation accuracy", ""]
    for name, t in twins.items():
        lines.append(f"- {name}: " + "; ".join(f"`{json.dumps(p)}` {s:.4f}" for p, s in t["trials"]))
    lines += ["", "Raw numbers: bench/results/search_one_pass.json."]
    provenance.write(OUT + ".md", "\n".join(lines) + "\n", "bench-search")
    records.append_record("search_one_pass", figures(res), make_target="bench-search", results_file=OUT + ".md",
                          config={"rows": args.rows, "epochs": args.epochs, "mlp_epochs": args.mlp_epochs,
                                  "rounds": args.rounds}, conn=conn)
    log(f"wrote {OUT}.md")


if __name__ == "__main__":
    main()
