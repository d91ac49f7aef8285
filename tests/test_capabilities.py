"""What combines with what (docs/reference.md, "What combines with what", generated from
ml/src/capabilities.rs): every row of the table that one server can reach is refused from SQL
as the page says — ERROR 0A000 before any work, a message ending in "yet", the row's hint, no
model stored — and a combination the table does not list trains. (The sharded table's rows are
asserted in test_shards.py, over a sharded table.)"""

import pathlib
import re

import pytest

from helpers import REPO, catalog_counts, connect, describe, train, train_error

ROWS = 2000


@pytest.fixture(scope="module")
def env(db):
    with connect(db) as admin:
        admin.execute(f"""CREATE TABLE cap AS SELECT i AS id,
                ARRAY[(i % 2) * 2 - 1 + ((i * 37) % 100) / 50.0, ((i * 53) % 100) / 50.0]::float8[] AS features,
                (i % 2) AS label, i % 3 AS class3, CASE WHEN i % 2 = 1 THEN 'yes' ELSE 'no' END AS answer,
                ((i * 37) % 100) / 10.0 AS x, (ARRAY['red', 'green', 'blue'])[1 + i % 3] AS color,
                ARRAY[1 + i % 5, 7]::int4[] AS idx, ARRAY[(i % 2) * 2 - 1.0, 0.5]::float8[] AS val
            FROM generate_series(1, {ROWS}) i""")
        admin.execute("CREATE TABLE cap_valid AS SELECT * FROM cap WHERE id % 10 = 0")
        admin.execute("ANALYZE cap, cap_valid")
    yield db


@pytest.fixture
def admin(env):
    with connect(env) as c:
        yield c


def table_rows():
    """(with, not yet, instead) of the reference page's table."""
    page = (pathlib.Path(REPO) / "docs" / "reference.md").read_text()
    table = page.split("<!-- capabilities -->\n", 1)[1].split("<!-- /capabilities -->", 1)[0]
    rows = [[c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in table.splitlines()[2:]]
    return [tuple(c.replace("\\|", "|") for c in r) for r in rows]


@pytest.fixture(scope="module")
def warm(env):
    """The model the warm starts continue: a logistic model."""
    with connect(env) as c:
        linear = train(c, "cap", "logistic", {"features": ["x", "color"], "epochs": 1, "seed": 1, "name": "cap_ws"})
    return {"linear": linear}


SEARCH = {"search": {"learning_rate": [0.01, 0.1]}, "name": "cap_search"}
INFERENCE = {"features": ["x"], "inference": True}
GROUPS = {"features": ["x"], "group_by": "color", "name": "cap_groups", "min_group_rows": 10}

# (with, not yet) as the page names them -> a training that uses both: (kind, params).
REACHABLE = {
    ('`"workers"`', '`"inference"`'): ("logistic", {**INFERENCE, "workers": 1}),
    ('`"inference"`', '`"search"`'): ("logistic", {**INFERENCE, **SEARCH}),
    ('`"inference"`', '`"group_by"`'): ("logistic", {**GROUPS, "inference": True}),
    ('`"inference"`', '`"folds"`'): ("logistic", {**INFERENCE, "folds": 3}),
    ('`"inference"`', '`"since"`'): ("logistic", {**INFERENCE, "since": "cap_ws"}),
    ('`"inference"`', '`"validation"`'): ("logistic", {**INFERENCE, "validation": {"fraction": 0.2}}),
    ('`"inference"`', "sparse features"): ("logistic", {"features": {"indices": "idx", "values": "val"},
                                                         "n_features": 8, "inference": True}),
    ('`"inference"`', '`"shuffle"`: `"sliding_window"`, `"mrs"`'): ("logistic", {**INFERENCE, "shuffle": "mrs"}),
    ('`"group_by"`', '`"search"`'): ("logistic", {**GROUPS, **SEARCH}),
    ('`"group_by"`', '`"folds"`'): ("logistic", {**GROUPS, "folds": 3}),
    ('`"group_by"`', '`"validation"`'): ("logistic", {**GROUPS, "validation": {"fraction": 0.2}}),
    ('`"group_by"`', '`"tolerance"`'): ("logistic", {**GROUPS, "tolerance": 0.01}),
    ('`"warm_start"`', '`"folds"`'): ("logistic", {"warm_start": "cap_ws", "folds": 3}),
    ('`"warm_start"`', '`"group_by"`'): ("logistic", {"warm_start": "cap_ws", "group_by": "color",
                                                       "name": "cap_ws_groups"}),
    ('`"warm_start"`', "a validation relation"): ("logistic", {"warm_start": "cap_ws",
                                                                "validation": {"relation": "cap_valid"}}),
    ('`"since"`', '`"folds"`'): ("logistic", {"since": "cap_ws", "folds": 3}),
    ('`"since"`', '`"group_by"`'): ("logistic", {"since": "cap_ws", "group_by": "color", "name": "cap_ws_groups"}),
    ('`"since"`', "a validation relation"): ("logistic", {"since": "cap_ws", "validation": {"relation": "cap_valid"}}),
    ('`"deploy": "if_better"`', '`"workers"`'): ("logistic", {"deploy": "if_better", "name": "cap_gate",
                                                              "validation": {"fraction": 0.2}, "workers": 1}),
    ('`"deploy": "if_better"`', '`"group_by"`'): ("logistic", {**GROUPS, "deploy": "if_better"}),
    ('`"deploy": "if_better"`', '`"folds"`'): ("logistic", {"deploy": "if_better", "name": "cap_gate", "folds": 3}),
}


def test_the_table_lists_what_the_tests_reach():
    rows = {(w, n) for w, n, _ in table_rows()}
    one_server = {r for r in rows if r[0] != "a sharded table"}
    assert one_server == set(REACHABLE), one_server ^ set(REACHABLE)


@pytest.mark.parametrize("row", [r for r in table_rows() if r[0] != "a sharded table"], ids=lambda r: f"{r[0]} {r[1]}")
def test_a_row_is_refused_before_any_work(admin, warm, row):
    with_, not_yet, instead = row
    kind, params = REACHABLE[(with_, not_yet)]
    before = catalog_counts(admin)
    e = train_error(admin, "cap", kind, {"epochs": 1, "seed": 1, **params})
    assert e is not None and e.sqlstate == "0A000", describe(e)
    assert e.diag.message_primary.endswith(" yet"), describe(e)
    assert e.diag.message_hint == instead, describe(e)
    assert catalog_counts(admin) == before


def test_workers_train_softmax_and_text_labels(admin):
    """Once refused ("the classes would be numbered differently"): the leader numbers them."""
    for kind, label in (("softmax", "class3"), ("logistic", "answer"), ("mlp", "answer")):
        extra = {"hidden": [4]} if kind == "mlp" else {}
        model = train(admin, "cap", kind, {"features": "features", "label": label, "epochs": 1, "seed": 1,
                                           "workers": 1, **extra})
        assert model > 0