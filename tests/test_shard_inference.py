"""Standard errors and p-values ("inference": true) on a sharded table (the shard servers of
test_shards.py): after the epochs, each Newton pass is a round in which every shard reads its
whole table at the coordinator's coefficients and sends its part of the information matrix (the
lower triangle of H, the gradient, rows, loss, counts); the coordinator merges them and steps
as one server does (src/shard/training/inference.rs, ml/src/inference/part.rs).

Newton's optimum is unique, so however differently the shards' SGD epochs end, the polished
coefficients and their standard errors must equal those one server computes on a local copy of
the same rows, to 1e-6 relative (a logistic model of an array column, a linear model of a column
list with a one-hot column and its reference level, a logistic model of a text label); a local
partition beside the two foreign ones counts. Then the size bound: a model whose shards' parts
cannot be read within four times corgipile.max_model_memory is 54000 with a hint after the
statistics round, before any training round, and nothing is stored; a forged Newton pass
request is refused by the shard before it reads a row. (Forged parts: test_shard_security.py.)"""

import json

import psycopg
import psycopg.errors as E
import pytest
from psycopg.types.json import Jsonb

import test_shards
from helpers import SHARD_PROTOCOL, models_count, scalar, train
from test_shards import S1, S2, local_copy, on_shard, shard_dsn, sharded_table, version

pytestmark = pytest.mark.own_cluster  # the two shard servers of test_shards.py

# test_shards.py's module fixture: its two shard servers, started for this module too.
shards = test_shards.shards
# Rows of shard 1, shard 2 and the local partition.
SIZES = (2500, 1500, 1000)
# a, b numbers; s a category of three levels (with an effect on both targets); y a linear
# target, z a 0/1 label and answer its text ('no'/'yes') from a logistic model; deterministic
# (hashes of the id), so that every server draws the same rows.
ROWS_SQL = """SELECT i AS id, a, b, s, 1.5 + 0.8 * a - 0.05 * b + e + 1.5 * n AS y,
                     (u < 1 / (1 + exp(-(-0.4 + 0.7 * a + 0.03 * b + e))))::int AS z,
                     CASE WHEN u < 1 / (1 + exp(-(-0.4 + 0.7 * a + 0.03 * b + e))) THEN 'yes' ELSE 'no' END AS answer,
                     ARRAY[a, b]::float8[] AS features
              FROM (SELECT i, (hashint4(i) % 1000) / 400.0 AS a, (hashint4(i * 7 + 3) % 1000) / 25.0 AS b,
                           (ARRAY['red', 'green', 'blue'])[1 + abs(hashint4(i * 5 + 1)) % 3] AS s,
                           (abs(hashint4(i * 11 + 2)) % 10000) / 10000.0 AS u,
                           ((abs(hashint4(i * 13 + 7)) % 10000) / 10000.0 - 0.5) * 2 AS n,
                           CASE abs(hashint4(i * 5 + 1)) % 3 WHEN 1 THEN 0.3 WHEN 2 THEN -0.2 ELSE 0 END AS e
                    FROM generate_series({start}, {stop}) i) r"""
COLS = "id int, a float8, b float8, s text, y float8, z int, answer text, features float8[]"
REL = 1e-6


def rows_sql(start, n):
    return ROWS_SQL.format(start=start, stop=start + n - 1)


@pytest.fixture(scope="module")
def inf(dsn, shards):
    """sh_inf: ids 1-2500 on shard 1, 2501-4000 on shard 2, 4001-5000 in a local partition;
    sh_inf_copy: a local copy of every row."""
    starts = (1, 1 + SIZES[0], 1 + SIZES[0] + SIZES[1])
    for i in (0, 1):
        on_shard(i, "DROP TABLE IF EXISTS inf_part", f"CREATE TABLE inf_part AS {rows_sql(starts[i], SIZES[i])}",
                 "VACUUM ANALYZE inf_part")
    with psycopg.connect(dsn, autocommit=True) as c:
        bounds = [f"FOR VALUES FROM ({s}) TO ({s + n})" for s, n in zip(starts, SIZES)]
        sharded_table(c, "sh_inf", [(bounds[0], S1, "inf_part"), (bounds[1], S2, "inf_part"), (bounds[2], None, None)],
                      cols=COLS)
        c.execute(f"INSERT INTO sh_inf {rows_sql(starts[2], SIZES[2])}")
        local_copy(c, "sh_inf")
        assert scalar(c, "SELECT count(*) FROM sh_inf_copy") == sum(SIZES)
    return "sh_inf"


def coefficients(conn, model):
    """feature -> (coefficient, std_error, statistic, p_value, ci_low, ci_high)."""
    rows = conn.execute("""SELECT feature, coefficient, std_error, statistic, p_value, ci_low, ci_high
                           FROM corgipile_model_coefficients(%s)""", (model,)).fetchall()
    return {r[0]: r[1:] for r in rows}


def inference(conn, model):
    return scalar(conn, "SELECT metrics->'inference' FROM corgipile.models WHERE id = %s", (model,))


def assert_same_tests(sharded, single, what):
    assert sharded.keys() == single.keys(), (what, sharded.keys() ^ single.keys())
    for name, want in single.items():
        got = sharded[name]
        for k, (g, w) in enumerate(zip(got, want)):
            if w is None:
                assert g is None, (what, name, k, g)
                continue
            # A tail's relative error is its statistic's times the statistic squared (z of 20:
            # 400 times): a p-value within 1e-4, every other number within REL.
            assert g == pytest.approx(w, rel=1e-4 if k == 3 else REL, abs=1e-12), (what, name, k, g, w)


@pytest.mark.parametrize("kind, params", [
    ("logistic", {"features": "features", "label": "z"}),
    ("linear", {"features": ["a", "b", "s"], "label": "y"}),
    ("logistic", {"features": ["a", "b", "s"], "label": "answer"}),
], ids=["logistic-array", "linear-one-hot", "logistic-text-label"])
def test_standard_errors_equal_one_servers(conn, inf, kind, params):
    params = {**params, "inference": True, "epochs": 2, "seed": 1}
    single = train(conn, "sh_inf_copy", kind, params)
    sharded = train(conn, "sh_inf", kind, params)
    got, want = coefficients(conn, sharded), coefficients(conn, single)
    print(f"\n{kind} {params['features']}: (coefficient, std_error) one server {[(k, v[:2]) for k, v in want.items()]}"
          f"\n  sharded {[(k, v[:2]) for k, v in got.items()]}")
    assert_same_tests(got, want, kind)
    # Every coefficient but a reference level has a test; the intercept's too.
    assert got["(intercept)"][1] is not None
    ours, theirs = inference(conn, sharded), inference(conn, single)
    assert ours["rows"] == theirs["rows"] == sum(SIZES)
    assert ours["test"] == theirs["test"] == ("z" if kind == "logistic" else "t")
    assert ours.get("reference") == theirs.get("reference")
    if params["features"] != "features":
        # s's most frequent named level is dropped from the design: no test, coefficient 0.
        assert [r["column"] for r in ours["reference"]] == ["s"]
        dropped = got[ours["reference"][0]["feature"]]
        assert dropped[0] == 0 and dropped[1] is None
    for key in ("log_likelihood", "sigma2", "df"):
        if theirs.get(key) is None:
            assert ours.get(key) is None, key
        else:
            assert ours[key] == pytest.approx(theirs[key], rel=REL), key
    assert 1 <= ours["newton_passes"] <= 12
    if params["features"] == "features":
        # The stored model is the polished one: one server's predictions.
        q = "SELECT corgipile_predict(%s::bigint, ARRAY[1.2, 7.5]::float8[])"
        assert scalar(conn, q, (sharded,)) == pytest.approx(scalar(conn, q, (single,)), rel=REL)


@pytest.fixture(scope="module")
def wide(dsn, shards):
    """sh_inf_wide: 300 features, 40 rows on each shard."""
    part = """CREATE TABLE inf_wide AS SELECT i AS id, i % 2 AS label,
              ARRAY(SELECT (hashint4(i * 301 + j) % 100) / 100.0 FROM generate_series(1, 300) j)::float8[] AS features
              FROM generate_series({start}, {stop}) i"""
    for i in (0, 1):
        on_shard(i, "DROP TABLE IF EXISTS inf_wide", part.format(start=1 + 40 * i, stop=40 + 40 * i))
    with psycopg.connect(dsn, autocommit=True) as c:
        sharded_table(c, "sh_inf_wide", [("FOR VALUES FROM (1) TO (41)", S1, "inf_wide"),
                                         ("FOR VALUES FROM (41) TO (81)", S2, "inf_wide")])
    return "sh_inf_wide"


def test_parts_too_large_to_read_are_54000_before_training(conn, wide):
    """With corgipile.max_model_memory 1MB, the 301 x 301 information matrix itself fits
    (725 kB), but a shard's part of it (45,451 values) could take more than four times that to
    read: refused after the statistics round, before the epochs' rounds, with what to do."""
    before = models_count(conn)
    conn.execute("SET corgipile.max_model_memory = '1MB'")
    try:
        with pytest.raises(E.ProgramLimitExceeded) as err:
            train(conn, wide, "logistic", {"inference": True, "epochs": 1, "seed": 1})
        primary = err.value.diag.message_primary
        assert primary.startswith('"inference" on 300 features over shards: each shard\'s part of the 301 x 301'), primary
        assert "four times corgipile.max_model_memory" in primary, primary
        assert err.value.diag.message_hint.startswith("Standard errors are for models of at most a few thousand")
        # Without "inference" the same model trains within the same limit.
        assert train(conn, wide, "logistic", {"epochs": 1, "seed": 1})
    finally:
        conn.execute("RESET corgipile.max_model_memory")
    assert models_count(conn) == before + 1


def test_a_forged_newton_pass_is_refused_by_the_shard(shards):
    """A Newton pass round asks a shard for its part at the coordinator's coefficients: the
    honest one sums every row (here exactly: x = [i, 2], 100 rows, a linear model); coefficients
    of another number, without the intercept the params fit, for a kind without a likelihood,
    a logistic model without its two labels, coefficients in a training round or none in a
    Newton pass are 08P01, and a matrix beyond this shard's corgipile.max_model_memory 54000,
    before a row is read."""
    on_shard(0, "DROP TABLE IF EXISTS forge_inf",
             "CREATE TABLE forge_inf AS SELECT i % 2 AS label, ARRAY[i, 2.0]::float8[] AS features "
             "FROM generate_series(1, 100) i")
    params = Jsonb({"features": "features", "label": "label", "inference": True})
    with psycopg.connect(shard_dsn(0), autocommit=True) as c:
        base = {"version": version(c), "protocol": SHARD_PROTOCOL, "phase": "Inference", "epoch": 1, "round": 0,
                "rounds": 1, "n_features": 2, "extras": {"label_values": [0.0, 1.0]}, "training": 5}
        ok = {**base, "inference": {"weights": [0.0, 0.0], "bias": 0.0}}
        reply = json.loads(scalar(c, "SELECT corgipile_shard_round('forge_inf', 'linear', %s, %s)",
                                  (params, json.dumps(ok))))
        part = reply["information"]
        # H's lower triangle over [x1, x2, 1]: sums of i^2, 2i, 4, i, 2, 1.
        assert part["h"] == [338350, 10100, 400, 5050, 200, 100]
        assert part["rows"] == reply["rows"] == 100 and part["counts"] == [100, 100]
        # At 0 the gradient is -sum(x * y) and the loss sum(y^2) (y: 1 for the 50 odd i).
        assert part["g"] == [-2500, -100, -50] and part["loss"] == 50
        for kind, request, state in (
                ("linear", {**base, "inference": {"weights": [0.0], "bias": 0.0}}, "08P01"),
                ("linear", {**base, "inference": {"weights": [0.0, 0.0], "bias": None}}, "08P01"),
                ("svm", ok, "08P01"),
                ("logistic", {**ok, "extras": {}}, "08P01"),
                ("linear", {**ok, "phase": "Train"}, "08P01"),
                ("linear", base, "08P01"),
                ("linear", {**base, "n_features": 100_000,
                            "inference": {"weights": [0.0] * 100_000, "bias": 0.0}}, "54000")):
            with pytest.raises(psycopg.Error) as err:
                c.execute("SELECT corgipile_shard_round('forge_inf', %s, %s, %s)",
                          (kind, params if kind != "svm" else Jsonb({"features": "features", "label": "label"}),
                           json.dumps(request)))
            assert err.value.sqlstate == state, (kind, err.value.sqlstate, err.value.diag.message_primary)
