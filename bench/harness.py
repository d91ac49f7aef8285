#!/usr/bin/env python3
"""CorgiPile in-database benchmark (paper §7.3-7.4): every shuffle strategy, Shuffle Once
(ORDER BY random() copy) and the scikit-learn export path, side by side in one run.

Usage: bench/harness.py [--quick] [--out bench/results/latest.md] [--db corgipile_bench]
Needs PGHOST/PGPORT/PGUSER for a cluster with corgipile installed (`make bench` sets them).
Writes <out> (markdown), <out>.json (raw numbers) and PNG plots next to it."""

import argparse
import json
import os
import statistics
import sys
import time

import psycopg

import datasets
import provenance
import records
import runner

BUFFER = "10%"  # paper §7.3: buffer 10% of the table for the main comparison
# Like for like: every strategy double-buffered (the default), except the `_single` pair, which
# compares the single-buffered modes with each other. sliding_window and mrs copy rows through
# a window and have one mode.
STRATEGIES = {
    "no_shuffle": {"shuffle": "no_shuffle", "double_buffer": True},
    "no_shuffle_single": {"shuffle": "no_shuffle", "double_buffer": False},
    "block_only": {"shuffle": "block_only", "double_buffer": True},
    "corgipile": {"shuffle": "corgipile", "double_buffer": True, "buffer_size": BUFFER},
    "corgipile_single": {"shuffle": "corgipile", "double_buffer": False, "buffer_size": BUFFER},
    "corgipile_buf2": {"shuffle": "corgipile", "double_buffer": True, "buffer_size": "2%"},
    "sliding_window": {"shuffle": "sliding_window", "buffer_size": BUFFER},
    "mrs": {"shuffle": "mrs", "buffer_size": BUFFER},
    "shuffle_once": {"shuffle": "no_shuffle", "double_buffer": True},  # over the ORDER BY random() copy
    "shuffle_once_pile": {"shuffle": "no_shuffle", "double_buffer": True},  # over the corgipile_shuffle copy
    "sklearn": None,
}
# The no_shuffle run each strategy's epoch is divided by (the same buffer mode).
BASELINE = {"no_shuffle_single": "no_shuffle_single", "corgipile_single": "no_shuffle_single"}
ALL = list(STRATEGIES)
TRACE_STRATEGIES = ["no_shuffle", "block_only", "corgipile", "sliding_window", "mrs", "shuffle_once"]
TOLERANCE = 0.005  # "within 0.5 percentage points of the best"

FULL = {
    "epochs": 5,
    "synthetic": [
        {"key": "susy", "kind": "dense", "rows": 4_500_000, "n_features": 18, "test_rows": 500_000,
         "models": ["svm", "logistic"], "strategies": ALL},
        {"key": "higgs", "kind": "dense", "rows": 4_000_000, "n_features": 28, "test_rows": 400_000,
         "models": ["svm"], "strategies": ALL, "sensitivity": True},
        {"key": "epsilon", "kind": "dense", "rows": 100_000, "n_features": 2000, "test_rows": 20_000,
         "models": ["svm"], "strategies": ALL},
        {"key": "criteo", "kind": "sparse", "rows": 5_000_000, "n_features": 1_000_000, "nnz": 40,
         "test_rows": 500_000, "models": ["logistic"],
         "strategies": ["no_shuffle", "no_shuffle_single", "corgipile", "corgipile_single", "corgipile_buf2",
                        "shuffle_once", "shuffle_once_pile"]},
    ],
    "real": ["a9a", "ijcnn1", "w8a"], "real_models": ["svm", "logistic"], "real_epochs": 10,
    "ceiling_max_cells": 5_000_000,
}
QUICK = {
    "epochs": 3,
    "synthetic": [
        {"key": "susy", "kind": "dense", "rows": 200_000, "n_features": 18, "test_rows": 20_000,
         "models": ["svm", "logistic"], "strategies": ALL},
        {"key": "epsilon", "kind": "dense", "rows": 5_000, "n_features": 2000, "test_rows": 2_000,
         "models": ["svm"], "strategies": ALL},
        {"key": "criteo", "kind": "sparse", "rows": 100_000, "n_features": 1_000_000, "nnz": 40,
         "test_rows": 10_000, "models": ["logistic"],
         "strategies": ["no_shuffle", "corgipile", "corgipile_buf2", "shuffle_once", "shuffle_once_pile",
                        "sklearn"]},
    ],
    "real": ["a9a", "ijcnn1"], "real_models": ["svm"], "real_epochs": 3,
    "ceiling_max_cells": 5_000_000,
}
SENSITIVITY = [("buffer 1%", {"buffer_size": "1%"}), ("buffer 2%", {"buffer_size": "2%"}),
               ("buffer 5%", {"buffer_size": "5%"}), ("buffer 10%", {"buffer_size": "10%"}),
               ("block 2MB", {"block_size": "2MB"}), ("block 10MB", {"block_size": "10MB"}),
               ("block 50MB", {"block_size": "50MB"})]


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def setup_database(db):
    with psycopg.connect(autocommit=True, dbname="postgres") as c:
        if not c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (db,)).fetchone():
            c.execute(f"CREATE DATABASE {db}")
    os.environ["PGDATABASE"] = db
    with runner.connect() as c:
        # Recreate the extension so that its SQL matches the installed library (the lead may have
        # reinstalled it); this drops earlier benchmark models, never the data tables.
        c.execute("SET client_min_messages = warning")
        c.execute("DROP EXTENSION IF EXISTS corgipile CASCADE")
        c.execute("CREATE EXTENSION corgipile")
        return c.execute("SELECT extversion FROM pg_extension WHERE extname = 'corgipile'").fetchone()[0]


def retrying(fn, *args, attempts=3):
    """Run fn(*args); if the server dropped the connection (another session's crash restarts every
    backend of a shared test cluster), wait until it accepts connections again and rerun."""
    for attempt in range(1, attempts + 1):
        try:
            return fn(*args)
        except psycopg.OperationalError as e:
            if attempt == attempts:
                raise
            log(f"connection lost ({str(e).splitlines()[0]}); waiting for the server, then retrying")
            for _ in range(120):
                time.sleep(1)
                try:
                    runner.connect().close()
                    break
                except psycopg.OperationalError:
                    pass


def time_to_target(run, target, offset):
    """Wall seconds until validation accuracy >= target (None if never): `offset` (a copy or an
    export before the training) + everything of the training statement but the epochs after
    the target and the harness's own per-epoch validation passes — i.e. the statistics pass,
    planning and storing the model count, as a user waits for them."""
    overhead = run.get("overhead", 0.0)
    total = offset + overhead
    for e, (s, a) in enumerate(zip(run["epoch_seconds"], run["val_acc"]), start=1):
        total += s
        if a is not None and a >= target:
            return total, e
    return None, None


def run_dataset(ds, models, strategies, epochs, cfg, seed):
    """All (model x strategy) runs of one dataset, side by side; returns {model: {strategy: result}}."""
    log(f"{ds.name}: scan floor")
    out = {"dataset": ds.name, "family": ds.family, "order": ds.order, "rows": ds.rows,
           "n_features": ds.n_features, "size": ds.size, "note": ds.note, "sparse": ds.sparse,
           "epochs": epochs, "floor": retrying(runner.scan_floor, ds), "models": {}}
    so_copy = so_secs = pile_copy = pile_secs = sk_data = None
    if "shuffle_once" in strategies:
        log(f"{ds.name}: Shuffle Once copy (ORDER BY random())")
        so_copy, so_secs = retrying(runner.shuffle_once_copy, ds, seed)
        out["shuffle_once_copy_seconds"] = so_secs
    if "shuffle_once_pile" in strategies:
        log(f"{ds.name}: Shuffle Once copy (corgipile_shuffle)")
        pile_copy, pile_secs = retrying(runner.pile_shuffle_copy, ds, seed)
        out["pile_shuffle_copy_seconds"] = pile_secs
    if "sklearn" in strategies:
        log(f"{ds.name}: export to numpy")
        sk_data = retrying(runner.export_all, ds)
        out["export_seconds"] = sk_data["export_seconds"]
    for model in models:
        res = {}
        for name in strategies:
            log(f"{ds.name}: {model} {name}")
            try:
                if name == "sklearn":
                    r = retrying(runner.sklearn_run, sk_data, model, epochs, seed, cfg["ceiling_max_cells"],
                                           40 if ds.sparse else ds.n_features)
                    r["offset"] = r["export_seconds"]
                elif name == "shuffle_once":
                    r = retrying(runner.train, ds, model, STRATEGIES[name], epochs, seed, so_copy)
                    r["offset"] = so_secs
                elif name == "shuffle_once_pile":
                    r = retrying(runner.train, ds, model, STRATEGIES[name], epochs, seed, pile_copy)
                    r["offset"] = pile_secs
                else:
                    r = retrying(runner.train, ds, model, STRATEGIES[name], epochs, seed)
                    r["offset"] = 0.0
            except runner.Skipped as e:
                r = {"skipped": str(e)}
                log(f"  skipped: {e}")
            res[name] = r
        ran = [r for r in res.values() if "skipped" not in r]
        best = max(a for r in ran for a in r["val_acc"] if a is not None)
        for r in ran:
            r["e2e"], r["e2e_epoch"] = time_to_target(r, best - TOLERANCE, r["offset"])
        out["models"][model] = {"best_val_acc": best, "runs": res}
    for copy in (so_copy, pile_copy):
        if copy:
            runner.drop(copy)
    return out


def sensitivity(ds, model, epochs, seed, target):
    rows = []
    for label, extra in SENSITIVITY:
        log(f"{ds.name}: sensitivity {label}")
        params = {**STRATEGIES["corgipile"], **extra}
        r = retrying(runner.train, ds, model, params, epochs, seed)
        r["e2e"], r["e2e_epoch"] = time_to_target(r, target - TOLERANCE, 0.0)
        rows.append((label, r))
    return rows


def trace_runs(table, seed):
    if not runner.trace_exists():
        return {"missing": "corgipile_trace() is not in pg_proc of the installed extension"}
    out = {}
    copy = f"{table}_so"
    with runner.connect() as c:
        c.execute("SELECT setseed(0.5)")
        c.execute(f"DROP TABLE IF EXISTS {copy}")
        c.execute(f"CREATE TABLE {copy} AS SELECT * FROM {table} ORDER BY random()")
    for name in TRACE_STRATEGIES:
        params = {**STRATEGIES[name], "seed": seed, "block_size": 1}
        try:
            out[name] = runner.trace(copy if name == "shuffle_once" else table, params)
        except runner.Skipped as e:
            out[name] = {"skipped": str(e)}
    runner.drop(copy)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small tables, 3 epochs (checks the harness; ~3-5 min)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--db", default="corgipile_bench")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--only", default=None, help="comma-separated dataset keys to run (debugging)")
    ap.add_argument("--report-only", action="store_true", help="rewrite <out> and the plots from <out>.json")
    args = ap.parse_args()
    cfg = QUICK if args.quick else FULL
    out_md = args.out or ("bench/results/quick.md" if args.quick else "bench/results/latest.md")
    if args.report_only:
        with open(out_md + ".json") as f:
            write_outputs(json.load(f), out_md)
        return
    started = time.perf_counter()
    version = retrying(setup_database, args.db)
    with runner.connect() as c:
        origin = provenance.line(c, "bench-quick" if args.quick else "bench")
    results = {"mode": "quick" if args.quick else "full", "extversion": version, "datasets": [],
               "started": time.strftime("%Y-%m-%d %H:%M:%S"), "config": cfg, "provenance": origin}
    only = set(args.only.split(",")) if args.only else None
    def with_conn(fn, *a):
        with runner.connect() as c:
            return fn(c, *a)

    trace_tbl = retrying(with_conn, datasets.trace_table)
    synth = [s for s in cfg["synthetic"] if not only or s["key"] in only]
    reals = [r for r in cfg["real"] if not only or r in only]
    gen_t0 = time.perf_counter()
    synth_ds = [(spec, retrying(with_conn, datasets.synthetic, spec)) for spec in synth]
    real_ds = [ds for name in reals for ds in retrying(with_conn, datasets.real, name)]
    results["generation_seconds"] = time.perf_counter() - gen_t0
    for _, ds in synth_ds:
        ds.extra["toast"] = retrying(with_conn, lambda c: c.execute(
            """SELECT pg_size_pretty(pg_total_relation_size(reltoastrelid))
               FROM pg_class WHERE oid = %s::regclass""", (ds.train,)).fetchone()[0])
    for spec, ds in synth_ds:
        r = run_dataset(ds, spec["models"], spec["strategies"], cfg["epochs"], cfg, args.seed)
        r["toast"] = ds.extra["toast"]
        if spec.get("sensitivity"):
            model = spec["models"][0]
            r["sensitivity"] = {"model": model,
                                "runs": sensitivity(ds, model, cfg["epochs"], args.seed, r["models"][model]["best_val_acc"])}
        results["datasets"].append(r)
    for ds in real_ds:
        results["datasets"].append(run_dataset(ds, cfg["real_models"], ALL, cfg["real_epochs"], cfg, args.seed))
    log("tuple-order trace")
    results["trace"] = retrying(trace_runs, trace_tbl, args.seed)
    results["total_seconds"] = time.perf_counter() - started
    os.makedirs(os.path.dirname(out_md) or ".", exist_ok=True)
    with open(out_md + ".json", "w") as f:
        json.dump(results, f, indent=1, default=str)
    write_outputs(results, out_md)
    with runner.connect() as c:
        installed = records.server(c)
    records.append_record(benchmark(results), figures(results), make_target="bench-quick" if args.quick else "bench",
                          results_file=out_md, config={"only": args.only, "seed": args.seed}, **installed)
    log(f"done in {results['total_seconds']:.0f} s; wrote {out_md}, {out_md}.json and the PNGs")


def write_outputs(results, out_md):
    import plots  # matplotlib: installed by `make bench` (bench/requirements.txt), not needed to read results
    prefix = os.path.splitext(out_md)[0]
    pngs = plots.all_plots(results, prefix)
    text = report(results, pngs)
    with open(out_md, "w") as f:
        f.write(text)
    print(text)


# ---------------------------------------------------------------- report

def med(xs):
    return statistics.median(xs)


def fmt_s(x):
    return "–" if x is None else f"{x:.3f}" if x < 10 else f"{x:.1f}"


def fmt_acc(x):
    return "–" if x is None else f"{x:.4f}"


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def fmt_r(x):
    return "–" if x is None else f"{x:.2f}"


def epoch_median(r):
    return med(r["epoch_seconds"]) if r and "skipped" not in r else None


def dataset_table(d):
    lines = []
    floor = med(d["floor"]["seconds"])
    fl = d["floor"]["seconds"]
    head = (f"### {d['dataset']}\n\n{d['rows']:,} rows x {d['n_features']:,} features"
            f"{' (sparse)' if d['sparse'] else ''}, {d['size']}"
            f"{', TOAST ' + d['toast'] if d.get('toast') else ''}; {d['epochs']} epochs"
            f"{'; ' + d['note'] if d['note'] else ''}.")
    extras = []
    if "shuffle_once_copy_seconds" in d:
        extras.append(f"Shuffle Once copy (`CREATE TABLE .. AS SELECT * .. ORDER BY random()`): {d['shuffle_once_copy_seconds']:.2f} s")
    if "pile_shuffle_copy_seconds" in d:
        extras.append(f"Shuffle Once copy with `corgipile_shuffle`: {d['pile_shuffle_copy_seconds']:.2f} s")
    if "export_seconds" in d:
        extras.append(f"psycopg export of the training table into numpy: {d['export_seconds']:.2f} s")
    lines.append(head + ("  \n" + "; ".join(extras) + "." if extras else ""))
    for model, m in d["models"].items():
        runs = m["runs"]
        base = epoch_median(runs.get("no_shuffle"))
        base_of = lambda name: epoch_median(runs.get(BASELINE.get(name, "no_shuffle")))  # noqa: E731
        lines += ["", f"**{model}** — best validation accuracy of any strategy {m['best_val_acc']:.4f}; "
                      f"target = best − 0.5 pt = {m['best_val_acc'] - TOLERANCE:.4f}", "",
                  "| strategy | epoch s median | range | ÷ no_shuffle (same buffer mode) | ÷ scan floor | train acc | test acc | "
                  "best val acc | end-to-end s to target (epoch) | backend VmHWM MB |",
                  "|---|---|---|---|---|---|---|---|---|---|",
                  f"| scan floor `{'sum(cardinality(val))' if d['sparse'] else 'sum(features[1])'}` | {fmt_s(floor)} | "
                  f"{fmt_s(min(fl))}–{fmt_s(max(fl))} | {fmt_r(ratio(floor, base))} | 1.00 | | | | | "
                  f"{d['floor']['vm_hwm_mb']:.0f} |"]
        for name, r in runs.items():
            if "skipped" in r:
                lines.append(f"| {name} | skipped: {r['skipped']} | | | | | | | | |")
                continue
            em = med(r["epoch_seconds"])
            e2e = "not reached" if r["e2e"] is None else f"{r['e2e']:.2f} ({r['e2e_epoch']})"
            best = max(a for a in r["val_acc"] if a is not None)
            hwm = f"{r['vm_hwm_mb']:.0f}" if "vm_hwm_mb" in r else "(client)"
            label = {"shuffle_once": "shuffle_once (copy + no_shuffle)",
                     "shuffle_once_pile": "shuffle_once_pile (corgipile_shuffle copy + no_shuffle)",
                     "sklearn": "sklearn SGDClassifier (export + partial_fit)"}.get(name, name)
            lines.append(f"| {label} | {fmt_s(em)} | {fmt_s(min(r['epoch_seconds']))}–{fmt_s(max(r['epoch_seconds']))} | "
                         f"{fmt_r(ratio(em, base_of(name))) if name != 'sklearn' else '–'} | "
                         f"{fmt_r(ratio(em, floor)) if name != 'sklearn' else '–'} | {fmt_acc(r['train_acc'])} | "
                         f"{fmt_acc(r['test_acc'])} | {fmt_acc(best)} | {e2e} | {hwm} |")
        sk = runs.get("sklearn")
        if sk and "skipped" not in sk:
            lines.append("")
            lines.append(f"Converged ceiling ({'LogisticRegression' if model == 'logistic' else 'LinearSVC'}) test accuracy: "
                         + (f"{sk['ceiling']:.4f} (fit {sk['ceiling_seconds']:.1f} s)" if sk["ceiling"] is not None
                            else sk["ceiling_note"]))
    if "sensitivity" in d:
        s = d["sensitivity"]
        lines += ["", f"**Sensitivity (§7.3.4)**, {s['model']}, corgipile double-buffered (buffer 10% / block auto = buffer / 256, ≤ 10 MB "
                      "unless varied):", "",
                  "| setting | epoch s median | range | test acc | best val acc | s to target (epoch) |",
                  "|---|---|---|---|---|---|"]
        for label, r in s["runs"]:
            e2e = "not reached" if r["e2e"] is None else f"{r['e2e']:.2f} ({r['e2e_epoch']})"
            lines.append(f"| {label} | {fmt_s(med(r['epoch_seconds']))} | {fmt_s(min(r['epoch_seconds']))}–"
                         f"{fmt_s(max(r['epoch_seconds']))} | {fmt_acc(r['test_acc'])} | "
                         f"{fmt_acc(max(a for a in r['val_acc'] if a is not None))} | {e2e} |")
    return "\n".join(lines)


def ratios(d, model):
    runs = d["models"][model]["runs"]
    ok = lambda n: runs.get(n) if runs.get(n) and "skipped" not in runs[n] else None  # noqa: E731
    cp, ns, sb, so, sk, c2, nss = (ok(n) for n in ("corgipile", "no_shuffle", "corgipile_single", "shuffle_once",
                                                    "sklearn", "corgipile_buf2", "no_shuffle_single"))
    floor = med(d["floor"]["seconds"])
    return {
        "cp_ns": ratio(epoch_median(cp), epoch_median(ns)),
        "sb_nss": ratio(epoch_median(sb), epoch_median(nss)),
        "cp_floor": ratio(epoch_median(cp), floor),
        "db_sb": ratio(epoch_median(cp), epoch_median(sb)),
        "sb_ns": ratio(epoch_median(sb), epoch_median(nss)),
        "db_sb_disjoint": bool(cp and sb and max(cp["epoch_seconds"]) < min(sb["epoch_seconds"])),
        "so_cp": ratio(so and so["e2e"], cp and cp["e2e"]),
        "sk_cp": ratio(sk and sk["e2e"], cp and cp["e2e"]),
        "acc_gap_2pct": None if not (c2 and so) else c2["test_acc"] - so["test_acc"],
    }


def summary_table(results):
    lines = ["| dataset | model | corgipile ÷ no_shuffle (epoch, both double-buffered) | (both single-buffered) | "
             "corgipile ÷ scan floor | double ÷ single buffer | "
             "shuffle-once ÷ corgipile (end-to-end) | sklearn ÷ corgipile (end-to-end) | corgipile 2% − shuffle-once test acc (pt) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for d in results["datasets"]:
        for model in d["models"]:
            r = ratios(d, model)
            gap = "–" if r["acc_gap_2pct"] is None else f"{100 * r['acc_gap_2pct']:+.2f}"
            lines.append(f"| {d['dataset']} | {model} | {fmt_r(r['cp_ns'])} | {fmt_r(r['sb_nss'])} | {fmt_r(r['cp_floor'])} | {fmt_r(r['db_sb'])} | "
                         f"{fmt_r(r['so_cp'])} | {fmt_r(r['sk_cp'])} | {gap} |")
    return "\n".join(lines)


def targets(results):
    out = []

    def add(name, passed, detail):
        out.append(f"| {name} | {'–' if passed is None else 'PASS' if passed else 'FAIL'} | {detail} |")

    by_family = {}
    for d in results["datasets"]:
        by_family.setdefault(d["family"], []).append(d)
    for fam in ("susy", "higgs"):
        for d in by_family.get(fam, []):
            for model in d["models"]:
                r = ratios(d, model)
                add(f"{fam}-like {model}: corgipile epoch ≤ 1.10 × no_shuffle (both double-buffered)",
                    None if r["cp_ns"] is None else r["cp_ns"] <= 1.10, f"{fmt_r(r['cp_ns'])}×")
                add(f"{fam}-like {model}: corgipile (double) epoch ≤ 1.3 × scan floor",
                    None if r["cp_floor"] is None else r["cp_floor"] <= 1.3, f"{fmt_r(r['cp_floor'])}×")
    # Sparse rows cost more to decode than the scan floor touches (issue #14: ≤ 2.0×).
    for d in by_family.get("criteo", []):
        for model in d["models"]:
            r = ratios(d, model)
            add(f"criteo-like {model}: corgipile (double) epoch ≤ 2.0 × scan floor",
                None if r["cp_floor"] is None else r["cp_floor"] <= 2.0, f"{fmt_r(r['cp_floor'])}×")
    for d in results["datasets"]:
        if d["family"] not in ("susy", "higgs", "epsilon", "criteo"):
            continue
        for model in d["models"]:
            r = ratios(d, model)
            if r["db_sb"] is None:
                continue
            matters = r["sb_ns"] is not None and r["sb_ns"] >= 1.10
            add(f"{d['dataset']} {model}: double buffer measurably faster than single"
                f"{'' if matters else ' (SGD compute hidden anyway: single ÷ no_shuffle < 1.10)'}",
                (r["db_sb"] < 0.95 and r["db_sb_disjoint"]) if matters else None,
                f"double ÷ single {fmt_r(r['db_sb'])}, single ÷ no_shuffle {fmt_r(r['sb_ns'])}, "
                f"epoch ranges {'disjoint' if r['db_sb_disjoint'] else 'overlap'}")
    for d in results["datasets"]:
        if d["order"] != "clustered":
            continue
        for model in d["models"]:
            r = ratios(d, model)
            if r["acc_gap_2pct"] is None:
                continue
            add(f"{d['dataset']} {model}: corgipile buffer 2% test acc within 0.5 pt of Shuffle Once",
                abs(r["acc_gap_2pct"]) <= TOLERANCE or r["acc_gap_2pct"] > 0, f"{100 * r['acc_gap_2pct']:+.2f} pt")
    for d in by_family.get("susy", []):
        for model in d["models"]:
            r = ratios(d, model)
            runs = d["models"][model]["runs"]
            cp = runs.get("corgipile", {})
            for other, key, need, what in (("shuffle_once", "so_cp", 5, "Shuffle Once"),
                                           ("sklearn", "sk_cp", 10, "scikit-learn export path")):
                o = runs.get(other, {})
                name = f"{d['dataset']} {model}: end-to-end to target ≥ {need}× faster than {what}"
                if "e2e" not in cp or "e2e" not in o:
                    add(name, None, "not run")
                elif cp["e2e"] is None:
                    add(name, False, f"corgipile did not reach the target in {d['epochs']} epochs "
                                     f"({other}: {fmt_s(o['e2e']) if o['e2e'] else 'not reached either'})")
                elif o["e2e"] is None:
                    add(name, True, f"{other} never reached the target; corgipile {fmt_s(cp['e2e'])} s")
                else:
                    add(name, r[key] >= need, f"{fmt_r(r[key])}× ({fmt_s(o['e2e'])} s vs {fmt_s(cp['e2e'])} s)")
    return "\n".join(["| target | result | measured |", "|---|---|---|", *out])


def benchmark(results):
    """The name of a run's records: harness (make bench) or harness_quick (make bench-quick)."""
    return "harness_quick" if results["mode"] == "quick" else "harness"


def figures(results):
    """The figures of the report's "Ratios" and "Targets" sections, for the run's record
    (bench/records.py): per dataset and model the ratios of ratios(), the accuracy gap in points,
    and PASS/FAIL of every target."""
    out = {"total_minutes": results["total_seconds"] / 60}
    for d in results["datasets"]:
        for model in d["models"]:
            r = ratios(d, model)
            out[f"{d['dataset']} / {model}"] = {
                "corgipile_div_no_shuffle": r["cp_ns"], "corgipile_single_div_no_shuffle_single": r["sb_nss"],
                "corgipile_div_floor": r["cp_floor"], "double_div_single": r["db_sb"],
                "shuffle_once_div_corgipile_e2e": r["so_cp"], "sklearn_div_corgipile_e2e": r["sk_cp"],
                "buf2_minus_shuffle_once_test_acc_points": None if r["acc_gap_2pct"] is None else 100 * r["acc_gap_2pct"]}
    out["targets"] = records.pass_fail(targets(results).splitlines())
    return out


def report(results, pngs):
    cfg = results["config"]
    quick = results["mode"] == "quick"
    skipped = sorted({f"{n}: {r['skipped']}" for d in results["datasets"] for m in d["models"].values()
                      for n, r in m["runs"].items() if "skipped" in r})
    lines = [
        f"# CorgiPile benchmark ({results['mode']}) — {results['started']}", "",
        results.get("provenance", "Provenance: not recorded (a run before provenance lines)."), "",
        f"Extension version {results['extversion']}; PostgreSQL 15, throw-away cluster (shared_buffers 1GB, fsync off, "
        "warm cache), parallel workers off for the scan floor. 2-core shared machine: read ratios measured side by "
        "side in this run, not absolute seconds. Total run time "
        f"{results['total_seconds'] / 60:.1f} min (dataset generation/loading {results['generation_seconds']:.0f} s, "
        "0 when reused).", "",
        "**Method.** Every in-database run opens a fresh connection (VmHWM is that backend's peak RSS, shared buffers "
        "it touched included — compare with the scan floor's VmHWM). Epoch seconds come from `corgipile.epochs.seconds` "
        "(the training pass; the per-epoch validation pass over the validation relation — ≤ 50,000 test rows, the "
        "whole test set on the real data — is timed apart in `validation_seconds`). Final accuracies: `corgipile_evaluate` on the training table and on the full test table. "
        "End-to-end to target = (Shuffle Once copy time | numpy export time | 0) + the training statement's wall time "
        "up to the epoch whose validation accuracy reaches the best accuracy any strategy reached on that dataset and "
        "model, minus 0.5 points: everything but the later epochs and the harness's own per-epoch validation passes "
        "(statistics pass, planning, storing included). Strategies, like for like: no_shuffle, block_only, "
        "shuffle_once and corgipile (buffer 10%) double-buffered; `no_shuffle_single` and `corgipile_single` "
        "single-buffered, each divided by the other; `corgipile_buf2` = buffer 2% double-buffered; "
        "sliding_window and mrs buffer 10%; block size auto (buffer / 256, at most 10 MB). scikit-learn: SGDClassifier(loss=hinge|log_loss, "
        "shuffle=True, defaults otherwise), one partial_fit per epoch. Seeds fixed (`seed` 1, setseed for data).", "",
        f"**What runs.** {cfg['epochs']} epochs on generated tables, {cfg['real_epochs']} on real ones. " +
        "; ".join(f"{s['key']}-like {s['rows']:,}x{s['n_features']:,}: {', '.join(s['models'])} × "
                  f"{'all strategies' if s['strategies'] == ALL else ', '.join(s['strategies'])}"
                  f"{' + sensitivity' if s.get('sensitivity') else ''}" for s in cfg["synthetic"]) +
        f"; real {', '.join(cfg['real'])} × (shuffled, clustered, feature-ordered) × {', '.join(cfg['real_models'])} × "
        "all strategies.",
    ]
    if quick:
        lines += ["", "_Quick mode: small tables to check the harness; the targets below are evaluated on these small "
                      "shapes, not on the 4.5M-row tables they are defined for._"]
    if skipped:
        lines += ["", "**Skipped strategies** (the installed extension rejects them): " + "; ".join(skipped)]
    lines += ["", "## Targets", "", targets(results), "", "## Ratios (same run)", "", summary_table(results), "",
              "## Per dataset", ""]
    for d in results["datasets"]:
        lines += [dataset_table(d), ""]
    lines += ["## Tuple order (paper Figures 3/4)", ""]
    tr = results["trace"]
    if "missing" in tr:
        lines.append(f"Not produced: {tr['missing']}.")
    else:
        for n, v in tr.items():
            if isinstance(v, dict) and "skipped" in v:
                lines.append(f"- {n}: skipped ({v['skipped']})")
    lines += ["", "## Plots", ""] + [f"![{os.path.basename(p)}]({os.path.basename(p)})" for p in pngs]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
