"""Dates and times as features: date, timestamp, timestamptz, time and interval columns in a
column list (or "*") become their parts — the value scaled like a number, the hour of the day as
a sin/cos pair, the day of the week and the month one-hot — named `at.hour_sin`, `at.dow=Mon`,
`at.month=Jan` in the coefficients.

What a user depends on:
* every date/time type trains, NULLs included (the value imputed, the other parts left out);
* a label that depends on the weekday and the working hours is learned from a timestamp alone;
* a timestamptz is read on the wall clock of the session's time zone at training, stored with
  the model: predictions from a row and evaluate give the same answers in a session of any
  other time zone, and the parts follow the training zone (a label defined by New York's
  working hours is learned when training in New York);
* `"parts"` in `preprocess` chooses the parts, and is refused where a type has no such part;
* an infinite timestamp is a clear ERROR, never a crash.
"""

import pytest

from helpers import connect, describe, scalar, train, train_error

ROWS = 12000


@pytest.fixture(scope="module")
def env(db):
    with connect(db) as admin:
        # Every 37 minutes from 2026-01-01 00:00 UTC; the label: a weekday between 9:00 and
        # 17:59 in New York.
        admin.execute(f"""CREATE TABLE dt AS SELECT i AS id,
                timestamptz '2026-01-01 00:00+00' + i * interval '37 minutes' AS at,
                (timestamptz '2026-01-01 00:00+00' + i * interval '37 minutes') AT TIME ZONE 'UTC' AS at_plain,
                date '2025-01-01' + (i % 500) AS day, time '00:00' + i * interval '13 minutes' AS tod,
                (i % 72) * interval '20 minutes' + (i % 3) * interval '1 month' AS dur,
                ((i * 37) % 100) / 100.0 AS x
            FROM generate_series(1, {ROWS}) i""")
        admin.execute("""ALTER TABLE dt ADD COLUMN label int""")
        admin.execute("""UPDATE dt SET label = (extract(isodow FROM at AT TIME ZONE 'America/New_York') <= 5
                         AND extract(hour FROM at AT TIME ZONE 'America/New_York') BETWEEN 9 AND 17)::int""")
        admin.execute("UPDATE dt SET at = NULL, at_plain = NULL, day = NULL, tod = NULL, dur = NULL WHERE id % 101 = 0")
    yield db


@pytest.fixture
def admin(env):
    with connect(env) as c:
        yield c


def accuracy(c, model):
    return scalar(c, "SELECT avg((corgipile_predict(%s, d)::int = label)::int)::float8 FROM dt d", (model,))


def test_every_type_trains_and_predicts_alike(env, admin):
    admin.execute("SET TimeZone = 'America/New_York'")
    model = train(admin, "dt", "logistic", {"features": ["at", "at_plain", "day", "tod", "dur", "x"],
                                            "epochs": 5, "seed": 1})
    n, trained, skipped = admin.execute(
        "SELECT n_features, rows_trained, rows_skipped FROM corgipile.models WHERE id = %s", (model,)).fetchone()
    # at 22, at_plain 22, day 20 (no hour), tod 3 (value, hour), dur 1, x 1.
    assert (n, trained, skipped) == (69, ROWS, 0)
    names = [r[0] for r in admin.execute(
        "SELECT feature FROM corgipile_model_coefficients(%s) ORDER BY feature_index", (model,))]
    assert names[:4] == ["at", "at.hour_sin", "at.hour_cos", "at.dow=Mon"]
    assert "day.month=Feb" in names and "tod.hour_cos" in names and "dur" in names
    assert "day.hour_sin" not in names and "dur.dow=Mon" not in names
    # Predictions from rows (NULL timestamps included) agree with evaluate.
    report = scalar(admin, "SELECT corgipile_evaluate(%s, 'dt')", (model,))
    assert report["rows_scored"] == ROWS
    assert abs(report["accuracy"] - accuracy(admin, model)) < 1e-9
    assert report["accuracy"] > 0.9, report


def test_a_timestamptz_is_read_in_the_training_sessions_zone(env, admin):
    admin.execute("SET TimeZone = 'America/New_York'")
    ny = train(admin, "dt", "logistic", {"features": ["at"], "epochs": 5, "seed": 1})
    assert scalar(admin, "SELECT preprocessing->'columns'->0->>'zone' FROM corgipile.models WHERE id = %s",
                  (ny,)) == "America/New_York"
    admin.execute("SET TimeZone = 'Asia/Tokyo'")
    tokyo = train(admin, "dt", "logistic", {"features": ["at"], "epochs": 5, "seed": 1})
    # New York's working hours are learned on New York's clock, not on Tokyo's.
    assert accuracy(admin, ny) > 0.95
    assert accuracy(admin, ny) > accuracy(admin, tokyo) + 0.03
    # The same predictions whatever the zone of the session that asks.
    predictions = []
    for zone in ("UTC", "Pacific/Auckland", "America/New_York"):
        admin.execute(f"SET TimeZone = '{zone}'")
        predictions.append(admin.execute(
            "SELECT array_agg(corgipile_predict(%s, d) ORDER BY id) FROM dt d", (ny,)).fetchone()[0])
        assert scalar(admin, "SELECT (corgipile_evaluate(%s, 'dt')->>'accuracy')::float8", (ny,)) == \
            pytest.approx(accuracy(admin, ny), abs=1e-12)
    assert predictions[0] == predictions[1] == predictions[2]


def test_parts_are_configurable(env, admin):
    model = train(admin, "dt", "logistic", {"features": ["at", "day"], "epochs": 2, "seed": 1,
                                            "preprocess": {"at": {"parts": ["dow", "hour"]},
                                                           "day": {"parts": ["value"]}}})
    names = [r[0] for r in admin.execute(
        "SELECT feature FROM corgipile_model_coefficients(%s) ORDER BY feature_index", (model,))]
    assert names == ["at.dow=" + d for d in ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")] + \
        ["at.hour_sin", "at.hour_cos", "day", "(intercept)"]
    for column, parts in (("day", ["hour"]), ("dur", ["dow"]), ("tod", ["month"]), ("x", ["value"]),
                          ("at", ["weekday"]), ("at", [])):
        e = train_error(admin, "dt", "logistic", {"features": [column], "preprocess": {column: {"parts": parts}}})
        assert e is not None and e.sqlstate == "22023" and "parts" in e.diag.message_primary, describe(e)


def test_star_takes_dates_and_infinity_is_an_error(env, admin):
    model = train(admin, "dt", "logistic", {"features": "*", "exclude": ["id"], "epochs": 1, "seed": 1})
    cols = scalar(admin, "SELECT features FROM corgipile.models WHERE id = %s", (model,))
    assert cols == ["at", "at_plain", "day", "tod", "dur", "x"]
    admin.execute("DROP TABLE IF EXISTS dt_inf")
    admin.execute("CREATE TABLE dt_inf AS SELECT * FROM dt")
    admin.execute("UPDATE dt_inf SET at = 'infinity' WHERE id = 77")
    e = train_error(admin, "dt_inf", "logistic", {"features": ["at"], "epochs": 1})
    assert e is not None and e.sqlstate.startswith("22"), describe(e)
    assert scalar(admin, "SELECT 1") == 1
    # A row to predict with an infinite timestamp: an ERROR too.
    with pytest.raises(Exception) as err:
        admin.execute("SELECT corgipile_predict(%s, d) FROM dt_inf d WHERE id = 77", (model,)).fetchall()
    assert getattr(err.value, "sqlstate", "22").startswith("22")
    assert scalar(admin, "SELECT 1") == 1


def test_warm_start_keeps_the_zone(env, admin):
    admin.execute("SET TimeZone = 'America/New_York'")
    first = train(admin, "dt", "logistic", {"features": ["at", "x"], "epochs": 3, "seed": 1, "name": "dt_warm"})
    admin.execute("SET TimeZone = 'UTC'")
    again = train(admin, "dt", "logistic", {"warm_start": "dt_warm", "epochs": 1, "seed": 1})
    assert scalar(admin, "SELECT preprocessing->'columns'->0->>'zone' FROM corgipile.models WHERE id = %s",
                  (again,)) == "America/New_York"
    assert accuracy(admin, again) >= accuracy(admin, first) - 0.01
