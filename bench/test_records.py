"""Unit tests of the run records (bench/records.py) and of scripts/bench_ranges.py; no database.

    .venv/bin/python -m pytest -q bench/test_records.py"""

import json
import math
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "scripts"))

import bench_ranges  # noqa: E402
import records  # noqa: E402


@pytest.fixture
def runs(tmp_path, monkeypatch):
    d = tmp_path / "runs"
    monkeypatch.setattr(records, "RUNS_DIR", str(d))
    monkeypatch.setattr(bench_ranges, "RUNS", str(d))
    return d


def lines(path):
    return path.read_text().splitlines()


def test_append_adds_one_line_per_run_and_never_rewrites(runs):
    records.append_record("demo", {"ratio": 1.06, "rounds": [1.04, 1.07], "ok": "PASS"}, make_target="bench-demo")
    first = (runs / "demo.jsonl").read_bytes()
    records.append_record("demo", {"ratio": 1.09})
    data = (runs / "demo.jsonl").read_bytes()
    assert data.startswith(first) and data.endswith(b"\n")
    a, b = (json.loads(x) for x in lines(runs / "demo.jsonl"))
    assert a["figures"] == {"ratio": 1.06, "rounds": [1.04, 1.07], "ok": "PASS"}
    assert b["figures"] == {"ratio": 1.09}
    for r in (a, b):
        assert records.problems(r, "demo") == []
        assert r["version"] == records.cargo_version()
        assert r["machine"]["cpus"] == os.cpu_count()
        assert r["commit"] is None or len(r["commit"]) == 40
        assert isinstance(r["dirty"], bool) or r.get("incomplete")
        assert r["date"].endswith("Z") and r["duration_s"] >= 0


def test_make_target_only_when_make_ran_it(monkeypatch):
    monkeypatch.delenv("MAKELEVEL", raising=False)
    assert records.make_record("demo", {"x": 1}, make_target="bench-demo")["make_target"] is None
    monkeypatch.setenv("MAKELEVEL", "1")
    assert records.make_record("demo", {"x": 1}, make_target="bench-demo")["make_target"] == "bench-demo"


@pytest.mark.parametrize("bad", [{"x": math.nan}, {"x": [1.0, math.inf]}, {"x": {"y": -math.inf}}, {"x": object()},
                                 {}, {1: 2.0}, None])
def test_bad_figures_write_nothing(runs, bad):
    with pytest.raises(ValueError):
        records.append_record("demo", bad)
    assert not (runs / "demo.jsonl").exists()


def test_clean_rounds_and_converts():
    np = pytest.importorskip("numpy")
    out = records.clean({"a": 1.0612345678, "b": (1, 2), "c": np.float64(0.5), "d": np.int64(3), "e": None, "f": True})
    assert out == {"a": 1.06123, "b": [1, 2], "c": 0.5, "d": 3, "e": None, "f": True}
    assert type(out["d"]) is int


def test_a_line_cut_short_is_not_joined(runs):
    runs.mkdir()
    (runs / "demo.jsonl").write_text('{"cut short')
    records.append_record("demo", {"x": 1})
    assert lines(runs / "demo.jsonl")[1].startswith('{"schema"')


def test_problems_names_what_is_missing():
    r = records.make_record("demo", {"x": 1})
    assert records.problems(r, "demo") == []
    assert "benchmark 'demo' in other.jsonl" in records.problems(r, "other")
    bad = dict(r, commit="not hex", machine={"cpus": 2})
    found = " | ".join(records.problems(bad, "demo"))
    assert "commit" in found and "machine has no cpu_model" in found
    del bad["figures"]
    assert "missing keys: figures" in " | ".join(records.problems(bad, "demo"))
    # Nulls only in a record that says it is incomplete.
    partial = dict(r, machine=dict(r["machine"], cpu_model=None))
    assert records.problems(partial, "demo")
    assert records.problems(dict(partial, incomplete=True), "demo") == []


def test_pass_fail():
    table = ["| target | result | measured |", "|---|---|---|", "| a ≤ 1.3 × b | PASS | 1.06× |",
             "| c | FAIL | 1.2 |", "| d | – | not run |", "| e | **FAIL** | x |"]
    assert records.pass_fail(table) == {"a ≤ 1.3 × b": "PASS", "c": "FAIL", "e": "FAIL"}


def test_check_passes_without_records(runs, capsys):
    assert bench_ranges.check(str(runs)) == 0  # no folder
    runs.mkdir()
    (runs / "README.md").write_text("format")
    assert bench_ranges.check(str(runs)) == 0  # an empty folder


def test_check_finds_bad_lines(runs, capsys):
    records.append_record("demo", {"x": 1})
    assert bench_ranges.check(str(runs)) == 0
    with open(runs / "demo.jsonl", "a") as f:
        f.write('{"schema": 1, "figures": {"x": 1}}\n\nnot json\n{"benchmark": "demo", "figures": {"x": NaN}}\n')
    (runs / "notes.txt").write_text("")
    assert bench_ranges.check(str(runs)) == 1
    err = capsys.readouterr().err
    assert "demo.jsonl:2: missing keys" in err and "demo.jsonl:3: empty line" in err
    assert "demo.jsonl:4: not JSON" in err and "demo.jsonl:5: not JSON (NaN" in err and "notes.txt" in err


def test_ranges_over_runs(runs, capsys):
    for ratio, rounds in ((1.04, [1.0, 1.05]), (1.09, [1.07, 1.18]), (1.06, [0.97, 1.06])):
        records.append_record("demo", {"ratio": ratio, "rounds": rounds, "t": {"ok": "PASS"}, "none": None},
                              config={"rows": 10})
    args = bench_ranges.argparse.Namespace(benchmark=None, version=None, major=None, clean=False, no_imported=False,
                                           commit=None, since=None, figure=None, quote=False, digits=3)
    got, problems = bench_ranges.read_runs(str(runs))
    assert problems == [] and len(got) == 3
    bench_ranges.ranges(bench_ranges.select(got, args), args)
    out = capsys.readouterr().out
    assert "3 runs" in out
    assert "- ratio: 1.04–1.09 (median 1.06), 3 runs" in out
    assert "- rounds: 0.970–1.18 (median 1.06), 3 runs, 6 values pooled" in out
    assert "- t / ok: PASS 3 (3 runs)" in out
    assert "- none: not measured in any of the 3 runs" in out


def test_provenance_lines_parse():
    p = bench_ranges.parse_provenance(
        "Provenance: corgipile 0.4.0, commit 7d295c2+changes, command `make bench-quick` → `bench/harness.py --quick`, "
        "PostgreSQL 15.20 (Debian 15.20-0+deb12u1), 2026-11-24 23:41 UTC, 2 CPUs (Intel(R) Xeon(R) Processor).")
    assert p == {"version": "0.4.0", "commit": "7d295c2", "changes": "+changes", "target": "bench-quick",
                 "command": "bench/harness.py --quick", "pg": "15.20 (Debian 15.20-0+deb12u1)",
                 "date": "2026-11-24 23:41", "cpus": "2", "cpu": "Intel(R) Xeon(R) Processor"}
    p = bench_ranges.parse_provenance(
        "Provenance: corgipile 0.5.0, commit 66bd755 (the library measured was built from it; later edits in the tree "
        "were not installed), command `make bench-groups` → `bench/groups_one_pass.py`, PostgreSQL 18.6, "
        "2026-11-27 01:39 UTC, 2 CPUs (AMD EPYC).")
    assert (p["commit"], p["changes"], p["pg"], p["cpu"]) == ("66bd755", None, "18.6", "AMD EPYC")
    assert bench_ranges.parse_provenance("Provenance: corgipile 0.4.0, committed in ff718d9 on 2026-11-23") is None


EPOCH_TIMES_MD = """Provenance: corgipile 0.5.0, commit 6bb92ed, command `make bench-epochs` → `bench/epoch_times.py`, PostgreSQL 15.20 (Debian 15.20-0+deb12u1), 2026-11-28 11:22 UTC, 2 CPUs (AMD EPYC).

Table `bench_clustered_4500000x18`: 4,500,000 rows x 18 float8 features, 925 MB, clustered by label; svm, 3 epochs x 3 interleaved rounds (medians over all epochs), default block and buffer sizes.

| what | median s | range s | ÷ no_shuffle | ÷ scan touching arrays | last-epoch train accuracy |
|---|---|---|---|---|---|
| `SELECT count(*)` | 0.310 | 0.302–0.311 | | | |
| `SELECT sum(features[1])` (scan floor) | 0.387 | 0.377–0.400 | | 1.00 | |
| epoch: corgipile, single buffer | 0.601 | 0.588–0.639 | 1.15 | 1.55 | 0.9864 |
| epoch: corgipile, double buffer | 0.409 | 0.372–0.488 | 1.01 | 1.06 | 0.9864 |
| `SELECT sum(corgipile_predict(57192, features))` | 0.456 | 0.454–0.458 | | 1.18 | |

| target (issue #35) | result | measured |
|---|---|---|
| corgipile double-buffered epoch ≤ 1.15 × scan floor (median) | PASS | 1.06× |
| … in every round (epoch median of the round ÷ the floor measured before it) | PASS | 1.04–1.07× |
"""


def test_epoch_times_markdown_reads_back_as_the_script_records_it():
    f = bench_ranges.epoch_times_figures(EPOCH_TIMES_MD)
    assert f["corgipile_double_div_floor"] == 1.06
    assert (f["corgipile_double_div_floor_rounds_min"], f["corgipile_double_div_floor_rounds_max"]) == (1.04, 1.07)
    assert f["corgipile_div_no_shuffle_double"] == 1.01 and f["corgipile_div_no_shuffle_single"] == 1.15
    assert f["floor_s"] == {"median": 0.387, "min": 0.377, "max": 0.4}
    assert f["predict"]["predict_by_id"]["div_floor"] == 1.18
    assert f["targets"]["corgipile double-buffered epoch ≤ 1.15 × scan floor (median)"] == "PASS"
    assert bench_ranges.epoch_times_config(EPOCH_TIMES_MD) == {"rows": 4_500_000, "features": 18, "epochs": 3, "rounds": 3}
    r = bench_ranges.imported_record("epoch_times", f, EPOCH_TIMES_MD.splitlines()[0], "x.md@abc1234", "x.md",
                                     bench_ranges.epoch_times_config(EPOCH_TIMES_MD))
    assert records.problems(r, "epoch_times") == []
    assert r["incomplete"] is True and r["machine"]["memory_bytes"] is None and r["dirty"] is False


def test_the_kept_records_are_valid():
    """What `make lint` checks, on the records in the tree."""
    assert subprocess.run([sys.executable, os.path.join(os.path.dirname(HERE), "scripts", "bench_ranges.py"),
                           "--check"], capture_output=True).returncode == 0


# ---------------------------------------------------------------- scripts/check_figures.py

import check_figures  # noqa: E402


def figure_run(commit, ratio, major=15, dirty=False):
    return {"benchmark": "demo", "commit": commit, "dirty": dirty, "postgres": {"major": major},
            "version": "0.5.0", "figures": {"epochs": {"corgipile": {"div_floor": ratio}}}}


RUNS = [figure_run("aaaa111", 1.07), figure_run("aaaa111", 1.10), figure_run("bbbb222", 1.30),
        figure_run("aaaa111", 1.90, dirty=True), figure_run("aaaa111", 1.60, major=18)]
MARK = '<!-- figure demo major=15 commit=aaaa111 runs=2 path="epochs / corgipile / div_floor" -->'


def check(tmp_path, text):
    page = tmp_path / "page.md"
    page.write_text(text)
    return check_figures.check_page(page, RUNS)


def test_a_marked_figure_is_its_records_range(tmp_path):
    # Clean runs of that commit and major only: not bbbb222's, not the uncommitted one, not 18's.
    assert check(tmp_path, f"an epoch costs {MARK}1.07–1.10× a scan") == ([], 1)
    problems, _ = check(tmp_path, f"an epoch costs {MARK}1.06–1.10× a scan")
    assert problems and "the 2 records say 1.07–1.10" in problems[0]
    problems, _ = check(tmp_path, MARK.replace("runs=2", "runs=3") + "1.07–1.10×")
    assert problems and "runs=3" in problems[0]
    both = MARK.replace("commit=aaaa111", "commit=aaaa111,bbbb222").replace("runs=2", "runs=3")
    assert check(tmp_path, both + "1.07–1.30×") == ([], 1)
    one = MARK.replace("major=15", "major=18").replace("runs=2", "runs=1")
    assert check(tmp_path, one + "1.60×") == ([], 1)


def test_a_marker_must_name_what_it_quotes(tmp_path):
    for bad in ['<!-- figure major=15 commit=a runs=1 path="x" -->1', '<!-- figure demo major=15 runs=1 path="x" -->1',
                '<!-- figure demo major=15 commit=a path="x" -->1', '<!-- figure demo major=15 commit=a runs=1 -->1',
                '<!-- figure demo major=15 commit=a runs=1 path="epochs / nothing" -->1']:
        problems, count = check(tmp_path, bad)
        assert count == 1 and len(problems) == 1, (bad, problems)


def test_runs_beside_a_busy_neighbour_are_their_own_figure(tmp_path):
    busy = figure_run("aaaa111", 1.75)
    busy["config"] = {"busy_neighbour": True}
    page = tmp_path / "page.md"
    page.write_text(f"{MARK}1.07–1.10× quiet, " + MARK.replace("runs=2", "runs=1 busy_neighbour=true") + "1.75× busy")
    assert check_figures.check_page(page, RUNS + [busy]) == ([], 2)


def test_a_marker_in_a_code_block_is_an_example(tmp_path):
    assert check(tmp_path, f"```markdown\n{MARK}9.99×\n```\nthen {MARK}1.07–1.10×\n") == ([], 1)


# ---------------------------------------------------------------- figures without a record (check_figures.page_figures)

RESULTS_MD = """Provenance: corgipile 0.5.0, commit aaaa111, command `make bench-demo` → `bench/demo.py`, 2 CPUs (AMD EPYC).

| what | median s | ÷ floor |
|---|---|---|
| epoch | 0.420 | 1.07 |
| copy | 4,500.5 | 0.93 |

Rounds 1.04–1.09; accuracy 0.9708, gap -0.15 points.
"""


def figures_page(tmp_path, text, name="docs/results.md"):
    """page_figures on a page of a checkout in tmp_path that holds bench/results/demo.md."""
    (tmp_path / "bench" / "results").mkdir(parents=True, exist_ok=True)
    (tmp_path / "bench" / "results" / "demo.md").write_text(RESULTS_MD)
    page = tmp_path / name
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(text)
    return check_figures.page_figures(page, root=tmp_path)


CITES = "`make bench-demo`, [bench/results/demo.md](../bench/results/demo.md): "


def test_a_figure_without_a_record_fails(tmp_path):
    problems, counts = figures_page(tmp_path, "## Epochs\n\nAn epoch costs 1.31× the floor and 0.42 s.\n")
    assert len(problems) == 2 and "'1.31×'" in problems[0] and "cites none" in problems[0]
    assert "results.md:3" in problems[0] and "'0.42 s'" in problems[1]
    # Cited, but the file does not hold it (nor a rounding of it: 0.42 is not 0.420).
    problems, _ = figures_page(tmp_path, f"## Epochs\n\n{CITES}an epoch costs 1.31× the floor and 0.42 s.\n")
    assert len(problems) == 2 and "bench/results/demo.md" in problems[0]


def test_a_figure_in_the_file_its_section_cites_passes(tmp_path):
    text = (f"## Epochs\n\n{CITES}an epoch takes 0.420 s, 1.07× the floor (rounds 1.04 to 1.09×), a copy "
            "4500.5 s or 4,500.5 s, 0.93×; accuracy 0.9708, −0.15 points.\n")
    assert figures_page(tmp_path, text) == ([], {"marked": 0, "cited": 8, "allowed": 0})
    # Another section's citation does not count, nor a sign the file does not have.
    problems, _ = figures_page(tmp_path, f"## A\n\n{CITES}\n\n## B\n\nAn epoch: 1.07×.\n")
    assert len(problems) == 1 and "(section 'B')" in problems[0]
    problems, _ = figures_page(tmp_path, f"## A\n\n{CITES}a gap of 0.15 points, -0.93×.\n")
    assert len(problems) == 2


def test_a_marked_figure_passes_and_is_counted(tmp_path):
    problems, counts = figures_page(tmp_path, f"## Epochs\n\nAn epoch costs {MARK}1.07–1.10× a scan.\n")
    assert problems == [] and counts["marked"] == 1


def test_code_links_and_other_sections_are_not_figures(tmp_path):
    text = ("# Title\n\n## Results\n\n"
            "```sql\nSELECT 0.5 AS x;  -- 1.07×\n```\n\n`{\"buffer_size\": \"10%\"}` and [the 0.4.0 notes](x-0.4.1.md), "
            "0.5.0, PostgreSQL 18.6, §7.3.4, 4.5M rows, 3 epochs of 20,000 rows, seeds 1 to 5.\n\n"
            "| setting (10%, 2.5 MB) | rows |\n|---|---|\n| 2.5 MB blocks | 0.97 |\n")
    # results.md is checked whole; only the table cell (0.97) is a figure here.
    problems, _ = figures_page(tmp_path, text)
    assert len(problems) == 1 and "'0.97'" in problems[0], problems
    # A page outside SCOPE is checked only in a section that cites results or carries a marker.
    guide = "## Install\n\nTakes 10 minutes, 1.5 GB, a default of 10%.\n\n## Speed\n\nIt took 3.5 s and "
    assert figures_page(tmp_path, guide + "more.\n", name="docs/guide.md") == ([], {"marked": 0, "cited": 0, "allowed": 0})
    problems, _ = figures_page(tmp_path, guide + f"{MARK}1.07–1.10×.\n", name="docs/guide.md")
    assert len(problems) == 1 and "'3.5 s'" in problems[0]


def test_ranges_and_before_after_are_figures(tmp_path):
    problems, _ = figures_page(tmp_path, "## R\n\nns a row 289–293, medians 403 → 425; 0 to 6 waits.\n")
    assert [p.split("'")[1] for p in problems] == ["289–293", "403", "425"]


def test_not_a_measurement_is_explicit_and_covers_one_number(tmp_path):
    allow = "<!-- not-a-measurement: the default -->"
    problems, counts = figures_page(tmp_path, f"## R\n\nA buffer of {allow}10% and {allow}\n2 MB blocks.\n")
    assert problems == [] and counts["allowed"] == 2
    problems, _ = figures_page(tmp_path, f"## R\n\n0.5 s, then {allow}10%, 2 MB.\n")
    assert len(problems) == 2 and "'0.5 s'" in problems[0] and "'2 MB'" in problems[1]
    problems, _ = figures_page(tmp_path, f"## R\n\nA buffer of {allow}10% of 2 MB.\n")
    assert len(problems) == 1 and "'2 MB'" in problems[0]
    problems, _ = figures_page(tmp_path, f"## R\n\n{allow}a buffer of 10%.\n")
    assert len(problems) == 2 and "not right before a figure" in problems[1]
    problems, _ = figures_page(tmp_path, f"## Guide\n\nA buffer of {allow}10%.\n", name="docs/guide.md")
    assert len(problems) == 1 and "outside the sections checked" in problems[0]


def test_a_key_may_hold_the_path_separator():
    run = figure_run("aaaa111", 1.0)
    run["figures"] = {"susy (4,500,000 x 18) / svm": {"div_floor": 1.22}}
    s = {"major": "15", "commit": "aaaa111", "path": "susy (4,500,000 x 18) / svm / div_floor", "runs": "1"}
    assert check_figures.figure([run], "demo", s) == ("1.22", 1)


def test_the_docs_pass():
    """What `make lint` checks, on README.md and docs/ of the tree."""
    assert subprocess.run([sys.executable, os.path.join(os.path.dirname(HERE), "scripts", "check_figures.py")],
                          capture_output=True).returncode == 0
