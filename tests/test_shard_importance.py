"""corgipile_feature_importance on a sharded table (the shard servers of test_shards.py): every
shard samples its share of the rows (in proportion to its rows) and permutes each column among
its own sample; the coordinator pools the shards' scores. Checked: the columns rank as on one
server scoring the same model on a local copy of the same rows, the importances, baseline and
standardized coefficients agree within sampling noise, the rows add up to the "rows" asked for
(and to every row when fewer), a local partition beside the foreign ones counts, the cost bound
comes before any shard is contacted, and a forged importance request is refused by the shard."""

import json

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

import test_shards
from helpers import SHARD_PROTOCOL, train
from test_shards import DEAD_PORT, S1, S2, cluster_dir, local_copy, on_shard, shard_dsn, sharded_table, version

pytestmark = pytest.mark.own_cluster  # the two shard servers of test_shards.py

# Rows of shard 1, shard 2 and the local partition: shares of 2/3, 2/9 and 1/9.
SIZES = (30_000, 10_000, 5_000)
TOTAL = sum(SIZES)
# Four features: the label follows x2 most, then x3, then x1; x4 not at all.
ROWS_SQL = """SELECT i AS id, (2 * x[2] + 0.8 * x[3] + 0.3 * x[1] + 0.2 * (random() - 0.5) > 0)::int AS label,
                     3 * x[2] + 1 * x[3] + 0.3 * x[1] + 0.1 * (random() - 0.5) AS y, x AS features
              FROM (SELECT i, ARRAY[random() * 2 - 1, random() * 2 - 1, random() * 2 - 1, random() * 2 - 1] AS x
                    FROM generate_series({start}, {stop}) i) g"""
COLS = "id int, label int, y float8, features float8[]"
# Sampling noise allowed between the sharded estimate and one server's (accuracy or R² points).
TOLERANCE = 0.02
# test_shards.py's module fixture: its two shard servers, started for this module too.
shards = test_shards.shards


def rows_sql(start, n):
    return ROWS_SQL.format(start=start, stop=start + n - 1)


@pytest.fixture(scope="module")
def imp(dsn, shards):
    """sh_imp: ids 1-30000 on shard 1, 30001-40000 on shard 2, 40001-45000 in a local partition;
    sh_imp_copy: a local copy of every row."""
    starts = (1, 1 + SIZES[0], 1 + SIZES[0] + SIZES[1])
    for i in (0, 1):
        on_shard(i, "DROP TABLE IF EXISTS imp_part", f"SELECT setseed({0.3 + 0.2 * i})",
                 f"CREATE TABLE imp_part AS {rows_sql(starts[i], SIZES[i])}", "VACUUM ANALYZE imp_part")
    with psycopg.connect(dsn, autocommit=True) as c:
        bounds = [f"FOR VALUES FROM ({s}) TO ({s + n})" for s, n in zip(starts, SIZES)]
        sharded_table(c, "sh_imp", [(bounds[0], S1, "imp_part"), (bounds[1], S2, "imp_part"), (bounds[2], None, None)],
                      cols=COLS)
        c.execute("SELECT setseed(0.9)")
        c.execute(f"INSERT INTO sh_imp {rows_sql(starts[2], SIZES[2])}")
        local_copy(c, "sh_imp")
        assert c.execute("SELECT count(*) FROM sh_imp_copy").fetchone()[0] == TOTAL
    return "sh_imp"


def importance(conn, model, rel, params):
    rows = conn.execute("SELECT * FROM corgipile_feature_importance(%s::bigint, %s::regclass, %s)",
                        (model, rel, Jsonb(params))).fetchall()
    return rows, {r[0]: r for r in rows}


@pytest.mark.parametrize("model, label, metric", [("logistic", "label", "accuracy"), ("linear", "y", "r2")])
def test_the_columns_rank_as_on_one_server(conn, imp, model, label, metric):
    m = train(conn, "sh_imp_copy", model, {"epochs": 3, "seed": 1, "label": label})
    params = {"rows": 9000, "repeats": 5, "seed": 3}
    sharded, by_sharded = importance(conn, m, "sh_imp", params)
    single, by_single = importance(conn, m, "sh_imp_copy", params)
    print(f"\n{model} one server: {[(r[0], round(r[1], 4), round(r[2], 4)) for r in single]}"
          f"\n{model} sharded:    {[(r[0], round(r[1], 4), round(r[2], 4)) for r in sharded]}")
    assert [r[0] for r in sharded] == [r[0] for r in single] == [f"features[{j}]" for j in (2, 3, 1, 4)]
    # The shards' shares add up to the rows asked for.
    assert {r[6] for r in sharded} == {r[6] for r in single} == {9000}
    assert {r[4] for r in sharded} == {metric}
    assert abs(sharded[0][5] - single[0][5]) <= TOLERANCE, "baseline"
    for name, row in by_single.items():
        got = by_sharded[name]
        assert abs(got[1] - row[1]) <= TOLERANCE + 3 * max(got[2], row[2]), (name, got, row)
        # The sample's standard deviation of the feature: the same within sampling noise.
        assert got[3] == pytest.approx(row[3], rel=0.05, abs=0.01), (name, got, row)
    assert by_sharded["features[4]"][1] < 0.01 < by_sharded["features[1]"][1]


def test_fewer_rows_than_asked_is_every_row(conn, imp):
    m = train(conn, "sh_imp_copy", "logistic", {"epochs": 1, "seed": 1})
    sharded, _ = importance(conn, m, "sh_imp", {"rows": 100_000, "repeats": 1})
    single, _ = importance(conn, m, "sh_imp_copy", {"rows": 100_000, "repeats": 1})
    assert {r[6] for r in sharded} == {r[6] for r in single} == {TOTAL}
    # Every row, unpermuted: the same accuracy as one server's, to the last digit.
    assert sharded[0][5] == single[0][5]


def test_the_cost_bound_comes_before_any_shard_is_contacted(dsn, conn, imp):
    """A shard where nothing listens would be 08001: the bound's 54000 comes first."""
    m = train(conn, "sh_imp_copy", "logistic", {"epochs": 1, "seed": 1})
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP SERVER IF EXISTS shi_dead CASCADE")
        c.execute(f"""CREATE SERVER shi_dead FOREIGN DATA WRAPPER postgres_fdw
                      OPTIONS (host '{cluster_dir(DEAD_PORT)}', port '{DEAD_PORT}', dbname 'x')""")
        c.execute("CREATE USER MAPPING FOR CURRENT_USER SERVER shi_dead OPTIONS (user 'postgres')")
        try:
            sharded_table(c, "sh_imp_dead", [("FOR VALUES FROM (1) TO (100)", S1, "imp_part"),
                                             ("FOR VALUES FROM (100) TO (200)", "shi_dead", "imp_part")], cols=COLS)
            with pytest.raises(psycopg.OperationalError) as err:
                importance(c, m, "sh_imp_dead", {"rows": 10})
            assert err.value.sqlstate == "08001", err.value.diag.message_primary
            # 25 columns x 100 repeats x 10^6 rows: more predictions than a call may make.
            c.execute("DROP TABLE IF EXISTS shi_wide")
            c.execute("""CREATE TABLE shi_wide AS SELECT i % 2 AS label,
                             ARRAY(SELECT random() FROM generate_series(1, 25) WHERE i > 0) AS features
                         FROM generate_series(1, 200) i""")
            wide = train(c, "shi_wide", "logistic", {"epochs": 1, "seed": 1})
            with pytest.raises(psycopg.Error) as err:
                importance(c, wide, "sh_imp_dead", {"rows": 1_000_000, "repeats": 100})
            assert err.value.sqlstate == "54000", (err.value.sqlstate, err.value.diag.message_primary)
            assert "2501000000 predictions" in err.value.diag.message_primary, err.value.diag.message_primary
            c.execute("SET corgipile.max_buffer_memory = '1MB'")
            with pytest.raises(psycopg.Error) as err:
                importance(c, m, "sh_imp_dead", {"rows": 100_000})
            assert err.value.sqlstate == "54000", (err.value.sqlstate, err.value.diag.message_primary)
            assert "corgipile.max_buffer_memory" in err.value.diag.message_primary
        finally:
            c.execute("DROP TABLE IF EXISTS sh_imp_dead, shi_wide")
            c.execute(sql.SQL("DROP SERVER IF EXISTS shi_dead CASCADE"))


def test_a_forged_importance_request_is_refused_by_the_shard(imp):
    """corgipile_shard_round is callable by anyone who can read the table: an importance round
    beyond the bounds is refused before any row is read."""
    with psycopg.connect(shard_dsn(0), autocommit=True) as c:
        model = {"kind": "logistic", "n_features": 4, "n_outputs": 1, "weights": [0.0, 1.0, 0.5, 0.0],
                 "bias": [0.0], "layers": None, "activation": None}
        base = {"version": version(c), "protocol": SHARD_PROTOCOL, "phase": "Importance", "epoch": 1, "round": 0,
                "rounds": 1, "n_features": 4, "weights": [], "bias": [], "extras": {},
                "evaluate": {"model": model, "classes": [0, 1], "preprocessing": None}}
        params = Jsonb({"features": "features", "label": "label"})

        def call(request):
            return c.execute("SELECT corgipile_shard_round('imp_part', 'logistic', %s, %s)",
                             (params, json.dumps(request))).fetchone()[0]

        honest = json.loads(call({**base, "importance": {"count": False, "rows": 100, "repeats": 2, "seed": 1}}))
        assert honest["rows"] == 100 and len(honest["importance"]["permuted"]) == 8
        assert json.loads(call({**base, "importance": {"count": True, "rows": 0, "repeats": 1, "seed": 1}}))["rows"] \
            == SIZES[0]
        for ask, state in [({"count": False, "rows": 100, "repeats": 1000, "seed": 1}, "08P01"),
                           ({"count": False, "rows": 10**9, "repeats": 1, "seed": 1}, "08P01"),
                           (None, "08P01")]:
            with pytest.raises(psycopg.Error) as err:
                call({**base, "importance": ask})
            assert err.value.sqlstate == state, (ask, err.value.sqlstate, err.value.diag.message_primary)
        with pytest.raises(psycopg.Error) as err:
            call({**base, "phase": "Evaluate", "importance": {"count": True, "rows": 0, "repeats": 1, "seed": 1}})
        assert err.value.sqlstate == "08P01", err.value.diag.message_primary
